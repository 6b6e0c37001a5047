// Our multi-tensor AdamW (tt::ops::adamw_step) on the CPU, where it runs the ATen formulation of the
// kernel's arithmetic: against torch::optim::AdamW over many steps, with and without weight decay and
// clipping; compute copies and summed gradients; the optimizer of the v4 stage; bad inputs.
#include <gtest/gtest.h>

#include "apps/train/optimizer.h"
#include "kernels/ops/adamw.h"
#include "tests/adamw_reference.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::expect_error;

const std::vector<std::vector<int64_t>> kOddShapes = {{1}, {7}, {33, 17}, {1000}, {3, 5, 7}};

TEST(AdamWCpu, MatchesTorchAdamWOverManySteps) { testing::expect_matches_torch_adamw(kOddShapes, 50, torch::kCPU); }

TEST(AdamWCpu, CopyGradientJoinsTheMastersAndCopiesAreTheRoundedMasters) {
  testing::expect_copy_gradients_join_and_copies_are_rounded_masters(64, 1, ops::AdamWHyperparameters{}, torch::kCPU);
}

TEST(AdamWCpu, Bf16MomentsTrackTorchAdamW) { testing::expect_bf16_moments_track_torch_adamw(kOddShapes, 40, torch::kCPU); }

TEST(AdamWCpu, RejectsBadInputs) {
  auto p = torch::randn({4}), g = torch::randn({4}), m = torch::zeros({4}), v = torch::zeros({4});
  auto state = ops::adamw_state(torch::kCPU);
  ops::AdamWHyperparameters h;
  expect_error([&] { ops::adamw_step({{p, {}, {}, {}, m, v}}, state, h); }, "has no gradient");
  expect_error([&] { ops::adamw_step({{p, torch::randn({5}), {}, {}, m, v}}, state, h); }, "grad has shape");
  expect_error([&] { ops::adamw_step({{p, g.to(torch::kBFloat16), {}, {}, m, v}}, state, h); }, "grad must be fp32");
  expect_error([&] { ops::adamw_step({{p, g, {}, {}, m, v}}, torch::zeros({2}), h); }, "adamw_state()");
  expect_error([&] { ops::adamw_step({{p, g, p.to(torch::kFloat64), {}, m, v}}, state, h); }, "BFloat16 or Half");
  expect_error([&] { ops::adamw_step({{p, g, {}, {}, m.to(torch::kHalf), v.to(torch::kHalf)}}, state, h); },
               "the moments must be contiguous fp32 or bf16 tensors");
  expect_error([&] { ops::adamw_step({{p, g, {}, {}, m, v}, {p.clone(), g, {}, {}, m.to(torch::kBFloat16), v.to(torch::kBFloat16)}}, state, h); },
               "every moment must have the same dtype");
  ops::AdamWHyperparameters bad = h;
  bad.beta2 = 1.0;
  expect_error([&] { ops::adamw_step({{p, g, {}, {}, m, v}}, state, bad); }, "beta2 must be in [0, 1)");
}

TEST(AdamWCpu, V4OptimizerOwnsTheCopiesAndSavesMasters) {
  // The v4 stage in bf16 keeps compute copies; its optimizer is ours, and others are refused.
  RunConfig c = testing::smoke_config();
  c.training.dtype = Precision::kBf16;
  Trainer trainer(stages::v4_ultra(), c, torch::kCPU);
  const auto& copies = trainer.model()->compute_copies();
  ASSERT_EQ(copies.size(), 2u * 4u + 1u);  // 4 projections per layer, 2 layers, and the tied head
  for (const auto& cp : copies) EXPECT_TRUE(torch::equal(cp.copy, cp.master.to(torch::kBFloat16)));
  expect_error([&] { make_optimizer(OptimizerKind::kAtenFusedAdamW, trainer.model(), AdamWOptions{}); },
               "only tt::ops::adamw_step writes");
  auto tokens = testing::random_tokens(c.training.batch_size, c.training.seq_len + 1, c.model.vocab_size, 3);
  auto x = tokens.narrow(1, 0, c.training.seq_len).contiguous(), y = tokens.narrow(1, 1, c.training.seq_len).contiguous();
  trainer.step(x, y);
  trainer.step(x, y);
  EXPECT_EQ(trainer.optimizer().step_count(), 2);
  for (const auto& cp : copies) EXPECT_TRUE(torch::equal(cp.copy, cp.master.to(torch::kBFloat16)));
}

}  // namespace
}  // namespace tt
