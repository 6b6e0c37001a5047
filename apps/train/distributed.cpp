#include "apps/train/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <limits>
#include <stdexcept>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

// ProcessGroupNCCL.hpp is empty unless LibTorch was built with NCCL (USE_C10D_NCCL, set by the torch_cuda
// CMake target), and it includes nccl.h, which CMake looked for (TT_HAVE_NCCL_H; see CMakeLists.txt).
#if defined(USE_C10D_NCCL) && defined(TT_HAVE_NCCL_H)
#define TT_DATA_PARALLEL 1
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "apps/train/device.h"
#include "apps/train/gradient_ready.h"
#include "apps/train/graph_step.h"
#include "models/scoped_range.h"

namespace tt {

// ---------------------------------------------------------------------------------------------------
// Process group (GPU, NCCL)
// ---------------------------------------------------------------------------------------------------

bool nccl_available() {
#ifdef TT_DATA_PARALLEL
  return true;
#else
  return false;
#endif
}

const char* collective_backend_name() {
#if defined(TT_DATA_PARALLEL) && defined(USE_ROCM)
  return "rccl";
#elif defined(TT_DATA_PARALLEL)
  return "nccl";
#else
  return "none";
#endif
}

struct DistributedContext::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

namespace {

std::string error_text(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

}  // namespace

#ifdef TT_DATA_PARALLEL
namespace {

void check_gpus(const DistributedEnv& env) {
  const int64_t gpus = torch::cuda::device_count();
  if (gpus == 0)
    throw ConfigError("data parallel runs one process per GPU, and rank " + std::to_string(env.rank) +
                      " sees no GPU (CUDA_VISIBLE_DEVICES, or a CPU-only machine)");
  if (env.local_rank >= gpus)
    throw ConfigError("LOCAL_RANK = " + std::to_string(env.local_rank) + " (" + env.source +
                      ") is not allowed: this host has " + std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") +
                      " (0.." + std::to_string(gpus - 1) + "); start at most " + std::to_string(gpus) +
                      " processes per host");
  if (env.local_world_size > gpus)
    throw ConfigError(std::to_string(env.local_world_size) + " processes on this host (" + env.source +
                      ") is not allowed: it has " + std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") +
                      "; start at most " + std::to_string(gpus));
}

}  // namespace
#endif

DistributedContext::DistributedContext(const DistributedEnv& env, const DistributedOptions& options)
    : env_(env), options_(options), impl_(std::make_unique<Impl>()) {
  TORCH_CHECK(env.enabled && env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
              "DistributedContext: rank ", env.rank, " of ", env.world_size);
#ifndef TT_DATA_PARALLEL
  throw ConfigError(std::string("data parallel (") + env.source +
                    " variables are set) needs a LibTorch with NCCL and nccl.h at build time; this build has "
                    "neither (CMake printed why when it configured)");
#else
  if (options.timeout.count() < 1)
    throw ConfigError("--dist-timeout " + std::to_string(options.timeout.count()) +
                      " is not allowed: must be >= 1 second");
  check_gpus(env);
  if (env.rank == 0) check_port_free(env.master_port);
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = env.rank == 0;
  so.numWorkers = static_cast<size_t>(env.world_size);
  so.waitWorkers = true;
  so.timeout = options.timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous of " + std::to_string(env.world_size) + " ranks at MASTER_ADDR:MASTER_PORT = " +
                             env.master_addr + ":" + std::to_string(env.master_port) + " failed within " +
                             std::to_string(options.timeout.count()) +
                             " s (--dist-timeout): are all ranks started, and is MASTER_ADDR reachable from every "
                             "host? c10d said: " + error_text(e));
  }
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));  // before the first collective
  device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  // A collective that times out (a dead or hung peer) tears this process down: LibTorch's default since 2.2,
  // stated here because the bounded wait depends on it (a value the user set is kept).
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", /*overwrite=*/0);
  auto prefix = c10::make_intrusive<c10d::PrefixStore>("default_pg/", impl_->store);
  impl_->group = c10::make_intrusive<c10d::ProcessGroup>(prefix, env.rank, env.world_size);
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = options.timeout;  // NCCL's watchdog aborts this process after it
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefix, env.rank, env.world_size, nccl_options);
  impl_->group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  impl_->group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#endif
}

DistributedContext::DistributedContext(const DistributedEnv& env, c10::intrusive_ptr<c10d::ProcessGroup> group,
                                       torch::Device device)
    : env_(env), impl_(std::make_unique<Impl>()), device_(device) {
  TORCH_CHECK(group && group->getRank() == env.rank && group->getSize() == env.world_size,
              "DistributedContext: the group is not rank ", env.rank, " of ", env.world_size);
  impl_->group = std::move(group);
}

