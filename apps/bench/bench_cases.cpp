#include "apps/bench/bench_cases.h"

#include <algorithm>
#include <optional>

#include "kernels/ops/adamw.h"
#include "kernels/ops/flash_attention.h"
#include "kernels/ops/rope.h"
#include "models/precision.h"
#include "models/reference.h"
#include "models/stage.h"
#include "models/transformer.h"

namespace tt::bench {
namespace {

int64_t element_size(torch::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// Forward and backward with autograd; torch::autograd::grad does not accumulate into .grad, so repeats
// do not add an accumulation kernel.
void forward_backward(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& inputs,
                      const std::vector<torch::Tensor>& grad_outputs) {
  torch::autograd::grad(outputs, inputs, grad_outputs);
}

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// The incoming gradient in the dtype `forward` produces (LibTorch ops may promote bf16 activations
// times an fp32 weight to fp32), so the timed backward contains no cast. If `forward` throws, the
// timing reports the implementation as unsupported; the gradient is then never used.
torch::Tensor gradient_for(const std::function<torch::Tensor()>& forward, const torch::Tensor& grad) {
  try {
    torch::NoGradGuard no_grad;
    return grad.to(forward().scalar_type());
  } catch (const std::exception&) {
    return grad;
  }
}

// A family's catalog entries in benchmark order: the last (most optimised) first, since speedups are
// measured against it; entries that share a function (two RoPE kinds that differ only in where their
// tables come from) once, under the first one's name.
template <class Entry>
std::vector<const Entry*> bench_order(const std::vector<Entry>& entries) {
  std::vector<const Entry*> out;
  for (const auto& e : entries) {
    const bool seen = std::any_of(out.begin(), out.end(), [&](const Entry* o) { return o->fn == e.fn; });
    if (!seen) out.push_back(&e);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// Adds each entry to the forward and the forward+backward case. `outputs(fn, use_leaves)` runs the entry
// on the plain inputs or on the leaf copies; `inputs` are the leaves, `grads` the incoming gradients.
template <class Entry, class Outputs>
std::vector<Case> entry_cases(const std::vector<Entry>& entries, int64_t forward_bytes, int64_t both_bytes,
                              const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& grads,
                              Outputs outputs, double forward_flops = 0) {
  // The backward of attention does 5 of the forward's matmul-sized products to the forward's 2.
  Case forward{"forward", forward_bytes, {}, forward_flops}, both{"forward+backward", both_bytes, {}, 3.5 * forward_flops};
  for (const Entry* e : bench_order(entries)) {
    auto fn = e->fn;
    forward.implementations.push_back({e->name, [=] { outputs(fn, false); }});
    std::vector<torch::Tensor> typed;
    for (size_t i = 0; i < grads.size(); ++i)
      typed.push_back(gradient_for([=] { return outputs(fn, false).at(i); }, grads[i]));
    both.implementations.push_back({e->name, [=] { forward_backward(outputs(fn, true), inputs, typed); }});
  }
  return {forward, both};
}

// The token embedding: the fp32 table looked up at a step's ids (uniform over the vocabulary). Bytes: the
// forward reads the looked-up rows and writes them; the backward reads their gradient and writes the table's
// gradient whole (every row, zeros included, however it is done).
std::vector<Case> embedding_cases(const BenchShape& shape, torch::ScalarType, c10::Device device) {
  const int64_t rows = shape.tokens(), vocab = shape.vocab, hidden = shape.hidden;
  auto options = torch::TensorOptions().device(device);
  auto weight = 0.02 * torch::randn({vocab, hidden}, options);
  auto ids = torch::randint(vocab, {rows}, options.dtype(torch::kInt64));
  auto weight_g = leaf(weight);
  const int64_t forward_bytes = 2 * rows * hidden * 4 + rows * 8;
  const int64_t both_bytes = forward_bytes + rows * hidden * 4 + vocab * hidden * 4;
  return entry_cases(
      embedding_implementations(), forward_bytes, both_bytes, {weight_g}, {torch::randn({rows, hidden}, options)},
      [=](EmbeddingFn fn, bool leaves) { return std::vector<torch::Tensor>{fn(leaves ? weight_g : weight, ids)}; });
}

constexpr double kNormEps = 1e-6;

// The residual add and the RMSNorm after it, as a pre-norm block runs them. In bf16 the residual stream is
// fp32, the sub-layer's output (delta) bf16, and the normalised output feeds a bf16 GEMM: under autocast,
// as in training, so every kind pays for the casts it needs (the unfused kinds' outputs are cast to bf16
// here, where autocast would cast them at the GEMM).
std::vector<Case> norm_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t rows = shape.tokens(), hidden = shape.hidden, es = element_size(dtype);
  const bool mixed = dtype != torch::kFloat32;
  const int64_t rs = mixed ? 4 : es;  // the residual stream's element size
  auto options = torch::TensorOptions().device(device);
  auto residual = torch::randn({rows, hidden}, options);
  auto delta = torch::randn({rows, hidden}, options).to(dtype);
  auto weight = torch::ones({hidden}, options);
  auto rg = leaf(residual), dg = leaf(delta), wg = leaf(weight);
  // Forward reads residual and delta, writes residual + delta and the output.
  const int64_t forward_bytes = rows * hidden * (2 * rs + 2 * es) + hidden * 4;
  // Backward reads the saved sum, grad_y and the residual gradient; writes grad_residual, grad_delta, grad_weight.
  const int64_t both_bytes = forward_bytes + rows * hidden * (3 * rs + es + (mixed ? es : 0)) + 2 * hidden * 4;
  const Precision precision = mixed ? Precision::kBf16 : Precision::kFp32;
  return entry_cases(norm_implementations(), forward_bytes, both_bytes, {rg, dg, wg},
                     {torch::randn({rows, hidden}, options), torch::randn({rows, hidden}, options).to(dtype)},
                     [=](NormFn fn, bool leaves) {
                       AutocastScope autocast(device, precision);
                       auto out = fn(leaves ? rg : residual, leaves ? dg : delta, leaves ? wg : weight, kNormEps);
                       return std::vector<torch::Tensor>{out.residual, out.normalized.to(dtype)};
                     });
}

std::vector<Case> rope_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t es = element_size(dtype), head_dim = shape.head_dim();
  auto options = torch::TensorOptions().device(device);
  auto q = torch::randn({shape.batch, shape.seq, shape.heads, head_dim}, options).to(dtype);
  auto k = torch::randn({shape.batch, shape.seq, shape.kv_heads, head_dim}, options).to(dtype);
  auto [cos, sin] = reference::rope_tables(shape.seq, head_dim, 10000.0, 0, device);
  auto qg = leaf(q), kg = leaf(k);
  const int64_t forward_bytes = 2 * (q.numel() + k.numel()) * es + 2 * cos.numel() * 4;
  return entry_cases(rope_implementations(), forward_bytes, 2 * forward_bytes, {qg, kg},
                     {torch::randn_like(q), torch::randn_like(k)}, [=](RopeFn fn, bool leaves) {
                       auto [q_out, k_out] = fn(leaves ? qg : q, leaves ? kg : k, cos, sin);
                       return std::vector<torch::Tensor>{q_out, k_out};
                     });
}

// RoPE on the fused QKV projection's output, as v2..v4 use it: the split views and rope (whose backward
// concatenates dq, dk, dv) against the kernel that reads qkv and writes its gradient whole.
std::vector<Case> rope_qkv_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t es = element_size(dtype), head_dim = shape.head_dim();
  const int64_t heads = shape.heads + 2 * shape.kv_heads;
  auto options = torch::TensorOptions().device(device);
  auto qkv = torch::randn({shape.batch, shape.seq, heads, head_dim}, options).to(dtype);
  auto [cos, sin] = reference::rope_tables(shape.seq, head_dim, 10000.0, 0, device);
  auto qkv_g = leaf(qkv);
  const int64_t qk = shape.batch * shape.seq * (shape.heads + shape.kv_heads) * head_dim;
  const int64_t v = shape.batch * shape.seq * shape.kv_heads * head_dim;
  // Forward reads and writes q and k; the backward reads dq, dk, dv and writes all of the qkv gradient.
  const int64_t forward_bytes = 2 * qk * es + 2 * cos.numel() * 4;
  const int64_t both_bytes = forward_bytes + 2 * (qk + v) * es + 2 * cos.numel() * 4;
  // One entry per distinct fused-QKV function, named after the catalog entry that has it first.
  std::vector<Implementation<RopeKind, RopeQkvFn>> entries;
  for (const auto& e : rope_implementations()) entries.push_back({e.kind, e.name, e.description, e.on_qkv});
  return entry_cases(entries, forward_bytes, both_bytes, {qkv_g},
                     {torch::randn({shape.batch, shape.seq, shape.heads, head_dim}, options),
                      torch::randn({shape.batch, shape.seq, shape.kv_heads, head_dim}, options),
                      torch::randn({shape.batch, shape.seq, shape.kv_heads, head_dim}, options)},
                     [=](RopeQkvFn fn, bool leaves) {
                       auto out = fn(leaves ? qkv_g : qkv, shape.heads, shape.kv_heads, cos, sin);
                       return std::vector<torch::Tensor>{out.q, out.k, out.v};
                     });
}

std::vector<Case> attention_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t es = element_size(dtype), head_dim = shape.head_dim();
  auto options = torch::TensorOptions().device(device);
  auto q = torch::randn({shape.batch, shape.heads, shape.seq, head_dim}, options).to(dtype);
  auto k = torch::randn({shape.batch, shape.kv_heads, shape.seq, head_dim}, options).to(dtype);
  auto v = torch::randn_like(k);
  auto qg = leaf(q), kg = leaf(k), vg = leaf(v);
  const int64_t forward_bytes = 2 * q.numel() * es + 2 * k.numel() * es;
  // Causal work counted once: QK^T and PV over the lower triangle, 2 * 2 * B * H * S^2 * D / 2.
  const double flops = 2.0 * static_cast<double>(shape.batch * shape.heads) * static_cast<double>(shape.seq) *
                       static_cast<double>(shape.seq) * static_cast<double>(head_dim);
  // The explicit-mask reference materialises B x H x S x S scores; at long sequences that is gigabytes.
  std::vector<AttentionImplementation> entries;
  // The register generation only where it runs (bf16/fp16 on an NVIDIA GPU).
  const bool registers =
      device.is_cuda() && ops::flash_attention_kernel_applies(ops::FlashAttentionKernel::kRegisterTiles, dtype, head_dim);
  for (const auto& e : attention_implementations())
    if (e.kind != AttentionKind::kOurFlashWhereFaster &&
        (e.kind != AttentionKind::kMaskedMatmul || shape.seq <= 1024) &&
        (e.kind != AttentionKind::kOurFlashRegisterTiles || registers))
      entries.push_back(e);
  return entry_cases(entries, forward_bytes, 3 * forward_bytes, {qg, kg, vg}, {torch::randn_like(q)},
                     [=](AttentionFn fn, bool leaves) {
                       return std::vector<torch::Tensor>{fn(leaves ? qg : q, leaves ? kg : k, leaves ? vg : v)};
                     },
                     flops);
}

// RoPE and attention from the fused QKV projection's output, as v4 needs them: RoPE inside our attention's load
// against a RoPE pass (tt::ops::rope_qkv) before our attention or before SDPA (cuDNN in bf16). The rule by which
// v4 picks one of them per shape is read off these rows.
std::vector<Case> attention_rope_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t es = element_size(dtype), head_dim = shape.head_dim();
  auto options = torch::TensorOptions().device(device);
  auto qkv = torch::randn({shape.batch, shape.seq, shape.heads + 2 * shape.kv_heads, head_dim}, options).to(dtype);
  auto [cos, sin] = reference::rope_tables(shape.seq, head_dim, 10000.0, 0, device);
  auto qkv_g = leaf(qkv);
  const int64_t heads = shape.heads, kv_heads = shape.kv_heads;
  using Attend = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&);
  // Attention over a rotated q, k: rope_qkv first, then `attend` on [B, H, S, D] views.
  auto after_rope_qkv = [=](const torch::Tensor& x, Attend attend) {
    auto r = ops::rope_qkv(x, heads, kv_heads, cos, sin);
    return attend(r.q.transpose(1, 2), r.k.transpose(1, 2), r.v.transpose(1, 2));
  };
  auto in_the_load = [=](const torch::Tensor& x) {
    auto parts = x.split({heads, kv_heads, kv_heads}, 2);
    return ops::flash_attention_rope(parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2), cos,
                                     sin);
  };
  const Attend ours = ops::flash_attention;
  const Attend sdpa = implementation(AttentionKind::kSdpa).fn;
  const int64_t q_elements = shape.batch * heads * shape.seq * head_dim;
  const int64_t forward_bytes = (qkv.numel() + q_elements) * es;
  const double flops = 2.0 * static_cast<double>(shape.batch * heads) * static_cast<double>(shape.seq) *
                       static_cast<double>(shape.seq) * static_cast<double>(head_dim);
  auto grad = torch::randn({shape.batch, heads, shape.seq, head_dim}, options).to(dtype);
  const std::vector<std::pair<std::string, std::function<torch::Tensor(const torch::Tensor&)>>> entries = {
      {"tt::ops::flash_attention_rope (RoPE in the load)", in_the_load},
      {"tt::ops::rope_qkv + tt::ops::flash_attention", [=](const torch::Tensor& x) { return after_rope_qkv(x, ours); }},
      {"tt::ops::rope_qkv + at::scaled_dot_product_attention",
       [=](const torch::Tensor& x) { return after_rope_qkv(x, sdpa); }},
  };
  Case forward{"forward", forward_bytes, {}, flops}, both{"forward+backward", 3 * forward_bytes, {}, 3.5 * flops};
  for (const auto& [name, fn] : entries) {
    forward.implementations.push_back({name, [=] { fn(qkv); }});
    both.implementations.push_back({name, [=] { forward_backward({fn(qkv_g)}, {qkv_g}, {grad}); }});
  }
  return {forward, both};
}

