// ZeRO-1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", 2020,
// stage 1): AdamW with its state split across the ranks of a data-parallel run. The update on the slices is the
// stage's own multi-tensor AdamW: ours (tt::ops::adamw_update; v4_ultra) or at::_fused_adamw_ (v2_fused, v3_custom).
//
// Every parameter, flattened, is cut into world_size slices of equal length (rounded up to kSliceAlign
// elements, so that each slice starts where the update kernel's vector loads may start; the last is padded).
// Rank r keeps the moments of slice r of every parameter only, so their memory divides by the world size.
// One step, with DataParallelStep (apps/train/data_parallel_step.h) around it:
//   1. during the backward, each layer's gradients are reduce-scattered (mean over ranks) as soon as they are
//      final (reduce_scatter()): rank r receives slice r of the averaged gradient, nothing else;
//   2. with clipping, the squared norms of every rank's slices are summed by an all-reduce: the global norm;
//   3. each rank updates slice r of the fp32 masters (and of their bf16 compute copies) with the stage's AdamW;
//   4. the slices of what the forward reads (the gradient leaves: the compute copies in bf16 stages, the masters
//      in fp32; in bf16 stages without compute copies, v2 and v3, the projections' bf16 casts that autocast would
//      make, ProjectionImpl::gathered_cast, cast from the updated slices, and the other masters) are all-gathered
//      in place, a layer at a time (ZeroGather, apps/train/launcher.h): with kUpdate
//      (the default) right after each layer's update, beside the next layer's update, the step ending when all
//      are done; with kForward the embedding's and layer 0's right after their updates (beside the later layers'
//      updates) and the others at the start of the next forward, queued before the embedding in the order the
//      forward reads them, each part waiting for its own only (TransformerImpl::set_before_weights: a layer's
//      before it; the final norm's, a tied head's bf16 copy and an untied head before the final norm), so
//      they run beside the forward. kForward needs more of the GPU's hardware queues than CUDA's default 8
//      (hardware_queues, below).
// Every element's arithmetic is the unsharded optimizer's; only the global norm sums in another order (clipping only).
// The fp32 masters a bf16 forward does not read (v4's under their copies, v2's and v3's under their gathered casts)
// are whole only after gather_weights() (checkpoints, evaluation and the report do it; call it before the
// optimizer goes if the model is used after it: the casts go with the optimizer); with
// kForward, so is everything after layer 0 between steps: any forward gathers first (every rank must run it, as
// every collective), and gather_weights() makes the whole model current.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/torch.h>

#include "apps/train/distributed.h"
#include "apps/train/optimizer.h"
#include "models/transformer.h"

namespace tt {

class ShardedAdamW final : public Optimizer {
 public:
  // Slices start at multiples of this many elements (256 bytes of fp32).
  static constexpr int64_t kSliceAlign = 64;

  // The model must hold the same weights on every rank (broadcast_weights) before the first step. With kForward
  // the model's forward calls this optimizer (set_before_weights) until it is destroyed.
  // `kind`: kOurAdamW or kAtenFusedAdamW (the latter without compute copies and with fp32 moments).
  ShardedAdamW(DistributedContext& context, const Transformer& model, OptimizerKind kind, const AdamWOptions& options,
               ZeroGather gather = kDefaultZeroGather);
  ~ShardedAdamW() override;

  // A training step begins (DataParallelStep::step, on the host, for every step, replayed ones too): with
  // kForward its forward all-gathers what the last update left stale. Called also when a replayed graph did the
  // last update, which the host does not see; a step after gather_weights() gathers again (the same values).
  void begin_step();
  ZeroGather gather() const;

  // Queues the reduce-scatter (mean over ranks) of these gradient leaves' gradients into this rank's slices, on
  // the collectives' stream after what the current stream has queued. Every leaf of the model must pass through
  // here once per step, on every rank in the same order; step() reads only the slices.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(const std::vector<torch::Tensor>& leaves);
  // In place of reduce_scatter() for a leaf whose gradient already holds the mean over ranks, the same on every
  // rank (the embedding's rows, exchanged by DataParallelStep): keeps this rank's slice of it. Stream-ordered.
  void take_averaged(const torch::Tensor& leaf);

  void zero_grad() override;
  void step() override;
  torch::Tensor exp_avg(size_t i) const override;     // gathered: a collective
  torch::Tensor exp_avg_sq(size_t i) const override;  // gathered: a collective
  int64_t step_count() const override;
  void load_state(const std::vector<torch::Tensor>& exp_avg, const std::vector<torch::Tensor>& exp_avg_sq,
                  int64_t step) override;
  bool sharded() const override { return true; }
  void gather_weights() override;  // the masters, and with kForward what the forward reads
  int64_t state_bytes() const override;  // this rank's slices only (no gather)

  struct Impl;  // slices, buffers and the update's plan (sharded_adamw.cpp)

 private:
  std::unique_ptr<Impl> impl_;
};

// CUDA_DEVICE_MAX_CONNECTIONS as the environment sets it (the GPU's hardware queues; CUDA's default is 8). kForward
// needs 32 (hardware_queues_needed, apps/train/run.h, says when; the stage restarts itself with it).
std::optional<std::string> hardware_queues();

// The OptimizerMaker of a trainer whose optimizer (`kind`, the stage's) is sharded over `context`'s ranks (which must
// outlive it).
OptimizerMaker sharded_adamw(DistributedContext& context, OptimizerKind kind, ZeroGather gather = kDefaultZeroGather);

}  // namespace tt
