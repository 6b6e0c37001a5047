// The one training loop every stage runs.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/runtime/device.h"
#include "apps/runtime/evaluate.h"
#include "apps/runtime/profiling.h"
#include "models/config.h"
#include "models/optimizer.h"
#include "models/stage.h"
#include "models/transformer.h"

namespace tt {

class Trainer {
 public:
  // Builds the stage's model on the CPU, initialises it from config.training.seed (identical weights in
  // every stage), moves it to the device and creates the stage's optimizer.
  Trainer(const StageSpec& spec, const RunConfig& config, const torch::Device& device);

  // One optimisation step: forward (autocast in bf16), backward, optional clipping, AdamW, gradient
  // reset. Returns the loss as a device scalar without a host sync. With a timer, marks 0..3 are taken at
  // step start, after forward, after backward and after the optimizer.
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer = nullptr);
  // Forward and backward only; gradients stay on the parameters (for the equivalence harness).
  torch::Tensor forward_backward(const torch::Tensor& inputs, const torch::Tensor& labels);

  // Restores weights, optimizer state and step from a checkpoint; a differing model config throws.
  void load_checkpoint(const std::string& path);
  void save_checkpoint(const std::string& path) const;

  // Held-out evaluation for run(): on data after every `every` steps (0: none during training) and after
  // the last step, between steps and outside their timed regions. The result gains an "evaluation" object.
  void set_eval_data(EvalData data, int64_t every);

  // Built-in profiling for run(): request.steps extra steps after the measured ones, recorded with Kineto
  // (trace to request.trace_path); the result gains a "profile" object. Not part of any measurement.
  void set_profile(ProfileRequest request) { profile_ = std::move(request); }

  // The full run: warm-up steps, measured steps, progress lines on `log`; returns the result JSON.
  nlohmann::json run(std::ostream& log);

  Transformer& model() { return model_; }
  Optimizer& optimizer() { return *optimizer_; }
  const torch::Device& device() const { return device_; }
  bool mixed_precision() const { return config_.training.dtype == "bf16"; }

 private:
  nlohmann::json stage_details() const;
  EvalResult evaluate_held_out(std::ostream& log, int64_t step, int64_t total);

  StageSpec spec_;
  RunConfig config_;
  torch::Device device_;
  Transformer model_{nullptr};
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<EvalData> eval_data_;
  int64_t eval_every_ = 0;
  ProfileRequest profile_;
};

}  // namespace tt