std::vector<Case> activation_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t rows = shape.tokens(), ffn = shape.ffn, es = element_size(dtype);
  auto options = torch::TensorOptions().device(device);
  auto gate_up = torch::randn({rows, 2 * ffn}, options).to(dtype);
  auto gate_up_g = leaf(gate_up);
  // Backward reads grad_out and gate_up and writes grad_gate_up.
  return entry_cases(activation_implementations(), 3 * rows * ffn * es, 8 * rows * ffn * es, {gate_up_g},
                     {torch::randn({rows, ffn}, options).to(dtype)}, [=](ActivationFn fn, bool leaves) {
                       return std::vector<torch::Tensor>{fn(leaves ? gate_up_g : gate_up)};
                     });
}

// The output head's GEMM and the loss, from the final norm's output, with the head's weight in the run's dtype
// (v4's bf16 copy). Bytes count the logits once written and read, as the unfused kinds move them; the fused
// kind's chunks stay smaller than that.
std::vector<Case> loss_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t rows = shape.tokens(), vocab = shape.vocab, hidden_dim = shape.hidden, es = element_size(dtype);
  auto options = torch::TensorOptions().device(device);
  auto hidden = torch::randn({rows, hidden_dim}, options).to(dtype);
  auto weight = (0.02 * torch::randn({vocab, hidden_dim}, options)).to(dtype);
  auto labels = torch::randint(vocab, {rows}, options.dtype(torch::kInt64));
  auto hidden_g = leaf(hidden), weight_g = leaf(weight);
  const int64_t forward_bytes = (rows + vocab) * hidden_dim * es + 2 * rows * vocab * es + rows * 8;
  // Backward reads the logits again, writes their gradient, and two GEMMs read it.
  const int64_t both_bytes = forward_bytes + 4 * rows * vocab * es + 2 * (rows + vocab) * hidden_dim * es;
  return entry_cases(loss_implementations(), forward_bytes, both_bytes, {hidden_g, weight_g},
                     {torch::ones({}, options)}, [=](LossFn fn, bool leaves) {
                       return std::vector<torch::Tensor>{fn(leaves ? hidden_g : hidden, leaves ? weight_g : weight,
                                                            labels, reference::kIgnoreIndex)};
                     });
}

