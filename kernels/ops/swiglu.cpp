// SwiGLU op layer: checks inputs, runs the custom kernels on GPU tensors and the ATen formulation of the
// same forward and backward on CPU tensors (so a float64 gradient check on CPU verifies the backward
// formulas the kernels implement).
#include "kernels/ops/swiglu.h"

#include <c10/core/DeviceGuard.h>

#include <limits>

#include "kernels/ops/common.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/swiglu.cuh"
#endif

namespace tt::ops {
namespace {

// op: "swiglu" or "swiglu_strided", for the messages.
void check_inputs(const torch::Tensor& gate_up, const char* op = "swiglu") {
  TORCH_CHECK(gate_up.defined(), "tt::ops::", op, ": gate_up must be a defined tensor");
  TORCH_CHECK(gate_up.is_floating_point(), "tt::ops::", op, ": gate_up must be a floating-point tensor, got ",
              gate_up.scalar_type());
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) > 0 && gate_up.size(-1) % 2 == 0, "tt::ops::", op,
              ": gate_up must have shape [..., 2 * ffn] with ffn > 0 (gate then up), got ", gate_up.sizes());
  if (gate_up.is_cpu()) return;
  detail::check_gpu_input(op, "gate_up", gate_up);
#ifdef TT_HAVE_GPU_KERNELS
  TORCH_CHECK(gate_up.numel() / gate_up.size(-1) <= std::numeric_limits<int32_t>::max() &&
                  gate_up.size(-1) <= std::numeric_limits<int32_t>::max(),
              "tt::ops::", op, ": the GPU kernel handles at most 2^31 - 1 rows of at most 2^31 - 1 elements, got ",
              gate_up.sizes());
#endif
}

// ---- ATen formulation (CPU) -----------------------------------------------------------------------

// gate and up in the compute dtype: fp32, or fp64 for fp64 inputs (the gradient check).
std::pair<torch::Tensor, torch::Tensor> split_aten(const torch::Tensor& gate_up) {
  const auto ct = gate_up.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const int64_t ffn = gate_up.size(-1) / 2;
  return {gate_up.narrow(-1, 0, ffn).to(ct), gate_up.narrow(-1, ffn, ffn).to(ct)};
}

torch::Tensor forward_aten(const torch::Tensor& gate_up) {
  auto [gate, up] = split_aten(gate_up);
  return (gate * torch::sigmoid(gate) * up).to(gate_up.scalar_type());
}

// grad_gate = grad_out * up * sig(gate) * (1 + gate * (1 - sig(gate))), grad_up = grad_out * silu(gate).
torch::Tensor backward_aten(const torch::Tensor& grad_out, const torch::Tensor& gate_up) {
  auto [gate, up] = split_aten(gate_up);
  auto go = grad_out.to(gate.scalar_type());
  auto sig = torch::sigmoid(gate);
  auto grad_gate = go * up * sig * (1 + gate * (1 - sig));
  auto grad_up = go * gate * sig;
  return torch::cat({grad_gate, grad_up}, -1).to(gate_up.scalar_type());
}

// ---- GPU kernels ------------------------------------------------------------------------------------

#ifdef TT_HAVE_GPU_KERNELS
// gate_up must be contiguous.
torch::Tensor forward_gpu(const torch::Tensor& gate_up) {
  c10::DeviceGuard guard(gate_up.device());
  const int64_t ffn = gate_up.size(-1) / 2;
  auto out_sizes = gate_up.sizes().vec();
  out_sizes.back() = ffn;
  auto out = torch::empty(out_sizes, gate_up.options());
  kernels::SwigluForwardParams params{};
  params.gate_up = gate_up.data_ptr();
  params.out = out.data_ptr();
  params.rows = gate_up.numel() / gate_up.size(-1);
  params.ffn = ffn;
  detail::check_launch(
      "swiglu",
      kernels::swiglu_forward(params, detail::kernel_dtype(gate_up.scalar_type()), detail::current_stream(gate_up)),
      "swiglu_forward");
  return out;
}

torch::Tensor backward_gpu(const torch::Tensor& grad_out, const torch::Tensor& gate_up) {
  c10::DeviceGuard guard(gate_up.device());
  // Gradients may arrive in another layout (an expanded scalar from .sum(), say) or dtype.
  auto grad = grad_out.to(gate_up.scalar_type()).contiguous();
  auto grad_gate_up = torch::empty(gate_up.sizes(), gate_up.options());
  kernels::SwigluBackwardParams params{};
  params.grad_out = grad.data_ptr();
  params.gate_up = gate_up.data_ptr();
  params.grad_gate_up = grad_gate_up.data_ptr();
  params.rows = gate_up.numel() / gate_up.size(-1);
  params.ffn = gate_up.size(-1) / 2;
  detail::check_launch(
      "swiglu",
      kernels::swiglu_backward(params, detail::kernel_dtype(gate_up.scalar_type()), detail::current_stream(gate_up)),
      "swiglu_backward");
  return grad_gate_up;
}

