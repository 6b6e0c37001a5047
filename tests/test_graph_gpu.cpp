// The v4 stage's whole-step graph (label `gpu`; skipped without a GPU): replays give the losses of the
// same step run eagerly, launching our kernels programmatically changes no loss, the result says how the step
// ran, profiling sees the graph's kernels, and a run too short to capture during its warm-up is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "kernels/ops/common.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::train_result;

const torch::Device kGpu(torch::kCUDA, 0);

// Clipping on: the device-side clipping is part of the graph.
RunConfig twenty_steps(Precision precision) { return testing::gpu_smoke_config(precision, 2, 18); }

TEST(GraphGpu, ReplaysGiveTheEagerLossesOverTwentySteps) {
  TT_REQUIRE_GPU();
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    std::ostringstream log;
    const auto graphed = train_result(stages::v4_ultra(), twenty_steps(precision), kGpu, log);
    const auto eagerly = train_result(testing::eager_step(stages::v4_ultra()), twenty_steps(precision), kGpu, log);
    const auto& a = graphed["losses"];
    const auto& b = eagerly["losses"];
    ASSERT_EQ(a.size(), 20u);
    ASSERT_EQ(b.size(), 20u);
    int identical = 0;
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double x = a[i].get<double>(), y = b[i].get<double>();
      identical += x == y;
      // Not std::max: it keeps `worst` when the difference is NaN; this lets a NaN loss fail the check.
      const double d = std::abs(x - y) / std::abs(y);
      if (!std::isnan(worst) && !(d <= worst)) worst = d;
    }
    // Bitwise where the same kernels run; a library that picks another algorithm under capture may move
    // the loss by fp32 round-off (bf16 round-off of the activations in bf16 runs).
    const double tolerance = precision == Precision::kFp32 ? 1e-5 : 2e-3;
    EXPECT_LE(worst, tolerance) << to_string(precision) << ": " << identical << " of 20 losses bitwise equal";
    std::cout << "[graph vs eager] " << to_string(precision) << ": " << identical
              << " of 20 losses bitwise equal, largest relative difference " << worst << std::endl;
    EXPECT_TRUE(graphed["summary"]["forward_ms"].is_null());
    EXPECT_NE(graphed["stage"]["components"]["step"].get<std::string>().find("graph"), std::string::npos);
    EXPECT_NE(eagerly["stage"]["components"]["step"].get<std::string>().find("eager"), std::string::npos);
    EXPECT_NO_THROW(validate_result_json(graphed));
  }
}

// Programmatic dependent launch (kernels/vendor.cuh) changes when our kernels start, never what they compute:
// twenty steps give the same losses, bit for bit, with it off and on, graphed and eagerly. A kernel launched
// early that read or wrote before its wait for the previous kernel would race, and move the losses. Skipped where
// our kernels launch the usual way either way (before sm_90, HIP, builds without sm_90a code).
TEST(GraphGpu, ProgrammaticLaunchChangesNoLoss) {
  TT_REQUIRE_GPU();
  struct RestoreSetting {
    bool was = ops::programmatic_launch_enabled();
    ~RestoreSetting() { ops::set_programmatic_launch(was); }
  } restore;
  ops::set_programmatic_launch(true);
  if (!ops::programmatic_launch_available())
    GTEST_SKIP() << "our kernels are not launched programmatically on this GPU and build";
  for (Precision precision : {Precision::kFp32, Precision::kBf16})
    for (const bool graph : {true, false}) {
      const StageSpec stage = graph ? stages::v4_ultra() : testing::eager_step(stages::v4_ultra());
      std::ostringstream log;
      ops::set_programmatic_launch(false);
      const auto off = train_result(stage, twenty_steps(precision), kGpu, log);
      ops::set_programmatic_launch(true);
      const auto on = train_result(stage, twenty_steps(precision), kGpu, log);
      ASSERT_EQ(off["losses"].size(), 20u);
      EXPECT_EQ(off["losses"], on["losses"]) << to_string(precision) << (graph ? ", graphed" : ", eager");
      EXPECT_FALSE(off["system"]["programmatic_launch"].get<bool>());
      EXPECT_TRUE(on["system"]["programmatic_launch"].get<bool>());
    }
}

TEST(GraphGpu, ProfileSeesTheGraphsKernels) {
  TT_REQUIRE_GPU();
  RunConfig c = twenty_steps(Precision::kBf16);
  c.training.num_steps = 3;
  Trainer trainer(stages::v4_ultra(), c, kGpu);
  RunExtras extras;
  extras.profile = {2, ::testing::TempDir() + "/tt_graph_profile/v4.trace.json"};
  std::ostringstream log;
  const auto result = run_training(trainer, extras, log);
  const auto& p = result.at("profile");
  EXPECT_GT(p["kernels_per_step"].get<double>(), 10.0) << log.str();
  std::cout << "[graph profile] " << p["kernels_per_step"].get<double>() << " kernels per step, "
            << p["gpu_time_per_step_ms"].get<double>() << " ms GPU time per step" << std::endl;
}

TEST(GraphGpu, TooFewWarmupStepsForTheCaptureIsAClearError) {
  TT_REQUIRE_GPU();
  RunConfig c = twenty_steps(Precision::kFp32);
  c.training.warmup_steps = 1;
  try {
    Trainer trainer(stages::v4_ultra(), c, kGpu);
    ADD_FAILURE() << "a graphed run with one warm-up step was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("training.warmup_steps\" = 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--no-graph"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Trainer(testing::eager_step(stages::v4_ultra()), c, kGpu));
}

}  // namespace
}  // namespace tt
