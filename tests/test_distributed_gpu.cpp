// Data parallel on GPUs (label `gpu`). With one GPU: a world of one NCCL rank trains exactly like a plain
// run, in-process and through scripts/launch.sh, and bad starts are refused. With two GPUs or more (skipped
// otherwise, saying so): two ranks equal one rank with the same global batch, their weights stay
// identical, differing configs are named, a killed rank ends the run without a result file, and a signal to
// one rank stops every rank after the same step.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/checkpointing.h"
#include "apps/train/data_parallel_step.h"
#include "apps/train/distributed.h"
#include "models/checkpoint.h"
#include "tests/helpers.h"
#include "tests/ports.h"

namespace tt {
namespace {

using testing::free_port;

namespace fs = std::filesystem;

#define TT_REQUIRE_NCCL_GPUS(n)                                                                              \
  do {                                                                                                       \
    if (!nccl_available()) GTEST_SKIP() << "this build has no NCCL (CMake said why when it configured)";     \
    if (torch::cuda::device_count() < (n))                                                                   \
      GTEST_SKIP() << "needs " << (n) << " GPU(s), this machine has "                                     \
                   << static_cast<int>(torch::cuda::device_count());                                         \
  } while (0)

DistributedEnv one_rank(int port) {
  DistributedEnv env;
  env.enabled = true;
  env.source = "test";
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

RunConfig gpu_config(Precision precision) { return testing::gpu_smoke_config(precision, 2, 8); }

struct Trained {
  nlohmann::json result;
  std::map<std::string, torch::Tensor> weights;
};

// The weights are taken at the last counted step: a GPU run may train on, unrecorded, for its energy figure
// after the result is made (apps/train/training_run.h), and the hook runs before those steps.
Trained train_plain(const StageSpec& spec, const RunConfig& config) {
  std::ostringstream log;
  Trainer trainer(spec, config, torch::Device(torch::kCUDA, 0));
  Trained trained;
  RunExtras extras;
  extras.after_last_counted_step = [&](int64_t) {
    for (const auto& [name, w] : trainer.model()->canonical_state()) trained.weights[name] = w.detach().clone();
  };
  trained.result = run_training(trainer, extras, log);
  return trained;
}

// As execute_run builds it: a graphed stage captures at the step its plain run does.
Trained train_one_rank(const StageSpec& spec, const RunConfig& config, GradientSync sync) {
  std::ostringstream log;
  // Not graphed_collectives, though execute_run sets it for a graphed stage: NCCL reads its variables once per
  // process, and this test process makes communicators for eager and graphed runs alike, so NCCL's graph mixing
  // stays at its default (on) here, where nothing needs to wait. Launched runs (separate processes) turn it off.
  DistributedContext context(one_rank(free_port()), {std::chrono::seconds(60)});  // outlives the trainer
  Trainer trainer(spec, config, context.device());
  broadcast_weights(context, trainer.model());
  const int64_t capture_at = trainer.graphed() ? trainer.first_measured_step(0) - 1 : -1;
  trainer.use_runner(std::make_unique<DataParallelStep>(context, trainer.model(), trainer.optimizer(),
                                                        config.training.grad_accum_steps, sync, capture_at));
  EXPECT_EQ(trainer.graphed(), capture_at >= 0);
  Trained trained;
  RunExtras extras;
  extras.distributed = &context;
  extras.after_last_counted_step = [&](int64_t) {
    for (const auto& [name, w] : trainer.model()->canonical_state()) trained.weights[name] = w.detach().clone();
  };
  trained.result = run_training(trainer, extras, log);
  return trained;
}

double largest_relative_difference(const nlohmann::json& a, const nlohmann::json& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!a[i].is_number() || !b[i].is_number()) {
      ADD_FAILURE() << "loss " << i << " is not a number: " << a[i] << " and " << b[i];
      return std::numeric_limits<double>::infinity();
    }
    const double x = a[i].get<double>(), y = b[i].get<double>();
    // Not std::max: it keeps `worst` when the difference is NaN; this lets a NaN loss fail the check.
    const double d = std::abs(x - y) / std::abs(y);
    if (!std::isnan(worst) && !(d <= worst)) worst = d;
  }
  return worst;
}

// One NCCL rank: an all-reduce of one is a copy and the mean loss over one rank is the loss, so the losses and
// weights are those of the plain run (bitwise, where the same kernels run), with either way of averaging and
// with v4's step captured as a graph (the per-layer all-reduces inside it).
TEST(DataParallelGpu, OneRankEqualsThePlainRun) {
  TT_REQUIRE_NCCL_GPUS(1);
  struct Case {
    StageSpec spec;
    Precision precision;
    GradientSync sync;
  };
  // v4 in bf16: compute copies, so the bf16 copies' gradients are all-reduced, and the tied embedding's fp32
  // one (gradient_leaves).
  for (const auto& [spec, precision, sync] :
       {Case{stages::v1_baseline(), Precision::kFp32, GradientSync::kReducer},
        Case{stages::v3_custom(), Precision::kFp32, GradientSync::kReducer},
        Case{stages::v3_custom(), Precision::kFp32, GradientSync::kLayers},
        Case{testing::eager_step(stages::v4_ultra()), Precision::kBf16, GradientSync::kReducer},
        Case{testing::eager_step(stages::v4_ultra()), Precision::kBf16, GradientSync::kLayers},
        Case{stages::v4_ultra(), Precision::kBf16, GradientSync::kLayers},
        Case{stages::v4_ultra(), Precision::kFp32, GradientSync::kLayers}}) {
    SCOPED_TRACE(spec.name + " " + to_string(spec.step) + " " + to_string(precision) + " " + to_string(sync));
    const auto plain = train_plain(spec, gpu_config(precision));
    const auto parallel = train_one_rank(spec, gpu_config(precision), sync);
    EXPECT_LE(largest_relative_difference(parallel.result.at("losses"), plain.result.at("losses")), 1e-6);
    for (const auto& [name, w] : plain.weights) EXPECT_LE(testing::rel_error(parallel.weights.at(name), w), 1e-6) << name;
    const auto& d = parallel.result.at("distributed");
    EXPECT_EQ(d.at("world_size"), 1);
    EXPECT_EQ(d.at("backend"), collective_backend_name());
    EXPECT_EQ(d.at("gradient_sync"), to_string(sync));
    const std::string kind = to_string(spec.step), step = d.at("step");
    EXPECT_EQ(step.rfind(kind.substr(0, kind.find(':') + 1), 0), 0u) << step;
    EXPECT_NE(step.find("data parallel"), std::string::npos) << step;
    EXPECT_EQ(d.at("weights_max_diff_across_ranks"), 0.0);
    EXPECT_GT(d.at("gradient_mb_per_step").get<double>(), 0.0);
    // The embedding's gradient travels as rows with layers where only the lookup writes it (bf16: the tied head
    // reads the bf16 copy).
    const bool rows = sync == GradientSync::kLayers &&
                      (precision == Precision::kBf16 || !gpu_config(precision).model.tie_embeddings);
    EXPECT_EQ(d.at("embedding_gradient"), rows ? "rows" : "dense");
    EXPECT_EQ(d.contains("embedding_rows_mb_per_step"), rows);
    EXPECT_TRUE(std::isfinite(d.at("allreduce_ms_per_step").get<double>()));
    EXPECT_EQ(d.at("total_tokens_per_s"), d.at("per_gpu_tokens_per_s"));
    EXPECT_NO_THROW(validate_result_json(parallel.result));
  }
}

// With gradient accumulation the first micro-batches' backwards do not all-reduce (no_sync) and the last one
// all-reduces the sum: one rank still trains exactly like the plain accumulating run, which equals one batch
// of all the rows (test_trainer.cpp). v4 graphed: the captured step holds all k micro-batches.
TEST(DataParallelGpu, OneRankWithAccumulationEqualsThePlainRun) {
  TT_REQUIRE_NCCL_GPUS(1);
  for (const auto& [spec, sync] :
       std::vector<std::pair<StageSpec, GradientSync>>{{stages::v1_baseline(), GradientSync::kReducer},
                                                       {testing::eager_step(stages::v4_ultra()), GradientSync::kReducer},
                                                       {testing::eager_step(stages::v4_ultra()), GradientSync::kLayers},
                                                       {stages::v4_ultra(), GradientSync::kLayers}}) {
    SCOPED_TRACE(spec.name + " " + to_string(spec.step) + " " + to_string(sync));
    RunConfig c = gpu_config(Precision::kFp32);
    c.training.batch_size = 2;
    c.training.grad_accum_steps = 3;
    c.training.lr_schedule = "cosine";
    c.training.lr_warmup_steps = 2;
    c.training.grad_clip = 0.5;  // clipping on the global norm of the averaged gradients
    const auto plain = train_plain(spec, c);
    const auto parallel = train_one_rank(spec, c, sync);
    EXPECT_LE(largest_relative_difference(parallel.result.at("losses"), plain.result.at("losses")), 1e-6);
    for (const auto& [name, w] : plain.weights)
      EXPECT_LE(testing::rel_error(parallel.weights.at(name), w), 1e-6) << name;
    EXPECT_EQ(parallel.result.at("distributed").at("weights_max_diff_across_ranks"), 0.0);
    EXPECT_EQ(parallel.result.at("training").at("tokens_per_step"), 6 * c.training.seq_len);
  }
}

TEST(DataParallelGpu, MoreLocalRanksThanGpusIsRefused) {
  TT_REQUIRE_NCCL_GPUS(1);
  const int gpus = static_cast<int>(torch::cuda::device_count());
  DistributedEnv env = one_rank(free_port());
  env.world_size = gpus + 1;
  env.rank = env.local_rank = gpus;
  try {
    DistributedContext context(env, {std::chrono::seconds(5)});
    ADD_FAILURE() << "no error for LOCAL_RANK " << gpus;
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("LOCAL_RANK = " + std::to_string(gpus) + " (test) is not allowed: this host has " +
                     std::to_string(gpus) + " GPU"),
              std::string::npos)
        << m;
  }
}

