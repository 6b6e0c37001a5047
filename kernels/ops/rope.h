// RoPE op layer: input checks, dispatch to the custom kernel on GPU tensors, real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// Rotates consecutive pairs (0,1), (2,3), ... of the last dim of q [B, S, Hq, D] and k [B, S, Hkv, D] by
// the angles whose cos/sin tables (fp32, [S, D/2]) are given, the workshop's convention. Differentiable
// in q and k.
std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace tt::ops
