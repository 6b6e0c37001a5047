#include "models/transformer.h"

#include <set>

#include "models/reference.h"
#include "models/scoped_range.h"

namespace tt {

TransformerImpl::TransformerImpl(const ModelConfig& config, const StageSpec& spec) : config_(config), spec_(spec) {
  validate(config_);
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_dim));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layers; ++i) layers->push_back(Block(config, spec));
  norm = register_module("norm", RMSNorm(config.hidden_dim, config.norm_eps, spec.norm));
  rotary_ = register_module("rotary", Rotary(config, spec.rope));
  lm_head_weight = config.tie_embeddings
                       ? embed_tokens->weight
                       : register_parameter("lm_head_weight", torch::empty({config.vocab_size, config.hidden_dim}));
}

torch::Tensor TransformerImpl::hidden_states(const torch::Tensor& input_ids, std::vector<KVCache>* caches) {
  if (before_weights_) before_weights_(-1);
  ResidualStream stream{implementation(spec_.embedding).fn(embed_tokens->weight, input_ids), torch::Tensor()};
  for (size_t i = 0; i < layers->size(); ++i) {
    ScopedRange range("layer");
    if (before_weights_) before_weights_(static_cast<int64_t>(i));
    stream = layers[i]->as<BlockImpl>()->forward(stream, rotary_, caches ? &(*caches)[i] : nullptr);
  }
  if (before_weights_) before_weights_(static_cast<int64_t>(layers->size()));
  return norm->forward(stream.residual, stream.delta).normalized;
}

// Tied: lm_head_weight is the embedding's own weight tensor (same storage, same gradient).
const torch::Tensor& TransformerImpl::head_weight() const {
  return head_compute_weight_.defined() ? head_compute_weight_
                                        : (config_.tie_embeddings ? embed_tokens->weight : lm_head_weight);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& input_ids, std::vector<KVCache>* caches) {
  AutocastScope autocast(input_ids.device(), precision_);
  return torch::nn::functional::linear(hidden_states(input_ids, caches), head_weight());
}

torch::Tensor TransformerImpl::loss(const torch::Tensor& input_ids, const torch::Tensor& labels) {
  AutocastScope autocast(input_ids.device(), precision_);
  auto hidden = hidden_states(input_ids, nullptr);
  return implementation(spec_.loss)
      .fn(hidden.view({-1, config_.hidden_dim}), head_weight(), labels.reshape({-1}), reference::kIgnoreIndex);
}

std::vector<CanonicalSlice> TransformerImpl::canonical_layout() const {
  std::vector<CanonicalSlice> out;
  auto whole = [&](const std::string& name, const torch::Tensor& p) { out.push_back({name, p, 0, p.size(0)}); };
  whole("model.embed_tokens.weight", embed_tokens->weight);
  const int64_t q_rows = config_.hidden_dim, kv_rows = config_.n_kv_heads * config_.head_dim();
  for (size_t i = 0; i < layers->size(); ++i) {
    const auto* block = layers->ptr(i)->as<BlockImpl>();
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    whole(prefix + "input_layernorm.weight", block->input_layernorm->weight);
    const auto& attn = *block->self_attn;
    if (attn.qkv_proj) {
      const auto& w = attn.qkv_proj->weight;
      out.push_back({prefix + "self_attn.q_proj.weight", w, 0, q_rows});
      out.push_back({prefix + "self_attn.k_proj.weight", w, q_rows, kv_rows});
      out.push_back({prefix + "self_attn.v_proj.weight", w, q_rows + kv_rows, kv_rows});
    } else {
      whole(prefix + "self_attn.q_proj.weight", attn.q_proj->weight);
      whole(prefix + "self_attn.k_proj.weight", attn.k_proj->weight);
      whole(prefix + "self_attn.v_proj.weight", attn.v_proj->weight);
    }
    whole(prefix + "self_attn.o_proj.weight", attn.o_proj->weight);
    whole(prefix + "post_attention_layernorm.weight", block->post_attention_layernorm->weight);
    const auto& mlp = *block->mlp;
    if (mlp.gate_up_proj) {
      const auto& w = mlp.gate_up_proj->weight;
      out.push_back({prefix + "mlp.gate_proj.weight", w, 0, config_.intermediate_dim});
      out.push_back({prefix + "mlp.up_proj.weight", w, config_.intermediate_dim, config_.intermediate_dim});
    } else {
      whole(prefix + "mlp.gate_proj.weight", mlp.gate_proj->weight);
      whole(prefix + "mlp.up_proj.weight", mlp.up_proj->weight);
    }
    whole(prefix + "mlp.down_proj.weight", mlp.down_proj->weight);
  }
  whole("model.norm.weight", norm->weight);
  if (!config_.tie_embeddings) whole("lm_head.weight", lm_head_weight);
  return out;
}

