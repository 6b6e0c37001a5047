// The data-parallel step: EagerStep's one accumulation loop (apps/train/step.h) with the gradients averaged over
// the ranks of a DistributedContext (apps/train/distributed.h) while the backward runs, by an all-reduce per
// layer or by c10d's Reducer (launcher.h: GradientSync), eagerly or captured in a graph. Needs only c10d's
// process group, so it runs on the CPU too (tests/threaded_group.h).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "apps/train/distributed.h"
#include "apps/train/gradient_ready.h"
#include "apps/train/launcher.h"
#include "apps/train/optimizer.h"
#include "apps/train/step.h"
#include "models/transformer.h"

namespace tt {

class ShardedAdamW;

// EagerStep's one accumulation loop with the gradients averaged over ranks, added through StepHooks (`sync`,
// launcher.h): by c10d's Reducer, or by an all-reduce per layer. Either way the all-reduces start during the
// backward, as the gradients become final, and run on NCCL's stream beside it; the optimizer (which clips on
// the global norm of the averaged gradients) starts after the last one. The returned loss is the mean over
// ranks (one more small all-reduce), so every rank records the global batch's loss. With gradient
// accumulation (accum_steps k > 1) the first k - 1 backwards accumulate locally (Python DDP's no_sync) and
// only the last one all-reduces: one gradient all-reduce per optimizer step, of the sum of all k
// micro-batches' gradients.
// A sharded optimizer (ZeRO-1, apps/train/sharded_adamw.h; layers only) receives each layer's gradients
// reduce-scattered instead of all-reduced, and all-gathers the updated weights itself (each step tells it when
// a step begins: ShardedAdamW::begin_step).
// With capture_at >= 1 (layers only) the step is captured as a graph at call capture_at after that many
// eager warm-up calls (GraphedStep): the all-reduces, the optimizer and the loss's mean are in the graph.
class DataParallelStep final : public StepRunner {
 public:
  // embedding_rows (layers only): the embedding's gradient, when only its lookup writes it, travels as the rows
  // the step's tokens touched (data_parallel_step.cpp, LayerSync); false: densely, as every other gradient.
  DataParallelStep(DistributedContext& context, Transformer model, Optimizer& optimizer, int64_t accum_steps = 1,
                   GradientSync sync = GradientSync::kReducer, int64_t capture_at = -1, bool embedding_rows = true);
  ~DataParallelStep() override;
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) override;
  bool times_phases() const override { return !graph_ && accum_steps_ == 1; }
  const char* describe() const override;
  bool captures_graph() const override { return graph_ != nullptr; }
  GradientSync sync() const { return sync_; }
  // Whether the embedding's gradient travels as the rows the step's tokens touched (embedding_rows, and only the
  // lookup writes it).
  bool exchanges_embedding_rows() const { return embedding_row_bytes_ > 0; }
  // Bytes one token adds to a rank's contribution to that exchange (its row and its id); 0 without it.
  int64_t embedding_row_bytes() const { return embedding_row_bytes_; }
  bool sharded() const { return sharded_optimizer_ != nullptr; }
  // The tensors whose gradients are synchronised (gradient_leaves): the weights the forward reads.
  const std::vector<torch::Tensor>& leaves() const { return leaves_; }
  // Bytes of gradients averaged densely (all-reduced or reduce-scattered) per step, per dtype: every leaf's but
  // the embedding's when it travels as rows.
  const std::vector<std::pair<torch::Dtype, int64_t>>& gradient_bytes() const { return gradient_bytes_; }

  struct State;  // the hooks that average the gradients (Reducer or layers: data_parallel_step.cpp)

 private:
  int64_t accum_steps_;
  GradientSync sync_;
  // The optimizer when it is sharded (a ShardedAdamW: the only sharded one): reduce-scatter instead of all-reduce.
  ShardedAdamW* sharded_optimizer_ = nullptr;
  int64_t embedding_row_bytes_ = 0;
  std::vector<torch::Tensor> leaves_;
  std::vector<std::pair<torch::Dtype, int64_t>> gradient_bytes_;
  std::unique_ptr<State> state_;
  std::unique_ptr<EagerStep> eager_;
  std::unique_ptr<StepRunner> graph_;  // null: eager
  Optimizer* overlapping_optimizer_ = nullptr;  // an optimizer that overlaps the backward waits through this step
};

}  // namespace tt
