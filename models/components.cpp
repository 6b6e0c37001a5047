#include "models/components.h"

#include <ATen/autocast_mode.h>

#include "kernels/ops/flash_attention.h"

#include "kernels/ops/naive_swiglu.h"
#include "models/reference.h"

namespace tt {
// ---- Projection ---------------------------------------------------------------------------------

ProjectionImpl::ProjectionImpl(int64_t in_features, int64_t out_features) {
  // torch::nn::Linear's own initialisation, for a layer used on its own; the model overwrites it
  // (TransformerImpl::init_weights).
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
}

namespace {
// The gathered cast in the graph where autocast's cast of the weight would be: the forward returns the cast (the
// same bf16 values autocast's cast of the whole, updated weight gives), and the backward hands the weight the
// gradient converted to the weight's dtype, as the cast's backward does.
struct GatheredCast : public torch::autograd::Function<GatheredCast> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& weight,
                               const torch::Tensor& cast) {
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return cast.view_as(cast);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grads[0].to(dtype), torch::Tensor()};
  }
};
}  // namespace

torch::Tensor ProjectionImpl::forward_weight() const {
  if (compute_weight.defined()) return compute_weight;
  if (gathered_cast.defined()) {
    const auto device = weight.device().type();
    TORCH_CHECK(at::autocast::is_autocast_enabled(device) &&
                    at::autocast::get_autocast_dtype(device) == gathered_cast.scalar_type(),
                "a projection with a sharded optimizer's gathered ", gathered_cast.scalar_type(),
                " cast runs only under autocast to that dtype (its fp32 weight may be stale outside this rank's "
                "slices until the optimizer's gather_weights())");
    return GatheredCast::apply(weight, gathered_cast);
  }
  return weight;
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(x, forward_weight());
}

// ---- RMSNorm ------------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, NormKind kind) : eps_(eps), kind_(kind) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return forward(x, torch::Tensor()).normalized; }

ResidualNorm RMSNormImpl::forward(const torch::Tensor& residual, const torch::Tensor& delta) {
  return implementation(kind_).fn(residual, delta, weight, eps_);
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
  return implementation(kind_).fn(q, k, cos, sin);
}

ops::RotatedQkv RotaryImpl::forward_qkv(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads,
                                        int64_t start_pos) {
  auto [cos, sin] = tables(qkv.size(1), start_pos, qkv.device());
  return implementation(kind_).on_qkv(qkv, n_heads, n_kv_heads, cos, sin);
}

// ---- Attention ----------------------------------------------------------------------------------

