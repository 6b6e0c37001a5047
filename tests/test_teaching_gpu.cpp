// The debugging exercise on a GPU: the pitfalls' effects where only a GPU shows them (the strided and naive
// kernels inside a whole model, the host clock beside device events) and the energy figure. No timing
// assertions: the lesson's sizes are measured by scripts/debugging_stages.sh, not asserted here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <sstream>

#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/energy.h"
#include "tests/helpers.h"
#include "tests/kernel_checks.h"
#include "tests/teaching_checks.h"

namespace tt {
namespace {

StageSpec v3_with(Pitfall p) { return stages::with_pitfall(stages::v3_custom(), p); }

RunConfig gpu_smoke() {
  RunConfig c = testing::smoke_config();
  c.training.device = "cuda";
  return c;
}

TEST(TeachingGpu, MissingInitMakesTheInitialLossExplode) {
  TT_REQUIRE_GPU();
  RunConfig c = testing::wide_smoke_config();
  c.training.device = "cuda";
  const double ln_vocab = std::log(static_cast<double>(c.model.vocab_size));
  EXPECT_GT(testing::initial_loss(v3_with(Pitfall::kMissingInit), c, torch::kCUDA), 10 * ln_vocab);
}

// The strided and the naive kernels inside the model: v3's loss and gradients (fp32, within the equivalence
// harness's 1e-4: the transposed GEMM and the naive kernels sum in another order than v3's cuBLAS GEMM).
TEST(TeachingGpu, NonContiguousAndNaiveSwigluStagesComputeV3sLossAndGradients) {
  TT_REQUIRE_GPU();
  testing::expect_same_as_v3(Pitfall::kNonContiguous, torch::kCUDA, 1e-4);
  testing::expect_same_as_v3(Pitfall::kNaiveSwiglu, torch::kCUDA, 1e-4);
}

TEST(TeachingGpu, EveryPitfallTrainsAndRecordsItsResult) {
  TT_REQUIRE_GPU();
  RunConfig c = gpu_smoke();
  c.training.num_steps = 4;
  for (const auto& entry : stages::pitfalls()) {
    std::ostringstream log;
    const auto result = testing::train_result(v3_with(entry.kind), c, torch::kCUDA, log);
    validate_result_json(result);
    EXPECT_EQ(result["stage"]["pitfall"]["name"], entry.name);
    EXPECT_TRUE(result["summary"]["final_loss"].is_number()) << entry.name << " diverged: " << log.str();
    EXPECT_EQ(result["summary"].contains("host_clock_ms"), entry.kind == Pitfall::kNoSyncTiming) << entry.name;
    if (entry.kind != Pitfall::kNoSyncTiming) continue;
    for (const char* phase : {"step_ms", "forward_ms", "backward_ms", "optimizer_ms"}) {
      EXPECT_TRUE(result["summary"][phase].is_object()) << "device events for " << phase;
      EXPECT_TRUE(result["summary"]["host_clock_ms"][phase].is_object()) << "host clock for " << phase;
    }
  }
}

// A window far too short for the counter (one smoke step: a few ms, where 20 refreshes of a counter polled every
// millisecond take at least 20 ms) still gets a figure, from extra steps after
// the run, and they change nothing the run records or saves: the losses are the counted steps', and the
// end-of-run checkpoint hook sees the optimizer at the last counted step.
TEST(TeachingGpu, ShortWindowGetsItsEnergyFromExtraStepsThatChangeNothingRecorded) {
  TT_REQUIRE_GPU();
  if (!EnergyMeter(torch::kCUDA).available()) GTEST_SKIP() << "no NVML energy counter on this GPU";
  RunConfig c = gpu_smoke();
  c.training.num_steps = 1;
  Trainer trainer(stages::v3_custom(), c, torch::kCUDA);
  RunExtras extras;
  int64_t steps_at_checkpoint = -1;
  extras.after_last_counted_step = [&](int64_t) { steps_at_checkpoint = trainer.optimizer().step_count(); };
  std::ostringstream log;
  const auto result = run_training(trainer, extras, log);
  const int64_t counted = c.training.warmup_steps + c.training.num_steps;
  EXPECT_EQ(steps_at_checkpoint, counted);
  EXPECT_EQ(result["losses"].size(), static_cast<size_t>(counted));
  const auto& s = result["summary"];
  ASSERT_TRUE(s["energy_j_per_step"].is_number()) << s["energy_note"];
  EXPECT_GT(s["energy_j_per_step"].get<double>(), 0.0);
  EXPECT_EQ(s["energy_window"]["extra_steps"], true) << s["energy_window"];
  const int64_t extra = s["energy_window"]["steps"].get<int64_t>();
  EXPECT_GE(extra, 1);
  EXPECT_EQ(trainer.optimizer().step_count(), counted + extra) << "the extra steps ran after the hook";
  EXPECT_GE(s["energy_window"]["seconds"].get<double>(),
            kEnergyMinRefreshes * s["energy_window"]["counter_refresh_ms"].get<double>() / 1e3);
}

// Where NVML is there (every NVIDIA driver installs it) the run has a figure; elsewhere a note says why.
// On an NVIDIA build a missing NVML fails the test (it would otherwise pass through the note branch),
// unless TT_ALLOW_NO_NVML=1 says the machine has none.
TEST(TeachingGpu, EnergyIsMeasuredWhereTheCounterExists) {
  TT_REQUIRE_GPU();
  const bool available = EnergyMeter(torch::kCUDA).available();
#if defined(TT_BACKEND_CUDA)
  const char* allow = std::getenv("TT_ALLOW_NO_NVML");
  if (!(allow != nullptr && std::string(allow) == "1")) {
    ASSERT_TRUE(available) << "NVML did not load on an NVIDIA machine (set TT_ALLOW_NO_NVML=1 if it has none)";
  }
#endif
  RunConfig c = gpu_smoke();
  // Long enough a window (hundreds of ms) for the driver to refresh the counter more than once.
  c.training.num_steps = 300;
  std::ostringstream log;
  const auto s = testing::train_result(stages::v3_custom(), c, torch::kCUDA, log)["summary"];
  if (available) {
    ASSERT_TRUE(s["energy_j_per_step"].is_number()) << s["energy_note"];
    EXPECT_GT(s["energy_j_per_step"].get<double>(), 0.0);
    EXPECT_GT(s["tokens_per_joule"].get<double>(), 0.0);
    EXPECT_NE(s["energy_note"].get<std::string>().find("NVML"), std::string::npos);
  } else {
    EXPECT_TRUE(s["energy_j_per_step"].is_null());
    EXPECT_NE(s["energy_note"].get<std::string>().find("energy not measured"), std::string::npos);
  }
}

}  // namespace
}  // namespace tt
