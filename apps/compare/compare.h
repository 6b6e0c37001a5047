// The `compare` tool's logic: loads result JSONs (the format of apps/results/result_file.h), checks that they
// are comparable and builds the stage table (speedup, memory, utilisation and loss against a reference result).
// Its writers: compare_text.h (terminal, Markdown, CSV), compare_svg.h (the chart), exercise.h (the debugging
// exercise's summary), html_report.h (report.html). The command line is apps/cli/compare_cli.cpp.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/compare/kernel_categories.h"

namespace tt::compare {

struct Result {
  std::string path;
  std::string label;  // stage name; "stage (file stem)" when two results share a stage
  nlohmann::json json;
};

// Reads and validates (tt::validate_result_json) one result file; throws std::runtime_error naming the
// file and the problem.
Result load_result(const std::string& path);
// Labels each result with its stage name, and with "stage (folder/file stem)" where two share a stage.
void assign_labels(std::vector<Result>& results);
// Loads all and assigns labels; throws like load_result.
std::vector<Result> load_results(const std::vector<std::string>& paths);

// A field whose value differs between the first result and another one.
struct Difference {
  std::string field;  // e.g. "config.model.hidden_dim", "training.dtype", "system.device_name"
  std::string first_path, first_value;
  std::string other_path, other_value;
  std::string describe() const;  // "field: 'a.json' has 512, 'b.json' has 256"
};

// What makes timings comparable: schema version, every model field, the training fields (all but
// log_every and device, which do not change the work), the dtype, the GPU name and the data-parallel world
// size (absent = 1). Each result is compared with the first.
std::vector<Difference> find_mismatches(const std::vector<Result>& results);
// Differences worth a note but not a refusal: LibTorch, CUDA/HIP runtime, driver, git commit, host.
std::vector<Difference> find_notes(const std::vector<Result>& results);

struct Row {
  std::string label, stage, path;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double samples_per_s = 0, tokens_per_s = 0;
  double speedup = 1;                    // reference median step time / this one
  double peak_mb = 0;                    // Comparison::memory_field; 0 on the CPU (not measured)
  std::optional<double> peak_reduction;  // 1 - peak / reference peak; none when the reference has no peak
  double tflops = 0;
  std::optional<double> mfu;
  std::optional<double> kernels_per_step;  // from a --profile run
  double final_loss = 0;
  double loss_delta = 0;  // final loss - reference final loss
  bool reference = false;
  std::optional<double> energy_j_per_step, tokens_per_joule;  // none without an energy figure
  // The GPU's mean draw over the energy window (energy_window_mean_power_w, also for results written before
  // summary.energy_window.average_power_w); none without an energy figure.
  std::optional<double> average_power_w;
  // The debugging exercise (stage.pitfall in the result): its name and lesson; empty outside it.
  std::string pitfall, lesson;
  double first_loss = 0;
  // The no-sync-timing pitfall's host clock: median step by the host's clock without a sync.
  std::optional<double> host_clock_step_ms;
  // From a --profile run: the result's "profile" object (null without one) and, on a GPU, its GPU time per
  // step by kernel category beside the host gap (kernel_categories.h).
  nlohmann::json profile;
  std::optional<double> gpu_ms_per_step;
  std::optional<TimeBreakdown> breakdown;
};

struct Comparison {
  std::vector<Row> rows;
  size_t reference = 0;
  std::string reference_reason;  // why that row is the reference
  std::string config_name, dtype, device_name;
  std::optional<double> peak_tflops;  // the reference's summary.peak_tflops
  std::string mfu_note;
  // The summary field the "peak MB" column shows: peak_allocated_mb, or peak_reserved_mb for every row when a
  // result replayed its step as a graph (its activations live in the graph's pool, which only the reserved
  // figure counts), so that the column compares like with like.
  std::string memory_field = "peak_allocated_mb";
  // Whether any row has a GPU time breakdown (then the writers show "where the time goes").
  bool has_breakdown() const;
  // The rows with a GPU time breakdown, in table order.
  std::vector<const Row*> profiled_rows() const;
  std::vector<Difference> mismatches, notes;
};

// reference: index into results; by default the first v1_baseline result, else the first result of the
// debugging exercise's v3 as shipped (--pitfall none), else the first result.
Comparison build_comparison(const std::vector<Result>& results, std::optional<size_t> reference = std::nullopt);

struct SlowerCheck {
  std::string label, path;
  double median_ms = 0, baseline_ms = 0;
  double slower_pct = 0;  // (median / baseline - 1) * 100; negative when faster
  bool too_slow = false;  // slower_pct > the allowed percentage
};
std::vector<SlowerCheck> check_slower(const Result& baseline, const std::vector<Result>& results, double allowed_pct);

}  // namespace tt::compare