TEST(DataParallelGpu, PortInUseIsRefused) {
  TT_REQUIRE_NCCL_GPUS(1);
  const int port = free_port();
  const testing::OccupiedPort occupied(port);
  ASSERT_TRUE(occupied.listening());
  std::string message = "(no ConfigError)";
  try {
    DistributedContext context(one_rank(port), {std::chrono::seconds(5)});
  } catch (const ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("MASTER_PORT = " + std::to_string(port) + " is not allowed: the port is in use"),
            std::string::npos)
      << message;
}

// ---------------------------------------------------------------------------------------------------
// Through the executables and scripts/launch.sh
// ---------------------------------------------------------------------------------------------------

fs::path build_dir() { return fs::canonical("/proc/self/exe").parent_path().parent_path(); }  // build/tests/..
std::string launcher() { return std::string(TT_SOURCE_DIR) + "/scripts/launch.sh"; }
std::string smoke_json() { return std::string(TT_SOURCE_DIR) + "/configs/smoke.json"; }

// Runs a bash script; returns its exit status (128 + signal when it was killed).
int shell(const std::string& script) {
  const fs::path file = fs::temp_directory_path() / ("tt_dp_script_" + std::to_string(::getpid()) + ".sh");
  std::ofstream(file) << script << "\n";
  const int status = std::system(("bash " + file.string()).c_str());
  fs::remove(file);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string stage_flags(int64_t batch, const fs::path& output, int64_t steps = 8) {
  return "--config " + smoke_json() + " --device cuda --batch-size " + std::to_string(batch) +
         " --warmup-steps 2 --num-steps " + std::to_string(steps) + " --log-every 1 --output " + output.string();
}

// scripts/launch.sh --nproc 1 runs the binary as rank 0 of a world of one: the plain binary's losses.
TEST(DataParallelGpu, LauncherWithOneProcessEqualsThePlainBinary) {
  TT_REQUIRE_NCCL_GPUS(1);
  const fs::path dir = testing::fresh_dir("tt_dp_one");
  for (const std::string stage : {"v1_baseline", "v4_ultra"}) {
    SCOPED_TRACE(stage);
    const std::string binary = (build_dir() / stage).string();
    // v4's launched run is graphed too (an all-reduce per layer in its graph): against the plain graphed run.
    ASSERT_EQ(shell(binary + " " + stage_flags(4, dir / (stage + "_plain.json")) + " > " +
                    (dir / (stage + "_plain.log")).string() + " 2>&1"),
              0)
        << read_text(dir / (stage + "_plain.log"));
    const fs::path log = dir / (stage + "_launched.log");
    ASSERT_EQ(shell(launcher() + " --nproc 1 --master-port " + std::to_string(free_port()) + " " + binary + " " +
                    stage_flags(4, dir / (stage + "_launched.json")) + " > " + log.string() + " 2>&1"),
              0)
        << read_text(log);
    const auto plain = read_json_file((dir / (stage + "_plain.json")).string());
    const auto launched = read_json_file((dir / (stage + "_launched.json")).string());
    // .at(): a missing key is a test failure naming it, not undefined behaviour of a const operator[].
    EXPECT_LE(largest_relative_difference(launched.at("losses"), plain.at("losses")), 1e-6);
    ASSERT_TRUE(launched.contains("distributed")) << read_text(log);
    EXPECT_EQ(launched.at("distributed").at("world_size"), 1);
    EXPECT_EQ(launched.at("distributed").at("launcher"), "torchrun-style");
    EXPECT_NE(read_text(log).find("[rank 0] [" + stage + "] data parallel: 1 ranks"), std::string::npos)
        << read_text(log);
  }
  // Checkpoints cross over: one written by a launched run loads into a plain run, and the other way round.
  const std::string binary = (build_dir() / "v1_baseline").string();
  const std::string short_run = "--config " + smoke_json() + " --device cuda --warmup-steps 0 --num-steps 2 --log-every 0";
  const fs::path log = dir / "checkpoints.log";
  const std::string port = std::to_string(free_port()), other_port = std::to_string(free_port());
  EXPECT_EQ(shell(launcher() + " --nproc 1 --master-port " + port + " " + binary + " " + short_run + " --output " +
                  (dir / "c1.json").string() + " --save-checkpoint " + (dir / "launched.ckpt").string() + " >> " +
                  log.string() + " 2>&1 && " + binary + " " + short_run + " --output " + (dir / "c2.json").string() +
                  " --load-checkpoint " + (dir / "launched.ckpt").string() + " --save-checkpoint " +
                  (dir / "plain.ckpt").string() + " >> " + log.string() + " 2>&1 && " + launcher() +
                  " --nproc 1 --master-port " + other_port + " " + binary + " " + short_run + " --output " +
                  (dir / "c3.json").string() + " --load-checkpoint " + (dir / "plain.ckpt").string() + " >> " +
                  log.string() + " 2>&1"),
            0)
      << read_text(log);
  testing::remove_tree(dir);
}

// Two ranks with batch B each equal one process with batch 2B: the same global batch, the gradients
// averaged over it. Loss sequences within fp32 round-off (the sums run in another order); the two
// ranks' weights identical after the run. Every stage with an all-reduce per layer (the default; v4's graphed,
// against the plain graphed run), and v3 and v4 with the Reducer (v4 then eager, against the plain eager run).
TEST(DataParallelGpu, TwoRanksEqualOneRankWithTheSameGlobalBatch) {
  TT_REQUIRE_NCCL_GPUS(2);
  const fs::path dir = testing::fresh_dir("tt_dp_two");
  std::map<std::string, double> unsharded_state_mb;  // per stage, before its sharded case
  struct Case {
    std::string stage, name, one_flags, two_flags, sync;
  };
  for (const auto& c :
       {Case{"v1_baseline", "v1_baseline", "", "", "layers"}, Case{"v2_fused", "v2_fused", "", "", "layers"},
        Case{"v3_custom", "v3_custom", "", "", "layers"},
        Case{"v3_custom", "v3_custom_reducer", "", " --dp-sync reducer", "reducer"},
        Case{"v3_custom", "v3_custom_sharded", "", " --shard-optimizer", "layers"},
        Case{"v4_ultra", "v4_ultra", "", "", "layers"},
        Case{"v4_ultra", "v4_ultra_reducer", " --no-graph", " --dp-sync reducer", "reducer"},
        Case{"v4_ultra", "v4_ultra_sharded", "", " --shard-optimizer", "layers"}}) {
    SCOPED_TRACE(c.name);
    const std::string binary = (build_dir() / c.stage).string();
    const fs::path one_log = dir / (c.name + "_one.log"), two_log = dir / (c.name + "_two.log");
    ASSERT_EQ(shell(binary + " " + stage_flags(4, dir / (c.name + "_one.json")) + c.one_flags + " > " +
                    one_log.string() + " 2>&1"),
              0)
        << read_text(one_log);
    ASSERT_EQ(shell(launcher() + " --nproc 2 --master-port " + std::to_string(free_port()) + " " + binary + " " +
                    stage_flags(2, dir / (c.name + "_two.json")) + c.two_flags + " > " + two_log.string() + " 2>&1"),
              0)
        << read_text(two_log);
    const auto one = read_json_file((dir / (c.name + "_one.json")).string());
    const auto two = read_json_file((dir / (c.name + "_two.json")).string());
    const double worst = largest_relative_difference(two.at("losses"), one.at("losses"));
    EXPECT_LE(worst, 1e-4) << "2 ranks x batch 2 vs 1 process x batch 4";
    std::cout << "[2 ranks vs 1] " << c.name << ": largest relative loss difference " << worst << std::endl;
    ASSERT_TRUE(two.contains("distributed")) << read_text(two_log);
    const auto& d = two.at("distributed");
    EXPECT_EQ(d.at("world_size"), 2);
    EXPECT_EQ(d.at("global_batch_size"), 4);
    EXPECT_EQ(d.at("gradient_sync"), c.sync);
    // The step as the result records it: graphed exactly where the plain run graphed.
    const std::string one_step = one.at("stage").at("components").at("step");
    const std::string two_step = two.at("stage").at("components").at("step");
    EXPECT_EQ(two_step.rfind(one_step.substr(0, one_step.find(':') + 1), 0), 0u) << one_step << " / " << two_step;
    EXPECT_NE(two_step.find("data parallel"), std::string::npos) << two_step;
    EXPECT_EQ(d.at("weights_max_diff_across_ranks"), 0.0) << "the ranks' weights drifted apart";
    EXPECT_DOUBLE_EQ(d.at("total_tokens_per_s").get<double>(), 2 * d.at("per_gpu_tokens_per_s").get<double>());
    const bool sharded = c.two_flags.find("--shard-optimizer") != std::string::npos;
    EXPECT_EQ(d.at("optimizer_sharded"), sharded);
    if (c.name == c.stage) unsharded_state_mb[c.stage] = d.at("optimizer_state_mb_per_gpu").get<double>();
    if (sharded) {
      // The smoke model's small weights are single slices, so a rank holds somewhat more than half.
      ASSERT_TRUE(unsharded_state_mb.count(c.stage)) << "the unsharded case runs first";
      EXPECT_LT(d.at("optimizer_state_mb_per_gpu").get<double>(), 0.55 * unsharded_state_mb.at(c.stage));
      EXPECT_NE(two_step.find("ZeRO-1"), std::string::npos) << two_step;
    }
  }
  testing::remove_tree(dir);
}

// ZeRO-1 on two GPUs (v4 graphed, clipping on): the losses and the checkpoint (weights and whole moments) of two
// ranks that keep all of the optimizer state. The clipping norm sums in another order, so the masters may differ in
// their last bits. In fp32 that stays at round-off. In bf16 (the compute copies all-gathered, the masters gathered
// for the checkpoint) a master one bit away can round to another bf16 copy (one bf16 step is 2^-8 relative), the
// forward differs there, and the steps carry it on: measured on 2 x H200, losses 9.3e-6, checkpoint weights 4.1e-4,
// moments 5.3e-3 (relative). A slice in the wrong place or a missing gather is O(1). Then runs resume across world
// sizes and sharding from either file (2 sharded -> 1 process; 2 unsharded -> 2 sharded). v3_custom (at::_fused_adamw_
// on the slices, eager, no compute copies: its fp32 masters are gathered in fp32, its projections' bf16 casts in bf16) against its own unsharded run, both dtypes.
// In bf16 autocast casts every master for every forward, so more of them can land on another bf16 value than v4's
// copies do: measured on 2 x H200, losses 2.4e-5, checkpoint weights 2.2e-3, moments 9.0e-3 (fp32: 2.3e-7 weights).
TEST(DataParallelGpu, ShardedOptimizerOnTwoGpusEqualsTheUnshardedOne) {
  TT_REQUIRE_NCCL_GPUS(2);
  const fs::path dir = testing::fresh_dir("tt_dp_zero");
  std::string binary;
  auto launched = [&](const std::string& name, const std::string& flags, int64_t steps = 8) {
    const fs::path log = dir / (name + ".log");
    EXPECT_EQ(shell(launcher() + " --nproc 2 --master-port " + std::to_string(free_port()) + " " + binary + " " +
                    stage_flags(2, dir / (name + ".json"), steps) + " --grad-clip 0.5" + flags + " > " +
                    log.string() + " 2>&1"),
              0)
        << read_text(log);
  };
  struct Tolerance {
    std::string dtype;
    double losses, weights, moments;
  };
  for (const std::string stage : {"v3_custom", "v4_ultra"})
    for (const auto& t :
         {Tolerance{"fp32", 1e-6, 1e-5, 1e-4}, Tolerance{"bf16", 1e-4, stage == "v3_custom" ? 5e-3 : 2e-3, 2e-2}}) {
      SCOPED_TRACE(stage + " " + t.dtype);
      binary = (build_dir() / stage).string();
      const std::string whole = stage + "_whole_" + t.dtype, sharded = stage + "_sharded_" + t.dtype;
      launched(whole, " --dtype " + t.dtype + " --save-checkpoint " + (dir / (whole + ".pt")).string());
      launched(sharded,
               " --dtype " + t.dtype + " --shard-optimizer --save-checkpoint " + (dir / (sharded + ".pt")).string());
      const auto w = read_json_file((dir / (whole + ".json")).string());
      const auto s = read_json_file((dir / (sharded + ".json")).string());
      const double worst = largest_relative_difference(s.at("losses"), w.at("losses"));
      EXPECT_LE(worst, t.losses);
      EXPECT_EQ(s.at("distributed").at("weights_max_diff_across_ranks"), 0.0);
      const Checkpoint a = read_checkpoint((dir / (sharded + ".pt")).string());
      const Checkpoint b = read_checkpoint((dir / (whole + ".pt")).string());
      EXPECT_EQ(a.step, b.step);
      EXPECT_TRUE(a.config.training.shard_optimizer);
      double weights = 0, moments = 0;
      for (const auto& [name, x] : b.weights) weights = std::max(weights, testing::rel_error(a.weights.at(name), x));
      for (const auto& [name, m] : b.exp_avg) {
        ASSERT_EQ(a.exp_avg.at(name).sizes(), m.sizes()) << name;
        moments = std::max(moments, testing::rel_error(a.exp_avg.at(name), m));
        moments = std::max(moments, testing::rel_error(a.exp_avg_sq.at(name), b.exp_avg_sq.at(name)));
      }
      std::cout << "[sharded vs whole, 2 GPUs, " << stage << " " << t.dtype << "] relative differences: losses "
                << worst << ", checkpoint weights " << weights << ", moments " << moments << std::endl;
      EXPECT_LE(weights, t.weights);
      EXPECT_LE(moments, t.moments);
    }
  binary = (build_dir() / "v4_ultra").string();  // the resumes: v4's files
  const fs::path one_log = dir / "resumed_one.log";
  EXPECT_EQ(shell(binary + " " + stage_flags(2, dir / "resumed_one.json", 12) + " --dtype bf16 --grad-clip 0.5" +
                  " --resume " + (dir / "v4_ultra_sharded_bf16.pt").string() + " > " + one_log.string() + " 2>&1"),
            0)
      << read_text(one_log);
  EXPECT_EQ(read_json_file((dir / "resumed_one.json").string()).at("first_step"), 10);
  launched("resumed_two", " --dtype bf16 --shard-optimizer --resume " + (dir / "v4_ultra_whole_bf16.pt").string(), 12);
  EXPECT_EQ(read_json_file((dir / "resumed_two.json").string()).at("first_step"), 10);
  testing::remove_tree(dir);
}

// Whether a line of `text` starts with `prefix` and contains `part`.
bool has_line(const std::string& text, const std::string& prefix, const std::string& part) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(prefix, 0) == 0 && line.find(part) != std::string::npos) return true;
  return false;
}

