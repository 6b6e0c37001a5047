// The one training loop every stage runs.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/runtime/device.h"
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

  // The full run: warm-up steps, measured steps, progress lines on `log`; returns the result JSON.
  nlohmann::json run(std::ostream& log);

  Transformer& model() { return model_; }
  Optimizer& optimizer() { return *optimizer_; }
  const torch::Device& device() const { return device_; }
  bool mixed_precision() const { return config_.training.dtype == "bf16"; }

 private:
  nlohmann::json stage_details() const;

  StageSpec spec_;
  RunConfig config_;
  torch::Device device_;
  Transformer model_{nullptr};
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace tt