// gate_up as [rows, 2F] without a copy when its layout allows one (any layout whose leading dimensions
// merge); otherwise reshape copies, and the strided kernels read the copy.
torch::Tensor as_rows(const torch::Tensor& gate_up) { return gate_up.reshape({-1, gate_up.size(-1)}); }

kernels::SwigluStridedParams strided_params(const torch::Tensor& rows_view) {
  kernels::SwigluStridedParams params{};
  params.gate_up = rows_view.data_ptr();
  params.rows = rows_view.size(0);
  params.ffn = rows_view.size(1) / 2;
  params.row_stride = rows_view.stride(0);
  params.col_stride = rows_view.stride(1);
  return params;
}

torch::Tensor forward_strided_gpu(const torch::Tensor& gate_up) {
  c10::DeviceGuard guard(gate_up.device());
  const auto rows_view = as_rows(gate_up);
  auto out_sizes = gate_up.sizes().vec();
  out_sizes.back() = gate_up.size(-1) / 2;
  auto out = torch::empty(out_sizes, gate_up.options());
  auto params = strided_params(rows_view);
  params.out = out.data_ptr();
  detail::check_launch("swiglu_strided",
                       kernels::swiglu_strided_forward(params, detail::kernel_dtype(gate_up.scalar_type()),
                                                       detail::current_stream(gate_up)),
                       "swiglu_strided_forward");
  return out;
}

torch::Tensor backward_strided_gpu(const torch::Tensor& grad_out, const torch::Tensor& gate_up) {
  c10::DeviceGuard guard(gate_up.device());
  const auto rows_view = as_rows(gate_up);
  auto grad = grad_out.to(gate_up.scalar_type()).contiguous();
  auto grad_gate_up = torch::empty(gate_up.sizes(), gate_up.options().memory_format(torch::MemoryFormat::Contiguous));
  auto params = strided_params(rows_view);
  params.grad_out = grad.data_ptr();
  params.out = grad_gate_up.data_ptr();
  detail::check_launch("swiglu_strided",
                       kernels::swiglu_strided_backward(params, detail::kernel_dtype(gate_up.scalar_type()),
                                                        detail::current_stream(gate_up)),
                       "swiglu_strided_backward");
  return grad_gate_up;
}
#endif

}  // namespace

// Saves gate_up (contiguous): the backward needs gate and up, and nothing else.
struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate_up) {
    check_inputs(gate_up);
    torch::Tensor saved = gate_up;
    torch::Tensor out;
    if (gate_up.is_cpu()) {
      out = forward_aten(gate_up);
    } else {
#ifdef TT_HAVE_GPU_KERNELS
      // The kernel reads rows as contiguous memory; other layouts are copied once here.
      saved = gate_up.contiguous();
      out = forward_gpu(saved);
#endif
    }
    ctx->save_for_backward({saved});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto gate_up = ctx->get_saved_variables()[0];
    if (gate_up.is_cpu()) return {backward_aten(grad_outputs[0], gate_up)};
#ifdef TT_HAVE_GPU_KERNELS
    return {backward_gpu(grad_outputs[0], gate_up)};
#else
    return {torch::Tensor()};
#endif
  }
};

torch::Tensor swiglu(const torch::Tensor& gate_up) { return SwigluFunction::apply(gate_up); }

// Saves gate_up as it came, in its own layout: the backward reads it through the same strided path.
struct SwigluStridedFunction : torch::autograd::Function<SwigluStridedFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate_up) {
    check_inputs(gate_up, "swiglu_strided");
    ctx->save_for_backward({gate_up});
    if (gate_up.is_cpu()) return forward_aten(gate_up);
#ifdef TT_HAVE_GPU_KERNELS
    return forward_strided_gpu(gate_up);
#else
    return torch::Tensor();
#endif
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto gate_up = ctx->get_saved_variables()[0];
    if (gate_up.is_cpu()) return {backward_aten(grad_outputs[0], gate_up)};
#ifdef TT_HAVE_GPU_KERNELS
    return {backward_strided_gpu(grad_outputs[0], gate_up)};
#else
    return {torch::Tensor()};
#endif
  }
};

torch::Tensor swiglu_strided(const torch::Tensor& gate_up) { return SwigluStridedFunction::apply(gate_up); }

}  // namespace tt::ops
