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

void check_hyper(const torch::Tensor& state, const AdamWHyperparameters& h) {
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
  // The build must have GPU kernels for GPU tensors (the state's fp32 dtype is one the kernels take).
  if (!state.is_cpu()) detail::check_gpu_input("adamw_step", "the optimizer state", state);
}

// Parameters [begin, end) of the list, on `device`.
void check_params(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Device& device) {
  TORCH_CHECK(begin <= end && end <= params.size(), "tt::ops::adamw_step: parameters [", begin, ", ", end,
              ") are not a range of the ", params.size(), " given");
  torch::ScalarType copy_dtype = torch::kFloat32;
  const torch::ScalarType state_dtype = begin < end ? params[begin].exp_avg.scalar_type() : torch::kFloat32;
  for (size_t i = begin; i < end; ++i) {
    const auto& p = params[i];
    TORCH_CHECK(p.master.defined() && p.master.scalar_type() == torch::kFloat32 && p.master.is_contiguous(),
                "tt::ops::adamw_step: parameter ", i, ": the master weight must be a contiguous fp32 tensor");
    TORCH_CHECK(p.master.device() == device, "tt::ops::adamw_step: parameter ", i, " is on ",
                p.master.device(), " but the state is on ", device);
    TORCH_CHECK(p.grad.defined() || p.copy_grad.defined(), "tt::ops::adamw_step: parameter ", i, " (shape ",
                p.master.sizes(), ") has no gradient; every parameter must receive one");
    for (const auto* moment : {&p.exp_avg, &p.exp_avg_sq}) {
      TORCH_CHECK(moment->defined() && moment->is_contiguous() &&
                      (moment->scalar_type() == torch::kFloat32 || moment->scalar_type() == torch::kBFloat16),
                  "tt::ops::adamw_step: parameter ", i, ": the moments must be contiguous fp32 or bf16 tensors");
      TORCH_CHECK(moment->scalar_type() == state_dtype, "tt::ops::adamw_step: parameter ", i, ": a moment is ",
                  moment->scalar_type(), " but the first parameter's are ", state_dtype,
                  "; every moment must have the same dtype");
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
}

// ---- ATen formulation (CPU) -----------------------------------------------------------------------

torch::Tensor gradient_of(const AdamWParam& p) {
  torch::Tensor g;
  if (p.grad.defined()) g = p.grad.to(torch::kFloat32);
  if (p.copy_grad.defined()) g = g.defined() ? g + p.copy_grad.to(torch::kFloat32) : p.copy_grad.to(torch::kFloat32);
  return g;
}

// One partial per parameter: the sum of its squared gradient, as a float.
void norm_aten(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& partials) {
  torch::NoGradGuard no_grad;
  auto sums = partials.accessor<float, 1>();
  for (size_t i = begin; i < end; ++i) sums[i] = gradient_of(params[i]).contiguous().pow(2).sum().item<float>();
}

void prepare_aten(const torch::Tensor& partials, const torch::Tensor& state, const AdamWHyperparameters& h) {
  auto s = state.accessor<float, 1>();
  float clip_scale = 1.0f;
  s[kAdamWGradNorm] = 0.0f;  // as on the GPU: the norm is computed only for clipping
  if (h.max_grad_norm > 0) {
    const auto sums = partials.accessor<float, 1>();
    float sum = 0.0f;
    for (int64_t i = 0; i < partials.numel(); ++i) sum += sums[i];
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
  s[kAdamWStepSize] = static_cast<float>(lr / bias_correction1);
  s[kAdamWBiasCorrection2Sqrt] = static_cast<float>(std::sqrt(bias_correction2));
  s[kAdamWLr] = static_cast<float>(lr);
  s[kAdamWDecay] = static_cast<float>(1.0 - lr * h.weight_decay);
}

void update_aten(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& state,
                 const AdamWHyperparameters& h) {
  torch::NoGradGuard no_grad;
  const auto s = state.accessor<float, 1>();
  const float clip_scale = s[kAdamWClipScale], step_size = s[kAdamWStepSize];
  const float bias_correction2_sqrt = s[kAdamWBiasCorrection2Sqrt], decay = s[kAdamWDecay];
  const auto beta1 = static_cast<float>(h.beta1), beta2 = static_cast<float>(h.beta2);
  const auto one_minus_beta1 = static_cast<float>(1.0 - h.beta1), one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  for (size_t i = begin; i < end; ++i) {
    const auto& p = params[i];
    auto g = gradient_of(p).contiguous() * clip_scale;
    p.master.mul_(decay);
    // In fp32 (bf16 moments: from their stored values; the new ones are rounded only where they are stored,
    // as the GPU kernel does). For fp32 moments .to() is the tensor itself, updated in place.
    auto m = p.exp_avg.to(torch::kFloat32), v = p.exp_avg_sq.to(torch::kFloat32);
    m.mul_(beta1).add_(g * one_minus_beta1);
    v.mul_(beta2).add_(g * g * one_minus_beta2);
    auto denom = v.sqrt() / bias_correction2_sqrt + static_cast<float>(h.eps);
    p.master.sub_(m * step_size / denom);
    if (!m.is_same(p.exp_avg)) p.exp_avg.copy_(m);
    if (!v.is_same(p.exp_avg_sq)) p.exp_avg_sq.copy_(v);
    if (p.copy.defined()) p.copy.copy_(p.master);
  }
}

// ---- GPU kernels ------------------------------------------------------------------------------------

#ifdef TT_HAVE_GPU_KERNELS
static_assert(sizeof(kernels::AdamWDeviceState) == kAdamWStateSize * sizeof(float),
              "the state tensor must mirror kernels::AdamWDeviceState");

int64_t chunks_of(const AdamWParam& p) {
  return (p.master.numel() + kernels::kAdamWChunk - 1) / kernels::kAdamWChunk;
}

// params[begin, end) as launch lists, and the dtype of their compute copies (fp32 when they have none).
std::vector<kernels::AdamWTensorList> lists_of(const std::vector<AdamWParam>& params, size_t begin, size_t end,
                                               kernels::DType* copy_dtype) {
  std::vector<kernels::AdamWTensorList> lists;
  *copy_dtype = kernels::DType::kFloat32;
  for (size_t i = begin; i < end; ++i) {
    const auto& p = params[i];
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
    t.exp_avg = p.exp_avg.data_ptr();
    t.exp_avg_sq = p.exp_avg_sq.data_ptr();
    t.copy = p.copy.defined() ? p.copy.data_ptr() : nullptr;
    t.numel = p.master.numel();
    if (p.copy.defined()) *copy_dtype = detail::kernel_dtype(p.copy.scalar_type());
    list.first_block[list.count + 1] = list.first_block[list.count] + chunks_of(p);
    ++list.count;
  }
  return lists;
}

kernels::AdamWHyper kernel_hyper(const AdamWHyperparameters& h) {
  return {h.lr_schedule(), h.beta1, h.beta2, h.eps, h.weight_decay, h.max_grad_norm};
}

kernels::AdamWDeviceState* device_state(const torch::Tensor& state) {
  return reinterpret_cast<kernels::AdamWDeviceState*>(state.data_ptr<float>());
}

void norm_gpu(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& partials) {
  c10::DeviceGuard guard(partials.device());
  int64_t offset = 0;  // the partials of the parameters before `begin`
  for (size_t i = 0; i < begin; ++i) offset += chunks_of(params[i]);
  kernels::DType copy_dtype;
  const auto lists = lists_of(params, begin, end, &copy_dtype);
  detail::check_launch("adamw_step",
                       kernels::adamw_norm(lists.data(), static_cast<int>(lists.size()),
                                           partials.data_ptr<float>() + offset, copy_dtype,
                                           detail::current_stream(partials)),
                       "adamw norm kernel");
}

void prepare_gpu(const torch::Tensor& partials, const torch::Tensor& state, const AdamWHyperparameters& h) {
  c10::DeviceGuard guard(state.device());
  const int64_t num_partials = h.max_grad_norm > 0 ? partials.numel() : 0;
  detail::check_launch("adamw_step",
                       kernels::adamw_prepare(partials.data_ptr<float>(), num_partials, kernel_hyper(h),
                                              device_state(state), detail::current_stream(state)),
                       "adamw prepare kernel");
}

void update_gpu(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& state,
                const AdamWHyperparameters& h, int64_t max_blocks) {
  c10::DeviceGuard guard(state.device());
  kernels::DType copy_dtype;
  const auto lists = lists_of(params, begin, end, &copy_dtype);
  const auto state_dtype = begin < end && params[begin].exp_avg.scalar_type() == torch::kBFloat16
                               ? kernels::DType::kBFloat16
                               : kernels::DType::kFloat32;
  detail::check_launch("adamw_step",
                       kernels::adamw_update(lists.data(), static_cast<int>(lists.size()), kernel_hyper(h),
                                             device_state(state), copy_dtype, state_dtype, max_blocks,
                                             detail::current_stream(state)),
                       "adamw update kernel");
}
#endif

// The passes on whichever side the tensors live, inputs already checked.
void run_norm(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& partials) {
  if (partials.is_cpu()) return norm_aten(params, begin, end, partials);
#ifdef TT_HAVE_GPU_KERNELS
  norm_gpu(params, begin, end, partials);
#endif
}

void run_prepare(const torch::Tensor& partials, const torch::Tensor& state, const AdamWHyperparameters& hyper) {
  if (state.is_cpu()) return prepare_aten(partials, state, hyper);
#ifdef TT_HAVE_GPU_KERNELS
  prepare_gpu(partials, state, hyper);
#endif
}

void run_update(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& state,
                const AdamWHyperparameters& hyper, int64_t max_blocks) {
  if (state.is_cpu()) return update_aten(params, begin, end, state, hyper);
#ifdef TT_HAVE_GPU_KERNELS
  update_gpu(params, begin, end, state, hyper, max_blocks);
#endif
}

}  // namespace

torch::Tensor adamw_state(const torch::Device& device) {
  auto state = torch::zeros({kAdamWStateSize}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  state[kAdamWClipScale] = 1.0f;
  return state;
}

torch::Tensor adamw_partials(const std::vector<AdamWParam>& params, const torch::Tensor& state) {
  int64_t count = static_cast<int64_t>(params.size());
#ifdef TT_HAVE_GPU_KERNELS
  if (!state.is_cpu()) {
    count = 0;
    for (const auto& p : params) count += chunks_of(p);
  }
#endif
  return torch::zeros({std::max<int64_t>(count, 1)}, state.options());
}

void adamw_norm(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& partials) {
  check_params(params, begin, end, partials.device());
  TORCH_CHECK(partials.scalar_type() == torch::kFloat32 && partials.is_contiguous() &&
                  partials.numel() >= (partials.is_cpu() ? static_cast<int64_t>(params.size()) : 1),
              "tt::ops::adamw_norm: partials must be the fp32 buffer adamw_partials() made for these parameters");
  run_norm(params, begin, end, partials);
}

void adamw_prepare(const torch::Tensor& partials, const torch::Tensor& state, const AdamWHyperparameters& hyper) {
  check_hyper(state, hyper);
  TORCH_CHECK(partials.device() == state.device() && partials.scalar_type() == torch::kFloat32,
              "tt::ops::adamw_prepare: partials must be the fp32 buffer adamw_partials() made, on the state's device");
  run_prepare(partials, state, hyper);
}

void adamw_update(const std::vector<AdamWParam>& params, size_t begin, size_t end, const torch::Tensor& state,
                  const AdamWHyperparameters& hyper, int64_t max_blocks) {
  check_hyper(state, hyper);
  check_params(params, begin, end, state.device());
  run_update(params, begin, end, state, hyper, max_blocks);
}

void adamw_step(const std::vector<AdamWParam>& params, const torch::Tensor& state, const AdamWHyperparameters& hyper) {
  check_hyper(state, hyper);
  check_params(params, 0, params.size(), state.device());
  // Without clipping the prepare pass reads no partials: an unfilled buffer, so that a step launches no
  // zeroing kernel for it (one fewer kernel in every replay of v4's graph).
  const auto partials = hyper.max_grad_norm > 0 ? adamw_partials(params, state) : torch::empty({1}, state.options());
  if (hyper.max_grad_norm > 0) run_norm(params, 0, params.size(), partials);
  run_prepare(partials, state, hyper);
  run_update(params, 0, params.size(), state, hyper, /*max_blocks=*/0);
}

}  // namespace tt::ops
