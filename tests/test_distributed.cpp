// Data parallel without a GPU: the launcher variables, the sharding of every global batch, the start-up
// agreement over a real TCPStore (ranks as threads), the port check and the command line's refusals.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <tuple>
#include <sstream>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "apps/cli/stage_cli.h"
#include "apps/train/data_parallel_step.h"
#include "apps/train/distributed.h"
#include "apps/train/run.h"
#include "apps/train/sharded_adamw.h"
#include "apps/train/trainer.h"
#include "helpers.h"
#include "ports.h"
#include "threaded_group.h"

namespace tt {
namespace {

using testing::free_port;

EnvLookup env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

#define EXPECT_MENTIONS(text, fragment) \
  EXPECT_NE((text).find(fragment), std::string::npos) << "expected \"" << (fragment) << "\" in: " << (text)

const std::map<std::string, std::string> kTorchrun = {{"RANK", "1"},        {"WORLD_SIZE", "4"},
                                                      {"LOCAL_RANK", "1"},  {"LOCAL_WORLD_SIZE", "2"},
                                                      {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29511"}};

std::map<std::string, std::string> with(std::map<std::string, std::string> vars, const std::string& name,
                                        const std::optional<std::string>& value) {
  if (value)
    vars[name] = *value;
  else
    vars.erase(name);
  return vars;
}

// ---------------------------------------------------------------------------------------------------

TEST(DistributedEnv, NoLauncherVariablesMeansOneProcess) {
  const auto env = parse_distributed_env(env_of({{"MASTER_ADDR", "x"}, {"PATH", "/bin"}}));
  EXPECT_FALSE(env.enabled);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.rank, 0);
}

TEST(DistributedEnv, TorchrunStyle) {
  const auto env = parse_distributed_env(env_of(kTorchrun));
  EXPECT_TRUE(env.enabled);
  EXPECT_EQ(env.source, "torchrun-style");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "node0");
  EXPECT_EQ(env.master_port, 29511);
}

TEST(DistributedEnv, OpenMpi) {
  const auto env = parse_distributed_env(env_of({{"OMPI_COMM_WORLD_RANK", "3"},
                                                 {"OMPI_COMM_WORLD_SIZE", "8"},
                                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                                 {"MASTER_ADDR", "10.0.0.1"}}));
  EXPECT_EQ(env.source, "Open MPI");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 3);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "10.0.0.1");
  EXPECT_EQ(env.master_port, kDefaultMasterPort);  // mpirun knows nothing of MASTER_PORT
}

TEST(DistributedEnv, Slurm) {
  const auto env = parse_distributed_env(env_of({{"SLURM_PROCID", "5"},
                                                 {"SLURM_NTASKS", "6"},
                                                 {"SLURM_LOCALID", "1"},
                                                 {"MASTER_ADDR", "gpu-07"},
                                                 {"MASTER_PORT", "29600"}}));
  EXPECT_EQ(env.source, "Slurm");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, -1);
  EXPECT_EQ(env.master_port, 29600);
}

TEST(DistributedEnv, TorchrunVariablesTakePrecedence) {
  auto vars = kTorchrun;
  vars["OMPI_COMM_WORLD_RANK"] = "0";
  vars["OMPI_COMM_WORLD_SIZE"] = "2";
  vars["SLURM_PROCID"] = "7";
  const auto env = parse_distributed_env(env_of(vars));
  EXPECT_EQ(env.source, "torchrun-style");
  EXPECT_EQ(env.rank, 1);
}

TEST(DistributedEnv, MissingOrBadValuesNameTheVariable) {
  auto message = [](const std::map<std::string, std::string>& vars) {
    return testing::error_of<ConfigError>([&] { parse_distributed_env(env_of(vars)); });
  };
  std::string m = message(with(kTorchrun, "MASTER_ADDR", std::nullopt));
  EXPECT_MENTIONS(m, "MASTER_ADDR is not set");
  EXPECT_MENTIONS(m, "127.0.0.1");
  EXPECT_MENTIONS(message(with(kTorchrun, "MASTER_ADDR", "")), "MASTER_ADDR is empty");
  EXPECT_MENTIONS(message(with(kTorchrun, "MASTER_PORT", std::nullopt)), "MASTER_PORT is not set");
  EXPECT_MENTIONS(message(with(kTorchrun, "MASTER_PORT", "70000")),
                  "MASTER_PORT = \"70000\" is not allowed: must be a TCP port in [1, 65535]");
  EXPECT_MENTIONS(message(with(kTorchrun, "WORLD_SIZE", "two")),
                  "WORLD_SIZE = \"two\" is not allowed: must be an integer >= 1");
  EXPECT_MENTIONS(message(with(kTorchrun, "WORLD_SIZE", "0")), "WORLD_SIZE = \"0\" is not allowed");
  EXPECT_MENTIONS(message(with(kTorchrun, "RANK", "4")),
                  "RANK = \"4\" is not allowed: must be an integer in [0, WORLD_SIZE = 4)");
  EXPECT_MENTIONS(message(with(kTorchrun, "RANK", "-1")), "RANK = \"-1\" is not allowed");
  EXPECT_MENTIONS(message(with(kTorchrun, "RANK", "1x")), "RANK = \"1x\" is not allowed");
  EXPECT_MENTIONS(message(with(kTorchrun, "LOCAL_RANK", std::nullopt)), "LOCAL_RANK is not set");
  EXPECT_MENTIONS(message(with(kTorchrun, "LOCAL_RANK", "2")), "LOCAL_RANK = 2 is not allowed: must be below LOCAL_WORLD_SIZE = 2");
  EXPECT_MENTIONS(message(with(kTorchrun, "RANK", std::nullopt)), "RANK is not set");
  EXPECT_MENTIONS(message({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}),
                  "MASTER_ADDR is not set: Open MPI data parallel");
  EXPECT_MENTIONS(message({{"SLURM_PROCID", "0"}, {"MASTER_ADDR", "x"}}), "SLURM_NTASKS is not set");
}

// ---------------------------------------------------------------------------------------------------

// Every step's rows of all ranks, in rank order, are the rows one process with the global batch draws.
void expect_shards_make_the_global_batch(const std::function<std::unique_ptr<TokenSource>()>& make_source) {
  constexpr int64_t kPerRank = 2, kSeq = 16, kSteps = 5;
  constexpr int kWorld = 3;
  Batches global(make_source(), kPerRank * kWorld, kSeq, kSteps, torch::kCPU);
  std::vector<std::unique_ptr<Batches>> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.push_back(std::make_unique<Batches>(make_sharded_source(make_source(), kPerRank, r, kWorld), kPerRank, kSeq,
                                              kSteps, torch::kCPU));
  for (int64_t step = 0; step < kSteps; ++step) {
    global.next();
    std::vector<torch::Tensor> inputs, labels;
    for (auto& b : ranks) {
      b->next();
      inputs.push_back(b->inputs().clone());
      labels.push_back(b->labels().clone());
    }
    EXPECT_TRUE(torch::equal(torch::cat(inputs), global.inputs())) << "step " << step;
    EXPECT_TRUE(torch::equal(torch::cat(labels), global.labels())) << "step " << step;
    EXPECT_FALSE(torch::equal(inputs[0], inputs[1])) << "ranks 0 and 1 got the same rows at step " << step;
  }
}

