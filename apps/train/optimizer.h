// AdamW behind one interface, so a stage chooses LibTorch's per-parameter loop, LibTorch's fused
// multi-tensor kernel or our own (tt::ops::adamw_step). Clipping the global gradient norm is part of the
// step. State (first/second moments, step count) is exposed per parameter for checkpoints.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "kernels/lr_schedule.h"
#include "models/config.h"
#include "models/stage.h"
#include "models/transformer.h"

namespace tt {

// The run's schedule: training.lr_schedule over every optimizer step (warmup_steps + num_steps), peaking at
// training.learning_rate.
LrSchedule lr_schedule_of(const TrainConfig& training);

struct AdamWOptions {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double max_grad_norm = 0.0;  // 0: no clipping
  LrSchedule schedule;         // its peak_lr is lr; the default is lr at every step
  // Our AdamW only: update each transformer layer's parameters during the backward, as soon as their
  // gradients are final (see OverlappedUpdate in optimizer.cpp). Bitwise the same arithmetic either way.
  bool overlap = false;
  // Our AdamW only: the moments' dtype, kFloat32 or kBFloat16; the other kinds keep fp32 moments.
  torch::Dtype state_dtype = torch::kFloat32;
  static AdamWOptions from(const TrainConfig& t) {
    return {t.learning_rate,
            t.beta1,
            t.beta2,
            t.adam_eps,
            t.weight_decay,
            t.grad_clip,
            lr_schedule_of(t),
            t.optimizer_overlap,
            t.optimizer_state_dtype == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat32};
  }
  // The learning rate of optimizer step `step` (1-based).
  double lr_at_step(int64_t step) const {
    LrSchedule s = schedule;
    s.peak_lr = lr;
    return lr_at(s, static_cast<double>(step));
  }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Gradients become undefined: no kernel per parameter, and the next backward writes fresh ones.
  virtual void zero_grad() = 0;
  // Clips the gradients when max_grad_norm > 0 (without a host sync), then updates every parameter with
  // the schedule's learning rate for this step (the step count + 1 before the call).
  virtual void step() = 0;
  // Called after the forward whose backward gives this step's gradients (the last micro-batch's), before
  // that backward. An optimizer that overlaps its update with the backward starts it from there, and step()
  // finishes it. The default does nothing: the whole update waits for step().
  virtual void before_last_backward() {}
  // Whether the step's own kernels should outrank this optimizer's: one that runs kernels on a second stream
  // beside the backward asks for the step's stream at high priority (a graph keeps each kernel's priority), so
  // that its kernels take SMs the backward leaves free instead of holding back the backward's next kernel.
  virtual bool wants_high_priority_step() const { return false; }
  // Whether this optimizer updates layers during the backward (before_last_backward). Data parallel then tells it
  // how to wait for a layer's averaged gradients (wait_for_averaging).
  virtual bool overlaps_backward() const { return false; }
  // Data parallel with an overlapping optimizer: `wait(leaves)` is called on the stream that will read the leaves'
  // gradients (on the CPU, on the host), once the backward has made them final and before anything reads them,
  // and makes that stream (or the host) wait until they are averaged over the ranks. An empty `wait` takes it back
  // (the data-parallel step's destructor: the optimizer outlives it).
  using AveragingWait = std::function<void(const std::vector<torch::Tensor>& leaves)>;
  virtual void wait_for_averaging(AveragingWait /*wait*/) {
    TORCH_CHECK(false, "this optimizer updates after the backward: it reads gradients only once they are averaged");
  }
  // Moments of parameter i (shaped like it; undefined before the first step) and the step count.
  virtual torch::Tensor exp_avg(size_t i) const = 0;
  virtual torch::Tensor exp_avg_sq(size_t i) const = 0;
  virtual int64_t step_count() const = 0;
  virtual void load_state(const std::vector<torch::Tensor>& exp_avg, const std::vector<torch::Tensor>& exp_avg_sq,
                          int64_t step) = 0;
  // Whether the state is split across data-parallel ranks (ZeRO-1: apps/train/sharded_adamw.h). Then exp_avg and
  // exp_avg_sq gather the slices (collectives: every rank calls them, in the same order), load_state keeps this
  // rank's slices, and the model's fp32 masters outside this rank's slices are stale until gather_weights().
  virtual bool sharded() const { return false; }
  // The model's master weights whole on every rank: a collective for a sharded optimizer, nothing otherwise.
  virtual void gather_weights() {}
  // Bytes of moments this process holds (m and v; a sharded optimizer's slices only).
  virtual int64_t state_bytes() const;
  const std::vector<torch::Tensor>& parameters() const { return params_; }

 protected:
  explicit Optimizer(std::vector<torch::Tensor> params) : params_(std::move(params)) {}
  std::vector<torch::Tensor> params_;
};

// The optimizer of `kind` over the model's parameters. The model's compute copies, if it has any, need
// kOurAdamW (the only one that writes them); other kinds throw.
std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, const Transformer& model, const AdamWOptions& options);

// Builds a trainer's optimizer over its model (Trainer's constructor; data parallel passes the sharded one).
using OptimizerMaker = std::function<std::unique_ptr<Optimizer>(const Transformer&, const AdamWOptions&)>;

// Scales all gradients so that their global L2 norm is at most max_norm, without a host sync.
void clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);
// clip_grad_norm's factor for a global L2 norm `norm` (a 0-dim fp32 tensor): min(1, max_norm / (norm + 1e-6)).
torch::Tensor clip_factor(const torch::Tensor& norm, double max_norm);

}  // namespace tt
