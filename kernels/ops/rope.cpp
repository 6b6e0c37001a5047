// RoPE op layer: checks inputs, runs the custom kernel on GPU tensors and the ATen formulation of the
// same forward and backward on CPU tensors (so a float64 gradient check on CPU verifies the backward
// formula the kernel implements).
#include "kernels/ops/rope.h"

#include <c10/core/DeviceGuard.h>

#include <limits>
#include <tuple>

#include "kernels/ops/common.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/rope.cuh"
#endif

namespace tt::ops {
namespace {

void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(q.defined() && k.defined() && cos.defined() && sin.defined(),
              "tt::ops::rope: q, k, cos and sin must be defined tensors");
  TORCH_CHECK(q.dim() == 4, "tt::ops::rope: q must have shape [batch, seq, heads, head_dim], got ", q.sizes());
  TORCH_CHECK(k.dim() == 4, "tt::ops::rope: k must have shape [batch, seq, kv_heads, head_dim], got ", k.sizes());
  TORCH_CHECK(q.is_floating_point(), "tt::ops::rope: q must be a floating-point tensor, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type(), "tt::ops::rope: q and k must have the same dtype, got q ",
              q.scalar_type(), " and k ", k.scalar_type());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3),
              "tt::ops::rope: q and k must agree in batch, seq and head_dim, got q ", q.sizes(), " and k ", k.sizes());
  const int64_t seq = q.size(1);
  const int64_t head_dim = q.size(3);
  TORCH_CHECK(head_dim > 0 && head_dim % 2 == 0,
              "tt::ops::rope: head_dim must be even and > 0 (pairs are rotated), got ", head_dim);
  for (const auto* table : {&cos, &sin}) {
    const char* name = table == &cos ? "cos" : "sin";
    TORCH_CHECK(table->scalar_type() == torch::kFloat32, "tt::ops::rope: ", name, " must be Float (fp32), got ",
                table->scalar_type());
    TORCH_CHECK(table->dim() == 2 && table->size(0) == seq && table->size(1) == head_dim / 2, "tt::ops::rope: ", name,
                " must have shape [seq, head_dim / 2] = [", seq, ", ", head_dim / 2, "], got ", table->sizes());
  }
  for (const auto* t : {&k, &cos, &sin}) {
    const char* name = t == &k ? "k" : t == &cos ? "cos" : "sin";
    TORCH_CHECK(t->device() == q.device(), "tt::ops::rope: ", name, " is on ", t->device(), " but q is on ", q.device(),
                "; all inputs must be on the same device");
  }
  if (q.is_cpu()) return;
  detail::check_gpu_input("rope", "q and k", q);
#ifdef TT_HAVE_GPU_KERNELS
  TORCH_CHECK(q.size(0) * seq <= std::numeric_limits<int32_t>::max() &&
                  (q.size(2) + k.size(2)) * head_dim <= std::numeric_limits<int32_t>::max(),
              "tt::ops::rope: the GPU kernel handles at most 2^31 - 1 tokens, got q ", q.sizes());
#endif
}

// ---- ATen formulation (CPU) -----------------------------------------------------------------------

// Rotates the pairs of x [B, S, H, D] by +angle (sign 1) or -angle (sign -1), computing in fp32 (fp64
// for fp64 inputs, the gradient check). The backward is the rotation by -angle: the matrix is orthogonal.
torch::Tensor rotate_aten(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, double sign) {
  const auto ct = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto pairs = x.to(ct).unflatten(-1, {-1, 2});  // [B, S, H, D/2, 2]
  auto x0 = pairs.select(-1, 0);
  auto x1 = pairs.select(-1, 1);
  auto c = cos.to(ct).unsqueeze(1);  // [S, 1, D/2], broadcast over heads
  auto s = sin.to(ct).unsqueeze(1) * sign;
  return torch::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).flatten(-2).to(x.scalar_type());
}

// ---- GPU kernel ---------------------------------------------------------------------------------------

