// The naive SwiGLU MLP op of the debugging exercise: gate/up projections and activation in our own kernel,
// one thread per output element (kernels/naive_swiglu.cuh), instead of a vendor GEMM plus tt::ops::swiglu.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// silu(x W_gate^T) * (x W_up^T) for x [..., H] and the fused weight [2F, H] (gate rows first, then up).
// Returns [..., F]. Differentiable in x and gate_up_weight. Both are cast to the autocast dtype under autocast,
// else the weight to x's dtype (an fp32 master weight with bf16 activations); each gradient arrives in its
// input's own dtype.
// On CPU tensors: the GEMM and tt::ops::swiglu, the formulation the kernel replaces.
torch::Tensor naive_swiglu(const torch::Tensor& x, const torch::Tensor& gate_up_weight);

}  // namespace tt::ops
