// Data parallel on LibTorch's own distributed engine, c10d: one process per GPU, a TCPStore rendezvous at
// MASTER_ADDR:MASTER_PORT, ProcessGroupNCCL (RCCL in ROCm builds of LibTorch) for the collectives, and
// c10d's Reducer, which is what Python's DistributedDataParallel drives: autograd hooks that all-reduce
// each bucket of gradients as soon as its last gradient is ready, so communication overlaps the rest of
// the backward. Each rank draws the whole global batch from the shared seed and keeps its own rows.
//
// The plain parts (reading the launcher's variables, sharding, comparing configs) are apps/train/launcher.h:
// they need no GPU and are tested on the CPU; the rest, here, needs a GPU and a LibTorch built with NCCL.
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
#include "apps/train/optimizer.h"
#include "apps/train/step.h"
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

  struct Impl;  // the c10d objects, kept out of this header
  Impl& impl() { return *impl_; }

 private:
  DistributedEnv env_;
  DistributedOptions options_;
  std::unique_ptr<Impl> impl_;
  torch::Device device_ = torch::kCPU;  // the GPU of env.local_rank once the NCCL group is made
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

// The leaves of the model that receive a gradient in a step at the model's precision: parameters, or in bf16 stages
// with compute copies, the copies (and the masters the forward also reads, such as a tied embedding).
// Found by one forward and backward on a tiny batch, so no stage's layout is assumed; gradients are reset.
std::vector<torch::Tensor> gradient_leaves(Transformer& model);

// EagerStep's one accumulation loop with the gradients averaged over ranks, added through StepHooks (`sync`,
// launcher.h): by c10d's Reducer, or by an all-reduce per layer. Either way the all-reduces start during the
// backward, as the gradients become final, and run on NCCL's stream beside it; the optimizer (which clips on
// the global norm of the averaged gradients) starts after the last one. The returned loss is the mean over
// ranks (one more small all-reduce), so every rank records the global batch's loss. With gradient
// accumulation (accum_steps k > 1) the first k - 1 backwards accumulate locally (Python DDP's no_sync) and
// only the last one all-reduces: one gradient all-reduce per optimizer step, of the sum of all k
// micro-batches' gradients.
// With capture_at >= 1 (layers only) the step is captured as a graph at call capture_at after that many
// eager warm-up calls (GraphedStep): the all-reduces, the optimizer and the loss's mean are in the graph.
class DataParallelStep final : public StepRunner {
 public:
  DataParallelStep(DistributedContext& context, Transformer model, Optimizer& optimizer, int64_t accum_steps = 1,
                   GradientSync sync = GradientSync::kReducer, int64_t capture_at = -1);
  ~DataParallelStep() override;
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) override;
  bool times_phases() const override { return !graph_ && accum_steps_ == 1; }
  const char* describe() const override;
  bool captures_graph() const override { return graph_ != nullptr; }
  GradientSync sync() const { return sync_; }
  // Bytes of gradients all-reduced per step, per dtype.
  const std::vector<std::pair<torch::Dtype, int64_t>>& gradient_bytes() const { return gradient_bytes_; }

  struct State;  // the hooks that average the gradients (Reducer or layers: distributed.cpp)

 private:
  int64_t accum_steps_;
  GradientSync sync_;
  std::vector<std::pair<torch::Dtype, int64_t>> gradient_bytes_;
  std::unique_ptr<State> state_;
  std::unique_ptr<EagerStep> eager_;
  std::unique_ptr<StepRunner> graph_;  // null: eager
};

}  // namespace tt
