// The result files this project writes, as a format of their own: the training result JSON (schema in README.md,
// "Result files") and the eval result file of --eval-only, their checks, and reading and writing JSON files.
// Only nlohmann::json and plain values: no trainer, no LibTorch, so that compare and the HTML report read results
// without linking either. Building a result from a run is apps/train/run_result.h's job.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
// Throws std::runtime_error naming the first missing or mistyped field of an "evaluation" object.
void validate_evaluation_json(const nlohmann::json& evaluation);
// Throws std::runtime_error naming the first missing or mistyped field of an eval result file (kind "evaluation").
void validate_eval_result_json(const nlohmann::json& result);

// Writes JSON to path through a temporary file and a rename; refuses to replace an existing file unless
// overwrite is set. Creates the parent folder.
void write_json_atomically(const std::string& path, const nlohmann::json& value, bool overwrite);
nlohmann::json read_json_file(const std::string& path);

}  // namespace tt
