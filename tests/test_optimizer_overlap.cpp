// Our AdamW overlapped with the backward, on the CPU (issue 27): a layer's update runs inside the hook that
// sees its last gradient arrive, in the eager order. The same losses, weights and moments as the update after
// the backward, in every mode; the updates really happen during the backward; and the switch's refusals.
#include <gtest/gtest.h>

#include "apps/cli/stage_cli.h"
#include "apps/train/optimizer.h"
#include "tests/helpers.h"
#include "tests/overlap_checks.h"

namespace tt {
namespace {

RunConfig short_run() {
  RunConfig c = testing::smoke_config();
  c.training.warmup_steps = 1;
  c.training.num_steps = 4;
  c.training.batch_size = 2;
  return c;
}

TEST(OptimizerOverlap, ChangesNoLossWeightOrMomentInAnyMode) {
  // v4 is the stage whose optimizer is ours (on the CPU its step runs eagerly).
  for (const auto& config : testing::overlap_modes(short_run()))
    testing::expect_overlap_changes_nothing(stages::v4_ultra(), config, torch::kCPU);
}

// The test above would pass if the overlap did nothing at all: here the layers' weights change inside the
// backward, before step(), and the embedding (updated by step()) does not.
TEST(OptimizerOverlap, LayersAreUpdatedDuringTheBackward) {
  for (double clip : {0.0, 1.0}) {
    SCOPED_TRACE("grad_clip " + std::to_string(clip));
    RunConfig c = short_run();
    c.training.grad_clip = clip;
    Transformer model = testing::spread_out_model(stages::v4_ultra(), 7);
    c.training.optimizer_overlap = true;
    AdamWOptions options = AdamWOptions::from(c.training);
    auto optimizer = make_optimizer(OptimizerKind::kOurAdamW, model, options);
    const auto tokens = testing::random_tokens(2, 16, c.model.vocab_size, 3);
    const auto before = model->canonical_state();
    auto loss = model->loss(tokens, tokens);
    optimizer->before_last_backward();
    loss.backward();
    const auto during = model->canonical_state();
    // Without clipping the layers are updated; with it, only their norms are taken (the updates need all).
    for (const auto& [name, w] : before) {
      const bool layer = name.rfind("model.layers.", 0) == 0;
      EXPECT_EQ(torch::equal(during.at(name), w), !(layer && clip == 0.0)) << name;
    }
    optimizer->step();
    optimizer->zero_grad();
    const auto after = model->canonical_state();
    for (const auto& [name, w] : before) EXPECT_FALSE(torch::equal(after.at(name), w)) << name;
  }
}

TEST(OptimizerOverlap, TheSwitchIsAFlagAndAConfigFieldOffByDefault) {
  auto parse = [](const std::vector<std::string>& args) { return parse_command_line("v4_ultra", args); };
  EXPECT_FALSE(parse({}).config.training.optimizer_overlap);
  EXPECT_TRUE(parse({"--optimizer-overlap"}).config.training.optimizer_overlap);
  EXPECT_FALSE(parse({"--optimizer-overlap=false"}).config.training.optimizer_overlap);
  const std::string field = testing::error_of<ConfigError>(
      [] { run_config_from_json({{"training", {{"optimizer_overlap", "yes"}}}}, "test.json"); });
  EXPECT_NE(field.find("\"training.optimizer_overlap\" must be true or false"), std::string::npos) << field;
}

// Optimizers without the overlap, and data parallel where the averaging does not follow the layers (the Reducer,
// ZeRO-1), run without it, and the plan's config and the stage's summary say so. Data parallel with an all-reduce
// per layer (the default) keeps it.
TEST(OptimizerOverlap, ThePlanTurnsItOffWhereItCannotApply) {
  RunConfig c = short_run();
  c.training.optimizer_overlap = true;
  RunOptions o;
  o.output = "unused.json";
  for (const StageSpec& spec : {stages::v1_baseline(), stages::v2_fused(), stages::v3_custom()}) {
    const RunPlan plan = plan_run(spec, c, o, {});
    EXPECT_FALSE(plan.config.training.optimizer_overlap) << spec.name;
    EXPECT_NE(plan.spec.summary.find("this run: the optimizer updates after the backward (the overlap is"),
              std::string::npos)
        << plan.spec.summary;
  }
  EXPECT_TRUE(plan_run(stages::v4_ultra(), c, o, {}).config.training.optimizer_overlap);

  DistributedEnv dist;
  dist.enabled = true;
  dist.world_size = 2;
  c.training.device = "auto";
  EXPECT_TRUE(plan_run(stages::v4_ultra(), c, o, dist).config.training.optimizer_overlap);
  RunOptions reducer = o;
  reducer.dp_sync = GradientSync::kReducer;
  const RunPlan with_reducer = plan_run(stages::v4_ultra(), c, reducer, dist);
  EXPECT_FALSE(with_reducer.config.training.optimizer_overlap);
  EXPECT_NE(with_reducer.spec.summary.find("after the backward (c10d's Reducer averages buckets, not layers)"),
            std::string::npos)
      << with_reducer.spec.summary;
  c.training.shard_optimizer = true;
  const RunPlan sharded = plan_run(stages::v4_ultra(), c, o, dist);
  EXPECT_FALSE(sharded.config.training.optimizer_overlap);
  EXPECT_NE(sharded.spec.summary.find("ZeRO-1's sharded optimizer updates after its reduce-scatters"),
            std::string::npos)
      << sharded.spec.summary;
}

}  // namespace
}  // namespace tt
