// Checkpoints in LibTorch's pickle format, readable by Python's torch.load: one dict whose keys are the
// canonical weight names (Hugging Face LLaMA), "optimizer.exp_avg.<name>" and "optimizer.exp_avg_sq.<name>"
// for the AdamW moments, plus "step" (int), "stage" (str), "config" (the run config as a JSON string)
// and "format". Canonical names make a checkpoint portable between stages. Beside them, what an exact
// resume needs: "run_step" (steps of the run done, which is also its data position) and "rng.cpu" (the
// default CPU generator's state, uint8). This layer knows tensors by
// canonical name only; the training layer (apps/train/trainer.h) maps optimizer state to and from them.
#pragma once

#include <map>
#include <string>

#include <torch/torch.h>

#include "models/config.h"
#include "models/transformer.h"

namespace tt {

constexpr const char* kCheckpointFormat = "tinytransformer-checkpoint-v1";

struct Checkpoint {
  RunConfig config;
  std::string stage;
  int64_t step = 0;
  std::map<std::string, torch::Tensor> weights;
  std::map<std::string, torch::Tensor> exp_avg, exp_avg_sq;  // empty when saved before any step
  int64_t run_step = -1;        // steps of the run done; -1 in checkpoints written before resume existed
  torch::Tensor cpu_rng_state;  // undefined in those too
};

constexpr const char* kRunStepKey = "run_step";
constexpr const char* kCpuRngKey = "rng.cpu";

// Writes atomically (temporary file, then rename). An existing file is replaced only with `overwrite`;
// otherwise the error names --save-checkpoint and --overwrite, as results do.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint, bool overwrite);
Checkpoint read_checkpoint(const std::string& path);
// Throws naming each model field where the checkpoint's config differs from `model`.
void check_model_config(const Checkpoint& checkpoint, const ModelConfig& model);
// check_model_config, then the checkpoint's weights into the model.
void restore_weights(const Checkpoint& checkpoint, Transformer& model);

}  // namespace tt
