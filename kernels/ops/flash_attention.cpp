// Flash attention op layer: checks inputs, runs the custom kernels on GPU tensors and the ATen formulation of
// the same forward and backward on CPU tensors (so a float64 gradient check on CPU verifies the backward
// formulas the kernels implement, including their use of the saved log-sum-exp).
//
// Backward formulas, with P = exp(q k^T * scale - lse) (masked entries 0) and delta = rowsum(dO * O):
//   dV = P^T dO,   dS = P * (dO V^T - delta),   dQ = dS K * scale,   dK = dS^T Q * scale,
// where for grouped-query attention dK and dV sum over the query heads that share a key/value head.
#include "kernels/ops/flash_attention.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include "kernels/ops/common.h"
#include "kernels/ops/flash_attention_params.h"
#include "kernels/ops/rope.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/flash_attention.cuh"
#endif

namespace tt::ops {
namespace {

// Grid dims y and z (heads, batch) are limited to 65535 on NVIDIA.
constexpr int64_t kMaxGridDim = 65535;

void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "tt::ops::flash_attention: q, k and v must be defined tensors");
  TORCH_CHECK(q.dim() == 4, "tt::ops::flash_attention: q must have shape [batch, q_heads, seq, head_dim], got ",
              q.sizes());
  TORCH_CHECK(k.dim() == 4, "tt::ops::flash_attention: k must have shape [batch, kv_heads, seq, head_dim], got ",
              k.sizes());
  TORCH_CHECK(v.dim() == 4, "tt::ops::flash_attention: v must have shape [batch, kv_heads, seq, head_dim], got ",
              v.sizes());
  TORCH_CHECK(q.is_floating_point(), "tt::ops::flash_attention: q must be a floating-point tensor, got ",
              q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "tt::ops::flash_attention: q, k and v must have the same dtype, got q ", q.scalar_type(), ", k ",
              k.scalar_type(), " and v ", v.scalar_type());
  TORCH_CHECK(k.device() == q.device(), "tt::ops::flash_attention: k is on ", k.device(), " but q is on ", q.device(),
              "; all inputs must be on the same device");
  TORCH_CHECK(v.device() == q.device(), "tt::ops::flash_attention: v is on ", v.device(), " but q is on ", q.device(),
              "; all inputs must be on the same device");
  TORCH_CHECK(k.sizes() == v.sizes(), "tt::ops::flash_attention: k and v must have the same shape, got k ", k.sizes(),
              " and v ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(3) == k.size(3),
              "tt::ops::flash_attention: q and k/v must agree in batch, seq and head_dim, got q ", q.sizes(), " and k ",
              k.sizes());
  const int64_t q_heads = q.size(1);
  const int64_t kv_heads = k.size(1);
  TORCH_CHECK(kv_heads > 0, "tt::ops::flash_attention: k and v must have at least one head, got k ", k.sizes());
  TORCH_CHECK(q_heads % kv_heads == 0, "tt::ops::flash_attention: number of query heads (", q_heads,
              ") must be a multiple of key/value heads (", kv_heads, ")");
  if (q.is_cpu()) return;
  detail::check_gpu_input("flash_attention", "q, k and v", q);
#ifdef TT_HAVE_GPU_KERNELS
  const int64_t head_dim = q.size(3);
  TORCH_CHECK(head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128,
              "tt::ops::flash_attention: the GPU kernel supports head_dim 16, 32, 64 or 128, got ", head_dim);
  TORCH_CHECK(q.size(2) <= std::numeric_limits<int32_t>::max(),
              "tt::ops::flash_attention: the GPU kernel handles at most 2^31 - 1 positions, got seq ", q.size(2));
  TORCH_CHECK(q.size(0) <= kMaxGridDim && q_heads <= kMaxGridDim, "tt::ops::flash_attention: the GPU kernel handles ",
              "at most ", kMaxGridDim, " batch entries and ", kMaxGridDim, " heads, got q ", q.sizes());
#endif
}

// ---- ATen formulation (CPU) -----------------------------------------------------------------------

// fp64 inputs (the CPU gradient check) compute in fp64; everything else in fp32.
torch::ScalarType compute_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