// ZeRO-1's two gather schedules move the same bytes with the same collectives, only at another time: `update`
// all-gathers after each step's update, `forward` gathers the embedding and layer 0 so too but queues the others
// at the next step's start, each part of the forward waiting for its own. v4 graphed in bf16 (the compute copies
// gathered), clipping on, evaluations between steps and a checkpoint at the end (both must gather first under
// `forward`): everything bitwise equal. A part that waits for the wrong gather reads stale weights and changes the
// losses. The same run once more with NCCL's graph mixing on (the user's NCCL_GRAPH_MIXING_SUPPORT=1 kept): the
// default turns it off and makes every collective outside the graph (the stop vote each step, the evaluations'
// and the checkpoint's gathers) wait for the GPU; neither may change a bit.
TEST(DataParallelGpu, ZeroGatherForwardEqualsUpdateBitwise) {
  TT_REQUIRE_NCCL_GPUS(2);
  const fs::path dir = testing::fresh_dir("tt_dp_zero_gather");
  const std::string binary = (build_dir() / "v4_ultra").string();
  const fs::path text = dir / "eval.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  struct Case {
    std::string name, mode, env;
  };
  const bool mixing_preset = std::getenv("NCCL_GRAPH_MIXING_SUPPORT") != nullptr;
  std::map<std::string, nlohmann::json> results;
  std::map<std::string, Checkpoint> checkpoints;
  // NCCL's own log line (INFO, subsystem ENV) shows the value NCCL read, not only the one the result records.
  const std::string nccl_log = "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ENV ";
  for (const auto& c : {Case{"update", "update", ""}, Case{"forward", "forward", nccl_log},
                        Case{"forward_mixing_on", "forward", nccl_log + "NCCL_GRAPH_MIXING_SUPPORT=1 "}}) {
    SCOPED_TRACE(c.name);
    const fs::path log = dir / (c.name + ".log"), json = dir / (c.name + ".json"), pt = dir / (c.name + ".pt");
    ASSERT_EQ(shell(c.env + launcher() + " --nproc 2 --master-port " + std::to_string(free_port()) + " " + binary +
                    " " + stage_flags(2, json, 10) + " --dtype bf16 --grad-clip 0.5 --shard-optimizer --zero-gather " +
                    c.mode + " --eval-data " + text.string() + " --eval-every 3 --save-checkpoint " + pt.string() +
                    " > " + log.string() + " 2>&1"),
              0)
        << read_text(log);
    results[c.name] = read_json_file(json.string());
    checkpoints.emplace(c.name, read_checkpoint(pt.string()));
    const auto& d = results[c.name].at("distributed");
    EXPECT_EQ(d.at("zero_gather"), c.mode);
    if (c.mode == "forward" && !std::getenv("CUDA_DEVICE_MAX_CONNECTIONS")) {  // each rank restarted with it
      EXPECT_EQ(d.at("cuda_device_max_connections"), "32");
      EXPECT_NE(read_text(log).find("restarting with CUDA_DEVICE_MAX_CONNECTIONS=32"), std::string::npos)
          << read_text(log);
    }
    if (c.name == "forward_mixing_on") {
      EXPECT_EQ(d.at("nccl_graph_mixing_support"), "1");
      EXPECT_EQ(d.at("collectives_outside_graph_wait_for_gpu"), false);
      EXPECT_NE(read_text(log).find("NCCL_GRAPH_MIXING_SUPPORT set by environment to 1"), std::string::npos)
          << read_text(log);
    } else if (!mixing_preset) {
      EXPECT_EQ(d.at("nccl_graph_mixing_support"), "0");
      EXPECT_EQ(d.at("collectives_outside_graph_wait_for_gpu"), true);
      EXPECT_NE(read_text(log).find("[note] NCCL_GRAPH_MIXING_SUPPORT=0"), std::string::npos) << read_text(log);
      if (c.name == "forward") {  // both ranks' NCCL read the 0 the run set
        for (const std::string rank : {"[rank 0] ", "[rank 1] "}) {
          EXPECT_TRUE(has_line(read_text(log), rank, "NCCL_GRAPH_MIXING_SUPPORT set by environment to 0"))
              << rank << "\n" << read_text(log);
        }
      }
    }
    EXPECT_TRUE(results[c.name].at("stage").at("components").at("step").get<std::string>().find("graph") !=
                std::string::npos)
        << results[c.name].at("stage").at("components").at("step");
  }
  const auto& u = results.at("update");
  ASSERT_EQ(u.at("evaluation").at("curve").size(), 4u) << u.at("evaluation");  // after steps 3, 6, 9 and 10
  const Checkpoint& b = checkpoints.at("update");
  for (const std::string other : {"forward", "forward_mixing_on"}) {
    SCOPED_TRACE(other);
    const auto& f = results.at(other);
    EXPECT_EQ(f.at("losses"), u.at("losses"));
    EXPECT_EQ(f.at("evaluation").at("curve"), u.at("evaluation").at("curve"));
    const Checkpoint& a = checkpoints.at(other);
    EXPECT_EQ(a.step, b.step);
    for (const auto& [name, w] : b.weights) EXPECT_TRUE(torch::equal(a.weights.at(name), w)) << name;
    for (const auto& [name, m] : b.exp_avg) {
      EXPECT_TRUE(torch::equal(a.exp_avg.at(name), m)) << name;
      EXPECT_TRUE(torch::equal(a.exp_avg_sq.at(name), b.exp_avg_sq.at(name))) << name;
    }
  }
  testing::remove_tree(dir);
}

