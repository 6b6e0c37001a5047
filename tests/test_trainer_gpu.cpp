// The trainer's run control on the GPU (issue 23; label `gpu`, skipped without a GPU): v4's whole-step
// graph with gradient accumulation (k micro-batches and the optimizer in one graph) against one large
// batch, its learning-rate schedule read on the device by every replay, and an interrupted and resumed
// graphed run against the uninterrupted one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/checkpointing.h"
#include "tests/helpers.h"

namespace tt {
namespace {

const torch::Device kGpu(torch::kCUDA, 0);

// Twelve steps of the smoke model: two to capture the graph, ten replays.
RunConfig gpu_config(Precision precision) { return testing::gpu_smoke_config(precision, 2, 10); }

// Largest relative difference of two loss lists, and how many are bitwise equal (printed).
double compare_losses(const nlohmann::json& a, const nlohmann::json& b, const std::string& what) {
  EXPECT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  int identical = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!a[i].is_number() || !b[i].is_number()) {
      ADD_FAILURE() << what << ": loss " << i << " is not a number";
      return INFINITY;
    }
    const double x = a[i].get<double>(), y = b[i].get<double>();
    identical += x == y;
    // NaN-propagating: std::max would keep the old worst and let a NaN loss pass.
    const double relative = std::abs(x - y) / std::abs(y);
    if (!(relative <= worst)) worst = relative;
  }
  std::cout << "[" << what << "] " << identical << " of " << a.size()
            << " losses bitwise equal, largest relative difference " << worst << std::endl;
  return worst;
}

TEST(TrainerGpu, GraphedAccumulationOfFourEqualsOneBatchOfFourTimesTheRows) {
  TT_REQUIRE_GPU();
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    RunConfig accumulated = gpu_config(precision);
    accumulated.training.batch_size = 2;
    accumulated.training.grad_accum_steps = 4;
    RunConfig large = gpu_config(precision);
    large.training.batch_size = 8;
    std::ostringstream log;
    const auto a = testing::train_result(stages::v4_ultra(), accumulated, kGpu, log);
    const auto b = testing::train_result(stages::v4_ultra(), large, kGpu, log);
    EXPECT_NE(a["stage"]["components"]["step"].get<std::string>().find("graph"), std::string::npos);
    // fp32: summation order only. bf16: the compute copies' gradients are bf16 and add up in bf16 across
    // the micro-batches (autograd accumulates in the leaf's dtype), so the steps differ by bf16 round-off.
    const double tolerance = precision == Precision::kFp32 ? 1e-5 : 2e-2;
    EXPECT_LE(compare_losses(a["losses"], b["losses"], std::string("graphed k=4 vs batch x4, ") + to_string(precision)),
              tolerance);
    EXPECT_EQ(a["training"]["tokens_per_step"], 8 * accumulated.training.seq_len);
    EXPECT_NO_THROW(validate_result_json(a));
  }
}

// A replay repeats its kernels' arguments: a rate passed from the host would stay the captured one. The
// prepare kernel evaluates the schedule at the device's step counter, so graph and eager agree, and both
// differ from the constant rate.
TEST(TrainerGpu, GraphedStepFollowsTheScheduleOnTheDevice) {
  TT_REQUIRE_GPU();
  RunConfig c = gpu_config(Precision::kFp32);
  c.training.lr_schedule = "cosine";
  c.training.lr_warmup_steps = 3;
  c.training.min_lr = 1e-5;
  std::ostringstream log;
  const auto graphed = testing::train_result(stages::v4_ultra(), c, kGpu, log);
  const auto eagerly = testing::train_result(testing::eager_step(stages::v4_ultra()), c, kGpu, log);
  EXPECT_LE(compare_losses(graphed["losses"], eagerly["losses"], "graphed vs eager, cosine"), 1e-5);
  RunConfig constant = c;
  constant.training.lr_schedule = "constant";
  constant.training.lr_warmup_steps = 0;
  constant.training.min_lr = 0;  // a constant schedule has no end rate
  const auto fixed = testing::train_result(stages::v4_ultra(), constant, kGpu, log);
  EXPECT_GT(std::abs(fixed["losses"].back().get<double>() - graphed["losses"].back().get<double>()), 1e-4)
      << "the schedule changed nothing under the graph";
}

TEST(TrainerGpu, InterruptedAndResumedGraphedRunEqualsTheUninterruptedOne) {
  TT_REQUIRE_GPU();
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    RunConfig c = gpu_config(precision);
    c.training.grad_accum_steps = 2;
    c.training.lr_schedule = "cosine";
    c.training.lr_warmup_steps = 2;
    std::ostringstream log;
    const auto whole = testing::train_result(stages::v4_ultra(), c, kGpu, log);
    const auto dir = testing::fresh_dir("tt_resume_gpu_" + std::string(to_string(precision)));
    nlohmann::json first;
    {
      Trainer trainer(stages::v4_ultra(), c, kGpu);
      RunExtras extras;
      extras.checkpoints = RunCheckpoints({dir.string(), 0, 0}, new_run_id());
      int64_t steps = 0;
      extras.stop_requested = [&] { return ++steps == 6; };
      first = run_training(trainer, extras, log);
    }
    ASSERT_EQ(first["interrupted"], true);
    const std::string path = checkpoint_path(dir.string(), 6);
    const Checkpoint ck = read_checkpoint(path);
    EXPECT_NO_THROW(check_resumable(ck, path, "v4_ultra", c, /*graphed=*/true));
    Trainer trainer(stages::v4_ultra(), c, kGpu);
    RunExtras extras;
    extras.first_step = trainer.resume(ck);
    const auto second = run_training(trainer, extras, log);
    EXPECT_NE(second["stage"]["components"]["step"].get<std::string>().find("graph"), std::string::npos);
    // The first kGraphWarmupSteps after the resume run eagerly and capture: unmeasured.
    EXPECT_EQ(second["training"]["measured_steps"], 12 - 6 - kGraphWarmupSteps);
    nlohmann::json losses = first["losses"];
    for (const auto& l : second["losses"]) losses.push_back(l);
    // Equal up to the stage's own run-to-run determinism: our kernels are deterministic (no atomics), the
    // vendor libraries may choose other algorithms after the new capture.
    const double tolerance = precision == Precision::kFp32 ? 1e-5 : 2e-3;
    EXPECT_LE(
        compare_losses(losses, whole["losses"], std::string("resumed vs whole, v4 graphed ") + to_string(precision)),
        tolerance);
  }
}

}  // namespace
}  // namespace tt