// Not a catalog family: the measurement behind the SDPA entry's fp32 rule (models/stage.cpp). With grouped
// K/V heads in fp32, SDPA's flash and memory-efficient kernels refuse enable_gqa and LibTorch falls back to
// its math path; v2 instead repeats K/V to all heads and keeps the memory-efficient kernel.
std::vector<Case> sdpa_gqa_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t es = element_size(dtype), head_dim = shape.head_dim(), n_rep = shape.heads / shape.kv_heads;
  auto options = torch::TensorOptions().device(device);
  auto q = torch::randn({shape.batch, shape.heads, shape.seq, head_dim}, options).to(dtype);
  auto k = torch::randn({shape.batch, shape.kv_heads, shape.seq, head_dim}, options).to(dtype);
  auto v = torch::randn_like(k);
  auto grad = torch::randn_like(q);
  auto qg = leaf(q), kg = leaf(k), vg = leaf(v);
  auto expanded = [n_rep](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return at::scaled_dot_product_attention(q, k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1), {}, 0.0,
                                            true);
  };
  auto native = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, /*enable_gqa=*/true);
  };
  Case forward{"forward", 2 * q.numel() * es + 2 * k.numel() * es, {}};
  forward.implementations = {
      {"expanded K/V (v2)", [=] { expanded(q, k, v); }},
      {"enable_gqa", [=] { native(q, k, v); }},
  };
  Case both{"forward+backward", 3 * forward.bytes, {}};
  both.implementations = {
      {"expanded K/V (v2)", [=] { forward_backward({expanded(qg, kg, vg)}, {qg, kg, vg}, {grad}); }},
      {"enable_gqa", [=] { forward_backward({native(qg, kg, vg)}, {qg, kg, vg}, {grad}); }},
  };
  return {forward, both};
}

