// Runs tt::ops::adamw_step and LibTorch's torch::optim::AdamW side by side over many steps on the same
// parameters and gradients; and the test bodies the CPU and GPU optimizer tests share, run on each device
// (tests/test_optimizer.cpp, tests/test_optimizer_gpu.cpp).
#pragma once

#include <cmath>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "apps/train/optimizer.h"
#include "kernels/ops/adamw.h"
#include "tests/helpers.h"

namespace tt::testing {

struct AdamWComparison {
  double max_param_rel = 0;   // max over tensors of ||ours - torch|| / ||torch||, after the last step
  double max_moment_rel = 0;  // the same for both moments
  torch::Tensor state;        // our state tensor after the last step (CPU)
};

// `shapes` parameters drawn from `seed`; every step draws fresh gradients (shared by both optimizers).
// With max_grad_norm > 0 LibTorch's side clips with tt::clip_grad_norm first. Gradients are scaled so
// that clipping, when on, is active in every step.
// Our moments are kept in moment_dtype (fp32, or bf16); LibTorch's always in fp32.
inline AdamWComparison compare_with_torch_adamw(const std::vector<std::vector<int64_t>>& shapes,
                                                const ops::AdamWHyperparameters& h, int steps,
                                                const torch::Device& device, uint64_t seed = 1,
                                                torch::Dtype moment_dtype = torch::kFloat32) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> ours, theirs, m, v;
  for (const auto& shape : shapes) {
    auto p = torch::randn(shape, gen);
    ours.push_back(p.clone().to(device));
    theirs.push_back(p.clone().to(device).requires_grad_(true));
    m.push_back(torch::zeros(shape, torch::TensorOptions().device(device).dtype(moment_dtype)));
    v.push_back(torch::zeros(shape, torch::TensorOptions().device(device).dtype(moment_dtype)));
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
  // NaN-propagating maximum: std::max(worst, NaN) keeps `worst`, so a NaN parameter or moment would pass
  // every tolerance; `!(x <= worst)` is true for NaN, and a NaN already kept stays (x <= NaN is false too,
  // but the isnan guard makes that explicit).
  auto raise = [](double& worst, double x) {
    if (!std::isnan(worst) && !(x <= worst)) worst = x;
  };
  AdamWComparison out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    raise(out.max_param_rel, rel_error(ours[i], theirs[i]));
    const auto* st = static_cast<const torch::optim::AdamWParamState*>(
        reference.state().at(theirs[i].unsafeGetTensorImpl()).get());
    raise(out.max_moment_rel, rel_error(m[i], st->exp_avg()));
    raise(out.max_moment_rel, rel_error(v[i], st->exp_avg_sq()));
  }
  out.state = state.cpu();
  return out;
}

// Against torch::optim::AdamW over `steps` steps on parameters of `shapes`, with weight decay and clipping each
// off and on: parameters and moments within 1e-5, the step counter at `steps`, clipping engaged when on.
inline void expect_matches_torch_adamw(const std::vector<std::vector<int64_t>>& shapes, int steps,
                                       const torch::Device& device) {
  for (double weight_decay : {0.0, 0.1}) {
    for (double clip : {0.0, 1.0}) {
      ops::AdamWHyperparameters h;
      h.lr = 1e-2;
      h.weight_decay = weight_decay;
      h.max_grad_norm = clip;
      const auto r = compare_with_torch_adamw(shapes, h, steps, device);
      EXPECT_LT(r.max_param_rel, 1e-5) << "weight_decay " << weight_decay << ", clip " << clip;
      EXPECT_LT(r.max_moment_rel, 1e-5) << "weight_decay " << weight_decay << ", clip " << clip;
      EXPECT_EQ(r.state[ops::kAdamWStep].item<float>(), static_cast<float>(steps));
      if (clip > 0) {
        EXPECT_LT(r.state[ops::kAdamWClipScale].item<float>(), 1.0f) << "clipping never engaged";
      }
    }
  }
}

// bf16 moments (training.optimizer_state_dtype): the same AdamW as LibTorch's fp32 one up to the moments'
// rounding, over `steps` steps with weight decay and clipping. Each stored moment is off by at most half a bf16
// ulp (2^-9 relative) per step; the parameters move by lr times an update off by about as much. The bounds sit
// 3-5x above what 40 steps give, and far below what a moment that is not updated, or not rounded back, gives.
inline void expect_bf16_moments_track_torch_adamw(const std::vector<std::vector<int64_t>>& shapes, int steps,
                                                  const torch::Device& device) {
  ops::AdamWHyperparameters h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  h.max_grad_norm = 1.0;
  const auto r = compare_with_torch_adamw(shapes, h, steps, device, 1, torch::kBFloat16);
  EXPECT_LT(r.max_param_rel, 2e-3);
  EXPECT_GT(r.max_param_rel, 0.0) << "bf16 moments cannot give LibTorch's fp32 result exactly";
  EXPECT_LT(r.max_moment_rel, 1e-2);
  EXPECT_EQ(r.state[ops::kAdamWStep].item<float>(), static_cast<float>(steps));
}

// A bf16 compute copy's gradient joins its master's (the same steps as with the summed fp32 gradient), and the
// copy equals the rounded master, after `steps` steps with `h` on one n-element tensor.
inline void expect_copy_gradients_join_and_copies_are_rounded_masters(int64_t n, int steps,
                                                                      const ops::AdamWHyperparameters& h,
                                                                      const torch::Device& device) {
  auto opts = torch::TensorOptions().device(device);
  auto master_a = torch::randn({n}, opts), master_b = master_a.clone();
  auto grad = torch::randn({n}, opts), copy_grad = torch::randn({n}, opts).to(torch::kBFloat16);
  auto m_a = torch::zeros({n}, opts), v_a = torch::zeros({n}, opts), m_b = torch::zeros({n}, opts),
       v_b = torch::zeros({n}, opts);
  auto copy = master_a.to(torch::kBFloat16);
  auto state_a = ops::adamw_state(device), state_b = ops::adamw_state(device);
  for (int s = 0; s < steps; ++s) {
    ops::adamw_step({{master_a, grad, copy, copy_grad, m_a, v_a}}, state_a, h);
    ops::adamw_step({{master_b, grad + copy_grad.to(torch::kFloat32), {}, {}, m_b, v_b}}, state_b, h);
  }
  EXPECT_TRUE(torch::equal(master_a, master_b));
  EXPECT_TRUE(torch::equal(copy, master_a.to(torch::kBFloat16)));
}

}  // namespace tt::testing
