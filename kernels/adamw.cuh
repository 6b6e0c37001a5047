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
  void* exp_avg;       // the moments, in the launch's state dtype (fp32 or bf16)
  void* exp_avg_sq;
  void* copy;          // refreshed with the updated master, rounded to copy_dtype; or nullptr
  int64_t numel;
};

// The most tensors one launch takes; longer lists take several launches. HIP: 48 * 56 bytes of tensors plus
// their block offsets stay under the 4 KB of kernel arguments that every HIP version accepts. CUDA accepts
// 32,764 bytes since 12.1 (on Volta and newer; we build for sm_80 and up): 128 tensors take 8.2 KB, so that the
// workshop's 50 parameters and medium's 98 go in one launch (they took two and three of 48).
// Both sides must agree on the list's layout: hipcc defines __HIP__ for the kernels, and CMake defines
// TT_BACKEND_HIP for everything that links the kernels in a HIP build (tt_kernels' public definitions).
#if defined(__HIP__) || defined(TT_BACKEND_HIP)
constexpr int kAdamWTensorsPerLaunch = 48;
#else
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__ < 1201)
#error "kernels/adamw.cuh: 128 tensors per launch need CUDA 12.1 or later (kernel arguments over 4 KB)"
#endif
constexpr int kAdamWTensorsPerLaunch = 128;
#endif

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

// A step is three passes, launched separately so that an optimizer can run them for groups of parameters as
// their gradients become final (apps/train/optimizer.cpp); each is bitwise the same arithmetic whether the
// parameters go in one call or in several. Deterministic: no atomics anywhere.
//
// 1. With clipping: the squared-norm partial sums of every chunk of `lists`, written to partials[0, ...) in
//    list order (one per block: one per chunk). A caller splitting the parameters offsets
//    `partials` by the chunks of the parameters before them, so the partials land where one call puts them.
LaunchStatus adamw_norm(const AdamWTensorList* lists, int num_lists, float* partials, DType copy_dtype, void* stream);
// 2. One block: the step counter, this step's rate and bias corrections, and with clipping the global norm
//    from all num_partials partials (summed in a fixed order) and the clip factor.
LaunchStatus adamw_prepare(const float* partials, int64_t num_partials, const AdamWHyper& hyper,
                           AdamWDeviceState* state, void* stream);
// 3. The update of every parameter of `lists`, which also writes the compute copies, with the scalars the
//    prepare pass left in `state`. max_blocks > 0 caps the grid (each block then walks several chunks): a
//    smaller grid leaves room on the GPU for kernels running beside it.
//    The moments are read and written in state_dtype: kFloat32, or kBFloat16 (the update computes in fp32 and
//    rounds the new moments to nearest when it stores them).
LaunchStatus adamw_update(const AdamWTensorList* lists, int num_lists, const AdamWHyper& hyper,
                          const AdamWDeviceState* state, DType copy_dtype, DType state_dtype, int64_t max_blocks,
                          void* stream);

}  // namespace tt::kernels
