// SwiGLU launchers: out = silu(gate) * up, where each row of gate_up [rows, 2F] holds gate in its first
// F columns and up in its last F (the fused gate/up GEMM's output).
// Plain pointers and sizes; inputs are checked by the op layer (kernels/ops/swiglu.cpp).
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

struct SwigluForwardParams {
  const void* gate_up;  // [rows, 2 * ffn], contiguous, dtype
  void* out;            // [rows, ffn], contiguous, dtype
  int64_t rows;
  int64_t ffn;
};

struct SwigluBackwardParams {
  const void* grad_out;  // [rows, ffn], contiguous, dtype
  const void* gate_up;   // [rows, 2 * ffn], contiguous, dtype
  void* grad_gate_up;    // [rows, 2 * ffn], contiguous, dtype
  int64_t rows;
  int64_t ffn;
};

LaunchStatus swiglu_forward(const SwigluForwardParams& params, DType dtype, void* stream);

// grad_gate = grad_out * up * sig(gate) * (1 + gate * (1 - sig(gate))), grad_up = grad_out * silu(gate).
LaunchStatus swiglu_backward(const SwigluBackwardParams& params, DType dtype, void* stream);

// The general strided path: gate_up read in place through any 2-D layout (element strides), one thread
// per output element, no vector accesses. What a kernel that "accepts any layout" costs when the layout
// is a transposed one: the debugging exercise's non-contiguous pitfall (tt::ops::swiglu_strided).
struct SwigluStridedParams {
  const void* gate_up;     // [rows, 2 * ffn], element (row, col) at row * row_stride + col * col_stride
  const void* grad_out;    // backward only: [rows, ffn], contiguous
  void* out;               // forward: [rows, ffn]; backward: grad_gate_up [rows, 2 * ffn]; contiguous
  int64_t rows;
  int64_t ffn;
  int64_t row_stride;
  int64_t col_stride;
};

LaunchStatus swiglu_strided_forward(const SwigluStridedParams& params, DType dtype, void* stream);
LaunchStatus swiglu_strided_backward(const SwigluStridedParams& params, DType dtype, void* stream);

}  // namespace tt::kernels
