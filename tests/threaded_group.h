// An in-process process group for CPU tests of data parallel: N ranks as N threads of one process, with a c10d
// Backend whose collectives meet at a shared rendezvous. LibTorch's own CPU backend (gloo) needs headers the
// wheel does not ship (docs/multi-gpu.md), so CI tests the data-parallel step's arithmetic through this one:
// the same c10d ProcessGroup, Reducer and op dispatch as on GPUs, only the transport differs. Results are
// combined in rank order on one thread and copied to every rank, so all ranks see identical values.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

namespace tt::testing {

class ThreadedBackend final : public c10d::Backend {
 public:
  // Where the ranks meet: one per group, shared by its ranks' backends.
  struct Hub {
    explicit Hub(int size) : size(size), slots(static_cast<size_t>(size)), calls(static_cast<size_t>(size)) {}
    const int size;
    std::mutex mutex;
    std::condition_variable changed;
    int arrived = 0;
    uint64_t generation = 0;
    std::vector<std::vector<at::Tensor>*> slots;  // each waiting rank's tensors
    std::vector<std::string> calls;  // and the collective it called, with its tensors' dtypes and shapes
    std::string error;  // the last collective's, for every rank to throw
    std::shared_ptr<const std::vector<at::Tensor>> gathered;  // the last all-gather's outputs (the same on every rank)
    // All-reduces deliver their results only when a rank waits for the work, as the all-gathers do, so that code
    // reading a gradient before waiting for its average reads its own. Off by default: c10d's Reducer reads a
    // bucket's result from the work's future, which this mode does not fill.
    bool all_reduce_on_wait = false;
  };

  ThreadedBackend(std::shared_ptr<Hub> hub, int rank) : Backend(rank, hub->size), hub_(std::move(hub)) {}
  const std::string getBackendName() const override { return "threaded (tests)"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override {
    const bool deferred = hub_->all_reduce_on_wait;
    meet("allreduce", tensors, [&](std::vector<std::vector<at::Tensor>*>& all) {
      auto results = std::make_shared<std::vector<at::Tensor>>();
      for (size_t i = 0; i < tensors.size(); ++i) {
        at::Tensor result = (*all[0])[i].clone();
        for (size_t r = 1; r < all.size(); ++r) {
          const at::Tensor& t = (*all[r])[i];
          switch (options.reduceOp) {
            case c10d::ReduceOp::MAX: result = at::maximum(result, t); break;
            case c10d::ReduceOp::MIN: result = at::minimum(result, t); break;
            default: result.add_(t);
          }
        }
        if (options.reduceOp == c10d::ReduceOp::AVG) result.div_(static_cast<double>(all.size()));
        TORCH_CHECK(options.reduceOp == c10d::ReduceOp::AVG || options.reduceOp == c10d::ReduceOp::SUM ||
                        options.reduceOp == c10d::ReduceOp::MAX || options.reduceOp == c10d::ReduceOp::MIN,
                    "ThreadedBackend: reduce op not supported");
        if (deferred)
          results->push_back(result.reshape({-1}));
        else
          for (auto* rank : all) (*rank)[i].copy_(result);
      }
      hub_->gathered = std::move(results);
    });
    // Read before the next collective, which only this rank's arrival lets any rank combine.
    if (deferred) return c10::make_intrusive<Delivered>(tensors, hub_->gathered);
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& options) override {
    return allreduce(tensors, options);
  }
  // Rank r receives slice r of the reduction of every rank's input (each input is world_size slices).
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& options) override {
    TORCH_CHECK(options.reduceOp == c10d::ReduceOp::AVG || options.reduceOp == c10d::ReduceOp::SUM,
                "ThreadedBackend: reduce-scatter supports AVG and SUM");
    std::vector<at::Tensor> both = inputs;
    both.insert(both.end(), outputs.begin(), outputs.end());
    const size_t n = inputs.size();
    meet("reduce_scatter", both, [&](std::vector<std::vector<at::Tensor>*>& all) {
      for (size_t i = 0; i < n; ++i) {
        // Summed as allreduce sums: rank 0's, then the others in rank order.
        at::Tensor result = (*all[0])[i].clone();
        for (size_t r = 1; r < all.size(); ++r) result.add_((*all[r])[i]);
        if (options.reduceOp == c10d::ReduceOp::AVG) result.div_(static_cast<double>(all.size()));
        for (size_t r = 0; r < all.size(); ++r) {
          at::Tensor& out = (*all[r])[n + i];
          out.copy_(result.narrow(0, static_cast<int64_t>(r) * out.numel(), out.numel()));
        }
      }
    });
    return done(outputs);
  }
  // Every rank's output receives every rank's input, in rank order, as NCCL does: the output is contiguous, of
  // world x the input's elements, whatever its shape; an input may be its own slice of the output. The outputs
  // change only when this rank waits for the work (Work::wait), as a GPU stream sees an NCCL all-gather's result
  // only after waiting for it: code that reads an output before its wait reads the old values, and fails its test.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions&) override {
    std::vector<at::Tensor> both = inputs;
    both.insert(both.end(), outputs.begin(), outputs.end());
    const size_t n = inputs.size();
    meet("allgather", both, [&](std::vector<std::vector<at::Tensor>*>& all) {
      auto gathered = std::make_shared<std::vector<at::Tensor>>();
      for (size_t i = 0; i < n; ++i) {
        std::vector<at::Tensor> parts;
        for (size_t r = 0; r < all.size(); ++r) parts.push_back((*all[r])[i].reshape({-1}));
        gathered->push_back(at::cat(parts));  // a copy: the inputs may be slices of the outputs
        for (size_t q = 0; q < all.size(); ++q) {
          const at::Tensor& out = (*all[q])[n + i];
          TORCH_CHECK(out.is_contiguous() && out.numel() == gathered->back().numel(),
                      "ThreadedBackend: an all-gather's output must be contiguous, world x its input's elements");
        }
      }
      hub_->gathered = std::move(gathered);
    });
    // Read before the next collective, which only this rank's arrival lets any rank combine.
    return c10::make_intrusive<Delivered>(outputs, hub_->gathered);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override {
    meet("broadcast", tensors, [&](std::vector<std::vector<at::Tensor>*>& all) {
      for (size_t i = 0; i < tensors.size(); ++i)
        for (auto* rank : all) (*rank)[i].copy_((*all[static_cast<size_t>(options.rootRank)])[i]);
    });
    return done(tensors);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    std::vector<at::Tensor> none;
    meet("barrier", none, [](auto&) {});
    return done(none);
  }
  void shutdown() override {}
  void abort() override {}

