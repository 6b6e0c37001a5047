#include "apps/cli/kernel_bench_cli.h"

#include <algorithm>
#include <ostream>
#include <sstream>

#include <cxxopts.hpp>

#include "apps/bench/kernel_bench.h"
#include "apps/cli/command_line.h"

namespace tt {
namespace {

// 64 GiB: larger than any GPU's last-level cache by far; more only risks running out of memory.
constexpr int64_t kMaxFlushMib = 65536;

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// A comma-separated list (spaces after commas allowed, as the defaults are printed); throws ConfigError
// naming the option, the bad value and the allowed ones.
std::vector<std::string> parse_choices(const std::string& option, const std::string& text,
                                       const std::vector<std::string>& allowed) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const auto first = item.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    items.push_back(item.substr(first, item.find_last_not_of(' ') - first + 1));
  }
  if (items.empty()) throw ConfigError("--" + option + " is empty; allowed: " + join(allowed));
  for (const auto& i : items)
    if (std::find(allowed.begin(), allowed.end(), i) == allowed.end())
      throw ConfigError("--" + option + " has unknown value '" + i + "'; allowed: " + join(allowed));
  return items;
}

std::vector<std::string> shape_names() {
  std::vector<std::string> names;
  for (const auto& s : bench::shapes()) names.push_back(s.name);
  return names;
}

}  // namespace

int kernel_bench_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const bench::BenchOptions defaults;
  cxxopts::Options spec("kernel_bench",
                        "Times every implementation of each component (forward, forward+backward) side by side.");
  spec.add_options()("kernels", "Comma-separated families: " + join(bench::families()),
                     cxxopts::value<std::string>()->default_value(join(bench::families())))(
      "shapes", "Comma-separated shapes: " + join(shape_names()) + " (the last five are long sequences for attention)",
      cxxopts::value<std::string>()->default_value("workshop, medium"))(
      "dtypes", "Comma-separated activation dtypes: " + join(bench::dtypes()) + " (the stages train in fp32 or bf16)",
      cxxopts::value<std::string>()->default_value("fp32,bf16"))(
      "warmup", "Untimed runs before each measurement",
      cxxopts::value<int64_t>()->default_value(std::to_string(defaults.warmup)))(
      "repeats", "Timed runs per measurement",
      cxxopts::value<int64_t>()->default_value(std::to_string(defaults.repeats)))(
      "flush-mib", "Size of the buffer written before each timed run to flush the caches (MiB)",
      cxxopts::value<int64_t>()->default_value(std::to_string(defaults.flush_mib)))(
      "device-index", "Which GPU to use", cxxopts::value<int64_t>()->default_value("0"))(
      "output", "Where to write the JSON results (an existing file is replaced)",
      cxxopts::value<std::string>()->default_value(defaults.output))("help", "Print this help");
  bench::BenchOptions options;
  try {
    const auto parsed = parse_flags(spec, args);
    if (parsed.count("help")) {
      out << spec.help() << std::endl;
      return 0;
    }
    options.families = parse_choices("kernels", parsed["kernels"].as<std::string>(), bench::families());
    options.shapes = parse_choices("shapes", parsed["shapes"].as<std::string>(), shape_names());
    options.dtypes = parse_choices("dtypes", parsed["dtypes"].as<std::string>(), bench::dtypes());
    options.warmup = parsed["warmup"].as<int64_t>();
    options.repeats = parsed["repeats"].as<int64_t>();
    options.flush_mib = parsed["flush-mib"].as<int64_t>();
    options.device_index = parsed["device-index"].as<int64_t>();
    options.output = parsed["output"].as<std::string>();
    if (options.warmup < 0) throw ConfigError("--warmup must be >= 0, got " + std::to_string(options.warmup));
    if (options.repeats < 1) throw ConfigError("--repeats must be >= 1, got " + std::to_string(options.repeats));
    if (options.flush_mib < 1 || options.flush_mib > kMaxFlushMib)
      throw ConfigError("--flush-mib must be in [1, " + std::to_string(kMaxFlushMib) + "], got " +
                        std::to_string(options.flush_mib));
    // Checked now, not after minutes of measuring; an existing file is replaced, as --help says.
    if (const auto refusal = refuse_output_file("--output", options.output, /*overwrite=*/true))
      throw ConfigError(*refusal);
    if (options.device_index < 0)
      throw ConfigError("--device-index must be >= 0, got " + std::to_string(options.device_index));
  } catch (const std::exception& e) {
    err << "kernel_bench: error: " << error_message(e) << std::endl;
    return 2;
  }
  try {
    return bench::run(options, out, err);
  } catch (const std::exception& e) {
    err << "kernel_bench: error: " << error_message(e) << std::endl;
    return 1;
  }
}

}  // namespace tt