// Our AdamW overlapped with the backward on two GPUs (--optimizer-overlap, an all-reduce per layer): each layer's
// update waits, on the optimizer's stream, for that layer's all-reduce on NCCL's, inside v4's captured graph. Bitwise
// the run that updates after the backward: losses, weights and moments, in fp32 and in bf16 with clipping (the
// layers' norm passes overlap, the updates follow the global norm). An update that read a gradient before its
// average would change them.
TEST(DataParallelGpu, OverlapOnTwoGpusEqualsTheUpdateAfterTheBackward) {
  TT_REQUIRE_NCCL_GPUS(2);
  const fs::path dir = testing::fresh_dir("tt_dp_overlap");
  const std::string binary = (build_dir() / "v4_ultra").string();
  for (const std::string mode : {"--dtype fp32", "--dtype bf16 --grad-clip 0.5"}) {
    SCOPED_TRACE(mode);
    std::map<std::string, nlohmann::json> results;
    std::map<std::string, Checkpoint> checkpoints;
    for (const std::string overlap : {"", " --optimizer-overlap"}) {
      const std::string name = overlap.empty() ? "after" : "overlapped";
      const fs::path log = dir / (name + ".log"), json = dir / (name + ".json"), pt = dir / (name + ".pt");
      ASSERT_EQ(shell(launcher() + " --nproc 2 --master-port " + std::to_string(free_port()) + " " + binary + " " +
                      stage_flags(2, json, 6) + " " + mode + overlap + " --overwrite --save-checkpoint " + pt.string() +
                      " > " + log.string() + " 2>&1"),
                0)
          << read_text(log);
      results[name] = read_json_file(json.string());
      checkpoints.emplace(name, read_checkpoint(pt.string()));
      EXPECT_NE(results[name].at("stage").at("components").at("step").get<std::string>().find("graph"),
                std::string::npos);
    }
    const auto& a = results.at("overlapped");
    const auto& b = results.at("after");
    EXPECT_EQ(a.at("training").at("optimizer").at("overlap").get<std::string>().rfind("each layer", 0), 0u)
        << a.at("training").at("optimizer").at("overlap");
    EXPECT_EQ(b.at("training").at("optimizer").at("overlap").get<std::string>().rfind("none", 0), 0u);
    EXPECT_EQ(a.at("losses"), b.at("losses"));
    const Checkpoint& x = checkpoints.at("overlapped");
    const Checkpoint& y = checkpoints.at("after");
    for (const auto& [name, w] : y.weights) EXPECT_TRUE(torch::equal(x.weights.at(name), w)) << name;
    for (const auto& [name, m] : y.exp_avg) {
      EXPECT_TRUE(torch::equal(x.exp_avg.at(name), m)) << name;
      EXPECT_TRUE(torch::equal(x.exp_avg_sq.at(name), y.exp_avg_sq.at(name))) << name;
    }
  }
  testing::remove_tree(dir);
}

