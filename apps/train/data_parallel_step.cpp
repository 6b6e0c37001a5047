#include "apps/train/data_parallel_step.h"

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "apps/train/gradient_ready.h"
#include "apps/train/graph_step.h"
#include "apps/train/sharded_adamw.h"

namespace tt {

// ---------------------------------------------------------------------------------------------------
// The data-parallel step
// ---------------------------------------------------------------------------------------------------

// What both ways of averaging share: the loss's mean over ranks.
struct DataParallelStep::State : StepHooks {
  explicit State(DistributedContext& context) : context(context) {}
  DistributedContext& context;
  torch::Tensor reported_loss(const torch::Tensor& total) override {
    auto mean = total.to(torch::kFloat32).clone();
    context.average(mean);  // the global batch's loss on every rank
    return mean;
  }
};

namespace {

// c10d's Reducer, in the order Python's DDP calls it, on the micro-batch whose backward all-reduces; before
// it the Reducer is left out entirely, as under DDP's no_sync: without prepare_for_backward its hooks return
// at once, and the gradients accumulate on the parameters, which the last backward's buckets then carry.
struct ReducerSync final : DataParallelStep::State {
  ReducerSync(DistributedContext& context, const std::vector<torch::Tensor>& leaves) : State(context) {
    auto [buckets, limits] = c10d::compute_bucket_assignment_by_size(
        leaves, {std::numeric_limits<size_t>::max()}, std::vector<bool>(leaves.size(), false));
    std::reverse(buckets.begin(), buckets.end());
    reducer = std::make_unique<c10d::Reducer>(
        leaves, std::move(buckets), context.group(), std::vector<bool>(leaves.size(), false), kBucketBytes,
        /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/false,
        std::unordered_map<size_t, std::string>{}, kFirstBucketBytes, /*skip_all_reduce_unused_params=*/false,
        /*use_python_reducer=*/false, std::vector<int64_t>{});
  }
  // rebuild_buckets is a no-op except in the second synced step, where it re-buckets in the order the first
  // backward produced gradients (a collective, on every rank).
  void before_forward(const torch::Tensor&, bool last) override {
    if (!last) return;
    reducer->prepare_for_forward();
    reducer->rebuild_buckets();
  }
  // The Reducer's hooks then all-reduce each bucket as its gradients become ready; the backward returns after
  // the last bucket's all-reduce is queued and the current stream waits for all of them.
  void before_backward(const torch::Tensor& loss, bool last) override {
    if (last) reducer->prepare_for_backward({loss});
  }

  // Bucket sizes as Python's DDP chooses them: the first iteration all-reduces one bucket per dtype (the
  // order in which gradients become ready is not known yet); then the Reducer rebuilds its buckets in that
  // order, a small first one (so the last layer's gradients start moving at once) and 25 MiB after it.
  static constexpr int64_t kFirstBucketBytes = 1 << 20;
  static constexpr int64_t kBucketBytes = 25 << 20;
  std::unique_ptr<c10d::Reducer> reducer;
};

// One all-reduce (mean) per group of leaves: a transformer layer's, or a run of parameters between layers,
// split by dtype (one NCCL call takes one dtype). A group's all-reduce is queued on NCCL's stream when its
// last gradient is final (GradientReadyHooks), ordered after what the backward queued so far; after the
// backward the current stream waits for all of them. Nothing here keeps host state from one step to the
// next, so a graph capture records the all-reduces in the backward's order and every replay repeats them.
// With a sharded optimizer (ZeRO-1, apps/train/sharded_adamw.h) a group's gradients are reduce-scattered into the
// optimizer's slices instead: the same hooks and order, each rank receiving only the mean of its slices.
// An optimizer that updates each layer during the backward (--optimizer-overlap) waits, on the stream of that
// update, for the all-reduces of the layer's groups (wait_for): their hooks ran before its own, which was armed
// after them on the same gradient accumulators, so they are queued by then.
//
// The embedding's gradient travels as rows (lookup_leaf, its own group): when only the lookup writes a weight's
// gradient (the tied embedding's fp32 master in bf16 stages, whose output head reads the bf16 copy; an untied
// embedding), that gradient is zero outside the rows of the step's token ids (at most 2,048 of medium's 32,000
// rows per rank at 4 x 512 tokens), and averaging it densely moves all of it (262 MB in fp32 for medium) after
// the last layer's backward, with nothing left to overlap. Instead every rank all-gathers its token ids and its
// gradient's rows at them, and rebuilds the mean from them, adding the ranks' rows in rank order: the same
// order on every rank, so the ranks' gradients stay identical. A token's repeats carry the same row and write
// the same value. For two ranks this is the dense average bit for bit: each element is a / 2 + b / 2 either way.
struct LayerSync final : DataParallelStep::State {
  LayerSync(DistributedContext& context, const std::vector<std::vector<torch::Tensor>>& groups,
            ShardedAdamW* sharded, torch::Tensor lookup_leaf)
      : State(context), groups(groups), sharded(sharded), lookup_leaf(std::move(lookup_leaf)) {
    for (size_t g = 0; g < this->groups.size(); ++g)
      for (const auto& leaf : this->groups[g]) group_of[leaf.unsafeGetTensorImpl()] = g;
    for (size_t g = 0; g < this->groups.size(); ++g)
      if (this->lookup_leaf.defined() && this->groups[g].size() == 1 && this->groups[g][0].is_same(this->lookup_leaf))
        lookup_group = g;
    TORCH_CHECK(!this->lookup_leaf.defined() || lookup_group < this->groups.size(),
                "LayerSync: the embedding's leaf must be a group of its own");
  }

