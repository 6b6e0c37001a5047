// RMSNorm op layer: input checks, dispatch to the custom kernel on GPU tensors, real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight. x [..., H] (fp32, bf16 or fp16), weight [H]
// (any float dtype). Differentiable in x and weight. CPU tensors take the ATen formulation of the same
// forward and backward.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

}  // namespace tt::ops
