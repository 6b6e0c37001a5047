// The naive SwiGLU MLP kernel of the debugging exercise ("know when not to write a kernel"): the gate and
// up projections computed by our own kernel, one thread per output element, each thread running its two
// dot products over the hidden dimension, instead of one vendor-BLAS GEMM followed by the activation.
// Plain pointers and sizes; inputs are checked by the op layer (kernels/ops/naive_swiglu.cpp).
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

struct NaiveSwigluForwardParams {
  const void* x;       // [rows, hidden], contiguous, dtype
  const void* weight;  // [2 * ffn, hidden], contiguous, dtype: gate rows first, then up rows
  void* out;           // [rows, ffn], contiguous, dtype: silu(gate) * up
  void* gate_up;       // [rows, 2 * ffn], contiguous, dtype: the projections, kept for the backward
  int64_t rows;
  int64_t hidden;
  int64_t ffn;
};

// out = silu(x W_gate^T) * (x W_up^T), with the pre-activations stored in gate_up.
LaunchStatus naive_swiglu_forward(const NaiveSwigluForwardParams& params, DType dtype, void* stream);

// C [m, n] = A [m, k] B [k, n], element (i, j) of a matrix at i * stride_0 + j * stride_1; C contiguous.
// One thread per element of C, fp32 accumulation: the backward's two products (grad_x = grad_gate_up W,
// grad_W = grad_gate_up^T x), as naive as the forward.
struct NaiveMatmulParams {
  const void* a;
  const void* b;
  void* c;
  int64_t m, n, k;
  int64_t a_stride_0, a_stride_1;
  int64_t b_stride_0, b_stride_1;
};

LaunchStatus naive_matmul(const NaiveMatmulParams& params, DType dtype, void* stream);

}  // namespace tt::kernels
