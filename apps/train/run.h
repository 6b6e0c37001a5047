// One run of a stage executable, in one place: the plan (config + flags -> the run that will happen, with
// every refusal decided once, before any work) and its execution (data, model, trainer, checkpoints, signals,
// data parallel) to the result file. The command line (apps/cli/stage_cli.h) only parses flags into a
// RunConfig and RunOptions, and prints.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "apps/train/checkpointing.h"
#include "apps/train/distributed.h"
#include "apps/train/error_message.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/stage.h"

namespace tt {

// The flags of a run beside its config.
struct RunOptions {
  std::string output;           // result JSON; empty: results/<stage>_<config>_<dtype>_<time>.json
  bool overwrite = false;       // replace an existing result, trace or checkpoint file
  std::string save_checkpoint;
  std::string load_checkpoint;
  // Checkpoints during training (apps/train/checkpointing.h) and the exact continuation of a run.
  std::string checkpoint_dir;    // empty: none; set alone: one at the last step or at a stop on a signal
  int64_t checkpoint_every = 0;  // also every N steps
  int64_t keep_checkpoints = 0;  // this run's newest N periodic ones kept; 0: all
  std::string resume;            // a checkpoint of this run (same stage, model and training config)
  bool validate_only = false;   // print the effective config and exit
  bool doctor = false;
  std::string eval_data;        // held-out text file: evaluated after training (or instead, with eval_only)
  int64_t eval_every = 0;       // also evaluate every N steps during training; 0: only after the last
  bool eval_only = false;       // evaluate the load_checkpoint weights, no training
  int64_t profile_steps = 0;    // --profile: extra steps recorded with Kineto after the measured ones; 0 = off
  bool no_graph = false;        // run a graphed stage's step eagerly (the same kernels, launched one by one)
  std::optional<Pitfall> pitfall;  // --pitfall NAME: the debugging exercise (v3_custom only)
  // Data parallel (a launcher set RANK/WORLD_SIZE, OMPI_COMM_WORLD_* or SLURM_*): apps/train/distributed.h.
  int64_t dist_timeout_s = 300;    // rendezvous and NCCL watchdog: a dead or hung rank stops the run after it
  bool dist_timeout_given = false;
  std::string scaling_baseline;    // a 1-GPU result JSON: fills in the result's scaling efficiency
  std::optional<GradientSync> dp_sync;  // --dp-sync; unset: kDefaultGradientSync
  std::optional<EmbeddingGradExchange> dp_embedding_grad;  // --dp-embedding-grad; unset: rows (layers), dense (reducer)
  std::optional<ZeroGather> zero_gather;  // --zero-gather (with a sharded optimizer); unset: kDefaultZeroGather
};

// The stage as this run will run it: --no-graph and --pitfall applied, and under a launcher (`dist` enabled)
// with --dp-sync reducer, the eager step the Reducer needs. Throws ConfigError for --no-graph on a stage that
// runs eagerly anyway.
StageSpec effective_stage(const StageSpec& stage, const RunOptions& options, const DistributedEnv& dist);

// What will happen, decided before any work.
struct RunPlan {
  StageSpec spec;  // effective_stage's
  RunConfig config;
  RunOptions options;
  DistributedEnv dist;                    // enabled under a launcher
  GradientSync dp_sync = kDefaultGradientSync;  // under a launcher: how the gradients are averaged
  EmbeddingGradExchange dp_embedding_grad = EmbeddingGradExchange::kRows;  // and the embedding's (kDense: reducer)
  bool writes_files = true;               // rank 0 (or the only process) writes the result and checkpoints
  std::string output;                     // the result JSON
  std::string trace;                      // --profile's trace, beside the result
  std::optional<Checkpoint> resume_from;  // --resume's checkpoint, read and checked
  RunCheckpoints checkpoints;             // the checkpoint folder, checked
};

// CUDA_DEVICE_MAX_CONNECTIONS (the GPU's hardware queues) as this run needs it set before CUDA starts, or nullopt:
// "32" for ZeRO-1 with --zero-gather forward under a launcher, on a device other than the CPU, when the environment
// sets none (an empty value is none, for CUDA as here). Its all-gathers run in branches of the CUDA graph beside the
// forward, and with CUDA's default 8 queues they shared them with it: on 2 x H200 the first layer's attention waited
// 3 ms behind them with 8, none with 32 (docs/multi-gpu.md). CUDA reads the variable once, when it starts, so the
// stage's entry (apps/cli/stage_cli.cpp) restarts the process with it before anything touches the GPU. Never on
// ROCm, whose HIP does not read it (its GPU_MAX_HW_QUEUES is not measured here).
// A run that plan_run would refuse for data parallel's options gets nullopt (its refusal comes first).
std::optional<std::string> hardware_queues_needed(const StageSpec& stage, const RunConfig& config,
                                                  const RunOptions& options, const DistributedEnv& dist);

// Every refusal of the run, before any work (nothing read but small files, no GPU memory taken): the stage's
// flags, data parallel's options, every file the run will write, the checkpoint folder's rules, the resumed
// checkpoint and the graph's warm-up. Throws ConfigError naming the flag, field or file (exit code 2).
RunPlan plan_run(const StageSpec& stage, const RunConfig& config, const RunOptions& options,
                 const DistributedEnv& dist);

// How a run ended: its result (null on ranks other than 0), where it was written, and the process's exit code
// (0; 128 + the signal when a signal stopped it).
struct RunOutcome {
  nlohmann::json result;
  std::string output;
  int exit_code = 0;
};

// A run that failed after the plan: its message and exit code (2: the user's input, found only when read, such
// as a --load-checkpoint of another model, or ranks started with different runs; 3: out of GPU memory, with
// the sizes involved; 1: anything else). Nothing was written.
class RunError : public std::runtime_error {
 public:
  RunError(int exit_code, const std::string& message) : std::runtime_error(message), exit_code(exit_code) {}
  int exit_code;
};

// Executes the plan (log: rank 0's progress; other ranks are silent) and writes the result file. Throws RunError.
RunOutcome execute_run(RunPlan plan, std::ostream& log);

}  // namespace tt