double softmax_scale(const torch::Tensor& q) { return 1.0 / std::sqrt(static_cast<double>(q.size(3))); }

// Key/value heads repeated to one per query head (the CPU formulation may copy; the kernels never do).
torch::Tensor per_query_head(const torch::Tensor& kv, int64_t q_heads) {
  const int64_t n_rep = q_heads / kv.size(1);
  return n_rep == 1 ? kv : kv.repeat_interleave(n_rep, 1);
}

// The gradient of a repeated key/value head: the sum over the query heads that used it.
torch::Tensor sum_over_group(const torch::Tensor& grad, int64_t kv_heads) {
  const int64_t n_rep = grad.size(1) / kv_heads;
  return n_rep == 1 ? grad : grad.unflatten(1, {kv_heads, n_rep}).sum(2);
}

// q k^T * scale [B, Hq, S, S] with the future (key > query) set to -inf.
torch::Tensor causal_scores(const torch::Tensor& q, const torch::Tensor& keys, double scale) {
  const int64_t seq = q.size(2);
  auto future = torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
  return (torch::matmul(q, keys.transpose(-2, -1)) * scale).masked_fill(future, -std::numeric_limits<double>::infinity());
}

// Returns the output (q's dtype) and the per-row log-sum-exp of the scaled scores (compute dtype).
std::pair<torch::Tensor, torch::Tensor> forward_aten(const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v) {
  // The kernels compute in fp32 whatever the caller's autocast says; so must this formulation. Under bf16
  // autocast the matmuls would otherwise round the scores and the log-sum-exp to bf16 (the backward, which
  // runs without autocast, then recomputes fp32 probabilities against a bf16 log-sum-exp).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto ct = compute_dtype(q);
  auto qf = q.to(ct);
  auto scores = causal_scores(qf, per_query_head(k.to(ct), q.size(1)), softmax_scale(q));
  auto lse = scores.logsumexp(-1);
  auto probs = torch::exp(scores - lse.unsqueeze(-1));
  auto out = torch::matmul(probs, per_query_head(v.to(ct), q.size(1)));
  return {out.to(q.scalar_type()), lse};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> backward_aten(const torch::Tensor& grad_out,
                                                                      const torch::Tensor& q, const torch::Tensor& k,
                                                                      const torch::Tensor& v, const torch::Tensor& out,
                                                                      const torch::Tensor& lse) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // as forward_aten
  const auto ct = compute_dtype(q);
  const double scale = softmax_scale(q);
  const int64_t kv_heads = k.size(1);
  auto qf = q.to(ct);
  auto keys = per_query_head(k.to(ct), q.size(1));
  auto values = per_query_head(v.to(ct), q.size(1));
  auto g = grad_out.to(ct);
  auto probs = torch::exp(causal_scores(qf, keys, scale) - lse.to(ct).unsqueeze(-1));
  auto delta = (g * out.to(ct)).sum(-1, /*keepdim=*/true);
  auto grad_scores = probs * (torch::matmul(g, values.transpose(-2, -1)) - delta);
  auto grad_q = torch::matmul(grad_scores, keys) * scale;
  auto grad_k = sum_over_group(torch::matmul(grad_scores.transpose(-2, -1), qf) * scale, kv_heads);
  auto grad_v = sum_over_group(torch::matmul(probs.transpose(-2, -1), g), kv_heads);
  return {grad_q.to(q.scalar_type()), grad_k.to(k.scalar_type()), grad_v.to(v.scalar_type())};
}

// ---- GPU kernels ------------------------------------------------------------------------------------

#ifdef TT_HAVE_GPU_KERNELS
// The kernels move rows in 16-byte accesses and take any batch/head/seq strides: views into a fused QKV
// projection pass as they are. Only a non-contiguous head dim, or data or strides off 16-byte alignment,
// is copied (clone, not contiguous(): a misaligned contiguous view would stay misaligned).
torch::Tensor kernel_ready(const torch::Tensor& t) {
  const int64_t vec = 16 / t.element_size();
  bool ready = t.stride(3) == 1 && reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int64_t dim = 0; dim < 3; ++dim) ready = ready && (t.size(dim) <= 1 || t.stride(dim) % vec == 0);
  return ready ? t : t.clone(at::MemoryFormat::Contiguous);
}

