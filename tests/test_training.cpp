#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/train/run_result.h"
#include "apps/results/flops.h"
#include "apps/train/trainer.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::smoke_config;
using testing::train_result;

std::string write_repetitive_text() {
  const std::string path = ::testing::TempDir() + "/repetitive.txt";
  std::ofstream out(path);
  for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  return path;
}

TEST(Training, LossFallsOnALearnableTask) {
  RunConfig c = smoke_config();
  c.training.data = write_repetitive_text();
  c.training.num_steps = 40;
  c.training.warmup_steps = 0;
  std::ostringstream log;
  auto result = train_result(stages::v1_baseline(), c, torch::kCPU, log);
  const double first = result["summary"]["first_loss"], last = result["summary"]["final_loss"];
  EXPECT_NEAR(first, std::log(256.0), 0.2);
  EXPECT_LT(last, 0.5 * first) << log.str();
}

TEST(Training, SameSeedGivesIdenticalLosses) {
  for (const auto& spec : stages::all()) {
    RunConfig c = smoke_config();
    std::ostringstream log;
    auto a = train_result(spec, c, torch::kCPU, log)["losses"];
    auto b = train_result(spec, c, torch::kCPU, log)["losses"];
    EXPECT_EQ(a, b) << spec.name;
    c.training.seed = 43;
    auto other = train_result(spec, c, torch::kCPU, log)["losses"];
    EXPECT_NE(a, other) << spec.name;
  }
}

TEST(Training, GraphedStageRunsEagerlyOnTheCpuAndSaysSo) {
  std::ostringstream log;
  auto result = train_result(stages::v4_ultra(), smoke_config(), torch::kCPU, log);
  EXPECT_NO_THROW(validate_result_json(result));
  const std::string step = result["stage"]["components"]["step"];
  EXPECT_NE(step.find("eager"), std::string::npos) << step;
  EXPECT_NE(step.find("graphs need a GPU"), std::string::npos) << step;
  EXPECT_TRUE(result["summary"]["forward_ms"].is_object());  // eager steps time their phases
}

TEST(Training, ResultJsonValidatesAndIsComplete) {
  RunConfig c = smoke_config();
  c.training.log_every = 3;
  // Two micro-batches per step: a rate computed from batch_size alone (instead of the rows of all
  // micro-batches) would then be off by 2x and fail the arithmetic checks below.
  c.training.grad_accum_steps = 2;
  std::ostringstream log;
  auto result = train_result(stages::v2_fused(), c, torch::kCPU, log);
  EXPECT_NO_THROW(validate_result_json(result));
  {
    // The summary's rates are the median step time's arithmetic, as the result file documents them
    // (relative 1e-9: the same double operations, possibly in another order).
    const auto& s = result["summary"];
    const auto& t = result["training"];
    const double median = s["step_ms"]["median"].get<double>();
    const double rows = t["batch_size"].get<double>() * t["grad_accum_steps"].get<double>();
    const double tokens = t["tokens_per_step"].get<double>();
    ASSERT_GT(median, 0.0);
    EXPECT_EQ(t["grad_accum_steps"].get<int64_t>(), 2);
    EXPECT_DOUBLE_EQ(tokens, rows * c.training.seq_len);
    auto expect_rel = [](double actual, double expected, const char* what) {
      EXPECT_NEAR(actual, expected, 1e-9 * std::abs(expected)) << what;
    };
    expect_rel(s["tokens_per_s"].get<double>(), 1000.0 * tokens / median, "tokens_per_s");
    expect_rel(s["samples_per_s"].get<double>(), 1000.0 * rows / median, "samples_per_s");
    const double tflop = s["model_tflop_per_step"].get<double>();
    expect_rel(tflop, training_flops_per_step(c.model, static_cast<int64_t>(rows), c.training.seq_len) / 1e12,
               "model_tflop_per_step");
    expect_rel(s["achieved_tflops"].get<double>(), tflop / (median / 1e3), "achieved_tflops");
  }
  EXPECT_EQ(result["losses"].size(), static_cast<size_t>(c.training.warmup_steps + c.training.num_steps));
  EXPECT_EQ(result["step_ms"].size(), static_cast<size_t>(c.training.num_steps));
  EXPECT_EQ(result["stage"]["name"], "v2_fused");
  EXPECT_EQ(result["config"]["model"]["hidden_dim"], 64);
  EXPECT_TRUE(result["summary"]["mfu"].is_null());  // no peak FLOP/s for a CPU: no guess
  EXPECT_GT(result["summary"]["step_ms"]["median"].get<double>(), 0.0);
  EXPECT_LE(result["summary"]["step_ms"]["p10"].get<double>(), result["summary"]["step_ms"]["p90"].get<double>());
  EXPECT_NE(log.str().find("step 3/12 | loss"), std::string::npos) << log.str();

  auto broken = result;
  broken["summary"].erase("tokens_per_s");
  EXPECT_THROW(validate_result_json(broken), std::runtime_error);
  broken = result;
  broken["schema_version"] = 99;
  EXPECT_THROW(validate_result_json(broken), std::runtime_error);
}

