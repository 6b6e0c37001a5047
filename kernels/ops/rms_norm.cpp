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

// fp64 inputs (the CPU gradient check) compute in fp64; everything else in fp32.
torch::ScalarType compute_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

void check_inputs(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight, double eps,
                  torch::ScalarType out_dtype) {
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
  const bool mixed = x.scalar_type() == torch::kFloat32 &&
                     (out_dtype == torch::kBFloat16 || out_dtype == torch::kFloat16);
  TORCH_CHECK(out_dtype == x.scalar_type() || mixed, "tt::ops::add_rms_norm: out_dtype must be the residual's dtype (",
              x.scalar_type(), ") or, for a Float residual, BFloat16 or Half; got ", out_dtype);
  if (delta.defined()) {
    TORCH_CHECK(delta.sizes() == x.sizes(), "tt::ops::add_rms_norm: delta must have the residual's shape ", x.sizes(),
                ", got ", delta.sizes());
    TORCH_CHECK(delta.device() == x.device(), "tt::ops::add_rms_norm: delta is on ", delta.device(),
                " but the residual is on ", x.device());
    TORCH_CHECK(delta.scalar_type() == out_dtype, "tt::ops::add_rms_norm: delta must be in out_dtype (", out_dtype,
                "), got ", delta.scalar_type());
  }
  if (x.is_cpu()) return;
  detail::check_gpu_input("rms_norm", "x", x);
#ifdef TT_HAVE_GPU_KERNELS
  TORCH_CHECK(x.numel() / x.size(-1) <= std::numeric_limits<int32_t>::max() &&
                  x.size(-1) <= std::numeric_limits<int32_t>::max(),
              "tt::ops::rms_norm: the GPU kernel handles at most 2^31 - 1 rows of at most 2^31 - 1 elements, got x ",
              x.sizes());
#endif
}

// What the forward hands to the backward and returns.
struct Forward {
  torch::Tensor y;             // out_dtype
  torch::Tensor residual_out;  // x + delta in x's dtype; undefined without delta
  torch::Tensor inv_rms;       // fp32 (fp64 for fp64 inputs), x's shape without its last dim
};

// ---- ATen formulation (CPU) -----------------------------------------------------------------------

// The same roundings as the kernels: x + delta is stored in x's dtype before it is normalised.
Forward forward_aten(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight, double eps,
                     torch::ScalarType out_dtype) {
  const auto ct = compute_dtype(x);
  Forward out;
  if (delta.defined()) out.residual_out = (x.to(ct) + delta.to(ct)).to(x.scalar_type());
  auto hf = (delta.defined() ? out.residual_out : x).to(ct);
  out.inv_rms = torch::rsqrt(hf.pow(2).mean(-1) + eps);  // [...]
  out.y = (hf * out.inv_rms.unsqueeze(-1) * weight.to(ct)).to(out_dtype);
  return out;
}

// With r = inv_rms and a = grad_y * weight:
//   grad_x = r * (a - x * r^2 * mean(a * x)) [+ grad_residual],   grad_weight = sum over rows of grad_y * x * r.
std::pair<torch::Tensor, torch::Tensor> backward_aten(const torch::Tensor& grad_y, const torch::Tensor& x,
                                                      const torch::Tensor& weight, const torch::Tensor& inv_rms,
                                                      const torch::Tensor& grad_residual) {
  const auto ct = compute_dtype(x);
  auto g = grad_y.to(ct);
  auto xf = x.to(ct);
  auto r = inv_rms.unsqueeze(-1);
  auto a = g * weight.to(ct);
  auto grad_x = (r * (a - xf * r.pow(2) * (a * xf).mean(-1, /*keepdim=*/true))).to(x.scalar_type());
  if (grad_residual.defined()) grad_x = (grad_x.to(ct) + grad_residual.to(ct)).to(x.scalar_type());
  auto grad_weight = (g * (xf * r)).reshape({-1, x.size(-1)}).sum(0);
  return {grad_x, grad_weight.to(weight.scalar_type())};
}

// ---- GPU kernels ------------------------------------------------------------------------------------

