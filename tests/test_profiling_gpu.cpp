// Built-in profiling on a GPU: the trace holds kernel events and the hotspot table adds up to the
// profiled GPU time. Skips without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/train/profiling.h"
#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/trainer.h"
#include "tests/helpers.h"

namespace tt {
namespace {

TEST(ProfilingGpu, TraceHasKernelsAndHotspotsAddUpToGpuTime) {
  TT_REQUIRE_GPU();
  RunConfig c = testing::smoke_config();
  c.training.device = "cuda";
  const std::string trace = ::testing::TempDir() + "/tt_profile_gpu/v2.trace.json";
  std::filesystem::remove(trace);
  Trainer trainer(stages::v2_fused(), c, torch::Device(torch::kCUDA, 0));
  std::ostringstream log;
  RunExtras extras;
  extras.profile = {2, trace};
  const auto result = run_training(trainer, extras, log);
  EXPECT_NO_THROW(validate_result_json(result));
  EXPECT_EQ(result["step_ms"].size(), static_cast<size_t>(c.training.num_steps));

  const auto& p = result.at("profile");
  EXPECT_EQ(p["basis"], "gpu_time");
  const int64_t kernels = p["gpu_kernels"];
  EXPECT_GT(kernels, 0) << log.str();
  EXPECT_DOUBLE_EQ(p["kernels_per_step"].get<double>(), static_cast<double>(kernels) / 2.0);
  const double total = p["total_gpu_us"];
  EXPECT_GT(total, 0.0);
  double sum = 0, shares = 0;
  int64_t kernel_calls = 0;
  for (const auto& h : p["hotspots"]) {
    const std::string kind = h["kind"];
    EXPECT_TRUE(kind == "kernel" || kind == "memcpy" || kind == "memset") << kind;
    sum += h["total_us"].get<double>();
    shares += h["share"].get<double>();
    if (kind == "kernel") kernel_calls += h["calls"].get<int64_t>();
  }
  EXPECT_NEAR(sum, total, 1e-9 * total);
  EXPECT_NEAR(shares, 1.0, 1e-9);
  EXPECT_EQ(kernel_calls, kernels);

  std::ifstream in(trace);
  ASSERT_TRUE(in) << trace;
  const auto json = nlohmann::json::parse(in);
  ASSERT_TRUE(json.contains("traceEvents") && json["traceEvents"].is_array());
  int64_t kernel_events = 0;
  bool saw_forward = false;
  for (const auto& e : json["traceEvents"]) {
    if (e.value("cat", "") == "kernel") ++kernel_events;
    saw_forward = saw_forward || e.value("name", "") == "forward";
  }
  EXPECT_GT(kernel_events, 0);
  EXPECT_TRUE(saw_forward) << "the forward range is missing from the trace";
}

}  // namespace
}  // namespace tt