TEST(Sharding, UnionOfShardsIsTheGlobalBatchSynthetic) {
  expect_shards_make_the_global_batch([] { return make_synthetic_source(1000, 7); });
}

TEST(Sharding, UnionOfShardsIsTheGlobalBatchText) {
  const std::string path = std::string(TT_SOURCE_DIR) + "/README.md";
  expect_shards_make_the_global_batch([&] { return make_text_source(path, 16, 7); });
}

TEST(Sharding, DescribesTheShard) {
  auto source = make_sharded_source(make_synthetic_source(100, 1), 4, 1, 2);
  EXPECT_MENTIONS(source->describe(), "global batch 8, rank 1 of 2 trains rows [4, 8)");
}

// ---------------------------------------------------------------------------------------------------

TEST(RunAgreement, DifferingFieldsNamePathsAndBothValues) {
  const nlohmann::json reference = {{"stage", "v1"}, {"config", {{"training", {{"batch_size", 8}, {"seed", 1}}}}}};
  nlohmann::json mine = reference;
  mine["config"]["training"]["batch_size"] = 16;
  mine["extra"] = true;
  const auto diff = differing_fields(mine, reference);
  ASSERT_EQ(diff.size(), 2u);
  EXPECT_EQ(diff[0], "config.training.batch_size (16 here, 8 on rank 0)");
  EXPECT_EQ(diff[1], "extra (true here, absent on rank 0)");
  EXPECT_TRUE(differing_fields(reference, reference).empty());
  EXPECT_NE(run_fingerprint(mine), run_fingerprint(reference));
  EXPECT_EQ(run_fingerprint(reference), run_fingerprint(nlohmann::json(reference)));
}

