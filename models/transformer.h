// The shared LLaMA-style model: token embedding, pre-norm residual blocks (RMSNorm, RoPE, grouped-query
// attention, SwiGLU MLP), final norm and an output head tied to the embedding.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/components.h"
#include "models/config.h"
#include "models/precision.h"
#include "models/stage.h"

namespace tt {

// One canonical (Hugging Face LLaMA) tensor: rows [offset, offset + rows) of an internal parameter.
// Fused weights (QKV, gate/up) hold several canonical tensors stacked along dim 0.
struct CanonicalSlice {
  std::string name;
  torch::Tensor parameter;
  int64_t offset = 0;
  int64_t rows = 0;
  // The same slice of any tensor shaped like the parameter (its gradient, an optimizer moment).
  torch::Tensor of(const torch::Tensor& like_parameter) const { return like_parameter.narrow(0, offset, rows); }
};

class TransformerImpl : public torch::nn::Module {
 public:
  TransformerImpl(const ModelConfig& config, const StageSpec& spec);

  // The precision the model computes in: forward and loss run under its autocast region (models/precision.h),
  // the one place a run's precision becomes autocast. kFp32 until set.
  void set_precision(Precision precision) { precision_ = precision; }
  Precision precision() const { return precision_; }

  // input_ids [B, S] int64 -> logits [B, S, vocab]. With caches (one per layer), decodes incrementally.
  torch::Tensor forward(const torch::Tensor& input_ids, std::vector<KVCache>* caches = nullptr);
  // Mean next-token cross-entropy of the stage's loss implementation; labels [B, S], kIgnoreIndex ignored.
  torch::Tensor loss(const torch::Tensor& input_ids, const torch::Tensor& labels);

  // N(0, init_std) for every linear and the embedding, ones for norms, drawn on the CPU in canonical
  // order: every stage gets bit-identical initial weights from the same seed.
  void init_weights(uint64_t seed);

  // Canonical names in a fixed order (embedding, layers in order, final norm, untied head if any).
  std::vector<CanonicalSlice> canonical_layout() const;
  std::map<std::string, torch::Tensor> canonical_state() const;  // detached copies, CPU
  std::map<std::string, torch::Tensor> canonical_grads() const;  // detached copies, CPU, fp32 (gradient_of)
  // Copies every canonical tensor in; missing, extra or mis-shaped names throw.
  void load_canonical_state(const std::map<std::string, torch::Tensor>& state);

  // Low-precision compute copies: one copy of every projection weight and of the output head's weight, which
  // the forward reads instead of casting the fp32 weights (the masters) in every step. The optimizer
  // rewrites the copies after each update (tt::ops::adamw_step); initialising or loading weights refreshes
  // them here. Call after moving the model to its device.
  struct ComputeCopy {
    torch::Tensor master;  // the fp32 parameter
    torch::Tensor copy;    // a leaf that requires grad: the forward's gradient lands here
  };
  void enable_compute_copies(torch::Dtype dtype);
  const std::vector<ComputeCopy>& compute_copies() const { return compute_copies_; }
  void refresh_compute_copies();
  // Gathered casts (ProjectionImpl::gathered_cast): every projection weight's cast to `dtype`, for a sharded
  // optimizer to keep whole; refreshed with the compute copies. disable_gathered_casts drops them.
  void enable_gathered_casts(torch::Dtype dtype);
  void disable_gathered_casts();
  // The projection whose weight is `parameter`, or null.
  ProjectionImpl* projection_of(const torch::Tensor& parameter) const;
  // A parameter's gradient: its own .grad plus its compute copy's (a tied weight has both), in fp32;
  // undefined when there is neither.
  torch::Tensor gradient_of(const torch::Tensor& parameter) const;

  // Called by the forward before it reads a part's weights: with -1 before the embedding, with i before layer i,
  // with the number of layers before the final norm and the head. A sharded optimizer (ZeRO-1,
  // apps/train/sharded_adamw.h) waits there for that part's weights, all-gathered beside the forward (or already
  // by the step, for the first parts). Empty: no call.
  using BeforeWeights = std::function<void(int64_t layer)>;
  void set_before_weights(BeforeWeights before) { before_weights_ = std::move(before); }

  // One cache per layer, sized for max_len positions, in the given dtype and device.
  std::vector<KVCache> make_caches(int64_t batch, int64_t max_len, torch::Dtype dtype, const torch::Device& device) const;

  const ModelConfig& config() const { return config_; }
  const StageSpec& spec() const { return spec_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::Tensor lm_head_weight;  // the embedding's weight when tied

 private:
  torch::Tensor hidden_states(const torch::Tensor& input_ids, std::vector<KVCache>* caches);
  const torch::Tensor& head_weight() const;
  ModelConfig config_;
  StageSpec spec_;
  Rotary rotary_{nullptr};
  std::vector<ComputeCopy> compute_copies_;
  torch::Tensor head_compute_weight_;  // the output head's copy, when there are compute copies
  Precision precision_ = Precision::kFp32;
  BeforeWeights before_weights_;
};
TORCH_MODULE(Transformer);

}  // namespace tt