AttentionImpl::AttentionImpl(const ModelConfig& c, const StageSpec& spec)
    : n_heads_(c.n_heads),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim()),
      kind_(spec.attention),
      rope_kind_(spec.rope) {
  TORCH_CHECK(spec.rope != RopeKind::kInOurAttention || spec.fused_qkv, "stage ", spec.name,
              ": RoPE inside our attention needs the fused QKV projection");
  const int64_t kv_dim = c.n_kv_heads * c.head_dim();
  if (spec.fused_qkv) {
    qkv_proj = register_module("qkv_proj", Projection(c.hidden_dim, c.hidden_dim + 2 * kv_dim));
  } else {
    q_proj = register_module("q_proj", Projection(c.hidden_dim, c.hidden_dim));
    k_proj = register_module("k_proj", Projection(c.hidden_dim, kv_dim));
    v_proj = register_module("v_proj", Projection(c.hidden_dim, kv_dim));
  }
  o_proj = register_module("o_proj", Projection(c.hidden_dim, c.hidden_dim));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, Rotary& rotary, KVCache* cache) {
  const int64_t batch = x.size(0), seq = x.size(1);
  const int64_t start = cache ? cache->length : 0;
  torch::Tensor q, k, v;
  if (qkv_proj) {
    // The catalog's fused-QKV form: split views (whose backward writes the three gradients into one
    // [q | k | v] tensor with one cat) or a kernel reading the projection's output itself and writing its
    // gradient whole.
    const auto qkv = qkv_proj->forward(x).view({batch, seq, n_heads_ + 2 * n_kv_heads_, head_dim_});
    if (!cache && rope_in_our_attention(rope_kind_, seq)) {
      // The kernel reads unrotated q, k, v from the projection, rotating q and k as it loads them.
      const auto [cos, sin] = rotary->tables(seq, start, qkv.device());
      auto out = ops::flash_attention_rope_qkv(qkv, n_heads_, n_kv_heads_, cos, sin);
      return o_proj->forward(out.transpose(1, 2).reshape({batch, seq, n_heads_ * head_dim_}));
    }
    const auto rotated = rotary->forward_qkv(qkv, n_heads_, n_kv_heads_, start);
    q = rotated.q;
    k = rotated.k;
    v = rotated.v;
  } else {
    q = q_proj->forward(x).view({batch, seq, n_heads_, head_dim_});
    k = k_proj->forward(x).view({batch, seq, n_kv_heads_, head_dim_});
    v = v_proj->forward(x).view({batch, seq, n_kv_heads_, head_dim_});
    std::tie(q, k) = rotary->forward(q, k, start);
  }
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
  // Decoding with a cache (start > 0) takes the plain formulation in every stage: its shapes change with
  // every new token, and in bf16 SDPA picks cuDNN, which builds a new execution graph for each new key
  // length. Workshop model, bf16, H200: 120 greedy tokens took 7.4 s through SDPA, 1.2 s this way. A few
  // query rows make the plain matmul/softmax/matmul cheap. Its mask is aligned to the bottom-right
  // corner: query i sees keys up to start + i.
  auto out = start > 0 ? reference::masked_attention(q, k, v, start) : implementation(kind_).fn(q, k, v);
  out = out.transpose(1, 2).reshape({batch, seq, n_heads_ * head_dim_});
  return o_proj->forward(out);
}

// ---- MLP ----------------------------------------------------------------------------------------

MLPImpl::MLPImpl(const ModelConfig& c, const StageSpec& spec)
    : activation_(spec.activation), pitfall_(spec.pitfall) {
  TORCH_CHECK(spec.activation == ActivationKind::kReference || spec.fused_gate_up,
              "stage ", spec.name, ": the ", implementation(spec.activation).name,
              " activation works on the fused gate/up GEMM output");
  if (spec.fused_gate_up) {
    gate_up_proj = register_module("gate_up_proj", Projection(c.hidden_dim, 2 * c.intermediate_dim));
  } else {
    gate_proj = register_module("gate_proj", Projection(c.hidden_dim, c.intermediate_dim));
    up_proj = register_module("up_proj", Projection(c.hidden_dim, c.intermediate_dim));
  }
  down_proj = register_module("down_proj", Projection(c.intermediate_dim, c.hidden_dim));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  torch::Tensor hidden;
  if (gate_up_proj && pitfall_ == Pitfall::kNaiveSwiglu) {
    hidden = ops::naive_swiglu(x, gate_up_proj->forward_weight());
  } else if (gate_up_proj && pitfall_ == Pitfall::kNonContiguous) {
    // The same GEMM computed as W x^T and transposed back, as an unfused transpose leaves it: [rows, 2F] with
    // column stride rows, which the activation reads in place through its strided path.
    const auto w = gate_up_proj->forward_weight();
    const auto rows = x.reshape({-1, x.size(-1)});
    auto out_sizes = x.sizes().vec();
    out_sizes.back() = w.size(0);
    hidden = implementation(activation_).fn(torch::matmul(w, rows.t()).t().view(out_sizes));
  } else if (gate_up_proj) {
    hidden = implementation(activation_).fn(gate_up_proj->forward(x));
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

ResidualStream BlockImpl::forward(const ResidualStream& stream, Rotary& rotary, KVCache* cache) {
  const auto x = input_layernorm->forward(stream.residual, stream.delta);
  const auto attention = self_attn->forward(x.normalized, rotary, cache);
  const auto h = post_attention_layernorm->forward(x.residual, attention);
  return {h.residual, mlp->forward(h.normalized)};
}

}  // namespace tt
