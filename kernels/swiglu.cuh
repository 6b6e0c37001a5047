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

}  // namespace tt::kernels
