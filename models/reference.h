// Plain LibTorch formulations of every op the stages swap out. v1 runs exactly these (the workshop's
// op-by-op baseline); the custom kernels and the tests compare against them.
#pragma once

#include <torch/torch.h>

namespace tt::reference {

// x * rsqrt(mean(x^2, -1) + eps) * weight, unfused (pow, mean, rsqrt, mul).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// cos and sin tables, fp32, shape [seq_len, head_dim / 2], for positions start_pos .. start_pos + seq_len - 1:
// angle(p, i) = p * theta^(-2i / head_dim).
std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double theta,
                                                    int64_t start_pos, const torch::Device& device);

// Rotates consecutive pairs (0,1), (2,3), ... of the last dim of x [B, S, H, D] by the table angles
// (cos/sin [S, D/2]); the rotation is computed in fp32 and returned in x's dtype.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// silu(gate) * up.
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// Mean cross-entropy over the rows of logits [N, V] whose label is not ignore_index.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, int64_t ignore_index);

// Causal attention with an explicit mask: q [B, Hq, S, D], k/v [B, Hkv, S, D]; K/V heads repeated with
// repeat_interleave to Hq, scores = q k^T / sqrt(D) masked above the diagonal, softmax, times v.
// q_offset > 0 means q holds the last S_q positions of a longer key sequence (KV-cache decoding).
torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t q_offset = 0);

constexpr int64_t kIgnoreIndex = -100;

}  // namespace tt::reference