 private:
  // A finished collective: its future holds the tensors (the Reducer reads a bucket's result from it).
  class Done final : public c10d::Work {
   public:
    explicit Done(std::vector<at::Tensor> tensors)
        : future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
      future_->markCompleted(c10::IValue(std::move(tensors)));
    }
    bool isCompleted() override { return true; }
    bool wait(std::chrono::milliseconds) override { return true; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

   private:
    c10::intrusive_ptr<c10::ivalue::Future> future_;
  };
  // An all-gather (or a deferred all-reduce) whose outputs receive their values when this rank waits for it.
  class Delivered final : public c10d::Work {
   public:
    Delivered(std::vector<at::Tensor> outputs, std::shared_ptr<const std::vector<at::Tensor>> gathered)
        : outputs_(std::move(outputs)), gathered_(std::move(gathered)) {}
    bool isCompleted() override { return delivered_; }
    bool wait(std::chrono::milliseconds) override {
      if (!delivered_)
        for (size_t i = 0; i < outputs_.size(); ++i) outputs_[i].view({-1}).copy_((*gathered_)[i]);
      delivered_ = true;
      return true;
    }

   private:
    std::vector<at::Tensor> outputs_;
    std::shared_ptr<const std::vector<at::Tensor>> gathered_;
    bool delivered_ = false;
  };

  static c10::intrusive_ptr<c10d::Work> done(const std::vector<at::Tensor>& tensors) {
    return c10::make_intrusive<Done>(tensors);
  }

  // Every rank calls with its tensors; the last to arrive checks that all ranks called the same collective on
  // tensors of the same shapes and dtypes (a rank out of step is the bug that hangs real runs: here it fails,
  // naming each rank's call), runs `combine` over all of them, then all return, or all throw its error.
  void meet(const char* op, std::vector<at::Tensor>& tensors,
            const std::function<void(std::vector<std::vector<at::Tensor>*>&)>& combine) {
    std::string call = op;
    for (const auto& t : tensors) call += " " + std::string(c10::toString(t.scalar_type())) + c10::str(t.sizes());
    std::unique_lock<std::mutex> lock(hub_->mutex);
    hub_->slots[static_cast<size_t>(getRank())] = &tensors;
    hub_->calls[static_cast<size_t>(getRank())] = call;
    const uint64_t generation = hub_->generation;
    if (++hub_->arrived == hub_->size) {
      hub_->error.clear();
      for (size_t r = 1; r < hub_->calls.size(); ++r)
        if (hub_->calls[r] != hub_->calls[0]) {
          hub_->error = "ThreadedBackend: the ranks called different collectives:";
          for (size_t q = 0; q < hub_->calls.size(); ++q)
            hub_->error += "\n  rank " + std::to_string(q) + ": " + hub_->calls[q];
          break;
        }
      if (hub_->error.empty()) {
        try {
          combine(hub_->slots);
        } catch (const std::exception& e) {
          hub_->error = e.what();
        }
      }
      hub_->arrived = 0;
      ++hub_->generation;
      hub_->changed.notify_all();
    } else {
      hub_->changed.wait(lock, [&] { return hub_->generation != generation; });
    }
    // Read before the lock goes: the next collective may clear it.
    if (!hub_->error.empty()) throw std::runtime_error(hub_->error);
  }

  std::shared_ptr<Hub> hub_;
};

// Rank `rank` of a group whose ranks share `hub`, on the CPU.
inline c10::intrusive_ptr<c10d::ProcessGroup> threaded_group(const std::shared_ptr<ThreadedBackend::Hub>& hub,
                                                             int rank) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(rank, hub->size);
  auto backend = c10::make_intrusive<ThreadedBackend>(hub, rank);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return group;
}

}  // namespace tt::testing