  void before_forward(const torch::Tensor& inputs, bool) override {
    if (lookup_leaf.defined()) ids.push_back(inputs.reshape({-1}));
  }
  void before_backward(const torch::Tensor&, bool last) override {
    if (!last) return;
    works.clear();
    work_of.assign(groups.size(), {});
    ready.arm(groups, [this](size_t g) { all_reduce(g); });
  }
  void after_backward(bool last) override {
    if (!last) return;
    // A group the hooks did not start (none of its leaves reached by the backward, yet with gradients from
    // an earlier micro-batch) is all-reduced now: every rank queues the same all-reduces in the same order.
    for (size_t g = 0; g < groups.size(); ++g)
      if (!ready.fired(g)) all_reduce(g);
    ready.disarm();
    for (auto& work : works) work->wait();  // a stream wait: the optimizer's kernels come after the all-reduces
    works.clear();
    work_of.assign(groups.size(), {});
    if (lookup_leaf.defined()) average_rows();
    ids.clear();
  }

  void all_reduce(size_t g) {
    if (g == lookup_group) {
      works.push_back(gather_rows());
      return;
    }
    // Every leaf: the sharded optimizer refuses one without a gradient (its slice would keep the last step's).
    if (sharded) {
      works.push_back(sharded->reduce_scatter(groups[g]));
      return;
    }
    std::vector<torch::Tensor> grads;
    for (const auto& leaf : groups[g])
      if (leaf.grad().defined()) grads.push_back(leaf.grad());
    if (grads.empty()) return;
    c10d::AllreduceCoalescedOptions options;
    options.reduceOp = c10d::ReduceOp::AVG;
    works.push_back(context.group()->allreduce_coalesced(grads, options));
    work_of[g] = works.back();
  }

  // The current stream (the host on the CPU) waits for the all-reduces of the groups holding `leaves`, which the
  // hooks have queued. The embedding's rows are averaged after the backward (average_rows): not here.
  void wait_for(const std::vector<torch::Tensor>& leaves) {
    std::vector<bool> waited(groups.size(), false);
    for (const auto& leaf : leaves) {
      if (!leaf.defined()) continue;
      const auto it = group_of.find(leaf.unsafeGetTensorImpl());
      // A master whose compute copy is the gradient leaf has no gradient of its own here; any other tensor with a
      // gradient that no group averages would be read unaveraged.
      TORCH_CHECK(it != group_of.end() || !leaf.grad().defined(),
                  "data parallel: a gradient the overlapped update reads is not averaged per layer (run without "
                  "--optimizer-overlap)");
      if (it == group_of.end() || waited[it->second]) continue;
      const size_t g = it->second;
      TORCH_CHECK(g != lookup_group,
                  "data parallel: the embedding's gradient is averaged after the backward; an "
                  "update during the backward cannot wait for it");
      TORCH_CHECK(ready.fired(g),
                  "data parallel: a layer's update would read gradients whose all-reduce has not "
                  "been queued (group ",
                  g, ")");
      if (work_of[g]) work_of[g]->wait();
      waited[g] = true;
    }
  }