// Runs check_same_run on `runs.size()` ranks, each a thread with its own TCPStore client (rank 0 serves),
// and returns each rank's error message ("" when it passed).
std::vector<std::string> agree(const std::vector<nlohmann::json>& runs) {
  const int world = static_cast<int>(runs.size());
  const int port = free_port();
  std::vector<std::string> errors(runs.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        c10d::TCPStoreOptions options;
        options.port = static_cast<uint16_t>(port);
        options.isServer = r == 0;
        options.numWorkers = static_cast<size_t>(world);
        options.timeout = std::chrono::seconds(30);
        c10d::TCPStore store("127.0.0.1", options);
        check_same_run(store, r, world, runs[static_cast<size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::string(dynamic_cast<const ConfigError*>(&e) ? "" : "NOT A CONFIG ERROR: ") +
                                         e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

nlohmann::json a_run() {
  return {{"stage", "v2_fused"}, {"world_size", 3}, {"config", to_json(testing::smoke_config())}};
}

TEST(RunAgreement, SameRunsPass) {
  for (const auto& error : agree({a_run(), a_run(), a_run()})) EXPECT_EQ(error, "");
}

TEST(RunAgreement, EveryRankNamesTheDifferingRankAndFields) {
  auto other = a_run();
  other["config"]["training"]["batch_size"] = 16;
  other["stage"] = "v3_custom";
  const auto errors = agree({a_run(), a_run(), other});
  for (size_t r = 0; r < errors.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_MENTIONS(errors[r], "the ranks were started with different runs");
    EXPECT_MENTIONS(errors[r], "rank 2 (fingerprint " + run_fingerprint(other) + ") differs in");
    EXPECT_MENTIONS(errors[r], "config.training.batch_size (16 here, 4 on rank 0)");
    EXPECT_MENTIONS(errors[r], "stage (\"v3_custom\" here, \"v2_fused\" on rank 0)");
    EXPECT_EQ(errors[r].find("rank 1 ("), std::string::npos) << "rank 1 agrees with rank 0: " << errors[r];
  }
}

TEST(RunAgreement, PortInUseIsNamed) {
  const int port = free_port();
  EXPECT_NO_THROW(check_port_free(port));
  std::string m;
  {
    const testing::OccupiedPort occupied(port);
    ASSERT_TRUE(occupied.listening());
    m = testing::error_of<ConfigError>([&] { check_port_free(port); });
  }
  EXPECT_MENTIONS(m, "MASTER_PORT = " + std::to_string(port) + " is not allowed: the port is in use on this host");
  EXPECT_MENTIONS(m, "--master-port");
}

TEST(DistributedContext, RefusesAHostWithoutGpusOrNccl) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a GPU; the GPU suite tests the GPU count check";
  DistributedEnv env = parse_distributed_env(env_of(kTorchrun));
  const std::string m = testing::error_of<ConfigError>([&] { DistributedContext context(env, {}); });
  if (nccl_available())
    EXPECT_MENTIONS(m, "rank 1 sees no GPU");
  else
    EXPECT_MENTIONS(m, "needs a LibTorch with NCCL and nccl.h at build time");
}

// ---------------------------------------------------------------------------------------------------
// Two ranks on the CPU: threads of this process over an in-process c10d backend (tests/threaded_group.h)
// ---------------------------------------------------------------------------------------------------

struct Trajectory {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> weights;
  std::vector<torch::Tensor> copies;  // the compute copies after the last step (bf16 stages)
  torch::Tensor logits;  // a forward of probe tokens after the last step, before anything else (threads only)
  Checkpoint checkpoint;    // after the last step (rank 0's, gathered, under data parallel)
  int64_t state_bytes = 0;  // the optimizer's moments on this rank
  bool embedding_rows = false;  // the embedding's gradient travelled as rows (DataParallelStep)
};

// One optimizer step per batch of one process on the whole global batch of each step (after `resume`'s state).
Trajectory train_alone(const StageSpec& spec, const RunConfig& c, const std::vector<torch::Tensor>& batches,
                       const Checkpoint* resume = nullptr) {
  Trainer trainer(spec, c, torch::kCPU);
  const int64_t first = resume ? trainer.resume(*resume) : 0;
  Trajectory t;
  for (const auto& batch : batches) {
    auto inputs = batch.narrow(1, 0, c.training.seq_len), labels = batch.narrow(1, 1, c.training.seq_len);
    t.losses.push_back(trainer.step(inputs, labels).item<double>());
  }
  t.checkpoint = trainer.checkpoint(first + static_cast<int64_t>(batches.size()));
  t.weights = trainer.model()->canonical_state();
  t.state_bytes = trainer.optimizer().state_bytes();
  return t;
}

struct InThreads {
  GradientSync sync = GradientSync::kLayers;
  bool shard = false;                  // ZeRO-1 (ShardedAdamW)
  const Checkpoint* resume = nullptr;  // every rank resumes from it
  bool embedding_rows = true;          // DataParallelStep's embedding_rows
  ZeroGather zero_gather = kDefaultZeroGather;  // with shard
  bool all_reduce_on_wait = false;  // the test backend's all-reduces deliver only when waited for (layers only)
};

// The same on `world` ranks, each a thread with its own model, optimizer and DataParallelStep; rank r trains
// rows [r * R, (r + 1) * R) of each global batch of world * R rows (as make_sharded_source deals them).
std::vector<Trajectory> train_in_threads(const StageSpec& spec, const RunConfig& c, int world,
                                         const std::vector<torch::Tensor>& batches, const InThreads& how) {
  auto hub = std::make_shared<testing::ThreadedBackend::Hub>(world);
  hub->all_reduce_on_wait = how.all_reduce_on_wait;
  std::vector<std::unique_ptr<DistributedContext>> contexts;
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<bool> rows;
  int64_t first = 0;
  for (int r = 0; r < world; ++r) {  // built here, one after another: the runs start from the same weights
    DistributedEnv env;
    env.enabled = true;
    env.source = "test threads";
    env.rank = env.local_rank = r;
    env.world_size = world;
    contexts.push_back(std::make_unique<DistributedContext>(env, testing::threaded_group(hub, r), torch::kCPU));
    trainers.push_back(std::make_unique<Trainer>(
        spec, c, torch::kCPU,
        how.shard ? sharded_adamw(*contexts.back(), spec.optimizer, how.zero_gather) : OptimizerMaker()));
    if (how.resume) first = trainers.back()->resume(*how.resume);
    auto step = std::make_unique<DataParallelStep>(*contexts.back(), trainers.back()->model(),
                                                   trainers.back()->optimizer(), c.training.grad_accum_steps,
                                                   how.sync, /*capture_at=*/-1, how.embedding_rows);
    rows.push_back(step->exchanges_embedding_rows());
    trainers.back()->use_runner(std::move(step));
  }
  std::vector<Trajectory> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) out[r].embedding_rows = rows[r];
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        broadcast_weights(*contexts[r], trainers[r]->model());
        for (const auto& batch : batches) {
          const int64_t rows = batch.size(0) / world;
          auto mine = batch.narrow(0, r * rows, rows);
          auto inputs = mine.narrow(1, 0, c.training.seq_len), labels = mine.narrow(1, 1, c.training.seq_len);
          out[r].losses.push_back(trainers[r]->step(inputs, labels).item<double>());
        }
        // A forward right after the last step: with ZeroGather::kForward it all-gathers the updated weights first
        // (a collective: every rank runs it). Then what the forward reads, whole on every rank.
        {
          torch::NoGradGuard no_grad;
          out[r].logits = trainers[r]->model()->forward(testing::random_tokens(2, c.training.seq_len,
                                                                               c.model.vocab_size, 7));
        }
        for (const auto& c : trainers[r]->model()->compute_copies())
          out[r].copies.push_back(c.copy.detach().clone());
        // A collective with a sharded optimizer (it gathers the masters and moments); every rank's copy is whole.
        out[r].checkpoint = trainers[r]->checkpoint(first + static_cast<int64_t>(batches.size()));
        out[r].weights = trainers[r]->model()->canonical_state();
        out[r].state_bytes = trainers[r]->optimizer().state_bytes();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

std::vector<torch::Tensor> global_batches(const RunConfig& c, int world, int steps, int seed) {
  std::vector<torch::Tensor> batches;
  for (int i = 0; i < steps; ++i)
    batches.push_back(testing::random_tokens(world * c.training.grad_accum_steps * c.training.batch_size,
                                             c.training.seq_len + 1, c.model.vocab_size, seed + i));
  return batches;
}

// Two ranks with R rows each equal one process with 2R rows: the same global batch, the gradients averaged
// over it (within fp32 round-off: the sums run in another order), for both ways of averaging, with gradient
// accumulation and clipping on the global norm; the ranks' weights identical, bitwise, after every run.
// The step on the GPU (NCCL, v4's graph) is tested by DataParallelGpu.*.
TEST(DataParallelCpu, TwoRanksEqualOneProcessWithTheSameGlobalBatch) {
  for (const auto& spec : {stages::v1_baseline(), testing::eager_step(stages::v4_ultra())})
    for (const GradientSync sync : {GradientSync::kLayers, GradientSync::kReducer})
      for (const int64_t accum : {1, 2}) {
        SCOPED_TRACE(spec.name + " " + to_string(sync) + " accumulation " + std::to_string(accum));
        RunConfig c = testing::smoke_config();
        c.training.batch_size = 2;  // per rank
        c.training.grad_accum_steps = accum;
        if (accum > 1) c.training.grad_clip = 0.5;
        constexpr int kWorld = 2, kSteps = 4;
        const std::vector<torch::Tensor> batches = global_batches(c, kWorld, kSteps, 100);
        RunConfig alone_config = c;
        alone_config.training.batch_size = kWorld * c.training.batch_size;
        // One process: micro-batch i is rows [i * 2R, (i + 1) * 2R); rank r's micro-batches are other rows of
        // the same step, which is the same mean over the same rows.
        const Trajectory alone = train_alone(spec, alone_config, batches);
        const auto ranks = train_in_threads(spec, c, kWorld, batches, {sync});
        ASSERT_EQ(ranks[0].losses.size(), alone.losses.size());
        for (size_t i = 0; i < alone.losses.size(); ++i) {
          EXPECT_NEAR(ranks[0].losses[i], alone.losses[i], 1e-5 * std::abs(alone.losses[i])) << "step " << i;
          EXPECT_EQ(ranks[1].losses[i], ranks[0].losses[i]) << "step " << i << ": every rank records the mean";
        }
        for (const auto& [name, w] : alone.weights) {
          EXPECT_LE(testing::rel_error(ranks[0].weights.at(name), w), 1e-5) << name;
          EXPECT_TRUE(torch::equal(ranks[1].weights.at(name), ranks[0].weights.at(name))) << name;
        }
        // Positive control: without averaging (each rank alone on its rows) the weights differ.
        if (sync == GradientSync::kLayers && accum == 1) {
          std::vector<torch::Tensor> own;
          for (const auto& b : batches) own.push_back(b.narrow(0, 0, c.training.batch_size));
          const Trajectory rank0_alone = train_alone(spec, c, own);
          double worst = 0;
          for (const auto& [name, w] : rank0_alone.weights)
            worst = std::max(worst, testing::rel_error(ranks[0].weights.at(name), w));
          EXPECT_GT(worst, 1e-4) << "the test would not see missing averaging";
        }
      }
}

// ZeRO-1: two ranks that each keep half of the optimizer's moments (ShardedAdamW: gradients reduce-scattered, the
// slices updated, the weights all-gathered) train exactly as two ranks that keep all of them. Without clipping
// every element's arithmetic is the same, bitwise; with clipping the global norm sums the slices' partial sums in
// another order (within 1e-6). The checkpoints, gathered, hold the same whole moments; each rank holds about half.
// Both times of the all-gathers (--zero-gather): the same arithmetic, bitwise. The test backend's all-gathers
// deliver only when waited for, so a part of the forward that read its weights before its wait would fail here.
// Both multi-tensor AdamWs a stage may shard: ours (v4, every case) and at::_fused_adamw_ (v3: in fp32 its masters
// are what the forward reads; in bf16 the projections' gathered bf16 casts, ProjectionImpl::gathered_cast; tied,
// accumulation once; v2, the same optimizer, in fp32).
// A cosine schedule with warm-up, so a learning rate taken at the wrong step would show. A limit of 1e3 that the
// smoke model's norm never reaches: the clipping factor is exactly 1 and the run bitwise the unsharded one.
TEST(DataParallelCpu, ShardedOptimizerEqualsTheUnshardedOne) {
  std::vector<Trajectory> gathered_in_forward;  // the same case's kForward run (the loop's order)
  for (const StageSpec& spec : {testing::eager_step(stages::v4_ultra()), stages::v3_custom(), stages::v2_fused()})
    for (const bool tied : {true, false})
      for (const Precision dtype : {Precision::kFp32, Precision::kBf16})
        for (const double clip : {0.0, 0.5, 1e3})
          for (const int64_t accum : {1, 2})
            for (const ZeroGather gather : {ZeroGather::kForward, ZeroGather::kUpdate}) {
              if (dtype == Precision::kBf16 && accum > 1) continue;  // bf16: the compute copies' paths, once per clip
              // An untied head (its own weight, gathered before the final norm with kForward): once per dtype.
              if (!tied && (clip > 0 || accum > 1)) continue;
              const bool ours = spec.optimizer == OptimizerKind::kOurAdamW;
              // at::_fused_adamw_'s stages: untied only in bf16 without clipping (the gathered casts of an untied
              // head), v2 in bf16 only without clipping (v2 has v3's casts, another forward).
              const bool casts_case = dtype == Precision::kBf16 && clip == 0.0;
              if (!ours && ((!tied && !casts_case) || (accum > 1 && clip > 0))) continue;
              if (spec.name == "v2_fused" && dtype != Precision::kFp32 && !casts_case) continue;
              const bool never_clips = clip > 1;
              if (never_clips && (dtype != Precision::kFp32 || accum > 1)) continue;
              SCOPED_TRACE(spec.name + " " + std::string(tied ? "tied" : "untied") + " " + to_string(dtype) + " clip " +
                           std::to_string(clip) + " accumulation " + std::to_string(accum) + " all-gathers at the " +
                           to_string(gather));
              RunConfig c = testing::smoke_config();
              c.model.tie_embeddings = tied;
              c.training.dtype = dtype;
              c.training.batch_size = 2;  // per rank
              c.training.grad_accum_steps = accum;
              c.training.grad_clip = clip;
              c.training.lr_schedule = "cosine";
              c.training.lr_warmup_steps = 2;
              const auto batches = global_batches(c, 2, 4, 300);
              const auto whole = train_in_threads(spec, c, 2, batches, {GradientSync::kLayers, false});
              InThreads how{GradientSync::kLayers, true};
              how.zero_gather = gather;
              const auto sharded = train_in_threads(spec, c, 2, batches, how);
              if (gather == ZeroGather::kForward) {
                gathered_in_forward = sharded;
              } else {
                ASSERT_EQ(gathered_in_forward.size(), sharded.size());
                EXPECT_EQ(gathered_in_forward[0].losses, sharded[0].losses);
                EXPECT_TRUE(torch::equal(gathered_in_forward[0].logits, sharded[0].logits));
                for (const auto& [name, w] : sharded[0].weights)
                  EXPECT_TRUE(torch::equal(gathered_in_forward[0].weights.at(name), w)) << name;
              }
              const double tolerance = clip > 0 && !never_clips ? 1e-6 : 0.0;
              // bf16 with clipping: the forward reads bf16 values of the masters (v4's copies, v3's autocast casts),
              // and a master one bit away (the norm sums in another order) can round to another bf16 value, which the
              // next steps carry on (measured on one CPU, the largest over the cases: 6.5e-6 in the losses, 3.6e-4
              // in the weights, 4.4e-3 in the moments; two ranks against one process on the same batches, in another
              // order too, differ by 6e-3 in the weights there, for v3 and v4). A misplaced slice is O(1).
              const bool bf16_rounding = clip > 0 && !never_clips && dtype == Precision::kBf16;
              const double loss_tolerance = bf16_rounding ? 1e-4 : tolerance,
                           weight_tolerance = bf16_rounding ? 5e-3 : tolerance,
                           moment_tolerance = bf16_rounding ? 5e-2 : tolerance;
              for (size_t i = 0; i < whole[0].losses.size(); ++i)
                EXPECT_LE(std::abs(sharded[0].losses[i] - whole[0].losses[i]),
                          loss_tolerance * std::abs(whole[0].losses[i]))
                    << "step " << i;
              for (const auto& [name, w] : whole[0].weights) {
                EXPECT_LE(testing::rel_error(sharded[0].weights.at(name), w), weight_tolerance) << name;
                EXPECT_TRUE(torch::equal(sharded[1].weights.at(name), sharded[0].weights.at(name))) << name;
              }
              // The next forward reads every rank's update: with the all-gathers in that forward (kForward) as with
              // them after the update, its logits are the same on both ranks (a stale slice would differ: each rank's
              // own slice is current) and the unsharded model's, exactly without clipping. With clipping in bf16 the
              // logits and v4's copies move by bf16 steps (above; measured on one CPU: 3.7e-3 and 9.7e-4).
              EXPECT_TRUE(torch::equal(sharded[1].logits, sharded[0].logits));
              EXPECT_LE(testing::rel_error(sharded[0].logits, whole[0].logits), bf16_rounding ? 1e-2 : tolerance * 10);
              // The bf16 copies the forward reads, identical on the ranks.
              ASSERT_EQ(sharded[0].copies.size(), whole[0].copies.size());
              EXPECT_EQ(sharded[0].copies.empty(), dtype == Precision::kFp32 || !spec.compute_copies);
              for (size_t i = 0; i < sharded[0].copies.size(); ++i) {
                EXPECT_TRUE(torch::equal(sharded[1].copies[i], sharded[0].copies[i])) << "copy " << i;
                EXPECT_LE(testing::rel_error(sharded[0].copies[i], whole[0].copies[i]), weight_tolerance)
                    << "copy " << i;
              }
              const Checkpoint &a = sharded[0].checkpoint, &b = whole[0].checkpoint;
              EXPECT_EQ(a.step, b.step);
              ASSERT_EQ(a.exp_avg.size(), b.exp_avg.size());
              for (const auto& [name, m] : b.exp_avg) {
                ASSERT_TRUE(a.exp_avg.count(name)) << name;
                EXPECT_EQ(a.exp_avg.at(name).sizes(), m.sizes()) << name;
                EXPECT_LE(testing::rel_error(a.exp_avg.at(name), m), moment_tolerance) << name;
                EXPECT_LE(testing::rel_error(a.exp_avg_sq.at(name), b.exp_avg_sq.at(name)), moment_tolerance) << name;
              }
              // Every element's moments are on exactly one rank, and no rank holds much more than half (the smoke
              // model's 64-element norm weights are one 64-element slice, so rank 0 holds them whole).
              EXPECT_EQ(sharded[0].state_bytes + sharded[1].state_bytes, whole[0].state_bytes);
              for (const auto& rank : sharded) EXPECT_LE(rank.state_bytes, 0.55 * whole[0].state_bytes);
            }
}

// The embedding's gradient as rows (DataParallelStep, LayerSync): where only the lookup writes it (bf16 with a tied
// head, which reads the bf16 copy; fp32 with an untied head), two ranks exchanging the rows their tokens touched
// train exactly as two ranks averaging it densely, bitwise (each element is a / 2 + b / 2 either way): with the
// all-reduce and with ZeRO-1, with accumulation (the rows of every micro-batch). Where the head also writes it
// (fp32, tied) the gradient stays dense.
TEST(DataParallelCpu, EmbeddingRowsEqualTheDenseAverage) {
  const StageSpec spec = testing::eager_step(stages::v4_ultra());
  struct Case {
    Precision dtype;
    bool tied;
  };
  for (const Case& k : {Case{Precision::kBf16, true}, Case{Precision::kFp32, false}, Case{Precision::kFp32, true}})
    for (const bool shard : {false, true})
      for (const int64_t accum : {1, 2}) {
        SCOPED_TRACE(std::string(to_string(k.dtype)) + (k.tied ? " tied" : " untied") + (shard ? " ZeRO-1" : "") +
                     " accumulation " + std::to_string(accum));
        RunConfig c = testing::smoke_config();
        c.training.dtype = k.dtype;
        c.model.tie_embeddings = k.tied;
        c.training.batch_size = 2;  // per rank
        c.training.grad_accum_steps = accum;
        const auto batches = global_batches(c, 2, 3, 500);
        const auto dense = train_in_threads(spec, c, 2, batches, {GradientSync::kLayers, shard, nullptr, false});
        const auto rows = train_in_threads(spec, c, 2, batches, {GradientSync::kLayers, shard, nullptr, true});
        EXPECT_FALSE(dense[0].embedding_rows);
        EXPECT_EQ(rows[0].embedding_rows, k.dtype == Precision::kBf16 || !k.tied);
        EXPECT_EQ(rows[0].losses, dense[0].losses);
        for (const auto& [name, w] : dense[0].weights) {
          EXPECT_TRUE(torch::equal(rows[0].weights.at(name), w)) << name;
          EXPECT_TRUE(torch::equal(rows[1].weights.at(name), rows[0].weights.at(name))) << name;
        }
      }
}

// Our AdamW overlapped with the backward under data parallel (an all-reduce per layer): each layer's update waits,
// on its own stream, for that layer's all-reduce, and gives bitwise the run that updates after the backward, on
// every rank, in fp32 and bf16, with and without clipping (whose norm is over the averaged gradients) and with
// accumulation. The test backend's all-reduces deliver here only when waited for, so an update that read a layer's
// gradients before waiting for their average would read this rank's own and fail (it did, with the wait taken out).
// v4 eager: the CPU runs a layer's update inside its hook.
TEST(DataParallelCpu, OverlappedUpdateEqualsTheUpdateAfterTheBackward) {
  const StageSpec spec = testing::eager_step(stages::v4_ultra());
  for (const Precision dtype : {Precision::kFp32, Precision::kBf16})
    for (const double clip : {0.0, 0.5})
      for (const int64_t accum : {1, 2}) {
        if (dtype == Precision::kBf16 && accum > 1) continue;
        SCOPED_TRACE(std::string(to_string(dtype)) + " clip " + std::to_string(clip) + " accumulation " +
                     std::to_string(accum));
        RunConfig c = testing::smoke_config();
        c.training.dtype = dtype;
        c.training.grad_clip = clip;
        c.training.batch_size = 2;  // per rank
        c.training.grad_accum_steps = accum;
        const auto batches = global_batches(c, 2, 3, 700);
        InThreads how;
        how.all_reduce_on_wait = true;
        const auto after = train_in_threads(spec, c, 2, batches, how);
        c.training.optimizer_overlap = true;
        const auto overlapped = train_in_threads(spec, c, 2, batches, how);
        for (int r = 0; r < 2; ++r) {
          EXPECT_EQ(overlapped[r].losses, after[r].losses) << "rank " << r;
          for (const auto& [name, w] : after[r].weights)
            EXPECT_TRUE(torch::equal(overlapped[r].weights.at(name), w)) << "rank " << r << " " << name;
          const Checkpoint& x = overlapped[r].checkpoint;
          const Checkpoint& y = after[r].checkpoint;
          for (const auto& [name, m] : y.exp_avg) {
            EXPECT_TRUE(torch::equal(x.exp_avg.at(name), m)) << "rank " << r << " " << name;
            EXPECT_TRUE(torch::equal(x.exp_avg_sq.at(name), y.exp_avg_sq.at(name))) << "rank " << r << " " << name;
          }
        }
      }
}

// The Reducer's buckets and ZeRO-1's reduce-scatter do not follow the layers: DataParallelStep refuses an
// overlapping optimizer with the Reducer, and the sharded optimizer refuses the overlap when it is made (plan_run
// turns the overlap off first in both cases, and says so in the stage's summary).
TEST(DataParallelCpu, OverlapNeedsAnAllReducePerLayerAndNoSharding) {
  RunConfig c = testing::smoke_config();
  c.training.optimizer_overlap = true;
  const StageSpec spec = testing::eager_step(stages::v4_ultra());
  DistributedEnv env;
  env.enabled = true;
  env.source = "test threads";
  env.world_size = 1;
  DistributedContext context(env, testing::threaded_group(std::make_shared<testing::ThreadedBackend::Hub>(1), 0),
                             torch::kCPU);
  Trainer trainer(spec, c, torch::kCPU);
  ASSERT_TRUE(trainer.optimizer().overlaps_backward());
  EXPECT_THROW(DataParallelStep(context, trainer.model(), trainer.optimizer(), 1, GradientSync::kReducer), c10::Error);
  EXPECT_NO_THROW(DataParallelStep(context, trainer.model(), trainer.optimizer(), 1, GradientSync::kLayers));
  EXPECT_THROW(Trainer(spec, c, torch::kCPU, sharded_adamw(context, spec.optimizer)), c10::Error);
  // That step is gone, and it took its wait back: the trainer's own step runs without it (it would otherwise call
  // into the destroyed step's all-reduces).
  const auto batch = testing::random_tokens(c.training.batch_size, c.training.seq_len + 1, c.model.vocab_size, 3);
  EXPECT_NO_THROW(trainer.step(batch.narrow(1, 0, c.training.seq_len), batch.narrow(1, 1, c.training.seq_len)));
  c.training.optimizer_overlap = false;
  Trainer plain(spec, c, torch::kCPU);
  EXPECT_FALSE(plain.optimizer().overlaps_backward());
  EXPECT_THROW(plain.optimizer().wait_for_averaging([](const std::vector<torch::Tensor>&) {}), c10::Error);
}

// A sharded run's checkpoint is the single-file format, whole, so runs resume across world sizes: one process
// for 2 steps, then two ranks with ZeRO-1 for 2 more (the same global batch), then one process again, end where
// one process training all 6 steps ends (within fp32 round-off: the averages sum in another order).
TEST(DataParallelCpu, ShardedCheckpointsResumeAcrossWorldSizes) {
  for (const StageSpec& spec : {testing::eager_step(stages::v4_ultra()), stages::v3_custom()}) {
    SCOPED_TRACE(spec.name);
    RunConfig c = testing::smoke_config();
    c.training.batch_size = 2;  // per rank
    c.training.grad_clip = 0.5;
    c.training.lr_schedule = "cosine";  // a resumed run's learning rate must come from the restored step count
    c.training.lr_warmup_steps = 2;
    RunConfig alone = c;
    alone.training.batch_size = 4;
    const auto batches = global_batches(c, 2, 6, 500);
    auto part = [&](size_t from, size_t to) {
      return std::vector<torch::Tensor>(batches.begin() + static_cast<long>(from),
                                        batches.begin() + static_cast<long>(to));
    };
    const Trajectory reference = train_alone(spec, alone, batches);
    const Trajectory first = train_alone(spec, alone, part(0, 2));
    const auto second = train_in_threads(spec, c, 2, part(2, 4), {GradientSync::kLayers, true, &first.checkpoint});
    EXPECT_EQ(second[0].checkpoint.step, 4);
    const Trajectory third = train_alone(spec, alone, part(4, 6), &second[0].checkpoint);
    for (const auto& [name, w] : reference.weights)
      EXPECT_LE(testing::rel_error(third.weights.at(name), w), 1e-5) << name;
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_NEAR(second[0].losses[i], reference.losses[2 + i], 1e-5 * reference.losses[2 + i]) << "step " << 2 + i;
      EXPECT_NEAR(third.losses[i], reference.losses[4 + i], 1e-5 * reference.losses[4 + i]) << "step " << 4 + i;
    }
    // Positive control: the moments matter here (a resume that dropped them would not end where the reference does).
    Checkpoint without_moments = second[0].checkpoint;
    for (auto& [name, m] : without_moments.exp_avg) m.zero_();
    const Trajectory wrong = train_alone(spec, alone, part(4, 6), &without_moments);
    double worst = 0;
    for (const auto& [name, w] : reference.weights)
      worst = std::max(worst, testing::rel_error(wrong.weights.at(name), w));
    EXPECT_GT(worst, 1e-4) << "the test would not see lost moments";
    // A resume may switch sharding (the file holds the state whole either way).
    RunConfig resumed = second[0].checkpoint.config;
    resumed.training.shard_optimizer = !resumed.training.shard_optimizer;
    EXPECT_NO_THROW(check_resumable(second[0].checkpoint, "sharded.pt", spec.name, resumed, /*graphed=*/false));
  }
}

// The in-process backend catches what hangs real runs: ranks calling different collectives (or the same one on
// other shapes) both fail, naming each rank's call. And a sharded step refuses a leaf without a gradient instead
// of reusing its slice of the last step's.
TEST(DataParallelCpu, RanksOutOfStepFailInsteadOfHanging) {
  auto hub = std::make_shared<testing::ThreadedBackend::Hub>(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto group = testing::threaded_group(hub, r);
      std::vector<torch::Tensor> t{torch::ones({r == 0 ? 3 : 4})};
      try {
        group->allreduce(t)->wait();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    EXPECT_MENTIONS(e, "the ranks called different collectives");
    EXPECT_MENTIONS(e, "rank 0: allreduce Float[3]");
    EXPECT_MENTIONS(e, "rank 1: allreduce Float[4]");
  }

  RunConfig c = testing::smoke_config();
  DistributedEnv env;
  env.enabled = true;
  env.world_size = 2;
  DistributedContext context(env, testing::threaded_group(std::make_shared<testing::ThreadedBackend::Hub>(2), 0),
                             torch::kCPU);
  Trainer trainer(stages::v4_ultra(), c, torch::kCPU, sharded_adamw(context, OptimizerKind::kOurAdamW));
  auto& sharded = dynamic_cast<ShardedAdamW&>(trainer.optimizer());
  EXPECT_MENTIONS(testing::error_of<c10::Error>([&] { sharded.reduce_scatter(trainer.model()->parameters()); }),
                  "has no gradient; every one must receive one each step");
}

// ---------------------------------------------------------------------------------------------------

// stage_main reads the process environment: set for one test, then restored.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_)
      value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// --zero-gather forward needs more hardware queues than CUDA's default, which CUDA reads only when it starts: the
// run asks for 32 (its stage then restarts with them) exactly when ZeRO-1 gathers in the forward, under a launcher,
// off the CPU, the environment gives none (an empty value is none, for CUDA as for us) and the run is not refused.
TEST(DataParallelPlan, ZeroGatherForwardAsksForHardwareQueues) {
  DistributedEnv dist;
  dist.enabled = true;
  dist.world_size = 2;
  RunConfig sharded;
  sharded.training.shard_optimizer = true;
  sharded.training.device = "auto";
  RunOptions defaults, forward, update;
  forward.zero_gather = ZeroGather::kForward;
  update.zero_gather = ZeroGather::kUpdate;
  const StageSpec v4 = stages::v4_ultra();
#if defined(USE_ROCM) || defined(TT_BACKEND_HIP)
  EXPECT_EQ(hardware_queues_needed(v4, sharded, forward, dist), std::nullopt);  // HIP does not read CUDA's variable
  return;
#endif
  for (const std::string unset : {"", "(unset)"}) {
    ScopedEnv env(std::map<std::string, std::string>{{"CUDA_DEVICE_MAX_CONNECTIONS", unset}});
    if (unset != "") ::unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
    EXPECT_FALSE(hardware_queues().has_value());
    EXPECT_EQ(hardware_queues_needed(v4, sharded, defaults, dist), std::optional<std::string>("32"));  // the default
    EXPECT_EQ(hardware_queues_needed(v4, sharded, forward, dist), std::optional<std::string>("32"));
    EXPECT_EQ(hardware_queues_needed(v4, sharded, update, dist), std::nullopt);
    RunConfig on_cuda = sharded, on_cpu = sharded, unsharded = sharded;
    on_cuda.training.device = "cuda";
    on_cpu.training.device = "cpu";
    unsharded.training.shard_optimizer = false;
    EXPECT_EQ(hardware_queues_needed(v4, on_cuda, forward, dist), std::optional<std::string>("32"));
    EXPECT_EQ(hardware_queues_needed(v4, on_cpu, forward, dist), std::nullopt);
    EXPECT_EQ(hardware_queues_needed(v4, unsharded, defaults, dist), std::nullopt);
    EXPECT_EQ(hardware_queues_needed(v4, sharded, forward, DistributedEnv{}), std::nullopt);  // no launcher
    // Runs that plan_run refuses are not restarted first: ZeRO-1 on a stage whose optimizer steps parameter by
    // parameter, or beside the Reducer. A stage with at::_fused_adamw_ is sharded as ours is.
    EXPECT_EQ(hardware_queues_needed(stages::v1_baseline(), sharded, forward, dist), std::nullopt);
    EXPECT_EQ(hardware_queues_needed(stages::v3_custom(), sharded, forward, dist), std::optional<std::string>("32"));
    RunOptions reducer = forward;
    reducer.dp_sync = GradientSync::kReducer;
    EXPECT_EQ(hardware_queues_needed(v4, sharded, reducer, dist), std::nullopt);
  }
  ScopedEnv env(std::map<std::string, std::string>{{"CUDA_DEVICE_MAX_CONNECTIONS", "8"}});  // the user's choice stands
  EXPECT_EQ(hardware_queues(), std::optional<std::string>("8"));
  EXPECT_EQ(hardware_queues_needed(v4, sharded, forward, dist), std::nullopt);
}

// The restart itself, through the executable, on a machine without a GPU (with one, the GPU suite checks it:
// DataParallelGpu.ZeroGatherForwardEqualsUpdateBitwise): under launcher variables a sharded run with the default
// gather starts again once with the variable (rank 0 says so once), then meets its refusal (no GPU).
TEST(DataParallelCommandLine, ARankThatNeedsHardwareQueuesRestartsOnceWithThem) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a GPU: the GPU suite checks the restart";
  namespace fs = std::filesystem;
  const fs::path binary = fs::canonical("/proc/self/exe").parent_path().parent_path() / "v4_ultra";  // build/tests/..
  const fs::path err = fs::temp_directory_path() / ("tt_restart_" + std::to_string(::getpid()) + ".err");
  const std::string command =
      "env -u CUDA_DEVICE_MAX_CONNECTIONS RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
      "MASTER_PORT=" + std::to_string(testing::free_port()) + " " + binary.string() + " --config " + TT_SOURCE_DIR +
      "/configs/smoke.json --shard-optimizer --output " + (fs::temp_directory_path() / "tt_restart.json").string() +
      " > /dev/null 2> " + err.string();
  const int status = std::system(command.c_str());
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(err);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 2) << text;
  const std::string note = "restarting with CUDA_DEVICE_MAX_CONNECTIONS=32";
  const size_t first = text.find(note);
  EXPECT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find(note, first + 1), std::string::npos) << "restarted more than once:\n" << text;
  EXPECT_MENTIONS(text, nccl_available() ? "rank 0 sees no GPU" : "needs a LibTorch with NCCL");
}

