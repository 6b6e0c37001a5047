// RMSNorm launchers: y = x * rsqrt(mean(x^2) + eps) * weight over the last dim of x [rows, hidden],
// optionally fused with the residual add before it (x = residual + delta).
// Plain pointers and sizes; inputs are checked by the op layer (kernels/ops/rms_norm.cpp).
//
// Two element types: the residual stream's, T (x, residual_out, grad_x, grad_residual), and the compute
// dtype, C (delta, y, grad_y, grad_delta). They are equal except in mixed precision, where the residual stream
// stays fp32 and the GEMMs around the norm read and write bf16 or fp16: there the norm reads the GEMM's
// output and writes its input directly, with no cast kernels between them. The kernels are built for those
// pairs only (equal types, or an fp32 residual with bf16 or fp16 compute); the op layer checks.
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

struct RmsNormForwardParams {
  const void* x;        // [rows, hidden], contiguous, T
  const void* delta;    // nullptr, or [rows, hidden], contiguous, C: the norm's input is x + delta
  void* residual_out;   // with delta: [rows, hidden], contiguous, T, receives x + delta; else nullptr
  const float* weight;  // [hidden]
  void* y;              // [rows, hidden], contiguous, C
  float* inv_rms;       // [rows]: rsqrt(mean(h^2) + eps) of the normalised input h, kept for the backward
  int64_t rows;
  int64_t hidden;
  float eps;
};

struct RmsNormBackwardParams {
  const void* grad_y;          // [rows, hidden], contiguous, C
  const void* x;               // [rows, hidden], contiguous, T: the normalised input (residual_out when fused)
  const void* grad_residual;   // nullptr, or [rows, hidden], contiguous, T: gradient of residual_out, added to grad_x
  const float* weight;         // [hidden]
  const float* inv_rms;        // [rows], from the forward
  void* grad_x;                // [rows, hidden], contiguous, T
  void* grad_delta;            // nullptr, or [rows, hidden], contiguous, C: grad_x again, in C (delta's gradient)
  float* weight_grad_partial;  // [num_partials, hidden] scratch, fp32; nullptr when num_partials is 0
  float* grad_weight;          // [hidden], fp32
  int64_t rows;
  int64_t hidden;
  int64_t num_partials;  // must be rms_norm_backward_num_partials(rows, compute)
};

LaunchStatus rms_norm_forward(const RmsNormForwardParams& params, DType residual, DType compute, void* stream);

// Rows of the scratch buffer the backward needs: 0 where the weight gradient is summed in the backward's own launch
// (up to kMaxOneLaunchRows rows with a 16-bit compute dtype, rms_norm.cu), else one per row block of its first
// kernel. It depends only on `rows` and `compute`. The weight gradient is bitwise reproducible run to run: with
// partial sums its summation order depends on `rows` alone; in one launch also on hidden, the pack width (the
// pointers' alignment) and the warp size, so it may differ between NVIDIA and AMD GPUs.
int64_t rms_norm_backward_num_partials(int64_t rows, DType compute);

// grad_x (and grad_delta), and grad_weight as a fixed-order sum over rows (no atomics): one kernel when
// num_partials is 0, else two (rms_norm.cu says when and why).
LaunchStatus rms_norm_backward(const RmsNormBackwardParams& params, DType residual, DType compute, void* stream);

}  // namespace tt::kernels