#ifdef TT_HAVE_GPU_KERNELS
// x and delta must be contiguous.
Forward forward_gpu(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight, double eps,
                    torch::ScalarType out_dtype) {
  c10::DeviceGuard guard(x.device());
  const int64_t hidden = x.size(-1);
  auto weight_f32 = weight.to(torch::kFloat32).contiguous();
  Forward out;
  out.y = torch::empty(x.sizes(), x.options().dtype(out_dtype));
  if (delta.defined()) out.residual_out = torch::empty(x.sizes(), x.options());
  out.inv_rms = torch::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(torch::kFloat32));
  kernels::RmsNormForwardParams params{};
  params.x = x.data_ptr();
  params.delta = delta.defined() ? delta.data_ptr() : nullptr;
  params.residual_out = delta.defined() ? out.residual_out.data_ptr() : nullptr;
  params.weight = weight_f32.data_ptr<float>();
  params.y = out.y.data_ptr();
  params.inv_rms = out.inv_rms.data_ptr<float>();
  params.rows = x.numel() / hidden;
  params.hidden = hidden;
  params.eps = static_cast<float>(eps);
  detail::check_launch("rms_norm",
                       kernels::rms_norm_forward(params, detail::kernel_dtype(x.scalar_type()),
                                                 detail::kernel_dtype(out_dtype), detail::current_stream(x)),
                       "rms_norm_forward");
  return out;
}

// grad_x in x's dtype, grad_delta (when wanted) in grad_y's, grad_weight.
struct BackwardGpu {
  torch::Tensor grad_x, grad_delta, grad_weight;
};

BackwardGpu backward_gpu(const torch::Tensor& grad_y_in, const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& inv_rms, const torch::Tensor& grad_residual_in, bool want_grad_delta,
                         torch::ScalarType out_dtype) {
  c10::DeviceGuard guard(x.device());
  const int64_t hidden = x.size(-1);
  const int64_t rows = x.numel() / hidden;
  auto f32 = x.options().dtype(torch::kFloat32);
  // Gradients may arrive in another layout (an expanded scalar from .sum(), say) or dtype.
  auto grad_y = grad_y_in.to(out_dtype).contiguous();
  auto grad_residual =
      grad_residual_in.defined() ? grad_residual_in.to(x.scalar_type()).contiguous() : torch::Tensor();
  auto weight_f32 = weight.to(torch::kFloat32).contiguous();
  BackwardGpu out;
  out.grad_x = torch::empty(x.sizes(), x.options());
  // Equal dtypes: delta's gradient is grad_x itself (autograd hands one tensor to both edges).
  if (want_grad_delta && out_dtype != x.scalar_type()) out.grad_delta = torch::empty(x.sizes(), grad_y.options());
  const int64_t num_partials = kernels::rms_norm_backward_num_partials(rows, detail::kernel_dtype(out_dtype));
  auto partial = num_partials > 0 ? torch::empty({num_partials, hidden}, f32) : torch::Tensor();
  // An empty batch launches nothing and has a zero weight gradient.
  out.grad_weight = rows == 0 ? torch::zeros({hidden}, f32) : torch::empty({hidden}, f32);
  kernels::RmsNormBackwardParams params{};
  params.grad_y = grad_y.data_ptr();
  params.x = x.data_ptr();
  params.grad_residual = grad_residual.defined() ? grad_residual.data_ptr() : nullptr;
  params.weight = weight_f32.data_ptr<float>();
  params.inv_rms = inv_rms.data_ptr<float>();
  params.grad_x = out.grad_x.data_ptr();
  params.grad_delta = out.grad_delta.defined() ? out.grad_delta.data_ptr() : nullptr;
  params.weight_grad_partial = partial.defined() ? partial.data_ptr<float>() : nullptr;
  params.grad_weight = out.grad_weight.data_ptr<float>();
  params.rows = rows;
  params.hidden = hidden;
  params.num_partials = num_partials;
  detail::check_launch("rms_norm",
                       kernels::rms_norm_backward(params, detail::kernel_dtype(x.scalar_type()),
                                                  detail::kernel_dtype(out_dtype), detail::current_stream(x)),
                       "rms_norm_backward");
  if (want_grad_delta && !out.grad_delta.defined()) out.grad_delta = out.grad_x;
  out.grad_weight = out.grad_weight.to(weight.scalar_type());
  return out;
}
#endif

