#include "apps/train/step.h"

#include "models/scoped_range.h"

namespace tt {

EagerStep::EagerStep(Transformer model, Optimizer& optimizer, Precision precision, int64_t accum_steps)
    : model_(std::move(model)),
      optimizer_(optimizer),
      precision_(precision),
      device_(model_->parameters().front().device()),
      accum_steps_(accum_steps) {
  TORCH_CHECK(accum_steps >= 1, "EagerStep: accum_steps must be >= 1, got ", accum_steps);
}

torch::Tensor micro_batch(const torch::Tensor& batch, int64_t i, int64_t k) {
  if (k == 1) return batch;
  TORCH_CHECK(batch.size(0) % k == 0, "a batch of ", batch.size(0), " rows is not ", k, " equal micro-batches");
  const int64_t rows = batch.size(0) / k;
  return batch.narrow(0, i * rows, rows);
}

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
  const int64_t k = accum_steps_;
  StepTimer* phases = k == 1 ? timer : nullptr;  // see times_phases()
  if (timer) timer->mark(kStepStart);
  torch::Tensor total;
  for (int64_t i = 0; i < k; ++i) {
    auto loss = forward(micro_batch(inputs, i, k), micro_batch(labels, i, k));
    if (phases) phases->mark(kAfterForward);
    // Each micro-batch's mean loss counts 1/k, so the summed gradients are those of the whole batch's mean.
    // Not applied for k = 1, whose step stays the plain one, bit for bit.
    if (k > 1) loss = loss / static_cast<double>(k);
    backward(loss);
    if (phases) phases->mark(kAfterBackward);
    total = i == 0 ? loss.detach() : total + loss.detach();
  }
  optimize();
  if (timer) timer->mark(kStepEnd);
  return total;
}

}  // namespace tt
