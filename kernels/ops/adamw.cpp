// AdamW op layer: checks the parameter list, runs the multi-tensor kernel on GPU tensors and the ATen
// formulation of the same arithmetic on CPU tensors.
#include "kernels/ops/adamw.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>

#include "kernels/ops/common.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/adamw.cuh"
#endif

namespace tt::ops {
namespace {

void check_same_shape(size_t i, const char* what, const torch::Tensor& t, const torch::Tensor& master) {
  TORCH_CHECK(t.sizes() == master.sizes(), "tt::ops::adamw_step: parameter ", i, ": ", what, " has shape ",
              t.sizes(), " but the master weight has ", master.sizes());
  TORCH_CHECK(t.device() == master.device(), "tt::ops::adamw_step: parameter ", i, ": ", what, " is on ",
              t.device(), " but the master weight is on ", master.device());
}

void check_inputs(const std::vector<AdamWParam>& params, const torch::Tensor& state, const AdamWHyperparameters& h) {
  TORCH_CHECK(h.lr > 0 && std::isfinite(h.lr), "tt::ops::adamw_step: lr must be finite and > 0, got ", h.lr);
  TORCH_CHECK(h.beta1 >= 0 && h.beta1 < 1, "tt::ops::adamw_step: beta1 must be in [0, 1), got ", h.beta1);
  TORCH_CHECK(h.beta2 >= 0 && h.beta2 < 1, "tt::ops::adamw_step: beta2 must be in [0, 1), got ", h.beta2);
  TORCH_CHECK(h.eps > 0, "tt::ops::adamw_step: eps must be > 0, got ", h.eps);
  TORCH_CHECK(h.weight_decay >= 0, "tt::ops::adamw_step: weight_decay must be >= 0, got ", h.weight_decay);
  const LrSchedule schedule = h.lr_schedule();
  TORCH_CHECK(schedule.min_lr >= 0 && schedule.min_lr <= h.lr,
              "tt::ops::adamw_step: schedule.min_lr must be in [0, lr = ", h.lr, "], got ", schedule.min_lr);
  TORCH_CHECK(schedule.warmup_steps >= 0 && schedule.total_steps >= 1,
              "tt::ops::adamw_step: the schedule needs warmup_steps >= 0 and total_steps >= 1, got ",
              schedule.warmup_steps, " and ", schedule.total_steps);
  TORCH_CHECK(h.max_grad_norm >= 0, "tt::ops::adamw_step: max_grad_norm must be >= 0 (0 = no clipping), got ",
              h.max_grad_norm);
  TORCH_CHECK(state.defined() && state.scalar_type() == torch::kFloat32 && state.numel() == kAdamWStateSize &&
                  state.is_contiguous(),
              "tt::ops::adamw_step: state must be the fp32 tensor of ", kAdamWStateSize, " elements from adamw_state()");
  torch::ScalarType copy_dtype = torch::kFloat32;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    TORCH_CHECK(p.master.defined() && p.master.scalar_type() == torch::kFloat32 && p.master.is_contiguous(),
                "tt::ops::adamw_step: parameter ", i, ": the master weight must be a contiguous fp32 tensor");
    TORCH_CHECK(p.master.device() == state.device(), "tt::ops::adamw_step: parameter ", i, " is on ",
                p.master.device(), " but the state is on ", state.device());
    TORCH_CHECK(p.grad.defined() || p.copy_grad.defined(), "tt::ops::adamw_step: parameter ", i, " (shape ",
                p.master.sizes(), ") has no gradient; every parameter must receive one");
    for (const auto* moment : {&p.exp_avg, &p.exp_avg_sq}) {
      TORCH_CHECK(moment->defined() && moment->scalar_type() == torch::kFloat32 && moment->is_contiguous(),
                  "tt::ops::adamw_step: parameter ", i, ": the moments must be contiguous fp32 tensors");
      check_same_shape(i, "a moment", *moment, p.master);
    }
    if (p.grad.defined()) {
      TORCH_CHECK(p.grad.scalar_type() == torch::kFloat32, "tt::ops::adamw_step: parameter ", i,
                  ": grad must be fp32 like its master, got ", p.grad.scalar_type());
      TORCH_CHECK(p.grad.is_contiguous(), "tt::ops::adamw_step: parameter ", i, ": grad must be contiguous");
      check_same_shape(i, "grad", p.grad, p.master);
    }
    TORCH_CHECK(!p.copy_grad.defined() || p.copy.defined(), "tt::ops::adamw_step: parameter ", i,
                ": copy_grad is given without its copy");
    if (!p.copy.defined()) continue;
    TORCH_CHECK(p.copy.scalar_type() == torch::kBFloat16 || p.copy.scalar_type() == torch::kFloat16,
                "tt::ops::adamw_step: parameter ", i, ": the compute copy must be BFloat16 or Half, got ",
                p.copy.scalar_type());
    TORCH_CHECK(copy_dtype == torch::kFloat32 || copy_dtype == p.copy.scalar_type(),
                "tt::ops::adamw_step: every compute copy must have the same dtype; parameter ", i, " has ",
                p.copy.scalar_type(), ", an earlier one ", copy_dtype);
    copy_dtype = p.copy.scalar_type();
    check_same_shape(i, "the compute copy", p.copy, p.master);
    TORCH_CHECK(p.copy.is_contiguous(), "tt::ops::adamw_step: parameter ", i, ": the compute copy must be contiguous");
    if (p.copy_grad.defined()) {
      TORCH_CHECK(p.copy_grad.scalar_type() == p.copy.scalar_type(), "tt::ops::adamw_step: parameter ", i,
                  ": copy_grad has dtype ", p.copy_grad.scalar_type(), " but the copy has ", p.copy.scalar_type());
      TORCH_CHECK(p.copy_grad.is_contiguous(), "tt::ops::adamw_step: parameter ", i, ": copy_grad must be contiguous");
      check_same_shape(i, "copy_grad", p.copy_grad, p.master);
    }
  }
  // The build must have GPU kernels for GPU tensors (the state's fp32 dtype is one the kernels take).
  if (!state.is_cpu()) detail::check_gpu_input("adamw_step", "the optimizer state", state);
}

// ---- ATen formulation (CPU) -----------------------------------------------------------------------

torch::Tensor gradient_of(const AdamWParam& p) {
  torch::Tensor g;
  if (p.grad.defined()) g = p.grad.to(torch::kFloat32);
  if (p.copy_grad.defined()) g = g.defined() ? g + p.copy_grad.to(torch::kFloat32) : p.copy_grad.to(torch::kFloat32);
  return g;
}

void step_aten(const std::vector<AdamWParam>& params, const torch::Tensor& state, const AdamWHyperparameters& h) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(gradient_of(p).contiguous());
  auto s = state.accessor<float, 1>();
  float clip_scale = 1.0f;
  s[kAdamWGradNorm] = 0.0f;  // as on the GPU: the norm is computed only for clipping
  if (h.max_grad_norm > 0) {
    float sum = 0.0f;
    for (const auto& g : grads) sum += g.pow(2).sum().item<float>();
    const float norm = std::sqrt(sum);
    s[kAdamWGradNorm] = norm;
    clip_scale = std::min(1.0f, static_cast<float>(h.max_grad_norm) / (norm + 1e-6f));
  }
  const float step = s[kAdamWStep] + 1.0f;
  s[kAdamWStep] = step;
  s[kAdamWClipScale] = clip_scale;
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
  const double lr = lr_at(h.lr_schedule(), static_cast<double>(step));
  const auto step_size = static_cast<float>(lr / bias_correction1);
  const auto bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const auto decay = static_cast<float>(1.0 - lr * h.weight_decay);
  s[kAdamWStepSize] = step_size;
  s[kAdamWBiasCorrection2Sqrt] = bias_correction2_sqrt;
  s[kAdamWLr] = static_cast<float>(lr);
  s[kAdamWDecay] = decay;
  const auto beta1 = static_cast<float>(h.beta1), beta2 = static_cast<float>(h.beta2);
  const auto one_minus_beta1 = static_cast<float>(1.0 - h.beta1), one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    auto g = grads[i] * clip_scale;
    p.master.mul_(decay);
    p.exp_avg.mul_(beta1).add_(g * one_minus_beta1);
    p.exp_avg_sq.mul_(beta2).add_(g * g * one_minus_beta2);
    auto denom = p.exp_avg_sq.sqrt() / bias_correction2_sqrt + static_cast<float>(h.eps);
    p.master.sub_(p.exp_avg * step_size / denom);
    if (p.copy.defined()) p.copy.copy_(p.master);
  }
}