// Ranks started with different flags stop at start-up, every one naming the differing rank and field.
TEST(DataParallelGpu, DifferentConfigsAreNamedAtStartUp) {
  TT_REQUIRE_NCCL_GPUS(2);
  const fs::path dir = testing::fresh_dir("tt_dp_mismatch");
  const std::string binary = (build_dir() / "v1_baseline").string();
  const std::string env = "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(free_port());
  const std::string rank0 = "RANK=0 LOCAL_RANK=0 " + env + " " + binary + " " + stage_flags(2, dir / "a.json");
  const std::string rank1 = "RANK=1 LOCAL_RANK=1 " + env + " " + binary + " " + stage_flags(3, dir / "b.json");
  const int status = shell(rank0 + " > " + (dir / "0.log").string() + " 2>&1 & p0=$!; " + rank1 + " > " +
                           (dir / "1.log").string() + " 2>&1 & p1=$!; wait $p0; a=$?; wait $p1; b=$?; " +
                           "[ $a -eq 2 ] && [ $b -eq 2 ]");
  EXPECT_EQ(status, 0) << "both ranks must exit 2\nrank 0:\n" << read_text(dir / "0.log") << "\nrank 1:\n"
                       << read_text(dir / "1.log");
  for (const char* log : {"0.log", "1.log"})
    EXPECT_NE(read_text(dir / log).find("rank 1 (fingerprint"), std::string::npos) << read_text(dir / log);
  EXPECT_NE(read_text(dir / "0.log").find("config.training.batch_size (3 here, 2 on rank 0)"), std::string::npos)
      << read_text(dir / "0.log");
  EXPECT_FALSE(fs::exists(dir / "a.json"));
  testing::remove_tree(dir);
}