// tt::clip_grad_norm against LibTorch's torch::nn::utils::clip_grad_norm_ on the same real gradients, with
// the limit below the global norm (clipping scales every gradient by limit / norm) and above it (nothing
// changes: ours clamps the scale at exactly 1, so the gradients must be bitwise unchanged).
TEST(Training, GradientClippingBoundsTheGlobalNorm) {
  RunConfig c = smoke_config();
  Trainer trainer(stages::v1_baseline(), c, torch::kCPU);
  auto tokens = testing::random_tokens(2, 17, 256, 3);
  trainer.forward_backward(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16));
  const auto& params = trainer.optimizer().parameters();
  auto global_norm = [](const std::vector<torch::Tensor>& ps) {
    double sq = 0;
    for (const auto& p : ps) sq += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
    return std::sqrt(sq);
  };
  const double norm = global_norm(params);
  ASSERT_GT(norm, 1e-2) << "the limits below must straddle the global norm";
  for (double limit : {1e-3, 0.5 * norm, 2 * norm, 1e3}) {
    std::vector<torch::Tensor> ours, theirs, before;
    for (const auto& p : params) {
      ours.push_back(p.detach().clone().requires_grad_(true));
      ours.back().mutable_grad() = p.grad().clone();
      theirs.push_back(p.detach().clone().requires_grad_(true));
      theirs.back().mutable_grad() = p.grad().clone();
      before.push_back(p.grad().clone());
    }
    clip_grad_norm(ours, limit);
    const double torch_norm = torch::nn::utils::clip_grad_norm_(theirs, limit);
    EXPECT_NEAR(torch_norm, norm, 1e-6 * norm) << "LibTorch's pre-clip norm; limit " << limit;
    for (size_t i = 0; i < ours.size(); ++i)
      EXPECT_LT(testing::rel_error(ours[i].grad(), theirs[i].grad()), 1e-6) << "limit " << limit << ", tensor " << i;
    if (limit < norm) {
      EXPECT_NEAR(global_norm(ours), limit, 1e-5 * limit) << "clipped to the limit";
    } else {
      for (size_t i = 0; i < ours.size(); ++i)
        EXPECT_TRUE(torch::equal(ours[i].grad(), before[i])) << "under the limit " << limit << ": tensor " << i
                                                             << " changed";
    }
  }
}

TEST(Results, SpreadAndAtomicWrite) {
  auto s = spread({5, 1, 4, 2, 3});
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.p10, 1.4);
  EXPECT_DOUBLE_EQ(s.p90, 4.6);
  EXPECT_THROW(spread({}), std::runtime_error);
  const std::string path = ::testing::TempDir() + "/sub/result.json";
  std::filesystem::remove(path);
  write_json_atomically(path, {{"a", 1}}, false);
  EXPECT_EQ(read_json_file(path)["a"], 1);
  EXPECT_THROW(write_json_atomically(path, {{"a", 2}}, false), std::runtime_error);
  write_json_atomically(path, {{"a", 2}}, true);
  EXPECT_EQ(read_json_file(path)["a"], 2);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Flops, MatchesHandCountAndPeakTable) {
  ModelConfig m;  // workshop model
  // Per token forward: 2 * (8 * (2*512^2 + 2*512*256 + 3*512*2048) + 512*1000) + 4 * 8 * 128 * 512.
  const double per_token = 2.0 * (8.0 * (2 * 512.0 * 512 + 2 * 512.0 * 256 + 3 * 512.0 * 2048) + 512.0 * 1000) +
                           4.0 * 8 * 128 * 512;
  EXPECT_DOUBLE_EQ(training_flops_per_step(m, 8, 128), 3 * per_token * 8 * 128);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 80GB HBM3", Precision::kBf16)->tflops, 989.4);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 PCIe", Precision::kFp32)->tflops, 51.2);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H200", Precision::kFp32)->tflops, 66.9);
  EXPECT_DOUBLE_EQ(peak_flops("AMD Instinct MI300X", Precision::kBf16)->tflops, 1307.4);
  EXPECT_TRUE(peak_flops("AMD Instinct MI250X", Precision::kBf16).has_value());
  EXPECT_TRUE(peak_flops("NVIDIA A100-SXM4-80GB", Precision::kBf16).has_value());
  EXPECT_TRUE(peak_flops("AMD Instinct MI325X", Precision::kFp32).has_value());
  EXPECT_FALSE(peak_flops("NVIDIA GeForce RTX 4090", Precision::kBf16).has_value());
}

}  // namespace
}  // namespace tt
