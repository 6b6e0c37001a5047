// Multi-tensor AdamW op: one optimizer step over a list of parameters, on the GPU with our kernel
// (kernels/adamw.cu), on the CPU with the ATen formulation of the same arithmetic. Not an autograd
// Function: an optimizer step has no backward.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "kernels/lr_schedule.h"

namespace tt::ops {

struct AdamWHyperparameters {
  double lr = 3e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double max_grad_norm = 0.0;  // clip the global gradient norm to this; 0: no clipping
  // The rate of step t is lr_at(schedule, t) with schedule.peak_lr = lr (the field above wins); the default,
  // constant without warm-up, is lr at every step.
  LrSchedule schedule;
  LrSchedule lr_schedule() const {
    LrSchedule s = schedule;
    s.peak_lr = lr;
    return s;
  }
};

// One parameter. Its gradient is grad + copy_grad, over whichever of the two are defined (a tied weight
// gets one from each use); at least one must be.
struct AdamWParam {
  torch::Tensor master;      // fp32, contiguous; updated in place
  torch::Tensor grad;        // fp32, shaped like master; or undefined
  torch::Tensor copy;        // bf16 or fp16 compute copy, shaped like master; rewritten from the update; or undefined
  torch::Tensor copy_grad;   // shaped and typed like copy; or undefined
  torch::Tensor exp_avg;     // fp32 or bf16 (every parameter's the same), shaped like master
  torch::Tensor exp_avg_sq;  // typed like exp_avg, shaped like master
};

// Elements of the state tensor adamw_step keeps on the masters' device (fp32).
constexpr int64_t kAdamWStateSize = 7;
enum AdamWStateField : int64_t {
  kAdamWStep,
  kAdamWClipScale,
  kAdamWStepSize,
  kAdamWBiasCorrection2Sqrt,
  kAdamWGradNorm,
  kAdamWLr,     // the learning rate of the last step
  kAdamWDecay,  // 1 - lr * weight_decay of the last step
};
// A fresh state: step 0.
torch::Tensor adamw_state(const torch::Device& device);

// Advances state's step counter and updates every parameter:
//   g = (grad + copy_grad) * clip,  clip = min(1, max_grad_norm / (||all g|| + 1e-6)) when clipping
//   lr = lr_at(hyper.lr_schedule(), step), evaluated where the step counter lives (on the device for GPU state)
//   master *= 1 - lr * weight_decay;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   master -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps);  copy = round(master)
// in fp32; bf16 moments are read as stored and the new ones rounded to nearest where they are stored.
// All on the device, no host sync: a captured graph replays it as it is.
void adamw_step(const std::vector<AdamWParam>& params, const torch::Tensor& state, const AdamWHyperparameters& hyper);

// ---- The same step in three passes --------------------------------------------------------------------
// adamw_step is: with clipping, adamw_norm over all parameters; adamw_prepare; adamw_update over all
// parameters. An optimizer that updates parameters while the backward still runs (apps/train/optimizer.cpp)
// calls the norm and update passes on ranges [begin, end) of the same list as their gradients become final,
// on the stream it chooses; the result is bitwise adamw_step's, whatever the ranges.

// A fresh buffer for the norm pass's partial sums of `params`, on the state's device: one per chunk of the
// GPU kernel, one per parameter on the CPU.
torch::Tensor adamw_partials(const std::vector<AdamWParam>& params, const torch::Tensor& state);
// The squared-gradient partial sums of params[begin, end), written where one pass over all params writes them.
void adamw_norm(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& partials);
// Advances the step counter and sets this step's scalars in state; with clipping, the global norm and clip
// factor from every partial sum (in a fixed order), which must all have been written.
void adamw_prepare(const torch::Tensor& partials, const torch::Tensor& state, const AdamWHyperparameters& hyper);
// Updates params[begin, end) (and their copies) with the scalars adamw_prepare left in state. On the GPU,
// max_blocks > 0 caps the update kernel's grid (kernels/adamw.cuh); 0 launches one block per chunk.
void adamw_update(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& state,
                  const AdamWHyperparameters& hyper, int64_t max_blocks = 0);

}  // namespace tt::ops