// A rank killed in the middle of training: the launcher stops the other and exits non-zero; started without
// the launcher, the survivor stops on its own within --dist-timeout (NCCL's watchdog). No result file.
TEST(DataParallelGpu, AKilledRankEndsTheRun) {
  TT_REQUIRE_NCCL_GPUS(2);
  const fs::path dir = testing::fresh_dir("tt_dp_killed");
  const std::string binary = (build_dir() / "v1_baseline").string();
  const std::string long_run = "--config " + smoke_json() +
                               " --device cuda --batch-size 2 --warmup-steps 2 --num-steps 100000 --log-every 1";
  // Waits (bounded) until rank 0 prints its first step: both ranks are then inside training.
  const std::string wait_for_training =
      "for i in $(seq 1200); do grep -q \"step 1/\" LOG && break; sleep 0.25; done; grep -q \"step 1/\" LOG || exit 90; ";
  auto with_log = [](std::string text, const fs::path& log) {
    for (size_t at; (at = text.find("LOG")) != std::string::npos;) text.replace(at, 3, log.string());
    return text;
  };
  {
    const fs::path log = dir / "launched.log";
    const std::string script = launcher() + " --nproc 2 --master-port " + std::to_string(free_port()) + " " + binary +
                               " " + long_run + " --output " + (dir / "launched.json").string() + " > " +
                               log.string() + " 2>&1 & l=$!; " + with_log(wait_for_training, log) +
                               "kill -KILL $(sed -n \"s/^\\[launch\\] rank 1 pid \\([0-9]*\\):.*/\\1/p\" " +
                               log.string() + "); wait $l; [ $? -ne 0 ]";
    EXPECT_EQ(shell(script), 0) << "the launcher must exit non-zero\n" << read_text(log);
    EXPECT_NE(read_text(log).find("rank 1 (pid"), std::string::npos) << read_text(log);
    EXPECT_FALSE(fs::exists(dir / "launched.json"));
  }
  {
    const fs::path log0 = dir / "rank0.log";
    const std::string env = "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                            std::to_string(free_port());
    const std::string flags = long_run + " --dist-timeout 20 --output " + (dir / "direct.json").string();
    // The survivor must end by itself: if it still runs after 300 s, it is killed and the test fails.
    const std::string script = "RANK=0 LOCAL_RANK=0 " + env + " " + binary + " " + flags + " > " + log0.string() +
                               " 2>&1 & p0=$!; RANK=1 LOCAL_RANK=1 " + env + " " + binary + " " + flags +
                               " > /dev/null 2>&1 & p1=$!; " + with_log(wait_for_training, log0) +
                               "kill -KILL $p1; for i in $(seq 1200); do kill -0 $p0 2>/dev/null || break; sleep 0.25; "
                               "done; if kill -0 $p0 2>/dev/null; then kill -KILL $p0; exit 91; fi; wait $p0; "
                               "[ $? -ne 0 ]";
    EXPECT_EQ(shell(script), 0) << "rank 0 must stop with a non-zero status after its peer died\n" << read_text(log0);
    EXPECT_FALSE(fs::exists(dir / "direct.json"));
  }
  testing::remove_tree(dir);
}

