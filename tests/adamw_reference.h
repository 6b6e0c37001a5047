// Runs tt::ops::adamw_step and LibTorch's torch::optim::AdamW side by side over many steps on the same
// parameters and gradients, for the CPU and GPU optimizer tests.
#pragma once

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "apps/train/optimizer.h"
#include "kernels/ops/adamw.h"

namespace tt::testing {

struct AdamWComparison {
  double max_param_rel = 0;   // max over tensors of ||ours - torch|| / ||torch||, after the last step
  double max_moment_rel = 0;  // the same for both moments
  torch::Tensor state;        // our state tensor after the last step (CPU)
};

// `shapes` parameters drawn from `seed`; every step draws fresh gradients (shared by both optimizers).
// With max_grad_norm > 0 LibTorch's side clips with tt::clip_grad_norm first. Gradients are scaled so
// that clipping, when on, is active in every step.
inline AdamWComparison compare_with_torch_adamw(const std::vector<std::vector<int64_t>>& shapes,
                                                const ops::AdamWHyperparameters& h, int steps,
                                                const torch::Device& device, uint64_t seed = 1) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> ours, theirs, m, v;
  for (const auto& shape : shapes) {
    auto p = torch::randn(shape, gen);
    ours.push_back(p.clone().to(device));
    theirs.push_back(p.clone().to(device).requires_grad_(true));
    m.push_back(torch::zeros(shape, torch::TensorOptions().device(device)));
    v.push_back(torch::zeros(shape, torch::TensorOptions().device(device)));
  }
  torch::optim::AdamW reference(
      theirs, torch::optim::AdamWOptions(h.lr).betas({h.beta1, h.beta2}).eps(h.eps).weight_decay(h.weight_decay));
  auto state = ops::adamw_state(device);
  for (int s = 0; s < steps; ++s) {
    std::vector<ops::AdamWParam> list;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto g = (torch::randn(shapes[i], gen) * 3.0).to(device);
      theirs[i].mutable_grad() = g.clone();
      list.push_back({ours[i], g, {}, {}, m[i], v[i]});
    }
    ops::adamw_step(list, state, h);
    if (h.max_grad_norm > 0) clip_grad_norm(theirs, h.max_grad_norm);
    // The schedule's rate for this step, set on LibTorch's param group as a Python LR scheduler would.
    static_cast<torch::optim::AdamWOptions&>(reference.param_groups().front().options())
        .lr(lr_at(h.lr_schedule(), static_cast<double>(s + 1)));
    reference.step();
  }
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    auto x = a.detach().to(torch::kCPU, torch::kFloat64), y = b.detach().to(torch::kCPU, torch::kFloat64);
    const double denom = y.norm().item<double>();
    return denom == 0 ? (x - y).norm().item<double>() : (x - y).norm().item<double>() / denom;
  };
  // NaN-propagating maximum: std::max(worst, NaN) keeps `worst`, so a NaN parameter or moment would pass
  // every tolerance; `!(x <= worst)` is true for NaN, and a NaN already kept stays (x <= NaN is false too,
  // but the isnan guard makes that explicit).
  auto raise = [](double& worst, double x) {
    if (!std::isnan(worst) && !(x <= worst)) worst = x;
  };
  AdamWComparison out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    raise(out.max_param_rel, rel(ours[i], theirs[i]));
    const auto* st = static_cast<const torch::optim::AdamWParamState*>(
        reference.state().at(theirs[i].unsafeGetTensorImpl()).get());
    raise(out.max_moment_rel, rel(m[i], st->exp_avg()));
    raise(out.max_moment_rel, rel(v[i], st->exp_avg_sq()));
  }
  out.state = state.cpu();
  return out;
}

}  // namespace tt::testing
