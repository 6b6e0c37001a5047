// The debugging exercise on the CPU (models/stage.h, Pitfall): each pitfall does what it claims where a CPU
// can show it, the catalog and the command line refuse what they should, and the energy reader says why it
// has no figure.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "apps/cli/stage_cli.h"
#include "apps/train/run_result.h"
#include "apps/train/energy.h"
#include "tests/helpers.h"
#include "tests/teaching_checks.h"

namespace tt {
namespace {

using testing::smoke_config;
using testing::train_result;

StageSpec v3_with(Pitfall p) { return stages::with_pitfall(stages::v3_custom(), p); }

TEST(Teaching, MissingInitMakesTheInitialLossExplode) {
  const RunConfig c = testing::wide_smoke_config();
  const double ln_vocab = std::log(static_cast<double>(c.model.vocab_size));
  const double loss = testing::initial_loss(v3_with(Pitfall::kMissingInit), c, torch::kCPU);
  EXPECT_GT(loss, 10 * ln_vocab) << "LibTorch's default init should put the initial loss far above ln(vocab)";
  const double shipped = testing::initial_loss(v3_with(Pitfall::kNone), c, torch::kCPU);
  EXPECT_LT(std::abs(shipped - ln_vocab), 0.5) << "v3 as shipped starts near ln(vocab) = " << ln_vocab;
}

TEST(Teaching, NonContiguousAndNaiveSwigluStagesComputeV3sLossAndGradients) {
  testing::expect_same_as_v3(Pitfall::kNonContiguous, torch::kCPU, 1e-5);
  testing::expect_same_as_v3(Pitfall::kNaiveSwiglu, torch::kCPU, 1e-5);
}

TEST(Teaching, NoSyncTimingRecordsBothTimers) {
  RunConfig c = smoke_config();
  c.training.num_steps = 3;
  std::ostringstream log;
  const auto result = train_result(v3_with(Pitfall::kNoSyncTiming), c, torch::kCPU, log);
  validate_result_json(result);
  EXPECT_EQ(result["stage"]["pitfall"]["name"], "no-sync-timing");
  const auto& s = result["summary"];
  ASSERT_TRUE(s.contains("host_clock_ms")) << s.dump(2);
  for (const char* phase : {"step_ms", "forward_ms", "backward_ms", "optimizer_ms"}) {
    ASSERT_TRUE(s[phase].is_object()) << "device/event timer for " << phase;
    ASSERT_TRUE(s["host_clock_ms"][phase].is_object()) << "host timer for " << phase;
    EXPECT_GT(s["host_clock_ms"][phase]["median"].get<double>(), 0.0) << phase;
  }
  // On the CPU the work is synchronous: both timers read the same clock at the same marks.
  EXPECT_DOUBLE_EQ(s["host_clock_ms"]["step_ms"]["median"].get<double>(), s["step_ms"]["median"].get<double>());
  const auto plain = train_result(stages::v3_custom(), c, torch::kCPU, log);
  EXPECT_FALSE(plain["summary"].contains("host_clock_ms"));
  EXPECT_FALSE(plain["stage"].contains("pitfall")) << "a run outside the exercise records no pitfall";
}

TEST(Teaching, PitfallCatalogAndCommandLineRefuseWhatTheyShould) {
  ASSERT_EQ(stages::pitfalls().size(), 5u);
  EXPECT_EQ(stages::pitfall_names(), "missing-init, non-contiguous, no-sync-timing, naive-swiglu, none");
  try {
    stages::parse_pitfall("slow");
    ADD_FAILURE() << "parse_pitfall accepted 'slow'";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--pitfall slow is not allowed: it must be one of missing-init"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(stages::with_pitfall(stages::v1_baseline(), Pitfall::kNone), ConfigError);
  EXPECT_EQ(v3_with(Pitfall::kNonContiguous).activation, ActivationKind::kOurKernelStrided);
  EXPECT_EQ(to_json(v3_with(Pitfall::kNaiveSwiglu))["pitfall"]["name"], "naive-swiglu");
  EXPECT_EQ(to_json(v3_with(Pitfall::kNone))["pitfall"]["name"], "none");

  const auto parsed = parse_command_line("v3_custom", {"--pitfall", "naive-swiglu"});
  ASSERT_TRUE(parsed.options.pitfall.has_value());
  EXPECT_EQ(*parsed.options.pitfall, Pitfall::kNaiveSwiglu);
  EXPECT_THROW(parse_command_line("v3_custom", {"--pitfall", "bogus"}), ConfigError);
}

TEST(Teaching, EnergyIsNullWithANoteWithoutAGpu) {
  EnergyMeter cpu(torch::kCPU);
  EXPECT_FALSE(cpu.available());
  cpu.start();
  const EnergyReading reading = cpu.stop();
  EXPECT_FALSE(reading.joules.has_value());
  EXPECT_NE(reading.note.find("energy not measured: the run is on the CPU"), std::string::npos) << reading.note;

  // A GPU device whose NVML cannot be loaded: the meter says which library it tried (CUDA builds).
  EnergyMeter missing(torch::Device(torch::kCUDA, 0), "libtt-no-such-nvml.so.1");
  EXPECT_FALSE(missing.available());
  EXPECT_NE(missing.note().find("energy not measured"), std::string::npos) << missing.note();

  RunConfig c = smoke_config();
  c.training.num_steps = 2;
  std::ostringstream log;
  const auto result = train_result(stages::v3_custom(), c, torch::kCPU, log);
  EXPECT_TRUE(result["summary"]["energy_j_per_step"].is_null());
  EXPECT_TRUE(result["summary"]["tokens_per_joule"].is_null());
  EXPECT_NE(result["summary"]["energy_note"].get<std::string>().find("CPU"), std::string::npos);
}

}  // namespace
}  // namespace tt
