#include "apps/train/gradient_ready.h"

#include <algorithm>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace tt {

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

std::vector<ParameterRange> layer_ranges(const std::vector<std::string>& names) {
  std::vector<ParameterRange> ranges;
  std::string current;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];  // layers.<i>.attention.wq.weight, ...
    const std::string layer = name.rfind("layers.", 0) == 0 ? name.substr(0, name.find('.', 7)) : "";
    if (ranges.empty() || layer != current) ranges.push_back({i, i, !layer.empty()});
    ranges.back().end = i + 1;
    current = layer;
  }
  return ranges;
}

void GradientReadyHooks::arm(const std::vector<std::vector<torch::Tensor>>& groups, Ready ready) {
  disarm();
  state_ = std::make_shared<State>();
  state_->ready = std::move(ready);
  state_->pending.assign(groups.size(), 0);
  state_->fired.assign(groups.size(), false);
  for (size_t g = 0; g < groups.size(); ++g)
    for (const auto& leaf : groups[g]) {
      if (!leaf.defined()) continue;
      auto accumulator = torch::autograd::impl::try_get_grad_accumulator(leaf);
      if (!accumulator) continue;  // the forward did not use the leaf: no gradient comes
      ++state_->pending[g];
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [state = state_, g](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            if (state->live && --state->pending[g] == 0) {
              state->fired[g] = true;
              state->ready(g);
            }
            return outputs;
          }));
      accumulators_.push_back(std::move(accumulator));
    }
}

void GradientReadyHooks::disarm() {
  if (state_) state_->live = false;
  accumulators_.clear();  // the hooks go with them, once the backward's graph (the only other owner) is gone
}

}  // namespace tt