// ---- GPU kernels ------------------------------------------------------------------------------------

#ifdef TT_HAVE_GPU_KERNELS
static_assert(sizeof(kernels::AdamWDeviceState) == kAdamWStateSize * sizeof(float),
              "the state tensor must mirror kernels::AdamWDeviceState");

void step_gpu(const std::vector<AdamWParam>& params, const torch::Tensor& state, const AdamWHyperparameters& h) {
  c10::DeviceGuard guard(state.device());
  std::vector<kernels::AdamWTensorList> lists;
  auto copy_dtype = kernels::DType::kFloat32;
  for (const auto& p : params) {
    if (lists.empty() || lists.back().count == kernels::kAdamWTensorsPerLaunch) {
      lists.emplace_back();
      lists.back().count = 0;
      lists.back().first_block[0] = 0;
    }
    auto& list = lists.back();
    auto& t = list.tensors[list.count];
    t.param = p.master.data_ptr<float>();
    t.grad = p.grad.defined() ? p.grad.data_ptr<float>() : nullptr;
    t.copy_grad = p.copy_grad.defined() ? p.copy_grad.data_ptr() : nullptr;
    t.exp_avg = p.exp_avg.data_ptr<float>();
    t.exp_avg_sq = p.exp_avg_sq.data_ptr<float>();
    t.copy = p.copy.defined() ? p.copy.data_ptr() : nullptr;
    t.numel = p.master.numel();
    if (p.copy.defined()) copy_dtype = detail::kernel_dtype(p.copy.scalar_type());
    list.first_block[list.count + 1] = list.first_block[list.count] + (t.numel + kernels::kAdamWChunk - 1) / kernels::kAdamWChunk;
    ++list.count;
  }
  const kernels::AdamWHyper hyper{h.lr_schedule(), h.beta1, h.beta2, h.eps, h.weight_decay, h.max_grad_norm};
  const int64_t num_partials =
      h.max_grad_norm > 0 ? kernels::adamw_norm_partials(lists.data(), static_cast<int>(lists.size())) : 0;
  auto partials = torch::empty({std::max<int64_t>(num_partials, 1)}, state.options());
  detail::check_launch("adamw_step",
                       kernels::adamw_step(lists.data(), static_cast<int>(lists.size()), hyper,
                                           reinterpret_cast<kernels::AdamWDeviceState*>(state.data_ptr<float>()),
                                           partials.data_ptr<float>(), copy_dtype, detail::current_stream(state)),
                       "adamw kernels");
}
#endif

}  // namespace

torch::Tensor adamw_state(const torch::Device& device) {
  auto state = torch::zeros({kAdamWStateSize}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  state[kAdamWClipScale] = 1.0f;
  return state;
}

void adamw_step(const std::vector<AdamWParam>& params, const torch::Tensor& state, const AdamWHyperparameters& hyper) {
  check_inputs(params, state, hyper);
  if (state.is_cpu()) return step_aten(params, state, hyper);
#ifdef TT_HAVE_GPU_KERNELS
  step_gpu(params, state, hyper);
#endif
}

}  // namespace tt::ops
