#include "apps/cli/compare_cli.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>

#include <cxxopts.hpp>

#include "apps/cli/flags.h"
#include "apps/compare/compare.h"
#include "apps/compare/compare_svg.h"
#include "apps/compare/compare_text.h"
#include "apps/compare/exercise.h"
#include "apps/compare/html_report.h"
#include "apps/results/text.h"

namespace tt {

namespace fs = std::filesystem;

int compare_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  using namespace compare;
  cxxopts::Options options("compare",
                           "Compare TinyTransformer result JSONs: a table of step time, throughput, speedup, memory, "
                           "TFLOP/s, MFU, kernels per step and loss, written also as Markdown, CSV and an SVG chart.\n"
                           "Exit status: 0 fine, 1 slower than --fail-if-slower allows, 2 bad input or results that "
                           "are not comparable.");
  options.add_options()
      ("output-dir", "write comparison.md, comparison.csv, comparison.svg and report.html here (default: the first result's folder)",
       cxxopts::value<std::string>(), "DIR")
      ("allow-mismatch", "compare results with different model/training config, dtype, GPU or schema anyway (with warnings)")
      ("baseline", "reference result for speedup and deltas (default: the v1_baseline result, else the --pitfall none result, else the first file)",
       cxxopts::value<std::string>(), "FILE")
      ("fail-if-slower", "exit 1 when a result's median step time is more than PCT % above the --baseline's",
       cxxopts::value<double>(), "PCT")
      ("help", "show this help")
      ("files", "result JSON files", cxxopts::value<std::vector<std::string>>());
  options.parse_positional({"files"});
  options.positional_help("RESULT.json [RESULT.json ...]");
  const auto [parsed, exit_code] = parse_tool_flags(options, args, out, err);
  if (exit_code) return *exit_code;
  const std::vector<std::string> files =
      parsed.count("files") ? parsed["files"].as<std::vector<std::string>>() : std::vector<std::string>{};
  const std::string baseline_path = parsed.count("baseline") ? parsed["baseline"].as<std::string>() : "";
  if (files.empty()) {
    err << "compare: error: no result files given (usage: compare [options] RESULT.json [RESULT.json ...], see --help)"
        << std::endl;
    return 2;
  }
  std::optional<double> allowed_pct;
  if (parsed.count("fail-if-slower")) {
    allowed_pct = parsed["fail-if-slower"].as<double>();
    if (baseline_path.empty()) {
      err << "compare: error: --fail-if-slower needs --baseline FILE: the result the others must not be slower than"
          << std::endl;
      return 2;
    }
    if (!(*allowed_pct >= 0)) {
      err << "compare: error: --fail-if-slower " << *allowed_pct << " is not allowed: it must be a percentage >= 0"
          << std::endl;
      return 2;
    }
  }

  std::vector<Result> compared, all;
  try {
    compared = load_results(files);
    if (!baseline_path.empty()) {
      all.push_back(load_result(baseline_path));
      std::error_code ec;
      for (const auto& r : compared)
        if (!fs::equivalent(r.path, baseline_path, ec)) all.push_back(r);
    } else {
      all = compared;
    }
    assign_labels(all);
    assign_labels(compared);
  } catch (const std::exception& e) {
    // Nothing compare calls is LibTorch's (it links none), so what() has no C++ backtrace to strip.
    err << "compare: error: " << e.what() << std::endl;
    return 2;
  }

  const auto mismatches = find_mismatches(all);
  if (!mismatches.empty()) {
    const bool allow = parsed.count("allow-mismatch") > 0;
    err << "compare: " << (allow ? "warning" : "error") << ": the results are not comparable; compared with '"
        << all[0].path << "':\n";
    for (const auto& d : mismatches) err << "  - " << d.describe() << "\n";
    if (!allow) {
      err << "Pass --allow-mismatch to compare them anyway (the table and files will carry a warning)." << std::endl;
      return 2;
    }
  }
  for (const auto& d : find_notes(all)) err << "compare: note: " << d.describe() << "\n";

  const Comparison comparison = build_comparison(all, baseline_path.empty() ? std::nullopt : std::optional<size_t>(0));
  out << format_table(comparison) << format_exercise(comparison) << format_time_breakdown(comparison);

  const fs::path dir = parsed.count("output-dir") ? fs::path(parsed["output-dir"].as<std::string>())
                                                  : fs::path(files.front()).parent_path();
  try {
    if (!dir.empty()) fs::create_directories(dir);
    for (const auto& [name, content] : {std::pair<std::string, std::string>{"comparison.md", to_markdown(comparison)},
                                        {"comparison.csv", to_csv(comparison)},
                                        {"comparison.svg", to_svg(comparison)},
                                        {"report.html", to_html(comparison, all, dir.string())}}) {
      const fs::path path = dir / name;
      std::ofstream file(path);
      file << content;
      if (!file) throw std::runtime_error("cannot write '" + path.string() + "'");
    }
  } catch (const std::exception& e) {
    err << "compare: error: " << e.what() << std::endl;
    return 2;
  }
  const std::string prefix = (dir.empty() ? std::string() : dir.string() + "/") + "comparison";
  out << "written: " << prefix << ".md (Markdown table), " << prefix << ".csv, " << prefix
      << ".svg (chart: open it in a browser), " << (dir.empty() ? std::string() : dir.string() + "/")
      << "report.html (everything in one page)" << std::endl;

  if (!allowed_pct) return 0;
  bool too_slow = false;
  out << "regression check against " << baseline_path << " (median step time may be at most "
      << strprintf("%g", *allowed_pct) << "% above it):\n";
  for (const auto& check : check_slower(all[0], compared, *allowed_pct)) {
    out << "  " << (check.too_slow ? "FAIL " : "ok   ") << check.label << ": " << strprintf("%.3f", check.median_ms)
        << " ms vs " << strprintf("%.3f", check.baseline_ms) << " ms (" << strprintf("%+.1f%%", check.slower_pct) << ")\n";
    too_slow = too_slow || check.too_slow;
  }
  out.flush();
  if (too_slow)
    err << "compare: a result is more than " << strprintf("%g", *allowed_pct) << "% slower than the baseline" << std::endl;
  return too_slow ? 1 : 0;
}

}  // namespace tt
