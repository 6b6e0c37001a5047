#include "models/stage.h"

namespace tt {
namespace stages {

// The workshop's v1, op by op: everything in plain LibTorch operations.
StageSpec v1_baseline() {
  StageSpec spec;
  spec.name = "v1_baseline";
  spec.summary = "plain LibTorch ops: separate projections, explicit-mask attention, unfused RMSNorm, torch::optim::AdamW";
  return spec;
}

// What the framework already offers, before anyone writes a kernel.
StageSpec v2_fused() {
  StageSpec spec = v1_baseline();
  spec.name = "v2_fused";
  spec.summary = "fused LibTorch ops: QKV and gate/up GEMMs, SDPA, cached RoPE tables, fused RMSNorm, fused AdamW";
  spec.fused_qkv = true;
  spec.fused_gate_up = true;
  spec.attention = AttentionKind::kSdpa;
  spec.rope = RopeKind::kCachedTables;
  spec.norm = NormKind::kFused;
  spec.optimizer = OptimizerKind::kFusedAdamW;
  return spec;
}

// v2 plus our own kernels, each with a real backward.
StageSpec v3_custom() {
  StageSpec spec = v2_fused();
  spec.name = "v3_custom";
  spec.summary = "v2 plus custom kernels: RMSNorm, RoPE, SwiGLU and cross-entropy, forward and backward";
  spec.norm = NormKind::kCustom;
  spec.rope = RopeKind::kCustom;
  spec.activation = ActivationKind::kCustom;
  spec.loss = LossKind::kCustom;
  return spec;
}

std::vector<StageSpec> all() { return {v1_baseline(), v2_fused(), v3_custom()}; }

}  // namespace stages

const char* to_string(NormKind kind) {
  switch (kind) {
    case NormKind::kReference: return "reference (pow, mean, rsqrt, mul)";
    case NormKind::kFused: return "at::rms_norm (fused)";
    case NormKind::kCustom: return "custom kernel";
  }
  return "?";
}
const char* to_string(RopeKind kind) {
  switch (kind) {
    case RopeKind::kReference: return "reference (tables per forward, elementwise)";
    case RopeKind::kCachedTables: return "cached tables, elementwise";
    case RopeKind::kCustom: return "custom kernel";
  }
  return "?";
}
const char* to_string(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::kMaskedMatmul: return "explicit mask, matmul/softmax/matmul, repeat_interleave";
    case AttentionKind::kSdpa: return "at::scaled_dot_product_attention (is_causal)";
  }
  return "?";
}
const char* to_string(ActivationKind kind) {
  return kind == ActivationKind::kReference ? "reference (silu * up)" : "custom kernel";
}
const char* to_string(LossKind kind) {
  return kind == LossKind::kReference ? "reference (cross_entropy on full logits)" : "custom fused softmax cross-entropy kernel";
}
const char* to_string(OptimizerKind kind) {
  return kind == OptimizerKind::kTorchAdamW ? "torch::optim::AdamW" : "at::_fused_adamw_";
}

nlohmann::json to_json(const StageSpec& s) {
  return {{"name", s.name},
          {"summary", s.summary},
          {"components",
           {{"norm", to_string(s.norm)},
            {"rope", to_string(s.rope)},
            {"attention", to_string(s.attention)},
            {"qkv_projection", s.fused_qkv ? "fused (one GEMM)" : "separate q, k, v"},
            {"gate_up_projection", s.fused_gate_up ? "fused (one GEMM)" : "separate gate, up"},
            {"activation", to_string(s.activation)},
            {"loss", to_string(s.loss)},
            {"optimizer", to_string(s.optimizer)}}}};
}

}  // namespace tt
