#include "models/reference.h"

#include <cmath>

namespace tt::reference {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto variance = x.pow(2).mean(-1, /*keepdim=*/true);
  return x * torch::rsqrt(variance + eps) * weight;
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double theta,
                                                    int64_t start_pos, const torch::Device& device) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  // Exponents in float64 so tables match across devices to the last fp32 bit.
  auto exponents = torch::arange(0, head_dim, 2, f32.dtype(torch::kFloat64)) / static_cast<double>(head_dim);
  auto inv_freq = torch::pow(theta, -exponents);
  auto positions = torch::arange(start_pos, start_pos + seq_len, f32.dtype(torch::kFloat64));
  auto angles = torch::outer(positions, inv_freq);
  return {torch::cos(angles).to(torch::kFloat32), torch::sin(angles).to(torch::kFloat32)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto sizes = x.sizes().vec();
  auto pairs = x.to(torch::kFloat32).unflatten(-1, {-1, 2});  // [B, S, H, D/2, 2]
  auto x0 = pairs.select(-1, 0);
  auto x1 = pairs.select(-1, 1);
  auto c = cos.unsqueeze(1);  // [S, 1, D/2], broadcast over heads
  auto s = sin.unsqueeze(1);
  auto rotated = torch::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1);
  return rotated.flatten(-2).to(x.scalar_type());
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) { return torch::silu(gate) * up; }

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, int64_t ignore_index) {
  return torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index));
}

torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t q_offset) {
  const int64_t n_rep = q.size(1) / k.size(1);
  auto keys = n_rep == 1 ? k : k.repeat_interleave(n_rep, 1);
  auto values = n_rep == 1 ? v : v.repeat_interleave(n_rep, 1);
  const int64_t s_q = q.size(2);
  const int64_t s_k = keys.size(2);
  auto scores = torch::matmul(q, keys.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  auto mask = torch::ones({s_q, s_k}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                  .triu(1 + q_offset);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores, -1);
  return torch::matmul(probs.to(values.scalar_type()), values);
}

}  // namespace tt::reference
