// RMSNorm op layer: checks inputs, runs the custom kernels on GPU tensors and the ATen formulation of
// the same forward and backward on CPU tensors (so a float64 gradient check on CPU verifies the
// backward formulas the kernels implement).
#include "kernels/ops/rms_norm.h"

#include <c10/core/DeviceGuard.h>

#include <cmath>
#include <limits>

#include "kernels/ops/common.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/rms_norm.cuh"
#endif

namespace tt::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// fp64 inputs (the CPU gradient check) compute in fp64; everything else in fp32.
torch::ScalarType compute_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

void check_inputs(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.defined() && weight.defined(), "tt::ops::rms_norm: x and weight must be defined tensors");
  TORCH_CHECK(x.is_floating_point(), "tt::ops::rms_norm: x must be a floating-point tensor, got ", x.scalar_type());
  TORCH_CHECK(weight.is_floating_point(), "tt::ops::rms_norm: weight must be a floating-point tensor, got ",
              weight.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0,
              "tt::ops::rms_norm: x must have shape [..., hidden] with hidden > 0, got ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "tt::ops::rms_norm: weight must have shape [",
              x.size(-1), "] (the last dim of x ", x.sizes(), "), got ", weight.sizes());
  TORCH_CHECK(weight.device() == x.device(), "tt::ops::rms_norm: weight is on ", weight.device(), " but x is on ",
              x.device(), "; both must be on the same device");
  TORCH_CHECK(std::isfinite(eps) && eps >= 0.0, "tt::ops::rms_norm: eps must be finite and >= 0, got ", eps);
  if (x.is_cpu()) return;
  detail::check_gpu_input("rms_norm", "x", x);
#ifdef TT_HAVE_GPU_KERNELS
  TORCH_CHECK(x.numel() / x.size(-1) <= std::numeric_limits<int32_t>::max() &&
                  x.size(-1) <= std::numeric_limits<int32_t>::max(),
              "tt::ops::rms_norm: the GPU kernel handles at most 2^31 - 1 rows of at most 2^31 - 1 elements, got x ",
              x.sizes());
#endif
}

// ---- ATen formulation (CPU) -----------------------------------------------------------------------

std::pair<torch::Tensor, torch::Tensor> forward_aten(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const auto ct = compute_dtype(x);
  auto xf = x.to(ct);
  auto inv_rms = torch::rsqrt(xf.pow(2).mean(-1) + eps);  // [...]
  auto y = xf * inv_rms.unsqueeze(-1) * weight.to(ct);
  return {y.to(x.scalar_type()), inv_rms};
}

// With r = inv_rms and a = grad_y * weight:
//   grad_x = r * (a - x * r^2 * mean(a * x)),   grad_weight = sum over rows of grad_y * x * r.
std::pair<torch::Tensor, torch::Tensor> backward_aten(const torch::Tensor& grad_y, const torch::Tensor& x,
                                                      const torch::Tensor& weight, const torch::Tensor& inv_rms) {
  const auto ct = compute_dtype(x);
  auto g = grad_y.to(ct);
  auto xf = x.to(ct);
  auto r = inv_rms.unsqueeze(-1);
  auto a = g * weight.to(ct);
  auto grad_x = r * (a - xf * r.pow(2) * (a * xf).mean(-1, /*keepdim=*/true));
  auto grad_weight = (g * (xf * r)).reshape({-1, x.size(-1)}).sum(0);
  return {grad_x.to(x.scalar_type()), grad_weight.to(weight.scalar_type())};
}

// ---- GPU kernels ------------------------------------------------------------------------------------

#ifdef TT_HAVE_GPU_KERNELS
// x must be contiguous; returns y and inv_rms (x's shape without its last dim, fp32).
std::pair<torch::Tensor, torch::Tensor> forward_gpu(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  c10::DeviceGuard guard(x.device());
  const int64_t hidden = x.size(-1);
  auto weight_f32 = weight.to(torch::kFloat32).contiguous();
  auto y = torch::empty(x.sizes(), x.options());
  auto inv_rms = torch::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(torch::kFloat32));
  kernels::RmsNormForwardParams params{};
  params.x = x.data_ptr();
  params.weight = weight_f32.data_ptr<float>();
  params.y = y.data_ptr();
  params.inv_rms = inv_rms.data_ptr<float>();
  params.rows = x.numel() / hidden;
  params.hidden = hidden;
  params.eps = static_cast<float>(eps);
  detail::check_launch(
      "rms_norm", kernels::rms_norm_forward(params, detail::kernel_dtype(x.scalar_type()), detail::current_stream(x)),
      "rms_norm_forward");
  return {y, inv_rms};
}

std::pair<torch::Tensor, torch::Tensor> backward_gpu(const torch::Tensor& grad_y, const torch::Tensor& x,
                                                     const torch::Tensor& weight, const torch::Tensor& inv_rms) {
  c10::DeviceGuard guard(x.device());
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  auto f32 = x.options().dtype(torch::kFloat32);
  // Gradients may arrive in another layout (an expanded scalar from .sum(), say) or dtype.
  auto grad = grad_y.to(x.scalar_type()).contiguous();
  auto weight_f32 = weight.to(torch::kFloat32).contiguous();
  auto grad_x = torch::empty(x.sizes(), x.options());
  const int64_t num_partials = kernels::rms_norm_backward_num_partials(rows);
  auto partial = torch::empty({num_partials, hidden}, f32);
  // An empty batch launches nothing and has a zero weight gradient.
  auto grad_weight = rows == 0 ? torch::zeros({hidden}, f32) : torch::empty({hidden}, f32);
  kernels::RmsNormBackwardParams params{};
  params.grad_y = grad.data_ptr();
  params.x = x.data_ptr();
  params.weight = weight_f32.data_ptr<float>();
  params.inv_rms = inv_rms.data_ptr<float>();
  params.grad_x = grad_x.data_ptr();
  params.weight_grad_partial = partial.data_ptr<float>();
  params.grad_weight = grad_weight.data_ptr<float>();
  params.rows = rows;
  params.hidden = hidden;
  params.num_partials = num_partials;
  detail::check_launch(
      "rms_norm", kernels::rms_norm_backward(params, detail::kernel_dtype(x.scalar_type()), detail::current_stream(x)),
      "rms_norm_backward");
  return {grad_x, grad_weight.to(weight.scalar_type())};
}
#endif

}  // namespace

// Saves x (contiguous), weight and the per-row inverse rms; the backward recomputes nothing else.
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, double eps) {
    check_inputs(x, weight, eps);
    torch::Tensor x_saved = x;
    torch::Tensor y;
    torch::Tensor inv_rms;
    if (x.is_cpu()) {
      std::tie(y, inv_rms) = forward_aten(x, weight, eps);
    } else {
#ifdef TT_HAVE_GPU_KERNELS
      // The kernel reads rows as contiguous memory; other layouts are copied once here.
      x_saved = x.contiguous();
      std::tie(y, inv_rms) = forward_gpu(x_saved, weight, eps);
#endif
    }
    ctx->save_for_backward({x_saved, weight, inv_rms});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto& inv_rms = saved[2];
    torch::Tensor grad_x;
    torch::Tensor grad_weight;
    if (x.is_cpu()) {
      std::tie(grad_x, grad_weight) = backward_aten(grad_outputs[0], x, weight, inv_rms);
    } else {
#ifdef TT_HAVE_GPU_KERNELS
      std::tie(grad_x, grad_weight) = backward_gpu(grad_outputs[0], x, weight, inv_rms);
#endif
    }
    return {grad_x, grad_weight, torch::Tensor()};
  }
};

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace tt::ops
