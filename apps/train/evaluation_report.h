// Held-out evaluation in result files, built from a run: the "evaluation" object of a training result and the
// eval result file that --eval-only writes (README, "Evaluation"). Their checks are the format's
// (apps/results/result_file.h: validate_evaluation_json, validate_eval_result_json).
#pragma once

#include <iosfwd>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/results/result_file.h"
#include "apps/train/evaluate.h"
#include "models/config.h"
#include "models/stage.h"

namespace tt {

// The "evaluation" object of result files: what was evaluated and how, and the result.
nlohmann::json to_json(const EvalResult& result, const EvalData& data, int64_t seq_len, int64_t batch_size,
                       Precision precision);
// One point of the held-out curve: {step, loss, perplexity}.
nlohmann::json curve_point(int64_t step, const EvalResult& result);

// --eval-only: the stage's model with the checkpoint's weights, evaluated on data. Returns the eval result
// file (kind "evaluation", schema in README) and prints one summary line on log.
nlohmann::json evaluate_checkpoint(const StageSpec& spec, const RunConfig& config, const std::string& checkpoint,
                                   const EvalData& data, const torch::Device& device, std::ostream& log);

}  // namespace tt