#ifdef TT_HAVE_GPU_KERNELS
// The kernel takes any strides for batch, seq and heads, so views into a fused QKV projection need no
// copy; only a non-contiguous head dim is copied.
torch::Tensor with_contiguous_head_dim(const torch::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); }

// in and out: [B, S, H, D] with a contiguous head dim. An undefined pair is "no such tensor".
kernels::RopeTensor rope_tensor(const torch::Tensor& in, const torch::Tensor& out) {
  if (!in.defined()) return {};
  return {in.data_ptr(), out.data_ptr(), in.size(2),    in.stride(0), in.stride(1),
          in.stride(2),  out.stride(0),  out.stride(1), out.stride(2)};
}

// One launch: rotates q and k (or their gradients, `inverse`) into q_out and k_out, and copies v into v_out
// when v is defined.
void launch_gpu(const torch::Tensor& q, const torch::Tensor& q_out, const torch::Tensor& k, const torch::Tensor& k_out,
                const torch::Tensor& v, const torch::Tensor& v_out, const torch::Tensor& cos, const torch::Tensor& sin,
                bool inverse) {
  c10::DeviceGuard guard(q.device());
  const auto cos_c = cos.contiguous();
  const auto sin_c = sin.contiguous();
  kernels::RopeParams params{};
  params.q = rope_tensor(q, q_out);
  params.k = rope_tensor(k, k_out);
  params.v = rope_tensor(v, v_out);
  params.cos = cos_c.data_ptr<float>();
  params.sin = sin_c.data_ptr<float>();
  params.batch = q.size(0);
  params.seq = q.size(1);
  params.head_dim = q.size(3);
  void* stream = detail::current_stream(q);
  const auto dtype = detail::kernel_dtype(q.scalar_type());
  const auto status =
      inverse ? kernels::rope_backward(params, dtype, stream) : kernels::rope_forward(params, dtype, stream);
  detail::check_launch("rope", status, inverse ? "rope_backward" : "rope_forward");
}

// Rotates q and k (or their gradients) in one launch; outputs are contiguous.
std::pair<torch::Tensor, torch::Tensor> rotate_gpu(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                                   const torch::Tensor& cos, const torch::Tensor& sin, bool inverse) {
  auto q = with_contiguous_head_dim(q_in);
  auto k = with_contiguous_head_dim(k_in);
  auto q_out = torch::empty(q.sizes(), q.options());
  auto k_out = torch::empty(k.sizes(), k.options());
  launch_gpu(q, q_out, k, k_out, {}, {}, cos, sin, inverse);
  return {q_out, k_out};
}
#endif

std::pair<torch::Tensor, torch::Tensor> rotate(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                               const torch::Tensor& sin, bool inverse) {
  if (q.is_cpu()) {
    const double sign = inverse ? -1.0 : 1.0;
    return {rotate_aten(q, cos, sin, sign), rotate_aten(k, cos, sin, sign)};
  }
#ifdef TT_HAVE_GPU_KERNELS
  return rotate_gpu(q, k, cos, sin, inverse);
#else
  TORCH_CHECK(false, "tt::ops::rope: this build has no GPU kernels");
#endif
}

}  // namespace

// Saves only the tables: the backward needs no activation.
struct RopeFunction : torch::autograd::Function<RopeFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    check_inputs(q, k, cos, sin);
    auto [q_out, k_out] = rotate(q, k, cos, sin, /*inverse=*/false);
    ctx->save_for_backward({cos, sin});
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_q, grad_k] = rotate(grad_outputs[0], grad_outputs[1], saved[0], saved[1], /*inverse=*/true);
    return {grad_q, grad_k, torch::Tensor(), torch::Tensor()};
  }
};

std::pair<torch::Tensor, torch::Tensor> rope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& cos,
                                             const torch::Tensor& sin) {
  auto outputs = RopeFunction::apply(q, k, cos, sin);
  return {outputs[0], outputs[1]};
}

