// The debugging exercise's summary (apps/compare/exercise.h) on synthetic results: the noise band from the
// repeats, a difference inside it read as no speed effect and one outside it as slower, and each pitfall's
// own figure.
#include <gtest/gtest.h>

#include "apps/compare/compare.h"
#include "apps/compare/exercise.h"
#include "apps/results/result_file.h"

namespace tt::compare {
namespace {

std::string fixture(const std::string& name) { return std::string(TT_SOURCE_DIR) + "/tests/fixtures/compare/" + name; }

TEST(Exercise, NoiseBandIsTheLargestSpreadOfARepeatedStage) {
  EXPECT_DOUBLE_EQ(relative_spread({10.0}), 0.0);
  EXPECT_NEAR(relative_spread({9.0, 11.0}), 0.2, 1e-12);
  EXPECT_FALSE(noise_band({{10.0}, {20.0}}).has_value()) << "one run each: no band";
  const auto band = noise_band({{9.0, 11.0}, {20.0, 20.2}, {5.0}});
  ASSERT_TRUE(band.has_value());
  EXPECT_NEAR(*band, 0.2, 1e-12);
}

// Runs that give the GPU the same work (GPU time within its band of the reference's) differ in wall time by host
// noise only, so the wall-time band covers their spread too: here two tight repeats per stage (1%) but 20%
// between the stages, as measured on an H100 in fp32. A stage with more GPU work does not widen it.
TEST(Exercise, WallBandCoversEveryRunWithTheReferencesGpuWork) {
  const std::vector<std::vector<double>> wall = {{9.0, 9.05}, {10.9, 10.95}, {20.0, 20.1}};
  const std::vector<std::vector<double>> gpu = {{6.75, 6.76}, {6.75, 6.78}, {12.0, 12.0}};
  const auto gpu_band = noise_band(gpu);
  ASSERT_TRUE(gpu_band.has_value());
  const auto band = wall_band_for(wall, gpu, /*reference=*/1, gpu_band);
  ASSERT_TRUE(band.has_value());
  EXPECT_NEAR(*band, relative_spread({9.0, 9.05, 10.9, 10.95}), 1e-12);
  EXPECT_EQ(speed_verdict(9.025, 10.925, band), "no speed effect (within noise)");
  EXPECT_NEAR(*noise_band(wall), 0.05 / 9.025, 1e-12) << "the repeats alone would have called 1.21x an effect";
  EXPECT_EQ(speed_verdict(9.025, 10.925, noise_band(wall)), "1.21x faster");
  // Without a GPU band (no profile) the wall band is the repeats' alone.
  EXPECT_EQ(wall_band_for(wall, gpu, 1, std::nullopt), noise_band(wall));
}

TEST(Exercise, VerdictInsideTheBandIsNoSpeedEffect) {
  EXPECT_EQ(speed_verdict(10.4, 10.0, 0.05), "no speed effect (within noise)");
  EXPECT_EQ(speed_verdict(9.6, 10.0, 0.05), "no speed effect (within noise)");
  EXPECT_EQ(speed_verdict(10.0, 10.0, 0.0), "no speed effect (within noise)");
}

TEST(Exercise, VerdictOutsideTheBandNamesTheDirection) {
  EXPECT_EQ(speed_verdict(13.2, 10.0, 0.05), "1.32x slower");
  EXPECT_EQ(speed_verdict(8.0, 10.0, 0.05), "1.25x faster");
  EXPECT_EQ(speed_verdict(10.4, 10.0, std::nullopt), "1.04x slower (noise unknown: one run each)");
}

// One run of the exercise: v3 with `pitfall`, wall median `wall_ms`, a GPU profile of `gpu_ms` per step of
// which `swiglu_ms` in SwiGLU kernels and `naive_ms` in the naive ones.
Result run(const std::string& pitfall, int repeat, double wall_ms, double gpu_ms, double swiglu_ms = 0.1,
           double naive_ms = 0, double first_loss = 7.04) {
  nlohmann::json j = read_json_file(fixture("v3_custom.json"));
  j["stage"]["pitfall"] = {{"name", pitfall}, {"lesson", "lesson of " + pitfall}};
  j["system"]["device"] = "cuda:0";
  j["summary"]["step_ms"]["median"] = wall_ms;
  j["summary"]["first_loss"] = first_loss;
  if (pitfall == "no-sync-timing") j["summary"]["host_clock_ms"] = {{"step_ms", {{"median", 1.25}}}};
  const double steps = 10;
  nlohmann::json hotspots = nlohmann::json::array();
  auto add = [&](const std::string& name, double ms) {
    if (ms > 0) hotspots.push_back({{"name", name}, {"kind", "kernel"}, {"calls", 10}, {"total_us", ms * 1e3 * steps}});
  };
  add("void tt::kernels::(anonymous namespace)::swiglu_forward_kernel<float>(tt::kernels::SwigluParams)", swiglu_ms);
  add("void tt::kernels::(anonymous namespace)::naive_matmul_kernel<float>(float const*)", naive_ms);
  add("nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNN", gpu_ms - swiglu_ms - naive_ms);
  j["profile"] = {{"basis", "gpu_time"}, {"steps", steps}, {"gpu_time_per_step_ms", gpu_ms}, {"hotspots", hotspots}};
  return {"debugging/round" + std::to_string(repeat) + "_" + pitfall + ".json", "", j};
}

TEST(Exercise, SummaryJudgesByGpuTimeWithinTheBandAndShowsEachPitfallsFigure) {
  // Wall time is launch noise (host-bound): ±30 % between repeats. GPU time is steady: ±2 %.
  std::vector<Result> results;
  for (int repeat : {1, 2}) {
    const double w = repeat == 1 ? 8.0 : 10.5;   // the wall clock's noise
    const double g = repeat == 1 ? 1.00 : 1.02;  // the GPU's
    results.push_back(run("missing-init", repeat, w, 2.0 * g, 0.1, 0, 478.79));
    results.push_back(run("non-contiguous", repeat, w * 1.1, 2.6 * g, 0.7));
    results.push_back(run("no-sync-timing", repeat, w * 0.95, 2.01 * g));
    results.push_back(run("naive-swiglu", repeat, 90.0 * g, 40.0 * g, 0.1, 37.0 * g));
    results.push_back(run("none", repeat, w * 1.2, 2.0 * g));
  }
  assign_labels(results);
  const std::string text = format_exercise(build_comparison(results));
  EXPECT_NE(text.find("2 runs of each stage"), std::string::npos) << text;
  // The band: GPU 2 % (every stage's repeats differ by 2 %); wall 51.5 %: the six runs of missing-init,
  // no-sync-timing and none have v3's GPU time, and their wall times span 7.6 to 12.6 ms (mean 9.71).
  EXPECT_NE(text.find("GPU time ±2.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("wall time ±51.5%"), std::string::npos) << text;
  // The table prints "noise" for a speed inside the band, never the wall clock's 1.20x "speedup".
  const size_t row = text.find("\nmissing-init ");
  ASSERT_NE(row, std::string::npos) << text;
  const std::string missing_init_row = text.substr(row + 1, text.find('\n', row + 1) - row - 1);
  EXPECT_EQ(missing_init_row.find("1.20x"), std::string::npos) << missing_init_row;
  EXPECT_NE(missing_init_row.find("noise"), missing_init_row.rfind("noise")) << "both speeds: " << missing_init_row;
  auto block = [&](const std::string& pitfall) {
    const size_t at = text.find("  " + pitfall + ": ");
    EXPECT_NE(at, std::string::npos) << pitfall << "\n" << text;
    return text.substr(at, text.find("what it teaches", at) - at);
  };
  // Same kernels: inside the band on both clocks, though wall time alone read 1.20x "faster".
  EXPECT_NE(block("missing-init")
                .find("GPU time: no speed effect (within noise); wall time: no speed effect (within "
                      "noise)"),
            std::string::npos)
      << text;
  EXPECT_NE(block("missing-init").find("first loss 478.79 against 7.04"), std::string::npos) << text;
  EXPECT_NE(block("no-sync-timing").find("GPU time: no speed effect (within noise)"), std::string::npos) << text;
  EXPECT_NE(block("no-sync-timing").find("host clock without a sync 1.250 ms"), std::string::npos) << text;
  // The strided kernel: 1.30x the GPU time, outside a 2 % band; the wall clock cannot tell.
  EXPECT_NE(block("non-contiguous").find("GPU time: 1.30x slower; wall time: no speed effect (within noise)"),
            std::string::npos)
      << text;
  EXPECT_NE(block("non-contiguous").find("SwiGLU kernels' GPU time 0.700 ms/step against 0.100 ms/step"),
            std::string::npos)
      << text;
  EXPECT_NE(block("naive-swiglu").find("GPU time: 20.00x slower; wall time: 8.19x slower"), std::string::npos) << text;
  EXPECT_NE(block("naive-swiglu").find("the naive kernels take 92.5% of the GPU time"), std::string::npos) << text;
}

TEST(Exercise, OneRunEachStatesThatTheNoiseIsUnknown) {
  std::vector<Result> results = {run("non-contiguous", 1, 11.0, 2.6, 0.7), run("none", 1, 10.0, 2.0)};
  assign_labels(results);
  const std::string text = format_exercise(build_comparison(results));
  EXPECT_NE(text.find("GPU time unknown (one run each)"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU time: 1.30x slower (noise unknown: one run each)"), std::string::npos) << text;
}

}  // namespace
}  // namespace tt::compare
