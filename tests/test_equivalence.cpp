// Every stage against v1 through the equivalence harness, on the CPU (CI) in fp32 and bf16; and the
// harness's own negative tests: a wrong candidate must make it report each kind of mismatch.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "models/stage.h"
#include "tests/equivalence.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::Comparison;
using testing::expect_bf16_equivalent;
using testing::expect_fp32_equivalent;
using testing::run_equivalence;
using testing::StageSnapshot;

using testing::long_untied_clipped;

RunConfig long_untied_clipped_config() { return long_untied_clipped(testing::smoke_config()); }

double global_grad_norm(const StageSnapshot& s) {
  double sq = 0;
  for (const auto& [name, grad] : s.grads) sq += grad.to(torch::kFloat64).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

void expect_matches_v1_in_fp32(const StageSpec& spec, const RunConfig& c) {
  auto run = run_equivalence(spec, c, stages::v1_baseline(), c, torch::kCPU);
  expect_fp32_equivalent(run.checkpoints[0], "initial weights");
  expect_fp32_equivalent(run.checkpoints[1], "after 3 optimizer steps");
  if (c.training.grad_clip > 0) {
    // Clipping only tests something if it scales: v1's gradient norm on the harness's batch, before and
    // after the steps, is above the limit (the steps' batches are drawn the same way).
    for (const auto& s : run.reference) EXPECT_GT(global_grad_norm(s), c.training.grad_clip);
  }
}

void expect_matches_v1_in_bf16(const StageSpec& spec, const RunConfig& fp32) {
  RunConfig bf16 = fp32;
  bf16.training.dtype = Precision::kBf16;
  auto baseline = run_equivalence(stages::v1_baseline(), bf16, stages::v1_baseline(), fp32, torch::kCPU);
  auto candidate = run_equivalence(spec, bf16, stages::v1_baseline(), fp32, torch::kCPU);
  for (size_t i = 0; i < 2; ++i)
    expect_bf16_equivalent(candidate.checkpoints[i], baseline.checkpoints[i], i == 0 ? "initial" : "after 3 steps");
}

class StageEquivalence : public ::testing::TestWithParam<StageSpec (*)()> {};

TEST_P(StageEquivalence, MatchesV1InFp32) { expect_matches_v1_in_fp32(GetParam()(), testing::smoke_config()); }

TEST_P(StageEquivalence, MatchesV1InBf16WithinTwiceV1sOwnError) {
  expect_matches_v1_in_bf16(GetParam()(), testing::smoke_config());
}

// The same contract, tolerances unchanged, on the long / clipped / untied config.
TEST_P(StageEquivalence, LongSequenceClippedUntiedMatchesV1InFp32) {
  const RunConfig c = long_untied_clipped_config();
  ASSERT_LE(c.training.seq_len, c.model.max_seq_len);
  expect_matches_v1_in_fp32(GetParam()(), c);
}

TEST_P(StageEquivalence, LongSequenceClippedUntiedMatchesV1InBf16WithinTwiceV1sOwnError) {
  expect_matches_v1_in_bf16(GetParam()(), long_untied_clipped_config());
}

INSTANTIATE_TEST_SUITE_P(Stages, StageEquivalence,
                         ::testing::Values(&stages::v2_fused, &stages::v3_custom, &stages::v4_ultra),
                         [](const auto& info) { return info.param().name; });

TEST(EquivalenceHarness, LongConfigReachesTheBranchesItIsFor) {
  // Guards the config above against drifting back onto the smoke paths: v4 must not take RoPE inside its
  // attention at this length, the head must be a tensor of its own, and clipping must be on.
  const RunConfig c = long_untied_clipped_config();
  EXPECT_FALSE(rope_in_our_attention(stages::v4_ultra().rope, c.training.seq_len));
  EXPECT_TRUE(rope_in_our_attention(stages::v4_ultra().rope, testing::smoke_config().training.seq_len));
  Transformer model(c.model, stages::v4_ultra());
  EXPECT_TRUE(model->canonical_state().count("lm_head.weight"));
  EXPECT_NE(model->lm_head_weight.data_ptr(), model->embed_tokens->weight.data_ptr());
  EXPECT_GT(c.training.grad_clip, 0);
}

TEST(EquivalenceHarness, RefusesConfigsThatDifferInMoreThanDtype) {
  // A stage with a different norm epsilon computes a different function: the harness must not compare it.
  RunConfig c = testing::smoke_config();
  RunConfig other = c;
  other.model.norm_eps = 1e-1;
  EXPECT_THROW(run_equivalence(stages::v2_fused(), other, stages::v1_baseline(), c, torch::kCPU), c10::Error);
}

// Each kind of mismatch, put into a real v2 snapshot one at a time, must make the checks fail, each with
// exactly one failure that names it (EXPECT_NONFATAL_FAILURE demands exactly one).
TEST(EquivalenceHarness, ReportsEachKindOfMismatch) {
  const RunConfig c = testing::smoke_config();
  const auto run = run_equivalence(stages::v2_fused(), c, stages::v1_baseline(), c, torch::kCPU, 1);
  const StageSnapshot& ref = run.reference[0];
  const StageSnapshot& good = run.candidate[0];
  expect_fp32_equivalent(testing::compare(good, ref), "unperturbed");  // the baseline for every case below
  const std::string some = "model.layers.1.mlp.down_proj.weight";
  ASSERT_TRUE(good.grads.count(some));

  StageSnapshot bad = good;
  bad.loss *= 1 + 1e-3;
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"), "case: loss");
  bad.loss = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"), "case: loss");

  bad = good;
  bad.logits = good.logits * 1.01;
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"), "case: logits");
  bad.logits = good.logits.narrow(0, 0, 1);  // would broadcast against the reference's batch
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"), "case: logits");

  bad = good;
  bad.grads[some] = good.grads.at(some) * 1.01;
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"), "case: gradients: worst " + some);
  // A NaN must not hide behind the other tensors' small errors (std::max(m, NaN) would keep m).
  bad.grads[some] = good.grads.at(some).clone();
  bad.grads[some].view(-1)[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(testing::compare(bad, ref).max_grad_rel()));
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"), "case: gradients: worst " + some);

  bad = good;
  bad.grads.erase(some);
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"),
                          some + " (the candidate has no such tensor)");
  bad = good;
  bad.grads[some] = torch::Tensor();
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"),
                          some + " (no gradient in the candidate)");
  bad = good;
  bad.grads["lm_head.weight"] = good.grads.at("model.embed_tokens.weight");
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, ref), "case"),
                          "lm_head.weight (the reference has no such tensor)");
  // Neither side with any gradient: nothing unmatched, but nothing compared either.
  bad = good;
  bad.grads.clear();
  StageSnapshot empty_ref = ref;
  empty_ref.grads.clear();
  EXPECT_NONFATAL_FAILURE(expect_fp32_equivalent(testing::compare(bad, empty_ref), "case"),
                          "case: gradients: none compared");

  // The bf16 check, with v2's own fp32 errors as the budget: a gradient 1% off exceeds twice v2's fp32
  // round-off plus the 1e-4 floor; so does a loss 1e-3 off (the floor is 2.5e-4).
  const Comparison budget = testing::compare(good, ref);
  bad = good;
  bad.grads[some] = good.grads.at(some) * 1.01;
  EXPECT_NONFATAL_FAILURE(expect_bf16_equivalent(testing::compare(bad, ref), budget, "case"), "case: gradients: " + some);
  bad = good;
  bad.loss *= 1 + 1e-3;
  EXPECT_NONFATAL_FAILURE(expect_bf16_equivalent(testing::compare(bad, ref), budget, "case"), "case: loss");
  bad = good;
  bad.grads.erase(some);
  EXPECT_NONFATAL_FAILURE(expect_bf16_equivalent(testing::compare(bad, ref), budget, "case"),
                          some + " (the candidate has no such tensor)");
}

