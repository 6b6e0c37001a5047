#include "models/components.h"

#include <torch/csrc/profiler/stubs/base.h>

#include "kernels/ops/cross_entropy.h"
#include "kernels/ops/rms_norm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "models/reference.h"

namespace tt {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

// ---- RMSNorm ------------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, NormKind kind) : eps_(eps), kind_(kind) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  switch (kind_) {
    case NormKind::kReference: return reference::rms_norm(x, weight, eps_);
    case NormKind::kFused: return at::rms_norm(x, {weight.size(0)}, weight, eps_);
    case NormKind::kCustom: return ops::rms_norm(x, weight, eps_);
  }
  TORCH_CHECK(false, "unknown NormKind");
}

// ---- RoPE ---------------------------------------------------------------------------------------

RotaryImpl::RotaryImpl(const ModelConfig& config, RopeKind kind) : config_(config), kind_(kind) {
  if (kind_ != RopeKind::kReference) {
    auto [cos, sin] = reference::rope_tables(config.max_seq_len, config.head_dim(), config.rope_theta, 0, torch::kCPU);
    // Buffers, so that .to(device) moves them once; they are not parameters and not in checkpoints.
    cos_cache_ = register_buffer("cos_cache", cos);
    sin_cache_ = register_buffer("sin_cache", sin);
  }
}

std::pair<torch::Tensor, torch::Tensor> RotaryImpl::tables(int64_t seq_len, int64_t start_pos,
                                                           const torch::Device& device) {
  if (kind_ == RopeKind::kReference)
    return reference::rope_tables(seq_len, config_.head_dim(), config_.rope_theta, start_pos, device);
  TORCH_CHECK(start_pos + seq_len <= cos_cache_.size(0), "positions up to ", start_pos + seq_len,
              " exceed max_seq_len (", cos_cache_.size(0), ")");
  return {cos_cache_.narrow(0, start_pos, seq_len), sin_cache_.narrow(0, start_pos, seq_len)};
}

std::pair<torch::Tensor, torch::Tensor> RotaryImpl::forward(const torch::Tensor& q, const torch::Tensor& k,
                                                            int64_t start_pos) {
  auto [cos, sin] = tables(q.size(1), start_pos, q.device());
  if (kind_ == RopeKind::kCustom) return ops::rope(q, k, cos, sin);
  return {reference::apply_rope(q, cos, sin), reference::apply_rope(k, cos, sin)};
}

// ---- Attention ----------------------------------------------------------------------------------

AttentionImpl::AttentionImpl(const ModelConfig& c, const StageSpec& spec)
    : n_heads_(c.n_heads), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim()), kind_(spec.attention) {
  const int64_t kv_dim = c.n_kv_heads * c.head_dim();
  if (spec.fused_qkv) {
    qkv_proj = register_module("qkv_proj", linear(c.hidden_dim, c.hidden_dim + 2 * kv_dim));
  } else {
    q_proj = register_module("q_proj", linear(c.hidden_dim, c.hidden_dim));
    k_proj = register_module("k_proj", linear(c.hidden_dim, kv_dim));
    v_proj = register_module("v_proj", linear(c.hidden_dim, kv_dim));
  }
  o_proj = register_module("o_proj", linear(c.hidden_dim, c.hidden_dim));
}

