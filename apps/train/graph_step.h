// The whole training step as one CUDA/HIP graph: the first steps run eagerly on a side stream (CUDA and
// HIP capture only from a non-default stream, and lazily initialised libraries must meet that stream
// before capture), then one step is captured there (forward, backward, optimizer, gradient reset) and
// every step from then on is a single replay. Nothing inside may allocate outside the graph's memory
// pool, sync with the host or depend on host data: our optimizer keeps its step counter on the device
// for this reason. The batch buffers and the returned loss are the same tensors at every replay.
#pragma once

#include <memory>

#include <torch/torch.h>

#include "apps/train/step.h"

namespace tt {

class GraphedStep final : public StepRunner {
 public:
  // Calls 0 .. capture_at - 1 run `eager` eagerly (warm-up), call `capture_at` captures and replays.
  // Throws without GPU kernels or a GPU. capture_at must be at least 1. With high_priority the step runs and is
  // captured on a high-priority stream: kernels the step queues on other streams (the optimizer overlap's)
  // keep their own, lower priority in the graph and yield to the step's when both wait for SMs.
  GraphedStep(EagerStep& eager, int64_t capture_at, bool high_priority = false);
  ~GraphedStep() override;
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) override;
  bool times_phases() const override { return false; }
  const char* describe() const override;
  bool captures_graph() const override { return true; }

 private:
  struct Graph;  // the vendor graph and its stream, kept out of this header
  EagerStep& eager_;
  int64_t capture_at_;
  int64_t calls_ = 0;
  std::unique_ptr<Graph> graph_;
};

}  // namespace tt