// A wrong stage end to end: v2 built from v1's canonical weights with one tensor changed (the final norm's
// weight tripled, which scales every logit), snapshotted on the harness's kind of batch. The fp32 check must
// report the loss, the logits and the gradients: three failures, one of each.
TEST(EquivalenceHarness, DetectsAPerturbedCanonicalTensor) {
  const RunConfig c = testing::smoke_config();
  Trainer reference(stages::v1_baseline(), c, torch::kCPU);
  Trainer candidate(stages::v2_fused(), c, torch::kCPU);
  auto state = reference.model()->canonical_state();
  state.at("model.norm.weight") = state.at("model.norm.weight") * 3.0;
  candidate.model()->load_canonical_state(state);
  const auto tokens = testing::random_tokens(c.training.batch_size, c.training.seq_len + 1, c.model.vocab_size, 1000);
  const auto inputs = tokens.narrow(1, 0, c.training.seq_len).contiguous();
  const auto labels = tokens.narrow(1, 1, c.training.seq_len).contiguous();
  const auto comparison =
      testing::compare(testing::snapshot(candidate, inputs, labels), testing::snapshot(reference, inputs, labels));

  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter capture(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    expect_fp32_equivalent(comparison, "perturbed");
  }
  bool loss = false, logits = false, gradients = false;
  for (int i = 0; i < failures.size(); ++i) {
    const std::string message = failures.GetTestPartResult(i).message();
    loss |= message.find("perturbed: loss") != std::string::npos;
    logits |= message.find("perturbed: logits") != std::string::npos;
    gradients |= message.find("perturbed: gradients: worst") != std::string::npos;
  }
  EXPECT_EQ(failures.size(), 3) << "loss " << comparison.loss_rel << ", logits " << comparison.logits_rel
                                << ", worst gradient " << comparison.max_grad_rel();
  EXPECT_TRUE(loss) << "loss error " << comparison.loss_rel;
  EXPECT_TRUE(logits) << "logits error " << comparison.logits_rel;
  EXPECT_TRUE(gradients) << "worst gradient error " << comparison.max_grad_rel();
}

}  // namespace
}  // namespace tt