// An uninitialised [B, H, S, D] result laid out as [B, S, H, D] (see flash_attention's comment).
torch::Tensor empty_bshd_as(const torch::Tensor& like) {
  return torch::empty({like.size(0), like.size(2), like.size(1), like.size(3)}, like.options()).transpose(1, 2);
}

// Below this many positions the default keeps the register tiles even where the Hopper kernels apply: at the
// workshop's 128 the Hopper forward, then with a block of 192 queries (a third empty there), measured slower (H100,
// bf16 forward, kernel_bench: 9.9 against 9.0 us; from 512 positions on it is faster: medium 37.7 against 41.2 us).
// Those figures are from before its grid became persistent, which made medium 30.6 us, and before head dim 64 took
// blocks of 128 queries up to 512 positions (a full block at 128); 128 positions was not measured again. The Hopper
// backward was measured from 512 positions on (H100, bf16, kernel_bench: medium forward + backward 140.7 against the
// register kernels' 156.4 us with its two kernels; 140.2 against 153.7 with the fused kernel and its writer warp), not
// between 129 and 511.
constexpr int64_t kHopperDefaultMinSeq = 129;

// Whether the Hopper kernel's tensor maps have been seen to read `t` (kernel-ready): no dimension of more than one
// element with stride 0, as a broadcast (expanded) view has. The register kernels read those as they are, so the
// default leaves such calls to them rather than rely on the driver's encoder taking a zero stride.
bool tma_tested_layout(const torch::Tensor& t) {
  for (int64_t dim = 0; dim < 3; ++dim)
    if (t.size(dim) > 1 && t.stride(dim) == 0) return false;
  return true;
}

// `t` (kernel-ready) as the Hopper kernels read it: itself, or a contiguous copy of a broadcast view. The default
// never sends those to the Hopper kernels (kernel_for); a caller naming the Hopper generation, or an incoming
// gradient that is broadcast over the batch or heads (an expand(), or a reduction's gradient over some dims), gets
// the copy.
torch::Tensor tma_ready(const torch::Tensor& t) { return tma_tested_layout(t) ? t : t.contiguous(); }

// The kernel generation that runs a call on kernel-ready q, k, v (FlashAttentionKernel's comment says which is the
// default).
kernels::FlashKernel kernel_for(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool rope,
                                FlashAttentionKernel choice) {
  switch (choice) {
    case FlashAttentionKernel::kSharedMemoryTiles: return kernels::FlashKernel::kSharedMemoryTiles;
    case FlashAttentionKernel::kHopper: return kernels::FlashKernel::kHopper;
    case FlashAttentionKernel::kRegisterTiles: return kernels::FlashKernel::kRegisterTiles;
    default:
      if (!rope && flash_attention_default_is_hopper(q.scalar_type(), q.size(3), q.size(2)) && tma_tested_layout(q) &&
          tma_tested_layout(k) && tma_tested_layout(v))
        return kernels::FlashKernel::kHopper;
      return kernels::default_flash_kernel(detail::kernel_dtype(q.scalar_type()));
  }
}

const float* data_or_null(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

struct ForwardResult {
  torch::Tensor out;
  torch::Tensor lse;        // fp32 [B, Hq, S]: the log-sum-exp of each query's scaled scores
  torch::Tensor q_rotated;  // with RoPE: the rotated q and k, which the backward reads
  torch::Tensor k_rotated;
};

// q, k, v: kernel_ready; cos, sin: checked RoPE tables, or undefined for none.
ForwardResult forward_gpu(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          kernels::FlashKernel kernel, const torch::Tensor& cos, const torch::Tensor& sin) {
  c10::DeviceGuard guard(q.device());
  ForwardResult result;
  auto out = empty_bshd_as(q);
  auto lse = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(torch::kFloat32));
  auto params = detail::flash_forward_params(q, k, v, out, lse);
  params.rope_cos = data_or_null(cos);
  params.rope_sin = data_or_null(sin);
  if (cos.defined()) {
    result.q_rotated = empty_bshd_as(q);
    result.k_rotated = empty_bshd_as(k);
    params.q_rotated = result.q_rotated.data_ptr();
    params.k_rotated = result.k_rotated.data_ptr();
    params.q_rotated_strides = detail::flash_strides(result.q_rotated);
    params.k_rotated_strides = detail::flash_strides(result.k_rotated);
  }
  detail::check_launch("flash_attention",
                       kernels::flash_attention_forward(params, detail::kernel_dtype(q.scalar_type()),
                                                        detail::current_stream(q), kernel),
                       "flash_attention_forward");
  result.out = out;
  result.lse = lse;
  return result;
}