void TransformerImpl::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(seed);
  for (const auto& slice : canonical_layout()) {
    auto target = slice.of(slice.parameter);
    torch::Tensor value;
    if (slice.parameter.dim() == 1) {
      value = torch::ones(target.sizes());
    } else {
      value = torch::empty(target.sizes()).normal_(0.0, config_.init_std, generator);
    }
    target.copy_(value);
  }
  refresh_compute_copies();
}

std::map<std::string, torch::Tensor> TransformerImpl::canonical_state() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& s : canonical_layout()) out[s.name] = s.of(s.parameter).detach().to(torch::kCPU).clone();
  return out;
}

std::map<std::string, torch::Tensor> TransformerImpl::canonical_grads() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& s : canonical_layout()) {
    const auto grad = gradient_of(s.parameter);
    out[s.name] = grad.defined() ? s.of(grad).detach().to(torch::kCPU).clone() : torch::Tensor();
  }
  return out;
}

void TransformerImpl::load_canonical_state(const std::map<std::string, torch::Tensor>& state) {
  torch::NoGradGuard no_grad;
  std::set<std::string> expected;
  for (const auto& s : canonical_layout()) {
    expected.insert(s.name);
    auto it = state.find(s.name);
    TORCH_CHECK(it != state.end(), "weights: tensor '", s.name, "' is missing");
    auto target = s.of(s.parameter);
    TORCH_CHECK(it->second.sizes() == target.sizes(), "weights: tensor '", s.name, "' has shape ", it->second.sizes(),
                " but this model needs ", target.sizes());
    target.copy_(it->second);
  }
  for (const auto& [name, value] : state)
    TORCH_CHECK(expected.count(name), "weights: tensor '", name, "' is not part of this model");
  refresh_compute_copies();
}

void TransformerImpl::enable_compute_copies(torch::Dtype dtype) {
  TORCH_CHECK(compute_copies_.empty(), "compute copies are already enabled");
  auto add = [&](const torch::Tensor& master) {
    compute_copies_.push_back({master, master.detach().to(dtype).requires_grad_(true)});
    return compute_copies_.back().copy;
  };
  for (const auto& m : modules(/*include_self=*/false))
    if (auto* projection = m->as<ProjectionImpl>()) projection->compute_weight = add(projection->weight);
  head_compute_weight_ = add(config_.tie_embeddings ? embed_tokens->weight : lm_head_weight);
}

void TransformerImpl::refresh_compute_copies() {
  torch::NoGradGuard no_grad;
  for (auto& c : compute_copies_) c.copy.copy_(c.master);
  for (const auto& m : modules(/*include_self=*/false))
    if (auto* projection = m->as<ProjectionImpl>(); projection && projection->gathered_cast.defined())
      projection->gathered_cast.copy_(projection->weight);
}

void TransformerImpl::enable_gathered_casts(torch::Dtype dtype) {
  TORCH_CHECK(compute_copies_.empty(), "gathered casts replace autocast's casts; this model has compute copies");
  for (const auto& m : modules(/*include_self=*/false))
    if (auto* projection = m->as<ProjectionImpl>())
      TORCH_CHECK(!projection->gathered_cast.defined(),
                  "gathered casts are already enabled (another sharded optimizer keeps them)");
  torch::NoGradGuard no_grad;
  for (const auto& m : modules(/*include_self=*/false))
    if (auto* projection = m->as<ProjectionImpl>()) projection->gathered_cast = projection->weight.detach().to(dtype);
}

void TransformerImpl::disable_gathered_casts() {
  for (const auto& m : modules(/*include_self=*/false))
    if (auto* projection = m->as<ProjectionImpl>()) projection->gathered_cast = torch::Tensor();
}

ProjectionImpl* TransformerImpl::projection_of(const torch::Tensor& parameter) const {
  for (const auto& m : modules(/*include_self=*/false))
    if (auto* projection = m->as<ProjectionImpl>(); projection && projection->weight.is_same(parameter))
      return projection;
  return nullptr;
}

torch::Tensor TransformerImpl::gradient_of(const torch::Tensor& parameter) const {
  torch::Tensor grad = parameter.grad();
  for (const auto& c : compute_copies_) {
    if (!c.master.is_same(parameter) || !c.copy.grad().defined()) continue;
    const auto copy_grad = c.copy.grad().to(torch::kFloat32);
    grad = grad.defined() ? grad + copy_grad : copy_grad;
  }
  return grad;
}

std::vector<KVCache> TransformerImpl::make_caches(int64_t batch, int64_t max_len, torch::Dtype dtype,
                                                  const torch::Device& device) const {
  std::vector<KVCache> caches(layers->size());
  auto options = torch::TensorOptions().dtype(dtype).device(device);
  for (auto& c : caches) {
    c.keys = torch::zeros({batch, config_.n_kv_heads, max_len, config_.head_dim()}, options);
    c.values = torch::zeros_like(c.keys);
  }
  return caches;
}

}  // namespace tt
