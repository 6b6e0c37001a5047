#include "apps/train/step.h"

#include "models/scoped_range.h"

namespace tt {

EagerStep::EagerStep(Transformer model, Optimizer& optimizer, Precision precision)
    : model_(std::move(model)),
      optimizer_(optimizer),
      precision_(precision),
      device_(model_->parameters().front().device()) {}

torch::Tensor EagerStep::forward(const torch::Tensor& inputs, const torch::Tensor& labels) {
  ScopedRange range("forward");
  AutocastScope autocast(device_, precision_);
  return model_->loss(inputs, labels);
}

void EagerStep::backward(const torch::Tensor& loss) {
  ScopedRange range("backward");
  loss.backward();
}

void EagerStep::optimize() {
  ScopedRange range("optimizer");
  optimizer_.step();
  optimizer_.zero_grad();
}

torch::Tensor EagerStep::forward_backward(const torch::Tensor& inputs, const torch::Tensor& labels) {
  auto loss = forward(inputs, labels);
  backward(loss);
  return loss.detach();
}

torch::Tensor EagerStep::step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) {
  if (timer) timer->mark(kStepStart);
  auto loss = forward(inputs, labels);
  if (timer) timer->mark(kAfterForward);
  backward(loss);
  if (timer) timer->mark(kAfterBackward);
  optimize();
  if (timer) timer->mark(kStepEnd);
  return loss.detach();
}

}  // namespace tt