// The gradients go into grad_q/k/v where given (kernel-ready [B, H, S, D] views, e.g. of one fused QKV
// gradient), else into fresh tensors.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> backward_gpu(const torch::Tensor& grad_out,
                                                                     const torch::Tensor& q, const torch::Tensor& k,
                                                                     const torch::Tensor& v, const torch::Tensor& out,
                                                                     const torch::Tensor& lse,
                                                                     kernels::FlashKernel kernel,
                                                                     const torch::Tensor& cos,
                                                                     const torch::Tensor& sin,
                                                                     torch::Tensor grad_q = {}, torch::Tensor grad_k = {},
                                                                     torch::Tensor grad_v = {}) {
  c10::DeviceGuard guard(q.device());
  // Gradients may arrive in another layout (an expanded scalar from .sum(), say) or dtype.
  auto grad = kernel_ready(grad_out.to(q.scalar_type()));
  if (kernel == kernels::FlashKernel::kHopper) grad = tma_ready(grad);
  if (!grad_q.defined()) grad_q = empty_bshd_as(q);
  if (!grad_k.defined()) grad_k = empty_bshd_as(k);
  if (!grad_v.defined()) grad_v = empty_bshd_as(v);
  auto delta = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(torch::kFloat32));
  // The fused Hopper backward sums dQ over key blocks in fp32, in whole 64-query tiles, taking turns per tile (its
  // kernels zero the sums and the turns).
  torch::Tensor grad_q_accum, grad_q_turns;
  if (kernel == kernels::FlashKernel::kHopper && kernels::hopper_backward_fused(q.size(3), q.size(2))) {
    const int64_t tiles = kernels::hopper_grad_q_tiles(q.size(2));
    grad_q_accum = torch::empty({q.size(0), q.size(1), tiles * kernels::kHopperGradQTileRows, q.size(3)},
                                q.options().dtype(torch::kFloat32));
    grad_q_turns = torch::empty({q.size(0), q.size(1), tiles}, q.options().dtype(torch::kInt32));
  }
  auto params =
      detail::flash_backward_params(q, k, v, out, lse, grad, grad_q, grad_k, grad_v, delta, grad_q_accum, grad_q_turns);
  params.rope_cos = data_or_null(cos);
  params.rope_sin = data_or_null(sin);
  detail::check_launch("flash_attention",
                       kernels::flash_attention_backward(params, detail::kernel_dtype(q.scalar_type()),
                                                         detail::current_stream(q), kernel),
                       "flash_attention_backward");
  return {grad_q, grad_k, grad_v};
}
#endif