namespace {

// qkv [B, S, Hq + 2 Hkv, D] -> its q, k and v heads, as views.
std::vector<torch::Tensor> split_heads(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads) {
  return qkv.split_with_sizes({n_heads, n_kv_heads, n_kv_heads}, 2);
}

void check_qkv_inputs(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads) {
  TORCH_CHECK(qkv.defined(), "tt::ops::rope_qkv: qkv must be a defined tensor");
  TORCH_CHECK(n_heads > 0 && n_kv_heads > 0, "tt::ops::rope_qkv: n_heads and n_kv_heads must be > 0, got ", n_heads,
              " and ", n_kv_heads);
  TORCH_CHECK(qkv.dim() == 4 && qkv.size(2) == n_heads + 2 * n_kv_heads,
              "tt::ops::rope_qkv: qkv must have shape [batch, seq, n_heads + 2 * n_kv_heads = ", n_heads + 2 * n_kv_heads,
              ", head_dim], got ", qkv.sizes());
}

}  // namespace

// Saves only the tables, like RopeFunction; the head counts travel in saved_data.
struct RopeQkvFunction : torch::autograd::Function<RopeQkvFunction> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv_in, int64_t n_heads, int64_t n_kv_heads,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    check_qkv_inputs(qkv_in, n_heads, n_kv_heads);
    const auto parts = split_heads(qkv_in, n_heads, n_kv_heads);
    check_inputs(parts[0], parts[1], cos, sin);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["n_heads"] = n_heads;
    ctx->saved_data["n_kv_heads"] = n_kv_heads;
    if (qkv_in.is_cpu()) {
      return {rotate_aten(parts[0], cos, sin, 1.0), rotate_aten(parts[1], cos, sin, 1.0), parts[2]};
    }
#ifdef TT_HAVE_GPU_KERNELS
    const auto qkv = with_contiguous_head_dim(qkv_in);
    const auto heads = split_heads(qkv, n_heads, n_kv_heads);
    auto q_out = torch::empty(heads[0].sizes(), qkv.options());
    auto k_out = torch::empty(heads[1].sizes(), qkv.options());
    launch_gpu(heads[0], q_out, heads[1], k_out, {}, {}, cos, sin, /*inverse=*/false);
    return {q_out, k_out, heads[2]};
#else
    TORCH_CHECK(false, "tt::ops::rope_qkv: this build has no GPU kernels");
#endif
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& cos = saved[0];
    const auto& sin = saved[1];
    const int64_t n_heads = ctx->saved_data["n_heads"].toInt();
    const int64_t n_kv_heads = ctx->saved_data["n_kv_heads"].toInt();
    const auto &grad_q = grad_outputs[0], &grad_k = grad_outputs[1], &grad_v = grad_outputs[2];
    torch::Tensor grad_qkv;
    if (grad_q.is_cpu()) {
      grad_qkv = torch::cat({rotate_aten(grad_q, cos, sin, -1.0), rotate_aten(grad_k, cos, sin, -1.0), grad_v}, 2);
    } else {
#ifdef TT_HAVE_GPU_KERNELS
      auto sizes = grad_q.sizes().vec();
      sizes[2] = n_heads + 2 * n_kv_heads;
      grad_qkv = torch::empty(sizes, grad_q.options());
      const auto heads = split_heads(grad_qkv, n_heads, n_kv_heads);
      launch_gpu(with_contiguous_head_dim(grad_q), heads[0], with_contiguous_head_dim(grad_k), heads[1],
                 with_contiguous_head_dim(grad_v), heads[2], cos, sin, /*inverse=*/true);
#else
      TORCH_CHECK(false, "tt::ops::rope_qkv: this build has no GPU kernels");
#endif
    }
    return {grad_qkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

RotatedQkv rope_qkv(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads, const torch::Tensor& cos,
                    const torch::Tensor& sin) {
  auto outputs = RopeQkvFunction::apply(qkv, n_heads, n_kv_heads, cos, sin);
  return {outputs[0], outputs[1], outputs[2]};
}

}  // namespace tt::ops
