// Data parallel's plain side, before any GPU or collective (apps/train/distributed.h and data_parallel_step.h
// are the rest): who this process is, from the variables its launcher set; which rows of each global batch it
// trains; how the gradients are averaged; and the start-up agreement that every rank runs the same run.
// Everything here is tested on the CPU.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/train/data.h"
#include "models/config.h"

namespace c10d {
class Store;
}

namespace tt {

// ---------------------------------------------------------------------------------------------------
// Who this process is, from the variables its launcher set
// ---------------------------------------------------------------------------------------------------

struct DistributedEnv {
  bool enabled = false;        // false: no launcher variables, a plain single-process run
  std::string source;          // "torchrun-style" | "Open MPI" | "Slurm"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;          // the GPU index on this host
  int local_world_size = -1;   // processes on this host; -1 when the launcher does not say
  std::string master_addr;
  int master_port = 0;
};

constexpr int kDefaultMasterPort = 29500;

// Looks a variable up; std::nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// Reads, in this order of precedence: RANK/WORLD_SIZE/LOCAL_RANK (scripts/launch.sh, torchrun), then
// OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE (mpirun), then SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
// (srun); MASTER_ADDR and MASTER_PORT with each (the port defaults to 29500 under mpirun and srun).
// None of them set: enabled = false. Throws ConfigError naming the variable, its value and what is
// allowed for a missing, non-numeric or out-of-range value.
DistributedEnv parse_distributed_env(const EnvLookup& lookup);

// ---------------------------------------------------------------------------------------------------
// How the gradients are averaged over ranks (--dp-sync)
// ---------------------------------------------------------------------------------------------------

// kReducer: c10d's Reducer (what Python's DDP drives): buckets of about 25 MiB in the order the first backward
// produced gradients, its bookkeeping on the host during the backward, so the step runs eagerly.
// kLayers: one all-reduce per transformer layer (and per run of parameters between layers), started by a hook
// when the layer's last gradient is final, on NCCL's stream beside the rest of the backward: no host state
// between steps, so a graphed stage captures it with the rest of its step.
enum class GradientSync { kReducer, kLayers };
const char* to_string(GradientSync sync);
// "reducer" or "layers"; throws ConfigError naming --dp-sync, the value and both allowed ones.
GradientSync parse_gradient_sync(const std::string& value);
// The default, the faster one on every stage measured (docs/multi-gpu.md: 2 x H200, medium bf16, v3 and v4).
constexpr GradientSync kDefaultGradientSync = GradientSync::kLayers;

// How the embedding's gradient is averaged with --dp-sync layers (--dp-embedding-grad), where only the lookup
// writes it (bf16 stages, whose output head reads the bf16 copy; an untied embedding): kRows all-gathers the rows
// the step's tokens touched with their token ids and rebuilds the mean (the same numbers as dense on two ranks,
// a fraction of the bytes); kDense averages all of it, as every other gradient. The Reducer always sends it dense.
enum class EmbeddingGradExchange { kRows, kDense };
const char* to_string(EmbeddingGradExchange exchange);
// "rows" or "dense"; throws ConfigError naming --dp-embedding-grad, the value and both allowed ones.
EmbeddingGradExchange parse_embedding_grad_exchange(const std::string& value);

// When ZeRO-1 all-gathers the updated weights (--zero-gather, apps/train/sharded_adamw.h): kUpdate after each
// layer's update, beside the next layer's, the step ending when all are done; kForward (the default) the
// embedding's and layer 0's likewise, the others at the start of the next step, each layer's forward waiting for
// its own weights only, so those all-gathers run beside the forward. On 2 x H200 (medium bf16, v4 graphed) kForward
// ran 33.46-33.52 ms a step against kUpdate's 34.13-34.24, given the CUDA_DEVICE_MAX_CONNECTIONS=32 it needs
// (hardware_queues_needed, apps/train/run.h); without it, it lost (docs/multi-gpu.md).
enum class ZeroGather { kForward, kUpdate };
constexpr ZeroGather kDefaultZeroGather = ZeroGather::kForward;
const char* to_string(ZeroGather gather);
// "forward" or "update"; throws ConfigError naming --zero-gather, the value and both allowed ones.
ZeroGather parse_zero_gather(const std::string& value);

// NCCL's graph mixing (NCCL_GRAPH_MIXING_SUPPORT, NCCL's default 1) lets collectives captured in a CUDA graph and
// collectives launched outside it be outstanding at once, by putting NCCL's own stream and events between each
// captured collective and the step's kernels. Off, the collectives sit on the step's streams as captured: on 2 x H200
// (medium bf16, v4 graphed, ZeRO-1) the step took 32.12-32.13 ms against 33.02-33.08 ms with it on (another host:
// 32.71-32.82 against 33.11-33.29; the gaps before the GEMMs and attention kernels shrank; docs/multi-gpu.md). The price, in NCCL's documentation: no
// collective may be launched outside a graph while a replay of a graph that holds collectives may still run,
// whatever the streams; DistributedContext then waits for the device first (apps/train/distributed.h).
// The variable's value as NCCL reads it (strtoll, base 0, when set and not empty): true when it turns mixing off.
bool graph_mixing_off(const char* nccl_graph_mixing_support);

// ---------------------------------------------------------------------------------------------------
// Sharding: every rank draws the global batch and keeps rows [rank * B, (rank + 1) * B) of each step
// ---------------------------------------------------------------------------------------------------

// Wraps a source that fills [n * B * world, S + 1] global rows (n steps of a global batch of B * world)
// and keeps this rank's B rows of every step. The union of all ranks' rows is exactly what a single
// process with batch B * world draws from the same seed.
std::unique_ptr<TokenSource> make_sharded_source(std::unique_ptr<TokenSource> global, int64_t per_rank_batch,
                                                 int rank, int world_size);

// ---------------------------------------------------------------------------------------------------
// Start-up agreement: every rank must run the same stage and effective config
// ---------------------------------------------------------------------------------------------------

// The dotted paths ("training.batch_size") where two JSON objects differ, each with both values.
std::vector<std::string> differing_fields(const nlohmann::json& mine, const nlohmann::json& reference,
                                          const std::string& prefix = "");
// A short fingerprint of a run description (FNV-1a of its compact dump, hex).
std::string run_fingerprint(const nlohmann::json& run);

// Publishes `run` under this rank on the store and compares every rank's with rank 0's. Throws ConfigError
// naming each differing rank and its fields. Waits for all ranks (the store's timeout bounds the wait); rank 0,
// which serves the store, returns only after every rank has read every run.
void check_same_run(c10d::Store& store, int rank, int world_size, const nlohmann::json& run);

// Rank 0's side of the rendezvous: throws ConfigError naming MASTER_PORT when the port is taken on this host.
void check_port_free(int port);

}  // namespace tt