// Saves q, k, v (as the kernels read them), the output and the log-sum-exp; the backward recomputes the
// probabilities from those instead of keeping the S x S matrix. `kernel` is a FlashAttentionKernel; cos and
// sin are RoPE tables applied inside the kernels (GPU register tiles only), or undefined.
struct FlashAttentionFunction : torch::autograd::Function<FlashAttentionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t kernel, const std::optional<torch::Tensor>& cos,
                               const std::optional<torch::Tensor>& sin) {
    check_inputs(q, k, v);
    torch::Tensor q_saved = q;
    torch::Tensor k_saved = k;
    torch::Tensor v_saved = v;
    torch::Tensor out;
    torch::Tensor lse;
    if (q.is_cpu()) {
      std::tie(out, lse) = forward_aten(q, k, v);
    } else {
#ifdef TT_HAVE_GPU_KERNELS
      q_saved = kernel_ready(q);
      k_saved = kernel_ready(k);
      v_saved = kernel_ready(v);
      const auto choice = static_cast<FlashAttentionKernel>(kernel);
      TORCH_CHECK(flash_attention_kernel_applies(choice, q.scalar_type(), q.size(3)), "tt::ops::flash_attention: ",
                  choice == FlashAttentionKernel::kHopper
                      ? "the Hopper kernel runs bf16/fp16 with head_dim 64 or 128 on an sm_90 GPU (sm_90a build) only"
                      : "the register-tile kernel runs bf16/fp16 on NVIDIA GPUs only",
                  "; got ", q.scalar_type(), ", head_dim ", q.size(3));
      TORCH_CHECK(choice != FlashAttentionKernel::kHopper || !cos.has_value(),
                  "tt::ops::flash_attention: the Hopper kernel takes no RoPE in the load");
      const auto generation = kernel_for(q_saved, k_saved, v_saved, cos.has_value(), choice);
      if (generation == kernels::FlashKernel::kHopper) {  // saved so, the backward reads the same tensors
        q_saved = tma_ready(q_saved);
        k_saved = tma_ready(k_saved);
        v_saved = tma_ready(v_saved);
      }
      auto result = forward_gpu(q_saved, k_saved, v_saved, generation, cos.value_or(torch::Tensor()),
                                sin.value_or(torch::Tensor()));
      out = result.out;
      lse = result.lse;
      if (result.q_rotated.defined()) {  // the backward works on the rotated q and k, and rotates dq, dk back
        q_saved = result.q_rotated;
        k_saved = result.k_rotated;
      }
#endif
    }
    ctx->saved_data["kernel"] = kernel;
    ctx->save_for_backward(
        {q_saved, k_saved, v_saved, out, lse, cos.value_or(torch::Tensor()), sin.value_or(torch::Tensor())});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& q = saved[0];
    torch::Tensor grad_q;
    torch::Tensor grad_k;
    torch::Tensor grad_v;
    if (q.is_cpu()) {
      std::tie(grad_q, grad_k, grad_v) = backward_aten(grad_outputs[0], q, saved[1], saved[2], saved[3], saved[4]);
    } else {
#ifdef TT_HAVE_GPU_KERNELS
      const auto choice = static_cast<FlashAttentionKernel>(ctx->saved_data["kernel"].toInt());
      std::tie(grad_q, grad_k, grad_v) = backward_gpu(grad_outputs[0], q, saved[1], saved[2], saved[3], saved[4],
                                                      kernel_for(q, saved[1], saved[2], saved[5].defined(), choice),
                                                      saved[5], saved[6]);
#endif
    }
    return {grad_q, grad_k, grad_v, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

#ifdef TT_HAVE_GPU_KERNELS
// q, k and v as [B, H, S, D] views of a fused [B, S, Hq + 2 Hkv, D] projection output (or of its gradient).
std::array<torch::Tensor, 3> split_qkv(const torch::Tensor& qkv, int64_t q_heads, int64_t kv_heads) {
  const auto parts = qkv.split({q_heads, kv_heads, kv_heads}, 2);
  return {parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2)};
}

// flash_attention_rope on the register tiles, with the fused projection output as its one input: the backward
// writes dq, dk and dv into the three parts of one gradient tensor, where split views would each send a
// full-size gradient back for autograd to add up (three fills and three adds per layer).
struct FlashAttentionQkvFunction : torch::autograd::Function<FlashAttentionQkvFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    const auto [q, k, v] = split_qkv(qkv, q_heads, kv_heads);
    auto result = forward_gpu(kernel_ready(q), kernel_ready(k), kernel_ready(v), kernels::FlashKernel::kRegisterTiles,
                              cos, sin);
    ctx->saved_data["q_heads"] = q_heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->save_for_backward({result.q_rotated, result.k_rotated, kernel_ready(v), result.out, result.lse, cos, sin});
    return result.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& q = saved[0];
    const int64_t q_heads = ctx->saved_data["q_heads"].toInt(), kv_heads = ctx->saved_data["kv_heads"].toInt();
    auto grad_qkv = torch::empty({q.size(0), q.size(2), q_heads + 2 * kv_heads, q.size(3)}, q.options());
    const auto [grad_q, grad_k, grad_v] = split_qkv(grad_qkv, q_heads, kv_heads);
    backward_gpu(grad_outputs[0], q, saved[1], saved[2], saved[3], saved[4], kernels::FlashKernel::kRegisterTiles,
                 saved[5], saved[6], grad_q, grad_k, grad_v);
    return {grad_qkv, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
#endif

// The kernels read the tables as fp32 [>= seq, head_dim / 2] rows, contiguous, on q's device.
void check_rope_tables(const torch::Tensor& q, const torch::Tensor& cos, const torch::Tensor& sin) {
  for (const auto& [name, t] : {std::pair<const char*, const torch::Tensor&>{"cos", cos}, {"sin", sin}}) {
    TORCH_CHECK(t.defined() && t.dim() == 2 && t.size(0) >= q.size(2) && t.size(1) == q.size(3) / 2,
                "tt::ops::flash_attention_rope: ", name, " must be a [seq, head_dim / 2] = [", q.size(2), ", ",
                q.size(3) / 2, "] table, got ", t.defined() ? t.sizes() : at::IntArrayRef{});
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, "tt::ops::flash_attention_rope: ", name, " must be Float, got ",
                t.scalar_type());
    TORCH_CHECK(t.device() == q.device(), "tt::ops::flash_attention_rope: ", name, " is on ", t.device(),
                " but q is on ", q.device());
  }
}

}  // namespace

torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              FlashAttentionKernel kernel) {
  return FlashAttentionFunction::apply(q, k, v, static_cast<int64_t>(kernel), std::optional<torch::Tensor>(),
                                       std::optional<torch::Tensor>());
}

torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return flash_attention(q, k, v, FlashAttentionKernel::kDefault);
}

bool flash_attention_kernel_applies(FlashAttentionKernel kernel, torch::ScalarType dtype, int64_t head_dim) {
  if (kernel == FlashAttentionKernel::kDefault || kernel == FlashAttentionKernel::kSharedMemoryTiles) return true;
#ifdef TT_HAVE_GPU_KERNELS
  if (dtype != torch::kBFloat16 && dtype != torch::kFloat16) return false;
  if (kernel == FlashAttentionKernel::kRegisterTiles)
    return kernels::flash_kernel_available(kernels::FlashKernel::kRegisterTiles, detail::kernel_dtype(dtype));
  return (head_dim == 64 || head_dim == 128) &&
         kernels::flash_kernel_available(kernels::FlashKernel::kHopper, detail::kernel_dtype(dtype));
#else
  (void)dtype, (void)head_dim;
  return false;
#endif
}

bool flash_attention_default_is_hopper(torch::ScalarType dtype, int64_t head_dim, int64_t seq) {
#ifdef TT_HAVE_GPU_KERNELS
  return seq >= kHopperDefaultMinSeq && flash_attention_kernel_applies(FlashAttentionKernel::kHopper, dtype, head_dim);
#else
  (void)dtype, (void)head_dim, (void)seq;
  return false;
#endif
}

namespace {

// Whether flash_attention_rope rotates inside the kernels for q (the register tiles, bf16/fp16 on NVIDIA).
bool rope_in_kernels(const torch::Tensor& q) {
#ifdef TT_HAVE_GPU_KERNELS
  return !q.is_cpu() &&
         kernels::default_flash_kernel(detail::kernel_dtype(q.scalar_type())) == kernels::FlashKernel::kRegisterTiles;
#else
  (void)q;
  return false;
#endif
}

// The first `rows` rows of a RoPE table as the kernels read it: 4 entries (16 bytes) at a time.
torch::Tensor kernel_table(const torch::Tensor& t, int64_t rows) {
  auto out = t.narrow(0, 0, rows).contiguous();
  return reinterpret_cast<std::uintptr_t>(out.data_ptr()) % 16 == 0 ? out : out.clone();
}

}  // namespace

