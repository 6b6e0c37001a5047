#include "apps/cli/roofline_cli.h"

#include <torch/torch.h>

#include <cxxopts.hpp>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "apps/cli/command_line.h"
#include "apps/compare/roofline.h"
#include "apps/results/flops.h"
#include "apps/results/result_file.h"
#include "apps/results/text.h"
#include "apps/train/device.h"

namespace tt {

namespace fs = std::filesystem;

namespace {

// Device-to-device copies of 1 GiB, read + write counted: the memory roof as this GPU really delivers it.
double measure_copy_bandwidth() {
  const torch::Device device(torch::kCUDA, 0);
  constexpr int64_t kElements = int64_t{1} << 28;  // 1 GiB of fp32
  constexpr int kRepeats = 20;
  auto src = torch::ones({kElements}, torch::TensorOptions().device(device));
  auto dst = torch::empty_like(src);
  dst.copy_(src);
  StepTimer timer(device, 2);
  timer.mark(0);
  for (int i = 0; i < kRepeats; ++i) dst.copy_(src);
  timer.mark(1);
  const double seconds = timer.elapsed_ms(0, 1) / 1e3;
  return 2.0 * kElements * sizeof(float) * kRepeats / seconds;
}

}  // namespace

int roofline_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "roofline",
      "Roofline report of profiled kernels: FLOP per DRAM byte and achieved FLOP/s against the GPU's compute roofs "
      "(the peak table MFU uses) and memory roof, as roofline.md, roofline.svg and roofline.json.\n"
      "The counters are ncu's raw CSV page; scripts/profile_roofline.sh collects them and runs this tool.\n"
      "Exit status: 0 fine, 2 bad arguments or files.");
  // clang-format off
  options.add_options()
      ("counters", "ncu raw CSV (ncu --import R.ncu-rep --csv --page raw --print-units base)",
       cxxopts::value<std::string>(), "FILE")
      ("result", "the profiled run's result JSON: the GPU's name and the run's stage, config and dtype for the title",
       cxxopts::value<std::string>(), "FILE")
      ("gpu", "GPU name for the compute roofs (default: the --result's system.device_name)",
       cxxopts::value<std::string>(), "NAME")
      ("bandwidth-gbs", "memory roof in GB/s (1e9 bytes/s)", cxxopts::value<double>(), "X")
      ("measure-bandwidth", "measure the memory roof: 1 GiB device-to-device copies on GPU 0 (needs a GPU)")
      ("top", "kernels in the table and chart [12]", cxxopts::value<int64_t>(), "N")
      ("output-dir", "where roofline.{md,svg,json} go (default: the counter file's folder)",
       cxxopts::value<std::string>(), "DIR")
      ("list-metrics", "print the ncu metrics the report reads, one a line, and exit")
      ("help", "show this help");
  // clang-format on
  const auto [parsed, exit_code] = parse_tool_flags(options, args, out, err);
  if (exit_code) return *exit_code;
  if (parsed.count("list-metrics")) {
    if (args.size() > 1) {
      err << "roofline: error: --list-metrics prints the metrics and exits: give it alone" << std::endl;
      return 2;
    }
    for (const auto& m : roofline::ncu_metrics()) out << m << "\n";
    return 0;
  }
  auto fail = [&](const std::string& message) {
    err << "roofline: error: " << message << std::endl;
    return 2;
  };
  if (!parsed.count("counters")) return fail("--counters FILE is required (ncu's raw CSV page, see --help)");
  const int64_t top = parsed.count("top") ? parsed["top"].as<int64_t>() : 12;
  if (top < 1) return fail("--top " + std::to_string(top) + " is not allowed: it must be >= 1");
  if (parsed.count("bandwidth-gbs") && parsed.count("measure-bandwidth"))
    return fail("--bandwidth-gbs and --measure-bandwidth are alternatives: give one");
  if (parsed.count("bandwidth-gbs") && !(parsed["bandwidth-gbs"].as<double>() > 0))
    return fail("--bandwidth-gbs " + strprintf("%g", parsed["bandwidth-gbs"].as<double>()) +
                " is not allowed: it must be > 0");
  const std::string counters = parsed["counters"].as<std::string>();
  roofline::Report report;
  std::string gpu = parsed.count("gpu") ? parsed["gpu"].as<std::string>() : "";
  try {
    report = roofline::read_ncu_csv(counters);
    report.title = fs::absolute(counters).parent_path().filename().string();
    if (parsed.count("result")) {
      const auto result = read_json_file(parsed["result"].as<std::string>());
      validate_result_json(result);
      if (gpu.empty()) gpu = result["system"]["device_name"].get<std::string>();
      report.title =
          result["stage"]["name"].get<std::string>() +
          (result["stage"].contains("pitfall") ? " --pitfall " + result["stage"]["pitfall"]["name"].get<std::string>()
                                               : "") +
          ", " + result["config"]["name"].get<std::string>() + ", " + result["training"]["dtype"].get<std::string>() +
          ", " + gpu;
    }
    if (parsed.count("measure-bandwidth")) {
      if (!torch::cuda::is_available()) return fail("--measure-bandwidth needs a GPU, and LibTorch sees none");
      report.bandwidth = measure_copy_bandwidth();
      report.bandwidth_source = "measured: 1 GiB device-to-device copies, read + write";
    }
  } catch (const std::exception& e) {
    return fail(error_message(e));
  }
  if (parsed.count("bandwidth-gbs")) {
    report.bandwidth = parsed["bandwidth-gbs"].as<double>() * 1e9;
    report.bandwidth_source = "given with --bandwidth-gbs";
  }
  if (!report.bandwidth) report.notes.push_back("no memory roof: pass --measure-bandwidth or --bandwidth-gbs");
  report.compute_roofs = roofline::roofs_for(gpu);
  if (report.compute_roofs.empty())
    report.notes.push_back("no compute roof: " + (gpu.empty() ? std::string("no GPU named (--gpu or --result)")
                                                              : "'" + gpu + "' is not in the peak table (it knows " +
                                                                    known_gpus() + ")"));

  const fs::path dir =
      parsed.count("output-dir") ? fs::path(parsed["output-dir"].as<std::string>()) : fs::path(counters).parent_path();
  const auto n = static_cast<size_t>(top);
  const std::string markdown = roofline::to_markdown(report, n);
  try {
    if (!dir.empty()) fs::create_directories(dir);
    for (const auto& [name, content] : {std::pair<std::string, std::string>{"roofline.md", markdown},
                                        {"roofline.svg", roofline::to_svg(report, n)},
                                        {"roofline.json", roofline::to_json(report, n).dump(2) + "\n"}}) {
      std::ofstream file(dir / name);
      file << content;
      if (!file) throw std::runtime_error("cannot write '" + (dir / name).string() + "'");
    }
  } catch (const std::exception& e) {
    return fail(error_message(e));
  }
  out << markdown;
  const std::string prefix = (dir.empty() ? std::string() : dir.string() + "/") + "roofline";
  out << "written: " << prefix << ".md, " << prefix << ".svg (chart: open it in a browser), " << prefix << ".json"
      << std::endl;
  return 0;
}

}  // namespace tt
