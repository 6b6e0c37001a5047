// The energy figure's window (apps/train/energy.h, finish_energy) with a fake counter that, like NVML's,
// advances only at its refreshes: a measured window too short for it is extended with extra steps until the
// stated resolution holds, a long one is used as it is, and a counter that is missing or stuck gives no figure.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/energy.h"
#include "tests/helpers.h"

namespace tt {
namespace {

// A GPU drawing `watts` whose counter is refreshed every `refresh_s`; the clock moves only when the code
// under test sleeps or runs steps (each `step_s` long).
class CoarseCounter final : public EnergyCounter {
 public:
  CoarseCounter(double watts, double refresh_s, double step_s, bool present = true)
      : watts_(watts), refresh_s_(refresh_s), step_s_(step_s), present_(present) {}
  bool available() const override { return present_; }
  const std::string& note() const override { return note_; }
  std::string source() const override { return "fake counter"; }
  std::optional<unsigned long long> read_mj() override {
    const double refreshed_at = std::floor(now_ / refresh_s_) * refresh_s_;
    return static_cast<unsigned long long>(std::llround(watts_ * refreshed_at * 1000.0));
  }
  double now_s() override { return now_; }
  void sleep_s(double seconds) override { now_ += seconds; }
  void run_steps(int64_t n) {
    now_ += static_cast<double>(n) * step_s_;
    steps_run_ += n;
  }
  // The window of `steps` measured steps starting now, read as the Recorder reads it.
  EnergyWindow measure(int64_t steps) {
    EnergyWindow w;
    w.start_mj = read_mj();
    w.start_s = now_;
    run_steps(steps);
    w.end_mj = read_mj();
    w.end_s = now_;
    return w;
  }
  int64_t steps_run() const { return steps_run_; }

