// RoPE op layer: input checks, dispatch to the custom kernel on GPU tensors, real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// Rotates consecutive pairs (0,1), (2,3), ... of the last dim of q [B, S, Hq, D] and k [B, S, Hkv, D] by
// the angles whose cos/sin tables (fp32, [S, D/2]) are given, the workshop's convention. Differentiable
// in q and k.
std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& q, const torch::Tensor& k,
                                             const torch::Tensor& cos, const torch::Tensor& sin);

struct RotatedQkv {
  torch::Tensor q;  // [B, S, Hq, D], rotated
  torch::Tensor k;  // [B, S, Hkv, D], rotated
  torch::Tensor v;  // [B, S, Hkv, D], a view into qkv
};

// The same rotation read straight from a fused QKV projection's output viewed as
// qkv [B, S, Hq + 2 Hkv, D]: q is heads [0, Hq), k the next Hkv, v the last Hkv. The forward is one launch
// (v is not touched); the backward writes the gradient of qkv, [dq | dk | dv], in one launch. Splitting
// qkv and calling rope() costs a concatenation of the three gradients on top of the rotation.
RotatedQkv rope_qkv(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads, const torch::Tensor& cos,
                    const torch::Tensor& sin);

}  // namespace tt::ops