// Not a catalog family either: the optimizer step over a model's parameters (the shape's model, built
// with v3's fused projections), our multi-tensor kernel against LibTorch's fused one as v2/v3 call it.
// fp32: fp32 gradients for both. bf16: as the stages train in bf16: ours reads the bf16 gradients of the
// compute copies and writes the copies, at::_fused_adamw_ reads the fp32 gradients autocast produces.
std::vector<Case> adamw_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  ModelConfig m;
  m.vocab_size = shape.vocab;
  m.hidden_dim = shape.hidden;
  m.n_heads = shape.heads;
  m.n_kv_heads = shape.kv_heads;
  m.intermediate_dim = shape.ffn;
  m.n_layers = 1;  // the step is per parameter: one layer plus the embedding, scaled by the byte count
  Transformer model(m, stages::v3_custom());
  model->to(device);
  const bool copies = dtype == torch::kBFloat16;
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps, copy_list, copy_grads;
  int64_t numel = 0;
  for (const auto& p : model->parameters()) {
    params.push_back(p.detach().clone());
    grads.push_back(torch::randn_like(params.back()));
    exp_avgs.push_back(torch::zeros_like(params.back()));
    exp_avg_sqs.push_back(torch::zeros_like(params.back()));
    steps.push_back(torch::zeros({}, params.back().options()));
    copy_list.push_back(params.back().to(torch::kBFloat16));
    copy_grads.push_back(grads.back().to(torch::kBFloat16));
    numel += p.numel();
  }
  auto state = ops::adamw_state(device);
  std::vector<ops::AdamWParam> list;
  for (size_t i = 0; i < params.size(); ++i)
    list.push_back({params[i], copies ? torch::Tensor() : grads[i], copies ? copy_list[i] : torch::Tensor(),
                    copies ? copy_grads[i] : torch::Tensor(), exp_avgs[i], exp_avg_sqs[i]});
  // Read master, gradient and both moments, write master and moments (+ copies: read a bf16 gradient
  // instead of an fp32 one, write the copy).
  const int64_t bytes = numel * (copies ? 4 * 3 + 2 + 4 * 3 + 2 : 4 * 4 + 4 * 3);
  Case step{"optimizer step", bytes, {}};
  step.implementations = {
      {"tt::ops::adamw_step", [=] { ops::adamw_step(list, state, {}); }},
      {"at::_fused_adamw_",
       [=] {
         at::_foreach_add_(steps, 1.0);
         at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, 3e-4, 0.9, 0.999, 0.01, 1e-8, false, false,
                           std::nullopt, std::nullopt);
       }},
  };
  return {step};
}

}  // namespace

const std::vector<std::pair<std::string, CaseBuilder>>& builders() {
  static const std::vector<std::pair<std::string, CaseBuilder>> list = {
      {"embedding", embedding_cases}, {"rms_norm", norm_cases},       {"rope", rope_cases},
      {"rope_qkv", rope_qkv_cases},   {"attention", attention_cases}, {"attention_rope", attention_rope_cases},
      {"swiglu", activation_cases},   {"cross_entropy", loss_cases},  {"sdpa_gqa", sdpa_gqa_cases},
      {"adamw", adamw_cases},
  };
  return list;
}


}  // namespace tt::bench
