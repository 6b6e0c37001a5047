// A stage is a choice of component implementations for the one shared model skeleton and training
// loop. The four executables differ only in the StageSpec they pass.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tt {

enum class NormKind { kReference, kFused, kCustom };
enum class RopeKind { kReference, kCachedTables, kCustom };
enum class AttentionKind { kMaskedMatmul, kSdpa };
enum class ActivationKind { kReference, kCustom };
enum class LossKind { kReference, kCustom };
enum class OptimizerKind { kTorchAdamW, kFusedAdamW };

struct StageSpec {
  std::string name;
  std::string summary;
  NormKind norm = NormKind::kReference;
  RopeKind rope = RopeKind::kReference;
  AttentionKind attention = AttentionKind::kMaskedMatmul;
  bool fused_qkv = false;      // one [q; k; v] weight and one GEMM
  bool fused_gate_up = false;  // one [gate; up] weight and one GEMM
  ActivationKind activation = ActivationKind::kReference;
  LossKind loss = LossKind::kReference;
  OptimizerKind optimizer = OptimizerKind::kTorchAdamW;
};

namespace stages {
StageSpec v1_baseline();
StageSpec v2_fused();
StageSpec v3_custom();
std::vector<StageSpec> all();
}  // namespace stages

const char* to_string(NormKind kind);
const char* to_string(RopeKind kind);
const char* to_string(AttentionKind kind);
const char* to_string(ActivationKind kind);
const char* to_string(LossKind kind);
const char* to_string(OptimizerKind kind);
nlohmann::json to_json(const StageSpec& spec);

}  // namespace tt
