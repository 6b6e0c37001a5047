// Built-in profiling on the CPU: the hotspot arithmetic on synthetic events, a real `--profile` run's
// trace and table, the flags, and that named ranges reach NVTX/ROCTX on GPU builds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <torch/csrc/profiler/stubs/base.h>

#include "apps/cli/stage_cli.h"
#include "apps/train/profiling.h"
#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/trainer.h"
#include "tests/helpers.h"

namespace tt {
namespace {

double sum_of(const nlohmann::json& hotspots, const char* key) {
  double total = 0;
  for (const auto& h : hotspots) total += h.at(key).get<double>();
  return total;
}

TEST(Profiling, GpuHotspotsAddUpToTheProfiledGpuTime) {
  const std::vector<ProfiledEvent> events = {
      {"gemm", EventKind::kKernel, 0, 0, 10'000},       {"gemm", EventKind::kKernel, 0, 20'000, 30'000},
      {"gemm", EventKind::kKernel, 0, 40'000, 50'000},  {"softmax", EventKind::kKernel, 0, 60'000, 100'000},
      {"Memcpy HtoD", EventKind::kMemcpy, 0, 0, 5'000}, {"aten::mm", EventKind::kCpuOp, 1, 0, 1'000'000},
  };
  const auto p = summarize_profile(events, 2, /*gpu=*/true);
  EXPECT_EQ(p["basis"], "gpu_time");
  EXPECT_DOUBLE_EQ(p["total_gpu_us"].get<double>(), 75.0);  // CPU ops are not GPU time
  EXPECT_DOUBLE_EQ(p["total_us"].get<double>(), 75.0);
  EXPECT_DOUBLE_EQ(p["gpu_time_per_step_ms"].get<double>(), 0.0375);
  // The copy ran during the first GEMM (two streams): busy counts that time once, the sum twice.
  EXPECT_DOUBLE_EQ(p["gpu_busy_per_step_ms"].get<double>(), 0.035);
  EXPECT_DOUBLE_EQ(p["gpu_concurrent_per_step_ms"].get<double>(), 0.0025);
  EXPECT_EQ(p["gpu_kernels"], 4);  // memcpy is GPU time but not a kernel launch
  EXPECT_DOUBLE_EQ(p["kernels_per_step"].get<double>(), 2.0);
  const auto& h = p["hotspots"];
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0]["name"], "softmax");  // largest total first
  EXPECT_EQ(h[1]["name"], "gemm");
  EXPECT_EQ(h[1]["calls"], 3);
  EXPECT_DOUBLE_EQ(h[1]["total_us"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(h[1]["mean_us"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(h[1]["share"].get<double>(), 30.0 / 75.0);
  EXPECT_EQ(h[2]["kind"], "memcpy");
  EXPECT_DOUBLE_EQ(sum_of(h, "total_us"), p["total_gpu_us"].get<double>());
  EXPECT_NEAR(sum_of(h, "share"), 1.0, 1e-12);

  const std::string table = format_hotspots(p, 2);
  EXPECT_NE(table.find("4 kernels (2.0 per step)"), std::string::npos) << table;
  EXPECT_NE(table.find("softmax"), std::string::npos) << table;
  EXPECT_NE(table.find("1 more"), std::string::npos) << table;
}

// Data parallel: NCCL's kernels (RCCL keeps their names) are marked as communication and summed per step;
// they still count as kernels and as GPU time.
TEST(Profiling, CollectiveKernelsAreNamedCommunication) {
  const std::vector<ProfiledEvent> events = {
      {"gemm", EventKind::kKernel, 0, 0, 40'000},
      {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", EventKind::kKernel, 0, 0, 6'000},
      {"ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)", EventKind::kKernel, 0, 10'000, 12'000},
      {"Memcpy DtoD", EventKind::kMemcpy, 0, 0, 1'000},
  };
  const auto p = summarize_profile(events, 2, /*gpu=*/true);
  EXPECT_DOUBLE_EQ(p["communication_ms_per_step"].get<double>(), 0.004);  // (6 + 2) us over 2 steps
  EXPECT_EQ(p["gpu_kernels"], 3);
  EXPECT_DOUBLE_EQ(p["total_gpu_us"].get<double>(), 49.0);
  std::map<std::string, std::string> kinds;
  for (const auto& h : p["hotspots"]) kinds[h["name"].get<std::string>().substr(0, 4)] = h["kind"];
  EXPECT_EQ(kinds["gemm"], "kernel");
  EXPECT_EQ(kinds["nccl"], "comm");
  EXPECT_EQ(kinds["Memc"], "memcpy");
  EXPECT_NE(format_hotspots(p, 5).find("comm"), std::string::npos);
  // Without a collective the figure is 0, and on the CPU (no GPU time) null.
  EXPECT_DOUBLE_EQ(summarize_profile({events[0]}, 1, true)["communication_ms_per_step"].get<double>(), 0.0);
  EXPECT_TRUE(summarize_profile({{"aten::mm", EventKind::kCpuOp, 1, 0, 10}}, 1, false)["communication_ms_per_step"]
                  .is_null());
}

TEST(Profiling, CpuHotspotsUseSelfTimeOfNestedOps) {
  const std::vector<ProfiledEvent> events = {
      {"aten::linear", EventKind::kCpuOp, 1, 0, 100},  // encloses matmul
      {"aten::matmul", EventKind::kCpuOp, 1, 10, 60},  // encloses mm
      {"aten::mm", EventKind::kCpuOp, 1, 20, 30},
      {"aten::add", EventKind::kCpuOp, 1, 100, 150},  // starts as linear ends: a sibling
      {"aten::add", EventKind::kCpuOp, 2, 0, 50},     // another thread
  };
  const auto p = summarize_profile(events, 1, /*gpu=*/false);
  EXPECT_EQ(p["basis"], "cpu_self_time");
  EXPECT_TRUE(p["total_gpu_us"].is_null());
  EXPECT_TRUE(p["kernels_per_step"].is_null());
  EXPECT_EQ(p["gpu_kernels"], 0);
  std::map<std::string, double> self_ns;
  for (const auto& h : p["hotspots"]) self_ns[h["name"]] = h["total_us"].get<double>() * 1e3;
  EXPECT_DOUBLE_EQ(self_ns["aten::linear"], 50);  // 100 - 50 in matmul
  EXPECT_DOUBLE_EQ(self_ns["aten::matmul"], 40);  // 50 - 10 in mm
  EXPECT_DOUBLE_EQ(self_ns["aten::mm"], 10);
  EXPECT_DOUBLE_EQ(self_ns["aten::add"], 100);               // 50 on each thread
  EXPECT_DOUBLE_EQ(p["total_us"].get<double>() * 1e3, 200);  // the time covered by top-level ops
  EXPECT_THROW(summarize_profile(events, 0, false), std::invalid_argument);
}

TEST(Profiling, TraceGoesNextToTheResult) {
  EXPECT_EQ(trace_path_for("results/run_1/v1_baseline.json"), "results/run_1/v1_baseline.trace.json");
  EXPECT_EQ(trace_path_for("out.json"), "out.trace.json");
}

TEST(Profiling, CpuRunWritesATraceAndAHotspotTableOutsideTheMeasurement) {
  RunConfig c = testing::smoke_config();
  const std::string trace = ::testing::TempDir() + "/tt_profile_cpu/v2.trace.json";
  std::filesystem::remove(trace);
  Trainer trainer(stages::v2_fused(), c, torch::kCPU);
  std::ostringstream log;
  RunExtras extras;
  extras.profile = {2, trace};
  const auto result = run_training(trainer, extras, log);
  EXPECT_NO_THROW(validate_result_json(result));
  // The profiled steps are extra: the measured statistics keep their sizes.
  EXPECT_EQ(result["step_ms"].size(), static_cast<size_t>(c.training.num_steps));
  EXPECT_EQ(result["losses"].size(), static_cast<size_t>(c.training.warmup_steps + c.training.num_steps));

  const auto& p = result.at("profile");
  EXPECT_EQ(p["steps"], 2);
  EXPECT_EQ(p["trace"], trace);
  EXPECT_EQ(p["basis"], "cpu_self_time");  // no GPU kernels on the CPU: ATen ops by self time
  EXPECT_TRUE(p["kernels_per_step"].is_null());
  ASSERT_FALSE(p["hotspots"].empty());
  EXPECT_NEAR(sum_of(p["hotspots"], "total_us"), p["total_us"].get<double>(), 1e-6 * p["total_us"].get<double>());
  bool saw_aten = false;
  for (const auto& h : p["hotspots"]) saw_aten = saw_aten || h["name"].get<std::string>().rfind("aten::", 0) == 0;
  EXPECT_TRUE(saw_aten) << p["hotspots"].dump();
  EXPECT_NE(log.str().find("[profile] 2 extra steps after the measured ones"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("trace written to " + trace), std::string::npos) << log.str();

  std::ifstream in(trace);
  ASSERT_TRUE(in) << trace;
  const auto json = nlohmann::json::parse(in);  // throws (fails the test) on an invalid trace
  ASSERT_TRUE(json.contains("traceEvents") && json["traceEvents"].is_array());
  std::set<std::string> names;
  for (const auto& e : json["traceEvents"])
    if (e.contains("name") && e["name"].is_string()) names.insert(e["name"].get<std::string>());
  for (const char* range : {"forward", "backward", "optimizer", "layer"})
    EXPECT_TRUE(names.count(range)) << "ScopedRange \"" << range << "\" is missing from the trace";
  EXPECT_TRUE(names.count("aten::mm") || names.count("aten::addmm") || names.count("aten::matmul"));
}

TEST(Profiling, Flags) {
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"--config", std::string(TT_SOURCE_DIR) + "/configs/smoke.json"});
    return parse_command_line("v1_baseline", args).options;
  };
  EXPECT_EQ(parse({}).profile_steps, 0);
  EXPECT_EQ(parse({"--profile"}).profile_steps, kDefaultProfileSteps);
  EXPECT_EQ(parse({"--profile", "--profile-steps", "5"}).profile_steps, 5);
  try {
    parse({"--profile-steps", "5"});
    ADD_FAILURE() << "--profile-steps without --profile was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-steps needs --profile"), std::string::npos) << e.what();
  }
  try {
    parse({"--profile", "--profile-steps", "0"});
    ADD_FAILURE() << "--profile-steps 0 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-steps 0 is not allowed"), std::string::npos) << e.what();
  }
}

// What this checks is the precondition of ScopedRange's NVTX/ROCTX ranges: that LibTorch's profiler stubs are
// live in a GPU build (only a vendor tool can observe the ranges themselves). ScopedRange's Kineto side is
// checked by CpuRunWritesATraceAndAHotspotTableOutsideTheMeasurement: its ranges are in the trace.
TEST(ScopedRange, ProfilerStubsThatCarryTheRangesAreLiveOnGpuBuilds) {
#if defined(TT_BACKEND_CUDA) || defined(TT_BACKEND_HIP)
  // The ranges go through LibTorch's CUDA profiler stubs, registered by libtorch_cuda / libtorch_hip.
  // Disabled stubs would silently drop every range nsys, ncu and rocprofv3 show.
  EXPECT_TRUE(torch::profiler::impl::cudaStubs()->enabled());
#else
  GTEST_SKIP() << "CPU-only build: no NVTX/ROCTX ranges expected";
#endif
}

}  // namespace
}  // namespace tt