DistributedContext::~DistributedContext() {
  if (!impl_->group) return;
  try {
    // On the way out of an error the peers may be gone: abort instead of waiting for them.
    if (std::uncaught_exceptions() > 0)
      impl_->group->abort();
    else
      impl_->group->shutdown();
  } catch (const std::exception&) {
    // Nothing left to do for a group that failed to close: the process is ending.
  }
}

void DistributedContext::abort() {
  if (!impl_->group) return;
  auto group = std::move(impl_->group);
  try {
    group->abort();
  } catch (const std::exception& e) {
    // Called on the way out of another error, which is the one to report; this one is added to it.
    std::cerr << "(while stopping after that error, aborting the process group failed too: " << error_text(e) << ")"
              << std::endl;
  }
}

c10d::Store& DistributedContext::store() {
  TORCH_CHECK(impl_->store, "DistributedContext: this context was given its group and has no store of its own");
  return *impl_->store;
}

void DistributedContext::broadcast_from_rank0(std::vector<torch::Tensor> tensors) {
  torch::NoGradGuard no_grad;
  for (auto& t : tensors) t = t.detach();
  c10d::broadcast_coalesced(impl_->group, tensors, 250u << 20, 0);
}

namespace {

void all_reduce(c10d::ProcessGroup& group, torch::Tensor& tensor, c10d::ReduceOp op) {
  std::vector<torch::Tensor> list{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group.allreduce(list, options)->wait();  // a stream wait, not a host sync
}

}  // namespace

void DistributedContext::average(torch::Tensor& tensor) { all_reduce(*impl_->group, tensor, c10d::ReduceOp::AVG); }

double DistributedContext::max_difference_across_ranks(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.detach().to(torch::kFloat32).reshape(-1));
  auto high = torch::cat(flat), low = high.clone();
  all_reduce(*impl_->group, high, c10d::ReduceOp::MAX);
  all_reduce(*impl_->group, low, c10d::ReduceOp::MIN);
  return (high - low).abs().max().item<double>();
}

double DistributedContext::time_allreduce_ms(const std::vector<std::pair<torch::Dtype, int64_t>>& bytes_per_dtype,
                                             int repeats) {
  TORCH_CHECK(repeats >= 1, "time_allreduce_ms: repeats must be >= 1, got ", repeats);
  std::vector<torch::Tensor> buffers;
  for (const auto& [dtype, bytes] : bytes_per_dtype) {
    const int64_t elements = bytes / static_cast<int64_t>(c10::elementSize(dtype));
    buffers.push_back(torch::ones({std::max<int64_t>(elements, 1)}, torch::TensorOptions().dtype(dtype).device(device())));
  }
  auto once = [&] {
    for (auto& b : buffers) all_reduce(*impl_->group, b, c10d::ReduceOp::AVG);
  };
  once();  // communicators and buffers warm
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    // Line the ranks up first, so the timed all-reduce does not include one rank waiting for another.
    auto token = torch::zeros({1}, torch::TensorOptions().device(device()));
    all_reduce(*impl_->group, token, c10d::ReduceOp::SUM);
    synchronize(device());
    StepTimer timer(device(), 2);
    timer.mark(0);
    once();
    timer.mark(1);
    ms.push_back(timer.elapsed_ms(0, 1));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// ---------------------------------------------------------------------------------------------------
// Weights and gradients
// ---------------------------------------------------------------------------------------------------

void broadcast_weights(DistributedContext& context, Transformer& model) {
  std::vector<torch::Tensor> state;
  for (const auto& p : model->parameters()) state.push_back(p);
  for (const auto& b : model->buffers()) state.push_back(b);
  context.broadcast_from_rank0(state);
  model->refresh_compute_copies();
}

std::vector<torch::Tensor> gradient_leaves(Transformer& model) {
  const auto parameters = model->parameters();
  const torch::Device device = parameters.front().device();
  const int64_t length = std::min<int64_t>(8, model->config().max_seq_len);
  auto tokens = torch::ones({1, length}, torch::TensorOptions().dtype(torch::kLong).device(device));
  model->loss(tokens, tokens).backward();  // at the model's precision
  std::vector<torch::Tensor> leaves;
  for (const auto& p : parameters) {
    if (p.grad().defined()) leaves.push_back(p);
    for (const auto& c : model->compute_copies())
      if (c.master.is_same(p) && c.copy.grad().defined()) leaves.push_back(c.copy);
  }
  for (auto p : parameters) p.mutable_grad() = torch::Tensor();
  for (auto c : model->compute_copies()) c.copy.mutable_grad() = torch::Tensor();
  return leaves;
}

// ---------------------------------------------------------------------------------------------------
// Stopping together
// ---------------------------------------------------------------------------------------------------

struct StopVote::State {
  torch::Tensor flag;  // on the device: 1 where this rank asks to stop, averaged over ranks
  torch::Tensor host;  // pinned, the averaged flag copied back
  c10::Event copied{c10::DeviceType::CUDA};
  bool pending = false;
};

StopVote::StopVote(DistributedContext& context) : context_(context), state_(std::make_unique<State>()) {
  state_->flag = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(context.device()));
  state_->host = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
}