  // All-gathers this rank's token ids of the step and the lookup leaf's gradient rows at them.
  c10::intrusive_ptr<c10d::Work> gather_rows() {
    torch::NoGradGuard no_grad;
    const auto& grad = lookup_leaf.grad();
    TORCH_CHECK(grad.defined(), "data parallel: the embedding's weight has no gradient");
    local_ids = torch::cat(ids).to(grad.device(), torch::kLong);
    local_rows = grad.index_select(0, local_ids);
    const int64_t world = context.world_size();
    all_ids = torch::empty({world * local_ids.size(0)}, local_ids.options());
    all_rows = torch::empty({world * local_rows.size(0), local_rows.size(1)}, local_rows.options());
    std::vector<at::Tensor> outputs{all_ids, all_rows}, inputs{local_ids, local_rows};
    return context.group()->allgather_into_tensor_coalesced(outputs, inputs);
  }
  // After the all-gather: the gradient becomes the mean of the ranks' rows, added in rank order. Only the rows
  // some rank's tokens touched are zeroed first: the others are zero already (this rank's lookup touched none of
  // them), and zeroing the whole gradient wrote 262 MB at medium (58 us of a step on an H200, by the trace).
  void average_rows() {
    torch::NoGradGuard no_grad;
    auto grad = lookup_leaf.grad();
    const int64_t world = context.world_size(), n = local_ids.size(0);
    grad.index_fill_(0, all_ids, 0.0);
    for (int64_t r = 0; r < world; ++r) {
      const auto at = all_ids.narrow(0, r * n, n);
      grad.index_put_({at}, grad.index_select(0, at) + all_rows.narrow(0, r * n, n) / static_cast<double>(world));
    }
    if (sharded) sharded->take_averaged(lookup_leaf);
    local_ids = local_rows = all_ids = all_rows = torch::Tensor();
  }

  std::vector<std::vector<torch::Tensor>> groups;
  ShardedAdamW* sharded;  // null: all-reduce
  torch::Tensor lookup_leaf;  // undefined: every gradient is averaged densely
  size_t lookup_group = std::numeric_limits<size_t>::max();
  std::vector<torch::Tensor> ids;  // the token ids of this step's micro-batches
  torch::Tensor local_ids, local_rows, all_ids, all_rows;
  GradientReadyHooks ready;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<c10::intrusive_ptr<c10d::Work>> work_of;          // per group: its all-reduce in this step, or none
  std::unordered_map<const c10::TensorImpl*, size_t> group_of;  // leaf -> its group
};

// The leaf whose gradient only the embedding lookup writes, or undefined when the output head also reads it
// (tied, without a compute copy of it for the head: fp32 stages).
torch::Tensor lookup_only_leaf(Transformer& model, const std::vector<torch::Tensor>& leaves) {
  const auto& weight = model->embed_tokens->weight;
  bool head_reads_it = model->config().tie_embeddings;
  for (const auto& c : model->compute_copies())
    if (c.master.is_same(weight)) head_reads_it = false;  // the head reads its copy; the lookup, the master
  if (head_reads_it) return {};
  for (const auto& leaf : leaves)
    if (leaf.is_same(weight)) return leaf;
  return {};
}

// Takes `leaf` out of its group into a group of its own, just after it.
void own_group(std::vector<std::vector<torch::Tensor>>& groups, const torch::Tensor& leaf) {
  for (size_t g = 0; g < groups.size(); ++g) {
    auto it = std::find_if(groups[g].begin(), groups[g].end(), [&](const torch::Tensor& t) { return t.is_same(leaf); });
    if (it == groups[g].end()) continue;
    if (groups[g].size() == 1) return;
    groups[g].erase(it);
    groups.insert(groups.begin() + static_cast<std::ptrdiff_t>(g) + 1, std::vector<torch::Tensor>{leaf});
    return;
  }
}

// The leaves in groups of one layer (or run between layers) and one dtype, in the model's parameter order;
// a compute copy goes with its master's layer.
std::vector<std::vector<torch::Tensor>> layer_groups(Transformer& model, const std::vector<torch::Tensor>& leaves) {
  std::vector<std::string> names;
  std::vector<torch::Tensor> parameters;
  for (const auto& named : model->named_parameters(/*recurse=*/true)) {
    names.push_back(named.key());
    parameters.push_back(named.value());
  }
  auto range_of = [&, ranges = layer_ranges(names)](const torch::Tensor& leaf) {
    torch::Tensor master = leaf;
    for (const auto& c : model->compute_copies())
      if (c.copy.is_same(leaf)) master = c.master;
    for (size_t r = 0; r < ranges.size(); ++r)
      for (size_t i = ranges[r].begin; i < ranges[r].end; ++i)
        if (parameters[i].is_same(master)) return r;
    TORCH_CHECK(false, "data parallel: a gradient leaf is neither a parameter nor a compute copy of one");
  };
  std::vector<std::vector<torch::Tensor>> groups;
  std::vector<std::pair<size_t, torch::Dtype>> keys;
  for (const auto& leaf : leaves) {
    const std::pair<size_t, torch::Dtype> key{range_of(leaf), leaf.scalar_type()};
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      groups.emplace_back();
      it = keys.end() - 1;
    }
    groups[static_cast<size_t>(it - keys.begin())].push_back(leaf);
  }
  return groups;
}

}  // namespace