torch::Tensor flash_attention_rope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& cos, const torch::Tensor& sin) {
  check_inputs(q, k, v);
  check_rope_tables(q, cos, sin);
  if (rope_in_kernels(q))
    return FlashAttentionFunction::apply(q, k, v, static_cast<int64_t>(FlashAttentionKernel::kDefault),
                                         std::optional<torch::Tensor>(kernel_table(cos, q.size(2))),
                                         std::optional<torch::Tensor>(kernel_table(sin, q.size(2))));
  // tt::ops::rope works on [B, S, H, D]; q and k are [B, H, S, D] views of that layout or not, either works.
  const auto rows = q.size(2);
  auto [q_rotated, k_rotated] = rope(q.transpose(1, 2), k.transpose(1, 2), cos.narrow(0, 0, rows), sin.narrow(0, 0, rows));
  return flash_attention(q_rotated.transpose(1, 2), k_rotated.transpose(1, 2), v);
}

torch::Tensor flash_attention_rope_qkv(const torch::Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                                       const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(qkv.dim() == 4 && q_heads > 0 && kv_heads > 0 && qkv.size(2) == q_heads + 2 * kv_heads,
              "tt::ops::flash_attention_rope_qkv: qkv must be [B, S, q_heads + 2 kv_heads, D] = [B, S, ",
              q_heads + 2 * kv_heads, ", D], got ", qkv.sizes(), " with q_heads ", q_heads, " and kv_heads ", kv_heads);
  const auto parts = qkv.split({q_heads, kv_heads, kv_heads}, 2);
  const auto q = parts[0].transpose(1, 2), k = parts[1].transpose(1, 2), v = parts[2].transpose(1, 2);
  check_inputs(q, k, v);
  check_rope_tables(q, cos, sin);
#ifdef TT_HAVE_GPU_KERNELS
  if (rope_in_kernels(q))
    return FlashAttentionQkvFunction::apply(qkv, q_heads, kv_heads, kernel_table(cos, q.size(2)),
                                            kernel_table(sin, q.size(2)));
#endif
  return flash_attention_rope(q, k, v, cos, sin);
}

}  // namespace tt::ops

namespace tt::ops::detail {

kernels::FlashStrides flash_strides(const torch::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

namespace {

// The fields both directions' blocks have: the forward's tensors, the log-sum-exp and the shape.
template <typename Params>
Params with_forward_tensors(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& out, const torch::Tensor& lse) {
  Params params{};
  params.q = q.data_ptr();
  params.k = k.data_ptr();
  params.v = v.data_ptr();
  params.out = out.data_ptr();
  params.q_strides = flash_strides(q);
  params.k_strides = flash_strides(k);
  params.v_strides = flash_strides(v);
  params.out_strides = flash_strides(out);
  params.lse = lse.data_ptr<float>();
  params.batch = q.size(0);
  params.q_heads = q.size(1);
  params.kv_heads = k.size(1);
  params.seq = q.size(2);
  params.head_dim = q.size(3);
  return params;
}

}  // namespace

kernels::FlashForwardParams flash_forward_params(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                                 const torch::Tensor& out, const torch::Tensor& lse) {
  return with_forward_tensors<kernels::FlashForwardParams>(q, k, v, out, lse);
}

kernels::FlashBackwardParams flash_backward_params(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, const torch::Tensor& out,
                                                   const torch::Tensor& lse, const torch::Tensor& grad_out,
                                                   const torch::Tensor& grad_q, const torch::Tensor& grad_k,
                                                   const torch::Tensor& grad_v, const torch::Tensor& delta,
                                                   const torch::Tensor& grad_q_accum,
                                                   const torch::Tensor& grad_q_turns) {
  auto params = with_forward_tensors<kernels::FlashBackwardParams>(q, k, v, out, lse);
  params.grad_out = grad_out.data_ptr();
  params.grad_q = grad_q.data_ptr();
  params.grad_k = grad_k.data_ptr();
  params.grad_v = grad_v.data_ptr();
  params.grad_out_strides = flash_strides(grad_out);
  params.grad_q_strides = flash_strides(grad_q);
  params.grad_k_strides = flash_strides(grad_k);
  params.grad_v_strides = flash_strides(grad_v);
  params.delta = delta.data_ptr<float>();
  params.grad_q_accum = grad_q_accum.defined() ? grad_q_accum.data_ptr<float>() : nullptr;
  params.grad_q_turns = grad_q_turns.defined() ? grad_q_turns.data_ptr<int>() : nullptr;
  return params;
}

}  // namespace tt::ops::detail