 private:
  double watts_, refresh_s_, step_s_;
  bool present_;
  double now_ = 12.345;  // not on a refresh boundary
  int64_t steps_run_ = 0;
  std::string note_ = "energy not measured: no counter here";
};

TEST(Energy, ShortWindowIsExtendedUntilTheCounterResolutionHolds) {
  // v4's workshop case: 50 steps of 1.5 ms (75 ms) against a counter refreshed every 100 ms.
  const double watts = 500, refresh = 0.1, step = 0.0015;
  CoarseCounter counter(watts, refresh, step);
  const EnergyWindow measured = counter.measure(50);
  const int64_t measured_steps = counter.steps_run();
  const EnergyReading r = finish_energy(counter, measured, 50, step, [&](int64_t n) {
    ASSERT_GE(n, 1);
    counter.run_steps(n);
  });
  ASSERT_TRUE(r.joules.has_value()) << r.note;
  EXPECT_TRUE(r.extra_steps);
  EXPECT_EQ(r.steps, counter.steps_run() - measured_steps) << "the figure's step count is the extra steps'";
  EXPECT_GE(r.seconds, kEnergyMinRefreshes * refresh);
  ASSERT_TRUE(r.refresh_s.has_value());
  EXPECT_NEAR(*r.refresh_s, refresh, 0.002);
  const double true_j_per_step = watts * step;
  EXPECT_NEAR(*r.joules / static_cast<double>(r.steps), true_j_per_step, true_j_per_step / kEnergyMinRefreshes)
      << "within the stated resolution";
  EXPECT_NE(r.source.find("extra training steps"), std::string::npos) << r.source;

  nlohmann::json summary;
  set_energy_fields(summary, r, 1024);
  EXPECT_NEAR(summary["energy_j_per_step"].get<double>(), *r.joules / static_cast<double>(r.steps), 1e-12);
  EXPECT_EQ(summary["energy_window"]["steps"], r.steps);
  EXPECT_EQ(summary["energy_window"]["extra_steps"], true);
  EXPECT_NEAR(summary["tokens_per_joule"].get<double>(), 1024.0 * static_cast<double>(r.steps) / *r.joules, 1e-9);
  // The counter draws a constant `watts`: the window's mean power is that, within the stated resolution.
  EXPECT_NEAR(summary["energy_window"]["average_power_w"].get<double>(), *r.joules / r.seconds, 1e-9);
  EXPECT_NEAR(summary["energy_window"]["average_power_w"].get<double>(), watts, watts / kEnergyMinRefreshes);
}

TEST(Energy, LongMeasuredWindowIsUsedAsItIs) {
  const double watts = 300, refresh = 0.1, step = 0.05;
  CoarseCounter counter(watts, refresh, step);
  const EnergyWindow measured = counter.measure(100);  // 5 s: 50 refreshes
  bool extended = false;
  const EnergyReading r = finish_energy(counter, measured, 100, step, [&](int64_t) { extended = true; });
  ASSERT_TRUE(r.joules.has_value()) << r.note;
  EXPECT_FALSE(extended);
  EXPECT_FALSE(r.extra_steps);
  EXPECT_EQ(r.steps, 100);
  EXPECT_NEAR(*r.joules, static_cast<double>(*measured.end_mj - *measured.start_mj) / 1000.0, 1e-12);
  EXPECT_NEAR(*r.joules / 100, watts * step, watts * step / kEnergyMinRefreshes);
  nlohmann::json summary;
  set_energy_fields(summary, r, 1024);
  EXPECT_NEAR(summary["energy_window"]["average_power_w"].get<double>(), watts, watts / kEnergyMinRefreshes)
      << "the measured window's mean power";
}

TEST(Energy, WindowThatAdvancedButSpansTooFewRefreshesIsExtended) {
  // 400 ms: the counter moved (four refreshes), but one refresh is a quarter of the figure.
  CoarseCounter counter(200, 0.1, 0.004);
  const EnergyWindow measured = counter.measure(100);
  ASSERT_GT(*measured.end_mj, *measured.start_mj);
  const EnergyReading r = finish_energy(counter, measured, 100, 0.004, [&](int64_t n) { counter.run_steps(n); });
  ASSERT_TRUE(r.joules.has_value()) << r.note;
  EXPECT_TRUE(r.extra_steps);
  EXPECT_GE(r.seconds, kEnergyMinRefreshes * 0.1);
}

TEST(Energy, NoCounterGivesNullWithItsNoteAndNoExtraSteps) {
  CoarseCounter counter(200, 0.1, 0.001, /*present=*/false);
  bool extended = false;
  const EnergyReading r = finish_energy(counter, {}, 10, 0.001, [&](int64_t) { extended = true; });
  EXPECT_FALSE(r.joules.has_value());
  EXPECT_FALSE(extended);
  EXPECT_EQ(r.note, "energy not measured: no counter here");
  nlohmann::json summary;
  set_energy_fields(summary, r, 1024);
  EXPECT_TRUE(summary["energy_j_per_step"].is_null());
  EXPECT_TRUE(summary["tokens_per_joule"].is_null());
  EXPECT_EQ(summary["energy_note"], r.note);
  EXPECT_TRUE(summary["energy_window"].is_null());
}

TEST(Energy, StuckCounterGivesNullAfterTheProbe) {
  CoarseCounter counter(0, 0.1, 0.001);  // 0 W: the counter never changes
  bool extended = false;
  const EnergyReading r = finish_energy(counter, counter.measure(10), 10, 0.001, [&](int64_t) { extended = true; });
  EXPECT_FALSE(r.joules.has_value());
  EXPECT_FALSE(extended);
  EXPECT_NE(r.note.find("did not change"), std::string::npos) << r.note;
}

// The end-of-run checkpoint's hook runs after the last counted step and before any extra step (here the
// --profile steps; on a GPU the energy figure's too), so a checkpoint holds the state the result describes.
TEST(Energy, LastCountedStepHookRunsBeforeTheExtraSteps) {
  RunConfig c = testing::smoke_config();
  c.training.num_steps = 3;
  c.training.warmup_steps = 1;
  Trainer trainer(stages::v2_fused(), c, torch::kCPU);
  RunExtras extras;
  extras.profile = {2, (std::filesystem::path(::testing::TempDir()) / "tt_energy_hook.trace.json").string()};
  int64_t steps_at_hook = -1;
  extras.after_last_counted_step = [&](int64_t) { steps_at_hook = trainer.optimizer().step_count(); };
  std::ostringstream log;
  const auto result = run_training(trainer, extras, log);
  EXPECT_EQ(steps_at_hook, 4);
  EXPECT_EQ(trainer.optimizer().step_count(), 6) << "the profiled steps ran after it";
  EXPECT_EQ(result["losses"].size(), 4u);
  EXPECT_TRUE(result["summary"]["energy_j_per_step"].is_null()) << "a CPU run has no counter";
  EXPECT_TRUE(result["summary"]["energy_window"].is_null());
}

// With gradient accumulation a step is all its micro-batches: the energy fields must count their tokens, as
// tokens/s does. The result checker holds tokens_per_joule x energy_j_per_step to training.tokens_per_step, so
// every GPU test that checks a result with an energy figure checks this too.
TEST(Energy, TokensPerJouleCountsEveryMicroBatchOfTheStep) {
  RunConfig c = testing::smoke_config();
  c.training.num_steps = 2;
  c.training.warmup_steps = 1;
  c.training.grad_accum_steps = 3;
  std::ostringstream log;
  auto result = testing::train_result(stages::v1_baseline(), c, torch::kCPU, log);
  const int64_t tokens = c.training.batch_size * 3 * c.training.seq_len;
  ASSERT_EQ(result["training"]["tokens_per_step"], tokens);
  EnergyReading reading;
  reading.joules = 12.0;
  reading.steps = 4;
  reading.seconds = 2.0;
  reading.source = "a synthetic counter";
  set_energy_fields(result["summary"], reading, static_cast<double>(c.training.tokens_per_step()));
  EXPECT_NEAR(result["summary"]["tokens_per_joule"].get<double>(), tokens * 4 / 12.0, 1e-9);
  EXPECT_NO_THROW(validate_result_json(result));

  auto one_micro_batch = result;
  set_energy_fields(one_micro_batch["summary"], reading, static_cast<double>(c.training.batch_size * c.training.seq_len));
  try {
    validate_result_json(one_micro_batch);
    ADD_FAILURE() << "the checker accepted tokens_per_joule counted over one micro-batch";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("but training.tokens_per_step is " + std::to_string(tokens)),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tt