torch::Tensor AttentionImpl::attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t q_offset) {
  // Decoding with a cache (q_offset > 0) takes the plain formulation in every stage: its shapes change with
  // every new token, and in bf16 SDPA picks cuDNN, which builds a new execution graph for each new key
  // length. Workshop model, bf16, H200: 120 greedy tokens took 7.4 s through SDPA, 1.2 s this way. A few
  // query rows make the plain matmul/softmax/matmul cheap. The mask is aligned to the bottom-right
  // corner: query i sees keys up to q_offset + i.
  if (kind_ == AttentionKind::kMaskedMatmul || q_offset > 0) return reference::masked_attention(q, k, v, q_offset);
  // On Hopper, fp32 with grouped heads makes SDPA fall back to its math path (flash and memory-efficient
  // kernels refuse enable_gqa in fp32). Repeating K/V to all heads costs one copy of each but keeps the
  // memory-efficient kernel: at the workshop shapes on an H200, forward + backward 221 us against 849 us
  // with enable_gqa (kernel_bench, sdpa_gqa). In bf16, native GQA (cuDNN) is the faster of the two
  // (118 us against 160 us at the medium shapes), so bf16 keeps it.
  if (q.scalar_type() == torch::kFloat32 && n_heads_ != n_kv_heads_ && q.is_cuda()) {
    const int64_t n_rep = n_heads_ / n_kv_heads_;
    return at::scaled_dot_product_attention(q, k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1), {}, 0.0,
                                            /*is_causal=*/true);
  }
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                          /*enable_gqa=*/n_heads_ != n_kv_heads_);
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, Rotary& rotary, KVCache* cache) {
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t kv_dim = n_kv_heads_ * head_dim_;
  torch::Tensor q, k, v;
  if (qkv_proj) {
    auto qkv = qkv_proj->forward(x);
    q = qkv.narrow(-1, 0, n_heads_ * head_dim_);
    k = qkv.narrow(-1, n_heads_ * head_dim_, kv_dim);
    v = qkv.narrow(-1, n_heads_ * head_dim_ + kv_dim, kv_dim);
  } else {
    q = q_proj->forward(x);
    k = k_proj->forward(x);
    v = v_proj->forward(x);
  }
  q = q.view({batch, seq, n_heads_, head_dim_});
  k = k.view({batch, seq, n_kv_heads_, head_dim_});
  v = v.view({batch, seq, n_kv_heads_, head_dim_});
  const int64_t start = cache ? cache->length : 0;
  std::tie(q, k) = rotary->forward(q, k, start);
  q = q.transpose(1, 2);  // [B, H, S, D]
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  if (cache) {
    TORCH_CHECK(cache->keys.defined(), "KVCache must be allocated (make_caches) before use");
    TORCH_CHECK(start + seq <= cache->keys.size(2), "KVCache holds ", cache->keys.size(2), " positions; ", start,
                " are filled and ", seq, " more do not fit (make_caches' max_len is too small)");
    cache->keys.narrow(2, start, seq).copy_(k);
    cache->values.narrow(2, start, seq).copy_(v);
    cache->length = start + seq;
    k = cache->keys.narrow(2, 0, cache->length);
    v = cache->values.narrow(2, 0, cache->length);
  }
  auto out = attend(q, k, v, start);
  out = out.transpose(1, 2).reshape({batch, seq, n_heads_ * head_dim_});
  return o_proj->forward(out);
}

// ---- MLP ----------------------------------------------------------------------------------------

MLPImpl::MLPImpl(const ModelConfig& c, const StageSpec& spec)
    : intermediate_dim_(c.intermediate_dim), activation_(spec.activation) {
  TORCH_CHECK(spec.activation != ActivationKind::kCustom || spec.fused_gate_up,
              "stage ", spec.name, ": the custom SwiGLU kernel works on the fused gate/up GEMM output");
  if (spec.fused_gate_up) {
    gate_up_proj = register_module("gate_up_proj", linear(c.hidden_dim, 2 * c.intermediate_dim));
  } else {
    gate_proj = register_module("gate_proj", linear(c.hidden_dim, c.intermediate_dim));
    up_proj = register_module("up_proj", linear(c.hidden_dim, c.intermediate_dim));
  }
  down_proj = register_module("down_proj", linear(c.intermediate_dim, c.hidden_dim));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  torch::Tensor hidden;
  if (gate_up_proj) {
    auto gate_up = gate_up_proj->forward(x);
    hidden = activation_ == ActivationKind::kCustom
                 ? ops::swiglu(gate_up)
                 : reference::swiglu(gate_up.narrow(-1, 0, intermediate_dim_),
                                     gate_up.narrow(-1, intermediate_dim_, intermediate_dim_));
  } else {
    hidden = reference::swiglu(gate_proj->forward(x), up_proj->forward(x));
  }
  return down_proj->forward(hidden);
}

// ---- Block --------------------------------------------------------------------------------------

BlockImpl::BlockImpl(const ModelConfig& c, const StageSpec& spec) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_dim, c.norm_eps, spec.norm));
  self_attn = register_module("self_attn", Attention(c, spec));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_dim, c.norm_eps, spec.norm));
  mlp = register_module("mlp", MLP(c, spec));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, Rotary& rotary, KVCache* cache) {
  auto h = x + self_attn->forward(input_layernorm->forward(x), rotary, cache);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

// ---- Profiler ranges ----------------------------------------------------------------------------

ScopedRange::ScopedRange(const char* name)
    : active_(torch::profiler::impl::cudaStubs()->enabled()), record_(at::RecordScope::USER_SCOPE) {
  if (active_) torch::profiler::impl::cudaStubs()->rangePush(name);
  if (record_.isActive()) record_.before(std::string_view(name));
}

ScopedRange::~ScopedRange() {
  if (active_) torch::profiler::impl::cudaStubs()->rangePop();
}

}  // namespace tt
