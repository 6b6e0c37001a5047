// The cross-stage equivalence harness: two stages built from the same canonical weights see the same
// batches; loss, logits and every parameter's gradient (by canonical name) are compared, at the start
// and again after optimizer steps. Every stage is checked against v1 this way.
#pragma once

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
  double max_grad_rel() const {
    double m = 0;
    for (const auto& [name, e] : grad_rel) m = std::max(m, e);
    return m;
  }
  std::string worst_grad() const {
    std::string worst;
    double m = -1;
    for (const auto& [name, e] : grad_rel)
      if (e > m) m = e, worst = name;
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
EquivalenceRun run_equivalence(const StageSpec& candidate, const RunConfig& candidate_config, const StageSpec& reference,
                               const RunConfig& reference_config, const torch::Device& device, int steps = 3);

}  // namespace tt::testing
