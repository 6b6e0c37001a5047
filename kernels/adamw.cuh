// Multi-tensor AdamW launchers: one optimizer step over every parameter of the model in a few launches,
// through lists of plain pointers passed as kernel arguments (no pointer table in device memory, so eager
// steps with freshly allocated gradients and replayed graphs take the same path). Inputs are checked by
// the op layer (kernels/ops/adamw.cpp).
#pragma once

#include <cstdint>

#include "lr_schedule.h"
#include "vendor.cuh"

namespace tt::kernels {

// One parameter. Its gradient is the sum of the gradients that are present: `grad`, the fp32 gradient of
// the master itself, and `copy_grad`, the gradient of its low-precision compute copy (the weight the
// forward read, in `copy_dtype`). At least one is present.
struct AdamWTensor {
  float* param;        // fp32 master weights
  const float* grad;   // or nullptr
  const void* copy_grad;  // copy_dtype, or nullptr
  float* exp_avg;
  float* exp_avg_sq;
  void* copy;          // refreshed with the updated master, rounded to copy_dtype; or nullptr
  int64_t numel;
};

// The most tensors one launch takes: 48 * 56 bytes of tensors plus their block offsets stay under the
// 4 KB of kernel arguments that every CUDA and HIP version accepts. Longer lists take several launches.
constexpr int kAdamWTensorsPerLaunch = 48;

// Elements one block updates: 512 threads x 4 elements x 8 rounds. Large enough that block scheduling
// costs nothing, small enough that the workshop model's ~31M parameters spread over ~1900 blocks.
constexpr int64_t kAdamWChunk = 16384;

struct AdamWTensorList {
  AdamWTensor tensors[kAdamWTensorsPerLaunch];
  int64_t first_block[kAdamWTensorsPerLaunch + 1];  // blocks of tensor i: [first_block[i], first_block[i + 1])
  int count;
};

// State that lives on the device, so that a replayed graph advances it: the step counter and the scalars
// every block needs, computed once per step by the prepare kernel. The learning rate is one of them: the
// prepare kernel evaluates the schedule at the new step, so the same graph replays a changing rate.
struct AdamWDeviceState {
  float step;          // steps taken, after this one's prepare (exact up to 2^24 steps)
  float clip_scale;    // min(1, max_norm / (norm + 1e-6)), or 1 without clipping
  float step_size;     // lr / (1 - beta1^step)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float grad_norm;     // the global gradient norm when clipping computed it, 0 otherwise
  float lr;            // this step's learning rate, lr_at(schedule, step)
  float decay;         // 1 - lr * weight_decay
};

// Doubles, as LibTorch's optimizers take them; the update rounds the derived constants to fp32 once.
struct AdamWHyper {
  LrSchedule schedule;  // its peak_lr is the learning rate of the constant schedule
  double beta1, beta2, eps, weight_decay;
  double max_grad_norm;  // 0: no clipping
};

// Blocks the squared-norm pass of `lists` writes partial sums for (one per chunk, all lists together).
int64_t adamw_norm_partials(const AdamWTensorList* lists, int num_lists);

// One step: with clipping, the squared-norm partials of every gradient (into `partials`, one per block)
// and their fixed-order sum; the prepare kernel (step counter, bias corrections, clip scale); then the
// update of every list, which also writes the compute copies. Deterministic: no atomics anywhere.
LaunchStatus adamw_step(const AdamWTensorList* lists, int num_lists, const AdamWHyper& hyper,
                        AdamWDeviceState* state, float* partials, DType copy_dtype, void* stream);

}  // namespace tt::kernels
