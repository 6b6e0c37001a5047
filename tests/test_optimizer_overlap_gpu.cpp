// Our AdamW overlapped with the backward on the GPU (label `gpu`; skipped without a GPU): each layer's pass on
// a second stream, forked from the backward's stream by events and joined before the step ends; inside v4's
// captured graph and in v4's step run eagerly (--no-graph). Bitwise the losses, weights and moments of the update after the
// backward, in every mode.
#include <gtest/gtest.h>

#include "tests/helpers.h"
#include "tests/overlap_checks.h"

namespace tt {
namespace {

const torch::Device kGpu(torch::kCUDA, 0);

// Enough steps after the graph's capture that replays, not just the eager warm-up, are compared.
RunConfig graphed_run() {
  RunConfig c = testing::gpu_smoke_config(Precision::kFp32, 3, 6);
  c.training.grad_clip = 0.0;
  return c;
}

TEST(OptimizerOverlapGpu, TheGraphedStepChangesNoLossWeightOrMomentInAnyMode) {
  TT_REQUIRE_GPU();
  for (const auto& config : testing::overlap_modes(graphed_run()))
    testing::expect_overlap_changes_nothing(stages::v4_ultra(), config, kGpu);
}

TEST(OptimizerOverlapGpu, TheEagerStepChangesNoLossWeightOrMomentInAnyMode) {
  TT_REQUIRE_GPU();
  for (const auto& config : testing::overlap_modes(graphed_run()))
    testing::expect_overlap_changes_nothing(testing::eager_step(stages::v4_ultra()), config, kGpu);
}

// The overlap must not depend on the update's grid covering every chunk: a capped grid, as the
// TT_ADAMW_OVERLAP_BLOCKS knob sets it, walks the chunks in a loop and must give the same bits.
TEST(OptimizerOverlapGpu, ACappedUpdateGridChangesNothing) {
  TT_REQUIRE_GPU();
  ::setenv("TT_ADAMW_OVERLAP_BLOCKS", "3", 1);
  RunConfig c = graphed_run();
  c.training.dtype = Precision::kBf16;
  testing::expect_overlap_changes_nothing(stages::v4_ultra(), c, kGpu);
  ::unsetenv("TT_ADAMW_OVERLAP_BLOCKS");
}

// The SM carveout knob (TT_ADAMW_OVERLAP_SMS) gives the backward's cuBLAS GEMMs an SM-count target: the
// promise holds only if cuBLAS then computes every product in the same order. This test says whether it does.
TEST(OptimizerOverlapGpu, AnSmCarveoutForTheUpdateChangesNothing) {
  TT_REQUIRE_GPU();
  ::setenv("TT_ADAMW_OVERLAP_SMS", "16", 1);
  ::setenv("TT_ADAMW_OVERLAP_BLOCKS", "16", 1);
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    RunConfig c = graphed_run();
    c.training.dtype = precision;
    testing::expect_overlap_changes_nothing(stages::v4_ultra(), c, kGpu);
  }
  ::unsetenv("TT_ADAMW_OVERLAP_SMS");
  ::unsetenv("TT_ADAMW_OVERLAP_BLOCKS");
}

// The priority knob (TT_ADAMW_OVERLAP_PRIORITY) captures the step on a high-priority stream, above the update's:
// it changes when the update's blocks run, never what they compute. The optimizer must ask for it (else the
// knob did nothing and the comparison below proves nothing), and only with the overlap on.
TEST(OptimizerOverlapGpu, AHighPriorityStepChangesNothing) {
  TT_REQUIRE_GPU();
  ::setenv("TT_ADAMW_OVERLAP_PRIORITY", "1", 1);
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    RunConfig c = graphed_run();
    c.training.dtype = precision;
    c.training.optimizer_overlap = true;
    EXPECT_TRUE(Trainer(stages::v4_ultra(), c, kGpu).optimizer().wants_high_priority_step());
    c.training.optimizer_overlap = false;
    EXPECT_FALSE(Trainer(stages::v4_ultra(), c, kGpu).optimizer().wants_high_priority_step());
    testing::expect_overlap_changes_nothing(stages::v4_ultra(), c, kGpu);
  }
  ::unsetenv("TT_ADAMW_OVERLAP_PRIORITY");
}

}  // namespace
}  // namespace tt
