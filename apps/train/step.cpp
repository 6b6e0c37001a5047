#include "apps/train/step.h"

#include "models/scoped_range.h"

namespace tt {

EagerStep::EagerStep(Transformer model, Optimizer& optimizer, int64_t accum_steps, StepHooks* hooks)
    : model_(std::move(model)),
      optimizer_(optimizer),
      accum_steps_(accum_steps),
      hooks_(hooks ? hooks : &no_hooks()) {
  TORCH_CHECK(accum_steps >= 1, "EagerStep: accum_steps must be >= 1, got ", accum_steps);
}

StepHooks& EagerStep::no_hooks() {
  static StepHooks none;
  return none;
}

torch::Tensor micro_batch(const torch::Tensor& batch, int64_t i, int64_t k) {
  if (k == 1) return batch;
  TORCH_CHECK(batch.size(0) % k == 0, "a batch of ", batch.size(0), " rows is not ", k, " equal micro-batches");
  const int64_t rows = batch.size(0) / k;
  return batch.narrow(0, i * rows, rows);
}

torch::Tensor EagerStep::forward(const torch::Tensor& inputs, const torch::Tensor& labels) {
  ScopedRange range("forward");
  return model_->loss(inputs, labels);  // under the model's precision
}

void EagerStep::backward(const torch::Tensor& loss) {
  ScopedRange range("backward");
  // Made in the first step, which is eager (GraphedStep captures a later one), and never replaced: a captured
  // graph reads this tensor's memory in every replay. Nothing writes to it: the engine hands it to the node that
  // made the loss (the cross-entropy functions of kernels/ops/cross_entropy.cpp, or the division by k with
  // accumulation), whose backward reads it.
  if (!seed_.defined()) seed_ = torch::ones_like(loss, torch::MemoryFormat::Contiguous);
  TORCH_CHECK(seed_.sizes() == loss.sizes() && seed_.scalar_type() == loss.scalar_type() &&
                  seed_.device() == loss.device(),
              "EagerStep: the loss changed from ", seed_.sizes(), " ", seed_.scalar_type(), " on ", seed_.device(),
              " to ", loss.sizes(), " ", loss.scalar_type(), " on ", loss.device(), " between steps");
  loss.backward(seed_);
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
    const bool last = i + 1 == k;
    const auto micro_inputs = micro_batch(inputs, i, k);
    hooks_->before_forward(micro_inputs, last);
    auto loss = forward(micro_inputs, micro_batch(labels, i, k));
    if (phases) phases->mark(kAfterForward);
    // Each micro-batch's mean loss counts 1/k, so the summed gradients are those of the whole batch's mean.
    // Not applied for k = 1, whose step stays the plain one, bit for bit.
    if (k > 1) loss = loss / static_cast<double>(k);
    hooks_->before_backward(loss, last);
    if (last) optimizer_.before_last_backward();  // an overlapping optimizer starts during this backward
    backward(loss);
    hooks_->after_backward(last);
    if (phases) phases->mark(kAfterBackward);
    total = i == 0 ? loss.detach() : total + loss.detach();
  }
  optimize();
  total = hooks_->reported_loss(total);
  if (timer) timer->mark(kStepEnd);
  return total;
}

}  // namespace tt
