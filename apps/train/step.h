// The step seam: how one training step runs is a StepRunner's business alone. The loop (loop.h) hands it a
// batch already in fixed device buffers and gets the loss back as a device scalar; it never learns whether
// the step ran op by op, as one captured graph, or across several GPUs.
#pragma once

#include <torch/torch.h>

#include "apps/train/device.h"
#include "apps/train/optimizer.h"
#include "models/config.h"
#include "models/transformer.h"

namespace tt {

// The points a runner may mark inside a step, in order. kStart and kEnd are always marked; a runner that
// cannot separate the phases (a replayed graph) marks only those two.
enum StepMark : size_t { kStepStart, kAfterForward, kAfterBackward, kStepEnd, kStepMarks };

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // One optimisation step on inputs/labels [B, S] (device buffers). Returns the loss as a device scalar
  // without a host sync. With a timer, marks kStepStart and kStepEnd, and the phase marks it can.
  virtual torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) = 0;
  // Whether step() marks kAfterForward and kAfterBackward.
  virtual bool times_phases() const = 0;
  // How the step runs, for result files: "eager", ...
  virtual const char* describe() const = 0;
  // Whether the step is captured as a graph during the warm-up (which then needs kGraphWarmupSteps steps).
  virtual bool captures_graph() const { return false; }
};

// What a step runner adds to the eager step's one accumulation loop without changing its arithmetic: data
// parallel's gradient synchronisation (apps/train/data_parallel_step.h). The defaults do nothing.
class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // Before a micro-batch's forward, with its token ids; `last`: the micro-batch whose backward carries the
  // step's gradients (the last of k; the only one with k = 1).
  virtual void before_forward(const torch::Tensor& /*inputs*/, bool /*last*/) {}
  // Before that micro-batch's backward, with its (scaled) loss.
  virtual void before_backward(const torch::Tensor& /*loss*/, bool /*last*/) {}
  // After it: the current stream must see the synchronised gradients from here on.
  virtual void after_backward(bool /*last*/) {}
  // The step's loss as the runner reports it, from this process's sum of micro-batch losses (after the
  // optimizer): itself, or its mean over ranks.
  virtual torch::Tensor reported_loss(const torch::Tensor& total) { return total; }
};

// The step op by op, as LibTorch's autograd runs it: forward (bf16 autocast under Precision::kBf16),
// backward, optimizer (which clips the gradients when configured to, and may have started its update during
// the last backward: Optimizer::before_last_backward), gradients reset to none.
// With gradient accumulation (accum_steps k > 1) the batch holds k micro-batches of rows in order; each
// runs forward and backward with its loss scaled by 1/k, the gradients add up on the parameters, and one
// optimizer step follows: the step of one batch of all k micro-batches' rows, at the memory of one.
class EagerStep final : public StepRunner {
 public:
  // `hooks` (not owned, may be null) must outlive the step.
  EagerStep(Transformer model, Optimizer& optimizer, int64_t accum_steps = 1, StepHooks* hooks = nullptr);
  // inputs/labels [k * B, S]; returns the mean of the micro-batches' losses (the whole batch's loss).
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) override;
  // Forward and backward phases interleave across micro-batches, so only k = 1 times them apart.
  bool times_phases() const override { return accum_steps_ == 1; }
  const char* describe() const override { return to_string(StepKind::kEager); }

  // Forward and backward only; gradients stay on the parameters (for the equivalence harness).
  torch::Tensor forward_backward(const torch::Tensor& inputs, const torch::Tensor& labels);

 private:
  torch::Tensor forward(const torch::Tensor& inputs, const torch::Tensor& labels);
  void backward(const torch::Tensor& loss);
  void optimize();
  static StepHooks& no_hooks();

  Transformer model_;
  Optimizer& optimizer_;
  int64_t accum_steps_;
  StepHooks* hooks_;  // never null: the do-nothing hooks when none were given
  // d(loss)/d(loss) = 1, the backward's seed, made once and kept: loss.backward() would make a new one in
  // every backward, a fill kernel in every replay of v4's graph.
  torch::Tensor seed_;
};

// Rows [i * B, (i + 1) * B) of a batch of k micro-batches of B rows (a view: no copy, and under a graph
// the same addresses at every replay). Throws when the rows are not k equal micro-batches.
torch::Tensor micro_batch(const torch::Tensor& batch, int64_t i, int64_t k);

}  // namespace tt
