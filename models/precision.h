// What a run's Precision ("dtype" in configs) means for LibTorch, decided here once: the dtype the model
// computes in, and the autocast region a forward pass runs under.
#pragma once

#include <torch/torch.h>

#include "models/config.h"

namespace tt {

// The dtype activations, KV caches and SDPA inputs have under `precision`: bf16 for kBf16, fp32 for kFp32.
torch::ScalarType compute_dtype(Precision precision);

// bf16 autocast for the forward pass under Precision::kBf16 (the workshop's --use-amp), fp32 master
// weights; nothing under kFp32.
class AutocastScope {
 public:
  AutocastScope(const torch::Device& device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  torch::DeviceType type_;
  bool enabled_, previous_;
};

}  // namespace tt
