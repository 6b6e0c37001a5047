// The result files this project writes, as a format of their own: the training result JSON (schema in README.md,
// "Result files") and the eval result file of --eval-only, their checks, and reading and writing JSON files.
// Only nlohmann::json and plain values: no trainer, no LibTorch, so that compare and the HTML report read results
// without linking either. Building a result from a run is apps/train/run_result.h's job.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tt {

constexpr int kResultSchemaVersion = 1;
constexpr int kEvalResultSchemaVersion = 1;

struct Spread {
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0;
};
// Percentiles by linear interpolation between closest ranks; throws on an empty sample.
Spread spread(std::vector<double> values);
// The result file's spread object: {median, p10, p90, min, max}.
nlohmann::json to_json(const Spread& s);

// Throws std::runtime_error naming the first missing or mistyped field (path like "summary.step_ms.median").
void validate_result_json(const nlohmann::json& result);

// The GPU's mean draw over a result's energy window, energy_j_per_step x energy_window.steps / energy_window.seconds:
// what summary.energy_window.average_power_w records, and the same figure for results written before that field.
// None without an energy figure.
std::optional<double> energy_window_mean_power_w(const nlohmann::json& summary);
// Throws std::runtime_error naming the first missing or mistyped field of an "evaluation" object.
void validate_evaluation_json(const nlohmann::json& evaluation);
// Throws std::runtime_error naming the first missing or mistyped field of an eval result file (kind "evaluation").
void validate_eval_result_json(const nlohmann::json& result);

// Writes JSON to path through a temporary file and a rename; refuses to replace an existing file unless
// overwrite is set. Creates the parent folder.
void write_json_atomically(const std::string& path, const nlohmann::json& value, bool overwrite);
nlohmann::json read_json_file(const std::string& path);

}  // namespace tt
