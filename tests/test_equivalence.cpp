// Every stage against v1 through the equivalence harness, on the CPU (CI) in fp32 and bf16.
#include <gtest/gtest.h>

#include "tests/equivalence.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::Comparison;
using testing::expect_bf16_equivalent;
using testing::expect_fp32_equivalent;
using testing::run_equivalence;

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
