// Naive SwiGLU MLP op layer: checks inputs, runs the naive kernels on GPU tensors (forward: projections and
// activation in one kernel; backward: the activation's gradient through the SwiGLU backward kernel, then
// the two products through the naive matmul kernel), and the GEMM + tt::ops::swiglu on CPU tensors.
#include "kernels/ops/naive_swiglu.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>

#include <limits>

#include "kernels/ops/common.h"
#include "kernels/ops/swiglu.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/naive_swiglu.cuh"
#include "kernels/swiglu.cuh"
#endif

namespace tt::ops {
namespace {

void check_inputs(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.defined() && weight.defined(), "tt::ops::naive_swiglu: x and gate_up_weight must be defined tensors");
  TORCH_CHECK(x.is_floating_point(), "tt::ops::naive_swiglu: x must be a floating-point tensor, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0,
              "tt::ops::naive_swiglu: x must have shape [..., hidden] with hidden > 0, got ", x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) > 0 && weight.size(0) % 2 == 0,
              "tt::ops::naive_swiglu: gate_up_weight must have shape [2 * ffn, hidden] with ffn > 0, got ",
              weight.sizes());
  TORCH_CHECK(weight.size(1) == x.size(-1), "tt::ops::naive_swiglu: gate_up_weight has ", weight.size(1),
              " columns but x has hidden size ", x.size(-1), "; they must be equal");
  TORCH_CHECK(x.device() == weight.device(), "tt::ops::naive_swiglu: x is on ", x.device(), " but gate_up_weight on ",
              weight.device(), "; they must be on the same device");
  if (x.is_cpu()) return;
  detail::check_gpu_input("naive_swiglu", "x", x);
#ifdef TT_HAVE_GPU_KERNELS
  TORCH_CHECK(x.numel() / x.size(-1) <= std::numeric_limits<int32_t>::max() &&
                  weight.size(0) <= std::numeric_limits<int32_t>::max(),
              "tt::ops::naive_swiglu: the GPU kernel handles at most 2^31 - 1 rows and 2^31 - 1 weight rows, got x ",
              x.sizes(), " and gate_up_weight ", weight.sizes());
#endif
}

#ifdef TT_HAVE_GPU_KERNELS
// c = a b through the naive kernel; a [m, k] and b [k, n] in any 2-D layout, c contiguous [m, n].
torch::Tensor naive_matmul(const torch::Tensor& a, const torch::Tensor& b) {
  auto c = torch::empty({a.size(0), b.size(1)}, a.options());
  kernels::NaiveMatmulParams params{};
  params.a = a.data_ptr();
  params.b = b.data_ptr();
  params.c = c.data_ptr();
  params.m = a.size(0);
  params.n = b.size(1);
  params.k = a.size(1);
  params.a_stride_0 = a.stride(0);
  params.a_stride_1 = a.stride(1);
  params.b_stride_0 = b.stride(0);
  params.b_stride_1 = b.stride(1);
  detail::check_launch("naive_swiglu",
                       kernels::naive_matmul(params, detail::kernel_dtype(a.scalar_type()), detail::current_stream(a)),
                       "naive_matmul");
  return c;
}
#endif

}  // namespace

// GPU tensors only (naive_swiglu sends CPU tensors to the ATen formulation). x and weight share a dtype.
// Saves x [rows, H], the weight and the projections [rows, 2F] the forward computed.
struct NaiveSwigluFunction : torch::autograd::Function<NaiveSwigluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in, const torch::Tensor& weight_in) {
#ifdef TT_HAVE_GPU_KERNELS
    c10::DeviceGuard guard(x_in.device());
    const int64_t hidden = x_in.size(-1), ffn = weight_in.size(0) / 2;
    const auto x = x_in.reshape({-1, hidden}).contiguous();
    const auto weight = weight_in.contiguous();
    auto out = torch::empty({x.size(0), ffn}, x.options());
    auto gate_up = torch::empty({x.size(0), 2 * ffn}, x.options());
    kernels::NaiveSwigluForwardParams params{};
    params.x = x.data_ptr();
    params.weight = weight.data_ptr();
    params.out = out.data_ptr();
    params.gate_up = gate_up.data_ptr();
    params.rows = x.size(0);
    params.hidden = hidden;
    params.ffn = ffn;
    detail::check_launch(
        "naive_swiglu",
        kernels::naive_swiglu_forward(params, detail::kernel_dtype(x.scalar_type()), detail::current_stream(x)),
        "naive_swiglu_forward");
    ctx->save_for_backward({x, weight, gate_up});
    ctx->saved_data["x_sizes"] = x_in.sizes().vec();
    auto out_sizes = x_in.sizes().vec();
    out_sizes.back() = ffn;
    return out.view(out_sizes);
#else
    (void)ctx;
    (void)weight_in;
    TORCH_CHECK(false, "tt::ops::naive_swiglu: x is on ", x_in.device(), " but this build has no GPU kernels");
#endif
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
#ifdef TT_HAVE_GPU_KERNELS
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &gate_up = saved[2];
    c10::DeviceGuard guard(x.device());
    const int64_t ffn = weight.size(0) / 2;
    auto grad = grad_outputs[0].to(x.scalar_type()).reshape({-1, ffn}).contiguous();
    auto grad_gate_up = torch::empty_like(gate_up);
    kernels::SwigluBackwardParams act{};
    act.grad_out = grad.data_ptr();
    act.gate_up = gate_up.data_ptr();
    act.grad_gate_up = grad_gate_up.data_ptr();
    act.rows = gate_up.size(0);
    act.ffn = ffn;
    detail::check_launch(
        "naive_swiglu", kernels::swiglu_backward(act, detail::kernel_dtype(x.scalar_type()), detail::current_stream(x)),
        "swiglu_backward");
    auto grad_x = naive_matmul(grad_gate_up, weight).view(ctx->saved_data["x_sizes"].toIntVector());
    auto grad_weight = naive_matmul(grad_gate_up.t(), x);
    return {grad_x, grad_weight};
#else
    (void)ctx;
    (void)grad_outputs;
    return {torch::Tensor(), torch::Tensor()};
#endif
  }
};

torch::Tensor naive_swiglu(const torch::Tensor& x, const torch::Tensor& gate_up_weight) {
  check_inputs(x, gate_up_weight);
  if (x.is_cpu()) return swiglu(torch::matmul(x, gate_up_weight.to(x.scalar_type()).t()));
  // Under autocast both operands go to the autocast dtype, as they would for the GEMM this kernel replaces.
  const auto device_type = x.device().type();
  const auto dtype =
      at::autocast::is_autocast_enabled(device_type) ? at::autocast::get_autocast_dtype(device_type) : x.scalar_type();
  return NaiveSwigluFunction::apply(x.to(dtype), gate_up_weight.to(dtype));
}

}  // namespace tt::ops