// The body of both autograd functions below. Inputs x (the residual), delta (undefined for RmsNormFunction),
// weight; outputs y and residual_out (x + delta, or x itself returned as a view when there is no delta, so that
// its gradient comes back here and joins the norm's in the same kernel). Saves the normalised input, weight and
// the per-row inverse rms.
variable_list forward_impl(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& delta,
                           const torch::Tensor& weight, double eps, torch::ScalarType out_dtype) {
  check_inputs(x, delta, weight, eps, out_dtype);
  Forward out;
  torch::Tensor x_used = x;
  if (x.is_cpu()) {
    out = forward_aten(x, delta, weight, eps, out_dtype);
  } else {
#ifdef TT_HAVE_GPU_KERNELS
    // The kernels read rows as contiguous memory; other layouts are copied once here.
    x_used = x.contiguous();
    out = forward_gpu(x_used, delta.defined() ? delta.contiguous() : delta, weight, eps, out_dtype);
#endif
  }
  const torch::Tensor residual_out = delta.defined() ? out.residual_out : x;
  ctx->save_for_backward({delta.defined() ? out.residual_out : x_used, weight, out.inv_rms});
  // A gradient that does not arrive stays undefined rather than a tensor of zeros (a fill kernel, and the
  // backward reading it): the model's final norm, whose residual_out nothing reads, got one every step, as did
  // every plain rms_norm. The backward handles both undefined (grad_residual: the kernel skips it).
  ctx->set_materialize_grads(false);
  ctx->saved_data["has_delta"] = delta.defined();
  ctx->saved_data["out_dtype"] = static_cast<int64_t>(out_dtype);
  return {out.y, residual_out};
}

// {grad_x, grad_delta (undefined without delta), grad_weight}.
variable_list backward_impl(AutogradContext* ctx, const variable_list& grad_outputs) {
  const auto saved = ctx->get_saved_variables();
  const auto& x = saved[0];
  const auto& weight = saved[1];
  const auto& inv_rms = saved[2];
  const bool has_delta = ctx->saved_data["has_delta"].toBool();
  const auto out_dtype = static_cast<torch::ScalarType>(ctx->saved_data["out_dtype"].toInt());
  auto grad_y = grad_outputs[0].defined() ? grad_outputs[0] : torch::zeros(x.sizes(), x.options().dtype(out_dtype));
  const auto& grad_residual = grad_outputs[1];
  torch::Tensor grad_x, grad_delta, grad_weight;
  if (x.is_cpu()) {
    std::tie(grad_x, grad_weight) = backward_aten(grad_y, x, weight, inv_rms, grad_residual);
    if (has_delta) grad_delta = grad_x.to(out_dtype);
  } else {
#ifdef TT_HAVE_GPU_KERNELS
    auto out = backward_gpu(grad_y, x, weight, inv_rms, grad_residual, has_delta, out_dtype);
    grad_x = out.grad_x;
    grad_delta = out.grad_delta;
    grad_weight = out.grad_weight;
#endif
  }
  return {grad_x, grad_delta, grad_weight};
}

}  // namespace

// Two functions because LibTorch's C++ autograd functions take no undefined tensor inputs: the norm alone,
// and the norm with the residual add.
struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, double eps,
                               torch::ScalarType out_dtype) {
    return forward_impl(ctx, x, torch::Tensor(), weight, eps, out_dtype);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto grads = backward_impl(ctx, grad_outputs);
    return {grads[0], grads[2], torch::Tensor(), torch::Tensor()};
  }
};

struct AddRmsNormFunction : torch::autograd::Function<AddRmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& delta,
                               const torch::Tensor& weight, double eps, torch::ScalarType out_dtype) {
    return forward_impl(ctx, x, delta, weight, eps, out_dtype);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto grads = backward_impl(ctx, grad_outputs);
    return {grads[0], grads[1], grads[2], torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.defined(), "tt::ops::rms_norm: x must be a defined tensor");
  return RmsNormFunction::apply(x, weight, eps, x.scalar_type())[0];
}

AddRmsNormOutput add_rms_norm(const torch::Tensor& residual, const torch::Tensor& delta, const torch::Tensor& weight,
                              double eps, torch::ScalarType out_dtype) {
  TORCH_CHECK(residual.defined(), "tt::ops::add_rms_norm: residual must be a defined tensor");
  // delta in out_dtype: a cast recorded by autograd here, outside the function, when it arrives in another.
  const auto d = delta.defined() && delta.scalar_type() != out_dtype && delta.is_floating_point() ? delta.to(out_dtype)
                                                                                                 : delta;
  auto outputs = d.defined() ? AddRmsNormFunction::apply(residual, d, weight, eps, out_dtype)
                             : RmsNormFunction::apply(residual, weight, eps, out_dtype);
  return {outputs[1], outputs[0]};
}

}  // namespace tt::ops
