// RMSNorm launchers: y = x * rsqrt(mean(x^2) + eps) * weight over the last dim of x [rows, hidden].
// Plain pointers and sizes; inputs are checked by the op layer (kernels/ops/rms_norm.cpp).
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

struct RmsNormForwardParams {
  const void* x;        // [rows, hidden], contiguous, dtype
  const float* weight;  // [hidden]
  void* y;              // [rows, hidden], contiguous, dtype
  float* inv_rms;       // [rows]: rsqrt(mean(x^2) + eps), kept for the backward
  int64_t rows;
  int64_t hidden;
  float eps;
};

struct RmsNormBackwardParams {
  const void* grad_y;          // [rows, hidden], contiguous, dtype
  const void* x;               // [rows, hidden], contiguous, dtype
  const float* weight;         // [hidden]
  const float* inv_rms;        // [rows], from the forward
  void* grad_x;                // [rows, hidden], contiguous, dtype
  float* weight_grad_partial;  // [num_partials, hidden] scratch, fp32
  float* grad_weight;          // [hidden], fp32
  int64_t rows;
  int64_t hidden;
  int64_t num_partials;  // must be rms_norm_backward_num_partials(rows)
};

LaunchStatus rms_norm_forward(const RmsNormForwardParams& params, DType dtype, void* stream);

// Rows of the scratch buffer the backward needs: one per block of its first kernel. It depends only on
// `rows` (not on the GPU), so the weight gradient is bitwise reproducible across runs and devices.
int64_t rms_norm_backward_num_partials(int64_t rows);

// grad_x, and grad_weight as the fixed-order sum over rows (no atomics): two kernels.
LaunchStatus rms_norm_backward(const RmsNormBackwardParams& params, DType dtype, void* stream);

}  // namespace tt::kernels
