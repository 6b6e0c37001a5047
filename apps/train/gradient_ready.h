// "This group's gradients are final": a call during the backward, as soon as the last gradient of a group of
// leaves has been accumulated, so that work on them (an optimizer's update, data parallel's all-reduce) can
// start beside the rest of the backward instead of after it. Used by our AdamW's overlap
// (apps/train/optimizer.cpp) and data parallel's per-layer all-reduce (apps/train/data_parallel_step.cpp).
//
// The hooks sit on the leaves' gradient accumulators (autograd's AccumulateGrad nodes), which run after the
// gradient is added to .grad. They run on the host while the backward is queued, so under a graph capture
// what they launch is captured in the backward's order, and replayed with it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/transformer.h"

namespace tt {

// The leaves of the model that receive a gradient in a step at the model's precision: parameters, or in bf16 stages
// with compute copies, the copies (and the masters the forward also reads, such as a tied embedding).
// Found by one forward and backward on a tiny batch, so no stage's layout is assumed; gradients are reset.
std::vector<torch::Tensor> gradient_leaves(Transformer& model);

// Consecutive parameters: one transformer layer's ("layers.<i>." in `names`), or the run between layers.
struct ParameterRange {
  size_t begin = 0, end = 0;
  bool layer = false;
};
std::vector<ParameterRange> layer_ranges(const std::vector<std::string>& names);

class GradientReadyHooks {
 public:
  using Ready = std::function<void(size_t group)>;
  GradientReadyHooks() = default;
  GradientReadyHooks(const GradientReadyHooks&) = delete;
  GradientReadyHooks& operator=(const GradientReadyHooks&) = delete;
  ~GradientReadyHooks() { disarm(); }

  // Before a backward (after its forward): `ready(g)` will be called, on the thread running the backward, when
  // the last leaf of groups[g] that this backward reaches has its gradient. Leaves the forward did not use
  // (no gradient accumulator) and undefined ones are skipped; a group left with none is never called.
  void arm(const std::vector<std::vector<torch::Tensor>>& groups, Ready ready);
  // After the backward (or after one that threw): the hooks do nothing from now on.
  void disarm();
  bool armed() const { return state_ && state_->live; }
  // Whether this arming called ready(g).
  bool fired(size_t g) const { return state_ && g < state_->fired.size() && state_->fired[g]; }

 private:
  // One arming's, shared with its hooks: an accumulator that outlives the arming (or this object) keeps its
  // hook, which then finds live == false and does nothing.
  struct State {
    std::vector<int> pending;  // per group: leaves whose gradient has not arrived yet
    std::vector<bool> fired;
    Ready ready;
    bool live = true;
  };
  std::shared_ptr<State> state_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // this arming's hooked ones
};

}  // namespace tt
