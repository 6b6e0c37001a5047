// Held-out evaluation in result files: the "evaluation" object of a training result, the eval result file
// that --eval-only writes, and their checks (README, "Evaluation").
#pragma once

#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/train/evaluate.h"
#include "models/config.h"
#include "models/stage.h"

namespace tt {

// The "evaluation" object of result files: what was evaluated and how, and the result.
nlohmann::json to_json(const EvalResult& result, const EvalData& data, int64_t seq_len, int64_t batch_size,
                       Precision precision);
// One point of the held-out curve: {step, loss, perplexity}.
nlohmann::json curve_point(int64_t step, const EvalResult& result);

// Throws std::runtime_error naming the first missing or mistyped field of an "evaluation" object.
void validate_evaluation_json(const nlohmann::json& evaluation);

// --eval-only: the stage's model with the checkpoint's weights, evaluated on data. Returns the eval result
// file (kind "evaluation", schema in README) and prints one summary line on log.
nlohmann::json evaluate_checkpoint(const StageSpec& spec, const RunConfig& config, const std::string& checkpoint,
                                   const EvalData& data, const torch::Device& device, std::ostream& log);
// Throws std::runtime_error naming the first missing or mistyped field of an eval result file.
void validate_eval_result_json(const nlohmann::json& result);

}  // namespace tt
