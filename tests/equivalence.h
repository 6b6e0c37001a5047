// The cross-stage equivalence harness: two stages built from the same canonical weights see the same
// batches; loss, logits and every parameter's gradient (by canonical name) are compared, at the start
// and again after optimizer steps. Every stage is checked against v1 this way.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "apps/train/trainer.h"
#include "models/stage.h"

namespace tt::testing {

struct StageSnapshot {
  double loss = 0;
  torch::Tensor logits;                          // CPU, fp32
  std::map<std::string, torch::Tensor> grads;    // CPU, canonical names
};

struct Comparison {
  double loss_rel = 0;
  double logits_rel = 0;
  std::map<std::string, double> grad_rel;        // ||ga - gb|| / ||gb|| per canonical tensor
  // Canonical names whose gradient only one side has (or that one side left undefined, or of another
  // shape), each with the reason. grad_rel covers only the matched names, so that a missing or extra
  // gradient is reported once, by the name-set check, and a candidate with no gradients at all cannot
  // pass by having nothing to compare.
  std::vector<std::string> unmatched_grads;
  // NaN-propagating: std::max(m, NaN) keeps m, which would let a NaN gradient pass every tolerance;
  // `!(e <= m)` is true for NaN, so a NaN error becomes the maximum (and is sticky) and fails the check.
  double max_grad_rel() const {
    double m = 0;
    for (const auto& [name, e] : grad_rel)
      if (!(e <= m) && !std::isnan(m)) m = e;
    return m;
  }
  std::string worst_grad() const {
    std::string worst;
    double m = -1;
    for (const auto& [name, e] : grad_rel)
      if (!(e <= m) && !std::isnan(m)) m = e, worst = name;
    return worst;
  }
};

// Runs one forward (logits, under the trainer's autocast) and one forward+backward on the batch.
StageSnapshot snapshot(Trainer& trainer, const torch::Tensor& inputs, const torch::Tensor& labels);
Comparison compare(const StageSnapshot& candidate, const StageSnapshot& reference);

struct EquivalenceRun {
  std::vector<Comparison> checkpoints;  // [0]: initial weights; [1]: after `steps` optimizer steps
  std::vector<StageSnapshot> candidate, reference;
};

// Builds both stages (the reference's canonical weights copied into the candidate), compares them, runs
// `steps` identical optimizer steps on both and compares again. The configs may differ in dtype only
// (bf16 candidates are measured against an fp32 reference).
// fp32 tolerances (the harness's contract): loss within 1e-5 relative; every gradient within 1e-4 of its
// norm; logits likewise 1e-4. Both checks also require that the candidate has exactly the reference's
// gradient names (a non-empty set): a stage that drops a parameter's gradient fails rather than passes.
void expect_fp32_equivalent(const Comparison& c, const std::string& what);

// bf16: the candidate's error against the fp32 reference may be at most twice the reference stage's own
// bf16 error, plus a floor for values that bf16 reproduces almost exactly: 1e-4 for logits and gradients,
// 2.5e-4 for the scalar loss. The loss after a few optimizer steps is one number whose bf16 error is
// small by luck as often as not (v1's own was 7e-6 relative on the smoke config, v2's 4e-5), while 2.5e-4
// of a loss near ln(256) is under a fiftieth of a bf16 ulp there.
void expect_bf16_equivalent(const Comparison& candidate, const Comparison& baseline, const std::string& what);

// `base` (the smoke config, on the CPU or the GPU) moved onto the paths the smoke run never takes: 160
// positions (above kRopeInAttentionMaxSeq, so v4 rotates with tt::ops::rope_qkv and runs SDPA instead of RoPE
// inside our attention), gradient clipping that engages (v1's global gradient norm at these weights is well
// above 0.05; the CPU suite checks it), and an untied output head (a separate lm_head.weight with its own
// gradient, and in v4 the fused loss reading a weight that is not the embedding). Batch 2 keeps a case at a
// few seconds on the CPU.
constexpr int64_t kLongSeq = 160;
constexpr double kEngagedClip = 0.05;
static_assert(kLongSeq > kRopeInAttentionMaxSeq, "the long config must take v4's path beyond RoPE-in-attention");
inline RunConfig long_untied_clipped(RunConfig base) {
  base.training.seq_len = kLongSeq;
  base.training.batch_size = 2;
  base.training.grad_clip = kEngagedClip;
  base.model.tie_embeddings = false;
  return base;
}

EquivalenceRun run_equivalence(const StageSpec& candidate, const RunConfig& candidate_config, const StageSpec& reference,
                               const RunConfig& reference_config, const torch::Device& device, int steps = 3);

}  // namespace tt::testing
