// Checkpoints in LibTorch's pickle format, readable by Python's torch.load: one dict whose keys are the
// canonical weight names (Hugging Face LLaMA), "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>"
// for the AdamW moments, plus "step" (int), "stage" (str), "config" (the run config as a JSON string)
// and "format". Canonical names make a checkpoint portable between stages.
#pragma once

#include <map>
#include <string>

#include <torch/torch.h>

#include "models/config.h"
#include "models/optimizer.h"
#include "models/transformer.h"

namespace tt {

constexpr const char* kCheckpointFormat = "tinytransformer-checkpoint-v1";

struct Checkpoint {
  RunConfig config;
  std::string stage;
  int64_t step = 0;
  std::map<std::string, torch::Tensor> weights;
  std::map<std::string, torch::Tensor> exp_avg, exp_avg_sq;  // empty when saved before any step
};

// Writes atomically (temporary file, then rename).
void save_checkpoint(const std::string& path, const Transformer& model, const Optimizer& optimizer,
                     int64_t step, const RunConfig& config);
Checkpoint read_checkpoint(const std::string& path);
// Loads weights (and moments and step into the optimizer, when given); a model config that differs
// from the checkpoint's throws, naming each differing field.
void restore_checkpoint(const Checkpoint& checkpoint, Transformer& model, Optimizer* optimizer);

}  // namespace tt
