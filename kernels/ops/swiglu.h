// SwiGLU activation op layer: input checks, dispatch to the custom kernel on GPU tensors, real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// silu(gate) * up, where gate_up [..., 2F] is the fused gate/up GEMM output: gate = [..., :F],
// up = [..., F:]. Returns [..., F]. Differentiable in gate_up.
torch::Tensor swiglu(const torch::Tensor& gate_up);

// The same function through the kernels' general strided path: gate_up is read in place in whatever
// layout it has (no .contiguous() copy), one thread per element. Slower than swiglu() on a transposed
// input, which it exists to show (the debugging exercise's non-contiguous pitfall); same results.
torch::Tensor swiglu_strided(const torch::Tensor& gate_up);

}  // namespace tt::ops