// SIGTERM to one rank only (as when a scheduler's signal reaches the ranks at different times): every rank
// stops after the same step (they vote after each step), so none waits in a collective for a peer that
// left; both exit with 128 + 15, and rank 0 writes the checkpoint and the result marked interrupted. v4 too:
// its vote runs between replays of a graph that holds the gradients' all-reduces.
TEST(DataParallelGpu, ASignalToOneRankStopsEveryRankAtTheSameStep) {
  TT_REQUIRE_NCCL_GPUS(2);
  for (const std::string stage : {"v1_baseline", "v4_ultra"}) {
    SCOPED_TRACE(stage);
    const fs::path dir = testing::fresh_dir("tt_dp_signal_" + stage);
    const std::string binary = (build_dir() / stage).string();
    const fs::path log0 = dir / "rank0.log";
    const std::string env =
        "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port());
    const std::string flags = "--config " + smoke_json() +
                              " --device cuda --batch-size 2 --warmup-steps 2 --num-steps 100000 --log-every 1"
                              " --dist-timeout 60 --checkpoint-dir " +
                              (dir / "ck").string() + " --output " + (dir / "stopped.json").string();
    const std::string script =
        "RANK=0 LOCAL_RANK=0 " + env + " " + binary + " " + flags + " > " + log0.string() + " 2>&1 & p0=$!; " +
        "RANK=1 LOCAL_RANK=1 " + env + " " + binary + " " + flags + " > /dev/null 2>&1 & p1=$!; " +
        "for i in $(seq 1200); do grep -q \"step 3/\" " + log0.string() + " && break; sleep 0.25; done; " +
        "kill -TERM $p1; wait $p0; s0=$?; wait $p1; s1=$?; echo \"exit $s0 $s1\" >> " + log0.string() +
        "; [ $s0 -eq 143 ] && [ $s1 -eq 143 ]";
    EXPECT_EQ(shell(script), 0) << "both ranks must stop with 143\n" << read_text(log0);
    EXPECT_NE(read_text(dir / "stopped.json").find("\"interrupted\": true"), std::string::npos) << read_text(log0);
    EXPECT_FALSE(checkpoints_in((dir / "ck").string()).empty()) << read_text(log0);
    testing::remove_tree(dir);
  }
}

}  // namespace
}  // namespace tt
