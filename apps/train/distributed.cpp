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

// ProcessGroupNCCL.hpp is empty unless LibTorch was built with NCCL (USE_C10D_NCCL, set by the torch_cuda
// CMake target), and it includes nccl.h, which CMake looked for (TT_HAVE_NCCL_H; see CMakeLists.txt).
#if defined(USE_C10D_NCCL) && defined(TT_HAVE_NCCL_H)
#define TT_DATA_PARALLEL 1
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "apps/train/device.h"
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
#ifndef USE_ROCM
  // Read by NCCL when it makes the first communicator, below; a value the user set is kept.
  if (options.graphed_collectives && ::setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", /*overwrite=*/0) != 0)
    throw std::runtime_error(std::string("setting NCCL_GRAPH_MIXING_SUPPORT=0 failed: ") + std::strerror(errno));
#endif
  waits_for_graphs_ = options.graphed_collectives && graph_mixing_off(std::getenv("NCCL_GRAPH_MIXING_SUPPORT"));
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

const c10::intrusive_ptr<c10d::ProcessGroup>& DistributedContext::group() const {
#ifdef TT_DATA_PARALLEL
  // Inside a capture the collective becomes part of the graph, and a device wait would break the capture.
  if (waits_for_graphs_ && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None)
    c10::cuda::device_synchronize();
#endif
  return impl_->group;
}

c10d::Store& DistributedContext::store() {
  TORCH_CHECK(impl_->store, "DistributedContext: this context was given its group and has no store of its own");
  return *impl_->store;
}

void DistributedContext::broadcast_from_rank0(std::vector<torch::Tensor> tensors) {
  torch::NoGradGuard no_grad;
  for (auto& t : tensors) t = t.detach();
  c10d::broadcast_coalesced(group(), tensors, 250u << 20, 0);
}

namespace {

void all_reduce(c10d::ProcessGroup& group, torch::Tensor& tensor, c10d::ReduceOp op) {
  std::vector<torch::Tensor> list{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group.allreduce(list, options)->wait();  // a stream wait, not a host sync
}

}  // namespace

void DistributedContext::average(torch::Tensor& tensor) { all_reduce(*group(), tensor, c10d::ReduceOp::AVG); }

double DistributedContext::max_difference_across_ranks(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.detach().to(torch::kFloat32).reshape(-1));
  auto high = torch::cat(flat), low = high.clone();
  all_reduce(*group(), high, c10d::ReduceOp::MAX);
  all_reduce(*group(), low, c10d::ReduceOp::MIN);
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
  // Fetched once: no graph runs in between, and a device wait per buffer would be timed with the all-reduces.
  c10d::ProcessGroup& collectives = *group();
  auto once = [&] {
    for (auto& b : buffers) all_reduce(collectives, b, c10d::ReduceOp::AVG);
  };
  once();  // communicators and buffers warm
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    // Line the ranks up first, so the timed all-reduce does not include one rank waiting for another.
    auto token = torch::zeros({1}, torch::TensorOptions().device(device()));
    all_reduce(collectives, token, c10d::ReduceOp::SUM);
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
// Weights
// ---------------------------------------------------------------------------------------------------

void broadcast_weights(DistributedContext& context, Transformer& model) {
  std::vector<torch::Tensor> state;
  for (const auto& p : model->parameters()) state.push_back(p);
  for (const auto& b : model->buffers()) state.push_back(b);
  context.broadcast_from_rank0(state);
  model->refresh_compute_copies();
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

}  // namespace tt