// NCCL's graph mixing is off exactly where NCCL reads NCCL_GRAPH_MIXING_SUPPORT as 0 (strtoll, base 0; a value it
// cannot read leaves its default, on): only then do collectives outside a graph wait for the GPU first.
TEST(DataParallelPlan, GraphMixingIsOffWhereNcclReadsZero) {
  EXPECT_FALSE(graph_mixing_off(nullptr));  // unset: NCCL's default
  EXPECT_FALSE(graph_mixing_off(""));
  for (const char* zero : {"0", "00", "0x0", " 0"}) EXPECT_TRUE(graph_mixing_off(zero)) << zero;
  EXPECT_FALSE(graph_mixing_off("1"));
  EXPECT_FALSE(graph_mixing_off("2"));                     // not 0 or 1: NCCL keeps its default
  EXPECT_FALSE(graph_mixing_off("99999999999999999999"));  // out of range: NCCL keeps its default
}

// Under a launcher a graphed stage keeps its graph (an all-reduce per layer, captured, the default) unless
// --dp-sync reducer asks for the Reducer, which needs the eager step; eager stages stay eager either way.
TEST(DataParallelPlan, GradientSyncAndStepKind) {
  DistributedEnv dist;
  dist.enabled = true;
  dist.world_size = 2;
  RunOptions defaults, reducer, layers;
  reducer.dp_sync = GradientSync::kReducer;
  layers.dp_sync = GradientSync::kLayers;
  EXPECT_EQ(effective_stage(stages::v4_ultra(), defaults, dist).step, StepKind::kGraph);
  EXPECT_EQ(effective_stage(stages::v4_ultra(), layers, dist).step, StepKind::kGraph);
  const StageSpec eager_v4 = effective_stage(stages::v4_ultra(), reducer, dist);
  EXPECT_EQ(eager_v4.step, StepKind::kEager);
  EXPECT_MENTIONS(eager_v4.summary, "--dp-sync reducer, the step runs eagerly");
  EXPECT_EQ(effective_stage(stages::v3_custom(), layers, dist).step, StepKind::kEager);
  EXPECT_EQ(effective_stage(stages::v3_custom(), reducer, dist).step, StepKind::kEager);
  EXPECT_EQ(kDefaultGradientSync, GradientSync::kLayers);
  EXPECT_EQ(parse_gradient_sync("layers"), GradientSync::kLayers);
  EXPECT_EQ(parse_gradient_sync(to_string(GradientSync::kReducer)), GradientSync::kReducer);
  EXPECT_MENTIONS(testing::error_of<ConfigError>([] { parse_gradient_sync(""); }),
                  "--dp-sync '' is not allowed: must be reducer (c10d's Reducer, eager) or layers");
  EXPECT_EQ(parse_embedding_grad_exchange("rows"), EmbeddingGradExchange::kRows);
  EXPECT_EQ(parse_embedding_grad_exchange(to_string(EmbeddingGradExchange::kDense)), EmbeddingGradExchange::kDense);
  EXPECT_MENTIONS(testing::error_of<ConfigError>([] { parse_embedding_grad_exchange("sparse"); }),
                  "--dp-embedding-grad 'sparse' is not allowed: must be rows");
  EXPECT_EQ(parse_zero_gather("forward"), ZeroGather::kForward);
  EXPECT_EQ(parse_zero_gather(to_string(ZeroGather::kUpdate)), ZeroGather::kUpdate);
  EXPECT_MENTIONS(testing::error_of<ConfigError>([] { parse_zero_gather("later"); }),
                  "--zero-gather 'later' is not allowed: must be forward");
}