DataParallelStep::DataParallelStep(DistributedContext& context, Transformer model, Optimizer& optimizer,
                                   int64_t accum_steps, GradientSync sync, int64_t capture_at, bool embedding_rows)
    : accum_steps_(accum_steps), sync_(sync) {
  TORCH_CHECK(accum_steps >= 1, "DataParallelStep: accum_steps must be >= 1, got ", accum_steps);
  TORCH_CHECK(capture_at < 0 || sync == GradientSync::kLayers,
              "DataParallelStep: the Reducer's host bookkeeping cannot be captured in a graph; use layers");
  leaves_ = gradient_leaves(model);
  const auto lookup_leaf = sync == GradientSync::kLayers && embedding_rows ? lookup_only_leaf(model, leaves_)
                                                                           : torch::Tensor();
  for (const auto& leaf : leaves_) {
    if (leaf.is_same(lookup_leaf)) continue;  // exchanged as rows
    const auto dtype = leaf.scalar_type();
    auto it = std::find_if(gradient_bytes_.begin(), gradient_bytes_.end(), [&](auto& e) { return e.first == dtype; });
    if (it == gradient_bytes_.end()) it = gradient_bytes_.insert(gradient_bytes_.end(), {dtype, 0});
    it->second += leaf.numel() * static_cast<int64_t>(leaf.element_size());
  }
  if (lookup_leaf.defined())
    embedding_row_bytes_ = lookup_leaf.size(1) * static_cast<int64_t>(lookup_leaf.element_size()) +
                           static_cast<int64_t>(sizeof(int64_t));  // the row and its token id
  auto* sharded = dynamic_cast<ShardedAdamW*>(&optimizer);
  TORCH_CHECK(!optimizer.sharded() || (sharded && sync == GradientSync::kLayers),
              "DataParallelStep: a sharded optimizer receives its gradients reduce-scattered per layer (layers), not "
              "all-reduced by the Reducer");
  sharded_optimizer_ = sharded;
  // (The sharded optimizer never overlaps: ShardedAdamW refuses the option when it is made.)
  TORCH_CHECK(!optimizer.overlaps_backward() || sync == GradientSync::kLayers,
              "DataParallelStep: an optimizer that updates each layer during the backward needs an all-reduce per "
              "layer, and c10d's Reducer averages buckets: use --dp-sync layers, or run without --optimizer-overlap");
  LayerSync* layers = nullptr;
  if (sync == GradientSync::kReducer) {
    state_ = std::make_unique<ReducerSync>(context, leaves_);
  } else {
    auto groups = layer_groups(model, leaves_);
    if (lookup_leaf.defined()) own_group(groups, lookup_leaf);
    auto owned = std::make_unique<LayerSync>(context, groups, sharded, lookup_leaf);
    layers = owned.get();
    state_ = std::move(owned);
  }
  eager_ = std::make_unique<EagerStep>(std::move(model), optimizer, accum_steps, state_.get());
  if (capture_at >= 0)
    graph_ = std::make_unique<GraphedStep>(*eager_, capture_at, optimizer.wants_high_priority_step());
  // Last, once nothing here can throw: the optimizer keeps this wait until the destructor takes it back.
  if (optimizer.overlaps_backward()) {
    optimizer.wait_for_averaging([layers](const std::vector<torch::Tensor>& leaves) { layers->wait_for(leaves); });
    overlapping_optimizer_ = &optimizer;
  }
}

// The optimizer outlives this step (the Trainer owns both): it must not keep a wait on this step's LayerSync.
DataParallelStep::~DataParallelStep() {
  if (overlapping_optimizer_) overlapping_optimizer_->wait_for_averaging({});
}

const char* DataParallelStep::describe() const {
  // The words before the colon are to_string(StepKind)'s (models/stage.cpp).
  if (graph_ && sharded())
    return "one CUDA/HIP graph: forward, backward with a reduce-scatter per layer, the sharded optimizer (ZeRO-1) and "
           "its all-gathers (data parallel) captured once, replayed every step";
  if (graph_)
    return "one CUDA/HIP graph: forward, backward with an all-reduce per layer (data parallel) and optimizer "
           "captured once, replayed every step";
  if (sharded()) return "eager: op by op through LibTorch's autograd, data parallel (a reduce-scatter per layer, ZeRO-1)";
  return sync_ == GradientSync::kReducer
             ? "eager: op by op through LibTorch's autograd, data parallel (c10d Reducer)"
             : "eager: op by op through LibTorch's autograd, data parallel (an all-reduce per layer)";
}

torch::Tensor DataParallelStep::step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) {
  if (sharded_optimizer_) sharded_optimizer_->begin_step();
  return graph_ ? graph_->step(inputs, labels, timer) : eager_->step(inputs, labels, timer);
}

}  // namespace tt
