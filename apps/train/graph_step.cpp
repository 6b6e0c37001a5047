#include "apps/train/graph_step.h"

#include <c10/core/Event.h>

#if defined(TT_BACKEND_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#elif defined(TT_BACKEND_HIP)
// ROCm builds of LibTorch keep the cuda names for the classes; only the header paths change.
#include <ATen/hip/HIPGraph.h>
#include <c10/hip/HIPGuard.h>
#include <c10/hip/HIPStream.h>
#endif

namespace tt {

#if defined(TT_BACKEND_CUDA) || defined(TT_BACKEND_HIP)

namespace {

// `waiter` runs what it is given next only after everything queued on `on` so far.
void wait_for(const c10::Stream& waiter, const c10::Stream& on) {
  c10::Event event(on.device_type());
  event.record(on);
  event.block(waiter);
}

}  // namespace

struct GraphedStep::Graph {
  explicit Graph(bool high_priority) : stream(c10::cuda::getStreamFromPool(high_priority)) {}
  // LibTorch's CUDA build instantiates it with per-node priorities (each kernel keeps its stream's); its ROCm
  // build does not, and there every kernel runs at the priority of the stream it is replayed on.
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStream stream;
  const void* inputs = nullptr;  // the buffers the capture read: every replay must be given the same
  const void* labels = nullptr;
  torch::Tensor loss;            // written by every replay
};

GraphedStep::GraphedStep(EagerStep& eager, int64_t capture_at, bool high_priority)
    : eager_(eager), capture_at_(capture_at), graph_(std::make_unique<Graph>(high_priority)) {
  TORCH_CHECK(capture_at >= 1, "GraphedStep: at least one eager warm-up step must come before the capture, got ",
              capture_at);
  TORCH_CHECK(torch::cuda::is_available(), "GraphedStep: no GPU visible; a graph needs one");
}

GraphedStep::~GraphedStep() = default;

const char* GraphedStep::describe() const { return to_string(StepKind::kGraph); }

torch::Tensor GraphedStep::step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) {
  if (timer) timer->mark(kStepStart);
  const auto caller = c10::cuda::getCurrentCUDAStream();
  torch::Tensor loss;
  if (calls_ <= capture_at_) {
    // Warm-up and capture both run on the side stream, ordered after everything the caller queued
    // (the batch copy) and before everything it queues next.
    wait_for(graph_->stream, caller);
    {
      c10::cuda::CUDAStreamGuard on_side(graph_->stream);
      if (calls_ < capture_at_) {
        loss = eager_.step(inputs, labels, nullptr);
      } else {
        graph_->inputs = inputs.data_ptr();
        graph_->labels = labels.data_ptr();
        graph_->graph.capture_begin();
        graph_->loss = eager_.step(inputs, labels, nullptr);
        graph_->graph.capture_end();
      }
    }
    wait_for(caller, graph_->stream);
  }
  if (calls_ >= capture_at_) {
    TORCH_CHECK(inputs.data_ptr() == graph_->inputs && labels.data_ptr() == graph_->labels,
                "GraphedStep: the graph reads the batch buffers it was captured with; pass the same tensors");
    graph_->graph.replay();  // on the caller's stream
    loss = graph_->loss;
  }
  ++calls_;
  if (timer) timer->mark(kStepEnd);
  return loss;
}

#else

struct GraphedStep::Graph {};

GraphedStep::GraphedStep(EagerStep& eager, int64_t capture_at, bool) : eager_(eager), capture_at_(capture_at) {
  TORCH_CHECK(false, "GraphedStep: this build has no GPU backend (CMake found neither CUDA nor HIP)");
}
GraphedStep::~GraphedStep() = default;
const char* GraphedStep::describe() const { return to_string(StepKind::kGraph); }
torch::Tensor GraphedStep::step(const torch::Tensor&, const torch::Tensor&, StepTimer*) { return {}; }

#endif

}  // namespace tt