TEST(DataParallelCommandLine, RefusalsBeforeAnyWork) {
  {
    auto [code, err] = testing::run_stage(stages::v2_fused(), {"--device", "cpu", "--dist-timeout", "0"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "--dist-timeout 0 is not allowed: must be >= 1 second");
  }
  {
    auto [code, err] = testing::run_stage(stages::v2_fused(), {"--device", "cpu", "--dist-timeout", "30"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "--dist-timeout applies to data-parallel runs");
  }
  {
    auto [code, err] = testing::run_stage(stages::v4_ultra(), {"--device", "cpu", "--dp-sync", "layers"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "--dp-sync applies to data-parallel runs");
  }
  {
    auto [code, err] = testing::run_stage(stages::v4_ultra(), {"--device", "cpu", "--dp-embedding-grad", "dense"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "--dp-embedding-grad applies to data-parallel runs");
  }
  {
    auto [code, err] = testing::run_stage(stages::v4_ultra(), {"--device", "cpu", "--zero-gather", "forward"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "--zero-gather applies to data-parallel runs");
  }
  {
    auto [code, err] = testing::run_stage(stages::v4_ultra(), {"--device", "cpu", "--shard-optimizer"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "\"training.shard_optimizer\" = true (--shard-optimizer) applies to data-parallel runs");
  }
  for (const auto& [stage, flags, phrase] : std::vector<std::tuple<StageSpec, std::vector<std::string>, std::string>>{
           {stages::v1_baseline(),
            {"--shard-optimizer"},
            "is not allowed for v1_baseline, whose optimizer (torch::optim::AdamW) steps parameter by parameter: "
            "ZeRO-1 updates slices with a multi-tensor AdamW"},
           {stages::v4_ultra(),
            {"--shard-optimizer", "--dp-sync", "reducer"},
            "is not allowed with --dp-sync reducer: the Reducer all-reduces whole gradients"},
           {stages::v4_ultra(),
            {"--dp-sync", "reducer", "--dp-embedding-grad", "rows"},
            "--dp-embedding-grad rows is not allowed with --dp-sync reducer"},
           {stages::v4_ultra(),
            {"--zero-gather", "update"},
            "--zero-gather applies to a sharded optimizer (config: field \"training.shard_optimizer\" = true"}}) {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}});
    std::vector<std::string> args = {"--device", "cpu"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto [code, err] = testing::run_stage(stage, args);
    EXPECT_EQ(code, 2) << stage.name;
    EXPECT_MENTIONS(err, phrase);
  }
  {
    auto [code, err] = testing::run_stage(stages::v4_ultra(), {"--device", "cpu", "--dp-sync", "ring"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "--dp-sync 'ring' is not allowed: must be reducer");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "29500"},
                   {"MASTER_ADDR", "restored afterwards"}});
    ::unsetenv("MASTER_ADDR");
    auto [code, err] = testing::run_stage(stages::v2_fused(), {"--device", "cpu"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "MASTER_ADDR is not set");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}});
    auto [code, err] = testing::run_stage(stages::v2_fused(), {"--device", "cpu"});
    EXPECT_EQ(code, 2);
    EXPECT_MENTIONS(err, "\"training.device\" = \"cpu\" is not allowed under a data-parallel launcher");
  }
  // --scaling-baseline must be a 1-GPU run of the same stage, model, dtype and per-GPU batch: each differing
  // field is named with both values (checked before the rendezvous, so no GPU is needed here).
  RunConfig c = testing::smoke_config();
  c.training.num_steps = 1;
  c.training.warmup_steps = 0;
  std::ostringstream log;
  const nlohmann::json v2_result = testing::train_result(stages::v2_fused(), c, torch::kCPU, log);
  const std::string dir = ::testing::TempDir();
  auto baseline = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json r = v2_result;
    change(r);
    const std::string path = dir + "/" + name + ".json";
    std::ofstream(path) << r.dump();
    return path;
  };
  const std::string smoke = std::string(TT_SOURCE_DIR) + "/configs/smoke.json";
  for (const auto& [name, change, phrase] :
       std::vector<std::tuple<std::string, std::function<void(nlohmann::json&)>, std::string>>{
           {"other_stage", [](nlohmann::json& r) { r["stage"]["name"] = "v1_baseline"; },
            "its stage.name is \"v1_baseline\", this run's is \"v2_fused\""},
           {"other_batch", [](nlohmann::json& r) { r["training"]["batch_size"] = 3; },
            "its training.batch_size is 3, this run's is 4"},
           {"other_dtype", [](nlohmann::json& r) { r["training"]["dtype"] = "bf16"; },
            "its training.dtype is \"bf16\", this run's is \"fp32\""},
           {"two_gpus", [](nlohmann::json& r) { r["distributed"] = {{"world_size", 2}}; },
            "its distributed.world_size is 2, this run's is 1"}}) {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}});
    const std::string path = baseline(name, change);
    auto [code, err] =
        testing::run_stage(stages::v2_fused(), {"--config", smoke, "--device", "cuda", "--scaling-baseline", path});
    EXPECT_EQ(code, 2) << name;
    EXPECT_MENTIONS(err, phrase);
  }
}

}  // namespace
}  // namespace tt
