// The building blocks of the shared LLaMA-style skeleton. Each block takes the StageSpec and runs the
// implementation the stage chose, through its catalog entry (models/stage.h); the stages never copy the
// model.
#pragma once

#include <torch/torch.h>

#include "models/config.h"
#include "models/stage.h"

namespace tt {

// Per-layer key/value cache for incremental decoding: keys/values [B, Hkv, S_max, D], `length`
// positions filled.
struct KVCache {
  torch::Tensor keys;
  torch::Tensor values;
  int64_t length = 0;
};

// A bias-free linear layer, y = x W^T, whose fp32 weight W is the parameter (the master copy). A stage
// that keeps low-precision compute copies gives it one (compute_weight, set by
// TransformerImpl::enable_compute_copies): the forward then reads the
// copy, which the optimizer rewrites after each update, instead of casting W in every step; the gradient
// lands on the copy (a leaf) and the optimizer adds it to W's update.
//
// A sharded optimizer in a bf16 autocast run without compute copies (ZeRO-1 for v2 and v3) gives it a gathered cast
// instead (gathered_cast, TransformerImpl::enable_gathered_casts): W's bf16 cast, kept whole by the optimizer, which
// all-gathers the cast of each rank's updated slice instead of the fp32 slice (half the bytes). The forward reads it
// where autocast would have cast W, and the gradient reaches W as through autocast's cast: the same arithmetic.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in_features, int64_t out_features);
  torch::Tensor forward(const torch::Tensor& x);
  // The weight the forward multiplies by: the compute copy, the gathered cast (only under autocast to its dtype: W
  // itself may then be stale outside this rank's slices), or W.
  torch::Tensor forward_weight() const;
  torch::Tensor weight;
  torch::Tensor compute_weight;  // undefined without a compute copy
  torch::Tensor gathered_cast;   // undefined without a sharded optimizer's gathered cast
};
TORCH_MODULE(Projection);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, NormKind kind);
  torch::Tensor forward(const torch::Tensor& x);
  // The residual add before the norm, then the norm (fused into one kernel by kinds that can): see NormFn.
  ResidualNorm forward(const torch::Tensor& residual, const torch::Tensor& delta);
  torch::Tensor weight;

 private:
  double eps_;
  NormKind kind_;
};
TORCH_MODULE(RMSNorm);

// Rotary embeddings. Tables are fp32 [S, head_dim / 2]; the reference kind rebuilds them every call
// (as the workshop's v1 did), the others slice a table built once for max_seq_len.
class RotaryImpl : public torch::nn::Module {
 public:
  RotaryImpl(const ModelConfig& config, RopeKind kind);
  // q [B, S, Hq, D], k [B, S, Hkv, D]; positions start_pos .. start_pos + S - 1.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& q, const torch::Tensor& k, int64_t start_pos);
  // The fused QKV projection's output viewed as qkv [B, S, Hq + 2 Hkv, D] -> rotated q and k, and v.
  ops::RotatedQkv forward_qkv(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads, int64_t start_pos);
  // cos, sin [seq_len, head_dim / 2] for positions start_pos ..: for a kernel that rotates by itself.
  std::pair<torch::Tensor, torch::Tensor> tables(int64_t seq_len, int64_t start_pos, const torch::Device& device);

 private:
  ModelConfig config_;
  RopeKind kind_;
  torch::Tensor cos_cache_, sin_cache_;
};
TORCH_MODULE(Rotary);

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, const StageSpec& spec);
  // x [B, S, H] -> [B, S, H]. With a cache, appends this chunk's keys/values and attends over all.
  torch::Tensor forward(const torch::Tensor& x, Rotary& rotary, KVCache* cache = nullptr);

  // Separate projections (v1) or one fused [q; k; v] weight (v2+); the unused ones stay empty.
  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, qkv_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_;
  AttentionKind kind_;
  RopeKind rope_kind_;  // kInOurAttention: our attention with RoPE in its load, where its rule says so
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const ModelConfig& config, const StageSpec& spec);
  torch::Tensor forward(const torch::Tensor& x);

  Projection gate_proj{nullptr}, up_proj{nullptr}, gate_up_proj{nullptr}, down_proj{nullptr};

 private:
  ActivationKind activation_;
  std::optional<Pitfall> pitfall_;  // the debugging exercise's MLP pitfalls (models/stage.h)
};
TORCH_MODULE(MLP);

// The residual stream between blocks: residual + delta, the last sub-layer's output not yet added, so that
// the add can run inside the norm that reads the sum (a stage's norm kind decides whether it does). The
// first block gets the embeddings with no delta.
struct ResidualStream {
  torch::Tensor residual;
  torch::Tensor delta;  // undefined: nothing pending
};

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& config, const StageSpec& spec);
  // x = residual + delta;  h = x + attention(norm(x));  returns h + mlp(norm(h)) as {h, mlp(...)}.
  ResidualStream forward(const ResidualStream& stream, Rotary& rotary, KVCache* cache = nullptr);

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

}  // namespace tt