StopVote::~StopVote() = default;

bool StopVote::operator()(bool stop_here) {
  auto& s = *state_;
  bool agreed = false;
  if (s.pending) {
    s.copied.synchronize();  // the previous step's vote, not this step's work
    agreed = s.host.item<float>() > 0;
  }
  s.flag.fill_(stop_here ? 1.0 : 0.0);
  context_.average(s.flag);  // > 0 when any rank asked
  s.host.copy_(s.flag, /*non_blocking=*/true);
  s.copied.record(at::accelerator::getCurrentStream(context_.device().index()));
  s.pending = true;
  return agreed;
}

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
        leaves, std::move(buckets), context.impl().group, std::vector<bool>(leaves.size(), false), kBucketBytes,
        /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/false,
        std::unordered_map<size_t, std::string>{}, kFirstBucketBytes, /*skip_all_reduce_unused_params=*/false,
        /*use_python_reducer=*/false, std::vector<int64_t>{});
  }
  // rebuild_buckets is a no-op except in the second synced step, where it re-buckets in the order the first
  // backward produced gradients (a collective, on every rank).
  void before_forward(bool last) override {
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
struct LayerSync final : DataParallelStep::State {
  LayerSync(DistributedContext& context, const std::vector<std::vector<torch::Tensor>>& groups)
      : State(context), groups(groups) {}

  void before_backward(const torch::Tensor&, bool last) override {
    if (!last) return;
    works.clear();
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
  }

  void all_reduce(size_t g) {
    std::vector<torch::Tensor> grads;
    for (const auto& leaf : groups[g])
      if (leaf.grad().defined()) grads.push_back(leaf.grad());
    if (grads.empty()) return;
    c10d::AllreduceCoalescedOptions options;
    options.reduceOp = c10d::ReduceOp::AVG;
    works.push_back(context.impl().group->allreduce_coalesced(grads, options));
  }

  std::vector<std::vector<torch::Tensor>> groups;
  GradientReadyHooks ready;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
};

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
                                   int64_t accum_steps, GradientSync sync, int64_t capture_at)
    : accum_steps_(accum_steps), sync_(sync) {
  TORCH_CHECK(accum_steps >= 1, "DataParallelStep: accum_steps must be >= 1, got ", accum_steps);
  TORCH_CHECK(capture_at < 0 || sync == GradientSync::kLayers,
              "DataParallelStep: the Reducer's host bookkeeping cannot be captured in a graph; use layers");
  const auto leaves = gradient_leaves(model);
  for (const auto& leaf : leaves) {
    const auto dtype = leaf.scalar_type();
    auto it = std::find_if(gradient_bytes_.begin(), gradient_bytes_.end(), [&](auto& e) { return e.first == dtype; });
    if (it == gradient_bytes_.end()) it = gradient_bytes_.insert(gradient_bytes_.end(), {dtype, 0});
    it->second += leaf.numel() * static_cast<int64_t>(leaf.element_size());
  }
  if (sync == GradientSync::kReducer)
    state_ = std::make_unique<ReducerSync>(context, leaves);
  else
    state_ = std::make_unique<LayerSync>(context, layer_groups(model, leaves));
  eager_ = std::make_unique<EagerStep>(std::move(model), optimizer, accum_steps, state_.get());
  if (capture_at >= 0) graph_ = std::make_unique<GraphedStep>(*eager_, capture_at);
}

DataParallelStep::~DataParallelStep() = default;

const char* DataParallelStep::describe() const {
  // The words before the colon are to_string(StepKind)'s (models/stage.cpp).
  if (graph_)
    return "one CUDA/HIP graph: forward, backward with an all-reduce per layer (data parallel) and optimizer "
           "captured once, replayed every step";
  return sync_ == GradientSync::kReducer
             ? "eager: op by op through LibTorch's autograd, data parallel (c10d Reducer)"
             : "eager: op by op through LibTorch's autograd, data parallel (an all-reduce per layer)";
}

torch::Tensor DataParallelStep::step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) {
  return graph_ ? graph_->step(inputs, labels, timer) : eager_->step(inputs, labels, timer);
}

}  // namespace tt
