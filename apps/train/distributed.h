// Data parallel on LibTorch's own distributed engine, c10d: one process per GPU, a TCPStore rendezvous at
// MASTER_ADDR:MASTER_PORT and ProcessGroupNCCL (RCCL in ROCm builds of LibTorch) for the collectives. Each
// rank draws the whole global batch from the shared seed and keeps its own rows.
//
// Three layers: the plain parts (reading the launcher's variables, sharding, comparing configs) are
// apps/train/launcher.h, tested on the CPU; the process group, the stop vote and the weights' broadcast are
// here and need a GPU and a LibTorch built with NCCL; the step that averages the gradients is
// apps/train/data_parallel_step.h.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/train/data.h"
#include "apps/train/launcher.h"
#include "models/config.h"
#include "models/transformer.h"

namespace c10d {
class ProcessGroup;
}

namespace tt {

// ---------------------------------------------------------------------------------------------------
// The process group and the data-parallel step (GPU, NCCL)
// ---------------------------------------------------------------------------------------------------

// Whether this build can run data parallel on GPUs (LibTorch with c10d and NCCL/RCCL, nccl.h found).
bool nccl_available();
// "nccl" or "rccl" (ROCm builds); "none" without it.
const char* collective_backend_name();

struct DistributedOptions {
  std::chrono::seconds timeout{300};  // rendezvous, and NCCL's watchdog for a collective that never ends
  // The step is one CUDA graph that holds collectives (v4_ultra under data parallel): NCCL's graph mixing is turned
  // off (NCCL_GRAPH_MIXING_SUPPORT=0, unless the variable is set; not on ROCm, where it has not been measured), and
  // then every collective launched outside a capture waits for the device first (graph_mixing_off, launcher.h).
  bool graphed_collectives = false;
};

class DistributedContext {
 public:
  // Rendezvous through a TCPStore (rank 0 serves it), then the NCCL process group on GPU env.local_rank,
  // which becomes the current device. Checks before anything else: a GPU for every local rank, the port.
  // Collectives that do not finish within options.timeout abort this process (NCCL's watchdog), so a
  // dead or hung rank never hangs the others forever.
  DistributedContext(const DistributedEnv& env, const DistributedOptions& options);
  // Over a process group made elsewhere, on `device` (tests: an in-process group of CPU ranks); no rendezvous.
  DistributedContext(const DistributedEnv& env, c10::intrusive_ptr<c10d::ProcessGroup> group, torch::Device device);
  ~DistributedContext();
  DistributedContext(const DistributedContext&) = delete;
  DistributedContext& operator=(const DistributedContext&) = delete;

  const DistributedEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  torch::Device device() const { return device_; }
  c10d::Store& store();
  std::chrono::seconds timeout() const { return options_.timeout; }
  // On an error: tears the communicators down without waiting for the other ranks (which may be gone).
  void abort();

  // Rank 0's values of `tensors` on every rank (coalesced broadcast).
  void broadcast_from_rank0(std::vector<torch::Tensor> tensors);
  // In place: the mean over ranks (no host sync).
  void average(torch::Tensor& tensor);
  // max over ranks of max |a_rank - a_0| over all tensors, read on the host (a sync): 0 when every rank
  // holds the same values.
  double max_difference_across_ranks(const std::vector<torch::Tensor>& tensors);
  // Median milliseconds of one all-reduce of `bytes_per_dtype` worth of gradients (one flat buffer per
  // dtype, as the Reducer's buckets are per dtype), measured alone with device events after `warmup` runs.
  double time_allreduce_ms(const std::vector<std::pair<torch::Dtype, int64_t>>& bytes_per_dtype, int repeats);

  // The process group, for the data-parallel step's collectives. Every collective of a graphed run goes through
  // here (the Reducer keeps the group it is given, but its runs are eager): when waits_for_graphs() and the current
  // stream is not capturing, this first waits for the device, so that no replay of a graph with collectives still
  // runs when one is launched outside it (NCCL's rule with graph mixing off).
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const;
  // Whether NCCL's graph mixing is off for this process (NCCL_GRAPH_MIXING_SUPPORT read as NCCL reads it) in a run
  // whose graphs hold collectives.
  bool waits_for_graphs() const { return waits_for_graphs_; }

  struct Impl;  // the c10d objects, kept out of this header

 private:
  DistributedEnv env_;
  DistributedOptions options_;
  std::unique_ptr<Impl> impl_;
  torch::Device device_ = torch::kCPU;  // the GPU of env.local_rank once the NCCL group is made
  bool waits_for_graphs_ = false;
};

// A stop on a signal under data parallel: every rank must end after the same step, whichever got the
// signal. Called after each step with this rank's request; queues the all-reduce of it and returns the
// agreement of the previous call's all-reduce, waiting for that one only (not for the step just queued),
// so the host still runs one step ahead. Every rank thus stops one step after the first signal.
class StopVote {
 public:
  explicit StopVote(DistributedContext& context);
  ~StopVote();
  bool operator()(bool stop_here);

 private:
  struct State;
  DistributedContext& context_;
  std::unique_ptr<State> state_;
};

// Rank 0's weights (and, in bf16 stages, the compute copies refreshed from them) on every rank.
void broadcast_weights(DistributedContext& context, Transformer& model);

}  // namespace tt
