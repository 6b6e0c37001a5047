// Every stage against v1 through the equivalence harness, on the CPU (CI) in fp32 and bf16.
#include <gtest/gtest.h>

#include "tests/equivalence.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::Comparison;
using testing::run_equivalence;

// fp32 tolerances (the harness's contract): loss within 1e-5 relative; every gradient within 1e-4 of its
// norm; logits likewise 1e-4.
void expect_fp32_equivalent(const Comparison& c, const std::string& what) {
  EXPECT_LT(c.loss_rel, 1e-5) << what;
  EXPECT_LT(c.logits_rel, 1e-4) << what;
  EXPECT_LT(c.max_grad_rel(), 1e-4) << what << ": worst gradient " << c.worst_grad();
}

// bf16: the candidate's error against the fp32 reference may be at most twice the reference stage's own
// bf16 error (plus a floor for values that bf16 reproduces almost exactly).
void expect_bf16_equivalent(const Comparison& candidate, const Comparison& baseline, const std::string& what) {
  constexpr double kFloor = 1e-4;
  EXPECT_LE(candidate.loss_rel, 2 * baseline.loss_rel + kFloor) << what;
  EXPECT_LE(candidate.logits_rel, 2 * baseline.logits_rel + kFloor) << what;
  for (const auto& [name, error] : candidate.grad_rel)
    EXPECT_LE(error, 2 * baseline.grad_rel.at(name) + kFloor) << what << ": " << name;
}

class StageEquivalence : public ::testing::TestWithParam<StageSpec (*)()> {};

TEST_P(StageEquivalence, MatchesV1InFp32) {
  RunConfig c = testing::smoke_config();
  auto run = run_equivalence(GetParam()(), c, stages::v1_baseline(), c, torch::kCPU);
  expect_fp32_equivalent(run.checkpoints[0], "initial weights");
  expect_fp32_equivalent(run.checkpoints[1], "after 3 optimizer steps");
}

TEST_P(StageEquivalence, MatchesV1InBf16WithinTwiceV1sOwnError) {
  RunConfig fp32 = testing::smoke_config();
  RunConfig bf16 = fp32;
  bf16.training.dtype = Precision::kBf16;
  auto baseline = run_equivalence(stages::v1_baseline(), bf16, stages::v1_baseline(), fp32, torch::kCPU);
  auto candidate = run_equivalence(GetParam()(), bf16, stages::v1_baseline(), fp32, torch::kCPU);
  for (size_t i = 0; i < 2; ++i)
    expect_bf16_equivalent(candidate.checkpoints[i], baseline.checkpoints[i], i == 0 ? "initial" : "after 3 steps");
}

INSTANTIATE_TEST_SUITE_P(Stages, StageEquivalence,
                         ::testing::Values(&stages::v2_fused, &stages::v3_custom, &stages::v4_ultra),
                         [](const auto& info) { return info.param().name; });

TEST(EquivalenceHarness, DetectsAWrongStage) {
  // A stage with a different norm epsilon computes a different function: the harness must notice.
  RunConfig c = testing::smoke_config();
  RunConfig other = c;
  other.model.norm_eps = 1e-1;
  EXPECT_THROW(run_equivalence(stages::v2_fused(), other, stages::v1_baseline(), c, torch::kCPU), c10::Error);
  auto run = run_equivalence(stages::v2_fused(), c, stages::v1_baseline(), c, torch::kCPU);
  auto corrupted = run.candidate[0];
  corrupted.grads.begin()->second = corrupted.grads.begin()->second * 1.01;
  EXPECT_GT(testing::compare(corrupted, run.reference[0]).max_grad_rel(), 1e-3);
}

}  // namespace
}  // namespace tt
