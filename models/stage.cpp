#include "models/stage.h"

#include <ATen/autocast_mode.h>

#include "kernels/ops/cross_entropy.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/flash_attention.h"
#include "kernels/ops/rms_norm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "models/precision.h"
#include "models/reference.h"

namespace tt {
namespace stages {

// The workshop's v1, op by op: everything in plain LibTorch operations.
StageSpec v1_baseline() {
  StageSpec spec;
  spec.name = "v1_baseline";
  spec.summary =
      "plain LibTorch ops: separate projections, explicit-mask attention, unfused RMSNorm, torch::optim::AdamW";
  return spec;
}

// What the framework already offers, before anyone writes a kernel.
StageSpec v2_fused() {
  StageSpec spec = v1_baseline();
  spec.name = "v2_fused";
  spec.summary = "fused LibTorch ops: QKV and gate/up GEMMs, SDPA, cached RoPE tables, fused RMSNorm, fused AdamW";
  spec.fused_qkv = true;
  spec.fused_gate_up = true;
  spec.attention = AttentionKind::kSdpa;
  spec.rope = RopeKind::kCachedTables;
  spec.norm = NormKind::kAtenFused;
  spec.optimizer = OptimizerKind::kAtenFusedAdamW;
  return spec;
}

// v2 plus our own kernels, each with a real backward.
StageSpec v3_custom() {
  StageSpec spec = v2_fused();
  spec.name = "v3_custom";
  spec.summary =
      "v2 plus custom kernels: RMSNorm, RoPE, flash attention, SwiGLU and cross-entropy, forward and backward, and "
      "the token embedding's backward";
  spec.embedding = EmbeddingKind::kOurKernel;
  spec.norm = NormKind::kOurKernel;
  spec.attention = AttentionKind::kOurFlash;
  spec.rope = RopeKind::kOurKernel;
  spec.activation = ActivationKind::kOurKernel;
  spec.loss = LossKind::kOurKernel;
  return spec;
}

// v3 with the host out of the step: the whole step as one graph, our multi-tensor AdamW, and (bf16) the
// weight copies written by the optimizer instead of autocast's casts. Each residual add runs inside the
// RMSNorm kernel after it, which also writes the next GEMM's bf16 input: per layer that removes the two add
// kernels and two casts of the forward, and the adds and casts of their gradients in the backward. Up to
// kRopeInAttentionMaxSeq positions RoPE has no pass of its own: our flash attention rotates q and k as it loads
// them from the QKV projection's output, and its backward rotates dq and dk back. Beyond, tt::ops::rope_qkv
// rotates them and the attention is ours where kernel_bench measured it at least as fast as cuDNN (wherever the
// Hopper kernels run), else cuDNN's through SDPA (both rules' comments in stage.h). The loss takes large logits in
// chunks (fused_linear_loss), so they never exist whole.
StageSpec v4_ultra() {
  StageSpec spec = v3_custom();
  spec.name = "v4_ultra";
  spec.summary =
      "v3 as one CUDA/HIP graph per step, with our multi-tensor AdamW writing bf16 weight copies, residual adds fused "
      "into our RMSNorm kernel, the loss in chunks of the logits, and up to 128 positions our flash attention with "
      "RoPE in its load (beyond: tt::ops::rope_qkv, then ours where measured faster, else SDPA)";
  spec.norm = NormKind::kOurFusedResidual;
  spec.rope = RopeKind::kInOurAttention;
  spec.loss = LossKind::kOurFusedLinear;
  spec.attention = AttentionKind::kOurFlashWhereFaster;
  spec.optimizer = OptimizerKind::kOurAdamW;
  spec.compute_copies = true;
  spec.step = StepKind::kGraph;
  return spec;
}

std::vector<StageSpec> all() { return {v1_baseline(), v2_fused(), v3_custom(), v4_ultra()}; }

const StageSpec* find(const std::string& name) {
  static const std::vector<StageSpec> specs = all();
  for (const auto& s : specs)
    if (s.name == name) return &s;
  return nullptr;
}

std::string names() {
  std::string out;
  for (const auto& s : all()) out += (out.empty() ? "" : ", ") + s.name;
  return out;
}

const std::vector<PitfallEntry>& pitfalls() {
  static const std::vector<PitfallEntry> list = {
      {Pitfall::kMissingInit, "missing-init",
       "initialise the weights: LibTorch's defaults (embedding N(0, 1), tied to the head) make the initial loss "
       "explode"},
      {Pitfall::kNonContiguous, "non-contiguous",
       "mind the layout: a kernel's general strided path on a transposed tensor is far slower than one "
       ".contiguous() copy and the fast path"},
      {Pitfall::kNoSyncTiming, "no-sync-timing",
       "time the device, not the host: without a sync a host clock measures kernel launches, not the work"},
      {Pitfall::kNaiveSwiglu, "naive-swiglu",
       "know when not to write a kernel: a naive kernel doing the gate/up GEMMs itself loses to the vendor BLAS"},
      {Pitfall::kNone, "none", "v3 as shipped: every pitfall fixed"},
  };
  return list;
}

const PitfallEntry& pitfall(Pitfall kind) {
  for (const auto& p : pitfalls())
    if (p.kind == kind) return p;
  TORCH_CHECK(false, "no pitfall of kind ", static_cast<int>(kind));
}

std::string pitfall_names() {
  std::string out;
  for (const auto& p : pitfalls()) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

Pitfall parse_pitfall(const std::string& name) {
  for (const auto& p : pitfalls())
    if (name == p.name) return p.kind;
  throw ConfigError("--pitfall " + name + " is not allowed: it must be one of " + pitfall_names());
}

StageSpec with_pitfall(StageSpec spec, Pitfall kind) {
  const std::string exercise_stage = v3_custom().name;
  if (spec.name != exercise_stage)
    throw ConfigError(std::string("--pitfall ") + pitfall(kind).name + " is not allowed for " + spec.name +
                      ": the debugging exercise's pitfalls are put back into " + exercise_stage);
  spec.pitfall = kind;
  if (kind == Pitfall::kNonContiguous) spec.activation = ActivationKind::kOurKernelStrided;
  if (kind != Pitfall::kNone) spec.summary += std::string("; with the pitfall ") + pitfall(kind).name + " put back";
  return spec;
}

}  // namespace stages

namespace {

// ---- Functions the catalog points at that are not an op of their own ------------------------------------

torch::Tensor aten_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return at::rms_norm(x, {weight.size(0)}, weight, eps);
}

// The norm kinds that run the residual add as an op of its own.
template <torch::Tensor (*Norm)(const torch::Tensor&, const torch::Tensor&, double)>
ResidualNorm add_then_norm(const torch::Tensor& residual, const torch::Tensor& delta, const torch::Tensor& weight,
                           double eps) {
  auto h = delta.defined() ? residual + delta : residual;
  return {h, Norm(h, weight, eps)};
}

// The dtype a GEMM reading `t` runs in: autocast's for an fp32 tensor while autocast is on, else t's own.
torch::ScalarType gemm_dtype(const torch::Tensor& t) {
  const auto device_type = t.device().type();
  return at::autocast::is_autocast_enabled(device_type) && t.scalar_type() == torch::kFloat32
             ? at::autocast::get_autocast_dtype(device_type)
             : t.scalar_type();
}

// The fused kind writes the normalised output in the dtype the next GEMM reads: autocast's, when autocast
// would cast the fp32 residual stream there anyway (the rounding is the same as that cast's).
ResidualNorm fused_add_norm(const torch::Tensor& residual, const torch::Tensor& delta, const torch::Tensor& weight,
                            double eps) {
  auto out = ops::add_rms_norm(residual, delta, weight, eps, gemm_dtype(residual));
  return {out.residual, out.normalized};
}

// Both elementwise RoPE kinds rotate the same way; they differ in where the tables come from
// (RotaryImpl rebuilds them every call for kReference).
std::pair<torch::Tensor, torch::Tensor> elementwise_rope(const torch::Tensor& q, const torch::Tensor& k,
                                                         const torch::Tensor& cos, const torch::Tensor& sin) {
  return {reference::apply_rope(q, cos, sin), reference::apply_rope(k, cos, sin)};
}

// The kinds without a fused-QKV form: split the projection's output into views, rotate q and k. The
// split's backward concatenates the three gradients.
template <RopeFn Rotate>
ops::RotatedQkv split_then_rotate(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads,
                                  const torch::Tensor& cos, const torch::Tensor& sin) {
  auto parts = qkv.split_with_sizes({n_heads, n_kv_heads, n_kv_heads}, 2);
  auto [q, k] = Rotate(parts[0], parts[1], cos, sin);
  return {q, k, parts[2]};
}

torch::Tensor masked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return reference::masked_attention(q, k, v);
}

torch::Tensor flash_attention_shared_memory_tiles(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return ops::flash_attention(q, k, v, ops::FlashAttentionKernel::kSharedMemoryTiles);
}

torch::Tensor flash_attention_register_tiles(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return ops::flash_attention(q, k, v, ops::FlashAttentionKernel::kRegisterTiles);
}

nlohmann::json no_backend_choice(const AttentionShape&, Precision, const torch::Device&) {
  return nlohmann::json::object();
}

// On Hopper, fp32 with grouped heads makes SDPA fall back to its math path (flash and memory-efficient
// kernels refuse enable_gqa in fp32). Repeating K/V to all heads costs one copy of each but keeps the
// memory-efficient kernel: at the workshop shapes on an H200, forward + backward 177 us against 842 us
// with enable_gqa (kernel_bench, sdpa_gqa). In bf16, native GQA (cuDNN) is the faster of the two
// (120 us against 268 us at the medium shapes), so bf16 keeps it.
bool sdpa_expands_kv(torch::ScalarType dtype, int64_t heads, int64_t kv_heads, bool on_gpu) {
  return dtype == torch::kFloat32 && heads != kv_heads && on_gpu;
}

torch::Tensor sdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  if (sdpa_expands_kv(q.scalar_type(), heads, kv_heads, q.is_cuda())) {
    const int64_t n_rep = heads / kv_heads;
    return at::scaled_dot_product_attention(q, k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1), {}, 0.0,
                                            /*is_causal=*/true);
  }
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                          /*enable_gqa=*/heads != kv_heads);
}

const char* sdp_backend_name(int64_t choice) {
  switch (choice) {
    case 0: return "math";
    case 1: return "flash_attention";
    case 2: return "efficient_attention";
    case 3: return "cudnn_attention";
    case 4: return "overrideable";
    default: return "error (no backend accepts these inputs)";
  }
}

// Which SDPA kernel LibTorch picks for the run's shapes and dtype, asked with the inputs sdpa() passes.
nlohmann::json sdpa_backend(const AttentionShape& s, Precision precision, const torch::Device& device) {
  const auto dtype = compute_dtype(precision);
  const bool expand = sdpa_expands_kv(dtype, s.heads, s.kv_heads, device.is_cuda());
  const int64_t kv_heads = expand ? s.heads : s.kv_heads;
  int64_t choice = 0;  // the CPU runs the math formulation
  if (device.is_cuda()) {
    auto options = torch::TensorOptions().dtype(dtype).device(device);
    auto q = torch::empty({s.batch, s.heads, s.seq, s.head_dim}, options);
    auto k = torch::empty({s.batch, kv_heads, s.seq, s.head_dim}, options);
    choice = at::_fused_sdp_choice(q, k, k, {}, 0.0, true, std::nullopt, kv_heads != s.heads);
  }
  return {{"sdpa_backend", sdp_backend_name(choice)},
          {"sdpa_gqa",
           expand ? "K/V expanded to all heads (fp32)" : (s.kv_heads != s.heads ? "native enable_gqa" : "no GQA")}};
}

torch::Tensor our_flash_where_faster(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return our_attention_measured_faster(q.scalar_type(), q.size(3), q.size(2), q.device())
             ? ops::flash_attention(q, k, v)
             : sdpa(q, k, v);
}

nlohmann::json our_flash_where_faster_backend(const AttentionShape& s, Precision precision,
                                              const torch::Device& device) {
  if (our_attention_measured_faster(compute_dtype(precision), s.head_dim, s.seq, device))
    return {{"attention_kernel", "tt::ops::flash_attention (Hopper generation: TMA and wgmma)"}};
  return sdpa_backend(s, precision, device);
}

// The loss kinds that take the logits: the head's GEMM (under autocast, as any projection), then the loss.
template <torch::Tensor (*Loss)(const torch::Tensor&, const torch::Tensor&, int64_t)>
torch::Tensor head_then_loss(const torch::Tensor& hidden, const torch::Tensor& head_weight, const torch::Tensor& labels,
                             int64_t ignore_index) {
  return Loss(torch::nn::functional::linear(hidden, head_weight), labels, ignore_index);
}

// Logits beyond this size are taken in chunks of at most this many bytes. Below it, chunking saves no memory
// and costs kernels (the gradients' scaling, the count of valid rows, the sum of row losses: six per step),
// so the op is the head's GEMM and our loss kernels as in v3. Medium config: 2,048 rows x 32,000 bf16 logits
// = 125 MiB, two chunks; workshop and long-context (vocab 1,000): one GEMM.
constexpr int64_t kLogitsChunkBytes = int64_t{64} << 20;

torch::Tensor fused_linear_loss(const torch::Tensor& hidden, const torch::Tensor& head_weight,
                                const torch::Tensor& labels, int64_t ignore_index) {
  const auto dtype = gemm_dtype(hidden);
  const int64_t row_bytes = head_weight.size(0) * static_cast<int64_t>(c10::elementSize(dtype));
  if (hidden.size(0) * row_bytes <= kLogitsChunkBytes)
    return head_then_loss<ops::cross_entropy>(hidden, head_weight, labels, ignore_index);
  return ops::linear_cross_entropy(hidden.to(dtype), head_weight.to(dtype), labels, ignore_index,
                                   std::max<int64_t>(1, kLogitsChunkBytes / row_bytes));
}

// torch::embedding is what torch::nn::Embedding's forward runs (its backward: ATen's embedding_dense_backward).
torch::Tensor reference_embedding(const torch::Tensor& weight, const torch::Tensor& ids) {
  return torch::embedding(weight, ids);
}

torch::Tensor reference_swiglu(const torch::Tensor& gate_up) {
  const int64_t f = gate_up.size(-1) / 2;
  return reference::swiglu(gate_up.narrow(-1, 0, f), gate_up.narrow(-1, f, f));
}

template <class Entry, class Kind>
const Entry& find_entry(const std::vector<Entry>& entries, Kind kind, const char* family) {
  for (const auto& e : entries)
    if (e.kind == kind) return e;
  TORCH_CHECK(false, "the catalog has no ", family, " implementation of kind ", static_cast<int>(kind));
}

}  // namespace

// ---- The catalog: every implementation of every component ---------------------------------------------

const std::vector<Implementation<EmbeddingKind, EmbeddingFn>>& embedding_implementations() {
  static const std::vector<Implementation<EmbeddingKind, EmbeddingFn>> list = {
      {EmbeddingKind::kReference, "reference",
       "torch::embedding (backward: ATen's embedding_dense_backward, the gradient zeroed first)", reference_embedding},
      {EmbeddingKind::kOurKernel, "tt::ops::embedding",
       "ATen's lookup; our backward kernel writes every row of the gradient once, in a fixed order "
       "(tt::ops::embedding)",
       ops::embedding},
  };
  return list;
}

const std::vector<Implementation<NormKind, NormFn>>& norm_implementations() {
  static const std::vector<Implementation<NormKind, NormFn>> list = {
      {NormKind::kReference, "reference", "residual add, then reference RMSNorm (pow, mean, rsqrt, mul)",
       add_then_norm<reference::rms_norm>},
      {NormKind::kAtenFused, "at::rms_norm", "residual add, then at::rms_norm (fused)", add_then_norm<aten_rms_norm>},
      {NormKind::kOurKernel, "tt::ops::rms_norm", "residual add, then our kernel (tt::ops::rms_norm)",
       add_then_norm<ops::rms_norm>},
      {NormKind::kOurFusedResidual, "tt::ops::add_rms_norm",
       "our kernel with the residual add fused in (tt::ops::add_rms_norm), writing the next GEMM's input dtype",
       fused_add_norm},
  };
  return list;
}

const std::vector<RopeImplementation>& rope_implementations() {
  static const std::vector<RopeImplementation> list = {
      {{RopeKind::kReference, "reference", "reference (tables per forward, elementwise)", elementwise_rope},
       split_then_rotate<elementwise_rope>},
      {{RopeKind::kCachedTables, "cached tables", "cached tables, elementwise", elementwise_rope},
       split_then_rotate<elementwise_rope>},
      {{RopeKind::kOurKernel, "tt::ops::rope", "our kernel (tt::ops::rope)", ops::rope}, split_then_rotate<ops::rope>},
      {{RopeKind::kOurKernelOnQkv, "tt::ops::rope_qkv",
        "our kernel reading q and k from the fused QKV projection's output (tt::ops::rope_qkv); its backward writes "
        "the projection's gradient [dq | dk | dv] in the same pass",
        ops::rope},
       ops::rope_qkv},
      {{RopeKind::kInOurAttention, "in tt::ops::flash_attention_rope",
        "up to 128 positions no RoPE pass: our flash attention rotates q and k as it loads them from the fused QKV "
        "projection's output and writes its gradient whole (tt::ops::flash_attention_rope_qkv); beyond, and when "
        "decoding with a KV cache, "
        "tt::ops::rope_qkv before the stage's attention",
        ops::rope},
       ops::rope_qkv},
  };
  return list;
}

const std::vector<AttentionImplementation>& attention_implementations() {
  static const std::vector<AttentionImplementation> list = {
      {{AttentionKind::kMaskedMatmul, "masked matmul", "explicit mask, matmul/softmax/matmul, repeat_interleave",
        masked_attention},
       no_backend_choice},
      {{AttentionKind::kSdpa, "at::scaled_dot_product_attention", "at::scaled_dot_product_attention (is_causal)", sdpa},
       sdpa_backend},
      // Before kOurFlash: kernel_bench takes a family's last entry as its most optimised.
      {{AttentionKind::kOurFlashSharedMemory, "tt::ops::flash_attention (shared-memory tiles)",
        "the first generation of our kernel: score tiles through shared memory in fp32 (kept for kernel_bench)",
        flash_attention_shared_memory_tiles},
       no_backend_choice},
      {{AttentionKind::kOurFlashRegisterTiles, "tt::ops::flash_attention (register tiles)",
        "the second generation of our kernel: register tiles (mma.sync), forward and backward, bf16/fp16 on NVIDIA "
        "(kept for kernel_bench)",
        flash_attention_register_tiles},
       no_backend_choice},
      // Not in kernel_bench's rows: it runs one of the two entries around it.
      {{AttentionKind::kOurFlashWhereFaster, "tt::ops::flash_attention where faster, else SDPA",
        "our flash attention where kernel_bench measured it at least as fast as cuDNN (wherever the Hopper "
        "kernels run: bf16/fp16, head dim 64 and 128, from 129 positions), else at::scaled_dot_product_attention",
        our_flash_where_faster},
       our_flash_where_faster_backend},
      {{AttentionKind::kOurFlash, "tt::ops::flash_attention",
        "our flash attention kernel (tt::ops::flash_attention): on Hopper TMA/wgmma kernels (bf16/fp16, head_dim "
        "64/128), else register tiles (mma.sync) for bf16/fp16 on NVIDIA; online softmax, native GQA, deterministic "
        "backward",
        ops::flash_attention},
       no_backend_choice},
  };
  return list;
}

const std::vector<Implementation<ActivationKind, ActivationFn>>& activation_implementations() {
  static const std::vector<Implementation<ActivationKind, ActivationFn>> list = {
      {ActivationKind::kReference, "reference", "reference (silu * up)", reference_swiglu},
      // Before our fast path: kernel_bench takes a family's last entry as its most optimised.
      {ActivationKind::kOurKernelStrided, "tt::ops::swiglu_strided",
       "our kernel's general strided path, reading the input in place (tt::ops::swiglu_strided)", ops::swiglu_strided},
      {ActivationKind::kOurKernel, "tt::ops::swiglu", "our kernel (tt::ops::swiglu)", ops::swiglu},
  };
  return list;
}

const std::vector<Implementation<LossKind, LossFn>>& loss_implementations() {
  static const std::vector<Implementation<LossKind, LossFn>> list = {
      {LossKind::kReference, "reference", "head GEMM, then reference cross_entropy on the full logits",
       head_then_loss<reference::cross_entropy>},
      {LossKind::kOurKernel, "tt::ops::cross_entropy",
       "head GEMM, then our fused softmax cross-entropy kernel (tt::ops::cross_entropy)",
       head_then_loss<ops::cross_entropy>},
      {LossKind::kOurFusedLinear, "tt::ops::linear_cross_entropy",
       "head GEMM and our cross-entropy kernels in chunks of rows, never the full logits "
       "(tt::ops::linear_cross_entropy; one GEMM and our kernel when the logits fit in 64 MiB)",
       fused_linear_loss},
  };
  return list;
}

const std::vector<OptimizerImplementation>& optimizer_implementations() {
  static const std::vector<OptimizerImplementation> list = {
      {OptimizerKind::kTorchAdamW, "torch::optim::AdamW", "torch::optim::AdamW"},
      {OptimizerKind::kAtenFusedAdamW, "at::_fused_adamw_", "at::_fused_adamw_"},
      {OptimizerKind::kOurAdamW, "tt::ops::adamw_step",
       "our multi-tensor AdamW kernel (tt::ops::adamw_step): step counter, clipping and bias correction on the "
       "device"},
  };
  return list;
}

const Implementation<EmbeddingKind, EmbeddingFn>& implementation(EmbeddingKind kind) {
  return find_entry(embedding_implementations(), kind, "embedding");
}
const Implementation<NormKind, NormFn>& implementation(NormKind kind) {
  return find_entry(norm_implementations(), kind, "norm");
}
bool rope_in_our_attention(RopeKind rope, int64_t seq) {
  return rope == RopeKind::kInOurAttention && seq <= kRopeInAttentionMaxSeq;
}

bool our_attention_measured_faster(torch::ScalarType dtype, int64_t head_dim, int64_t seq,
                                   const torch::Device& device) {
  return device.is_cuda() && ops::flash_attention_default_is_hopper(dtype, head_dim, seq);
}

const RopeImplementation& implementation(RopeKind kind) {
  return find_entry(rope_implementations(), kind, "rope");
}
const AttentionImplementation& implementation(AttentionKind kind) {
  return find_entry(attention_implementations(), kind, "attention");
}
const Implementation<ActivationKind, ActivationFn>& implementation(ActivationKind kind) {
  return find_entry(activation_implementations(), kind, "activation");
}
const Implementation<LossKind, LossFn>& implementation(LossKind kind) {
  return find_entry(loss_implementations(), kind, "loss");
}
const OptimizerImplementation& implementation(OptimizerKind kind) {
  return find_entry(optimizer_implementations(), kind, "optimizer");
}

nlohmann::json to_json(const StageSpec& s) {
  nlohmann::json out = {
      {"name", s.name},
      {"summary", s.summary},
      {"components",
       {{"embedding", implementation(s.embedding).description},
        {"norm", implementation(s.norm).description},
        {"rope", implementation(s.rope).description},
        {"attention", implementation(s.attention).description},
        {"qkv_projection", s.fused_qkv ? "fused (one GEMM)" : "separate q, k, v"},
        {"gate_up_projection", s.pitfall == Pitfall::kNaiveSwiglu
                                   ? "inside our naive SwiGLU kernel (tt::ops::naive_swiglu), one thread per output"
                               : s.pitfall == Pitfall::kNonContiguous
                                   ? "fused (one GEMM), its output left transposed: [rows, 2F] with column stride rows"
                               : s.fused_gate_up ? "fused (one GEMM)"
                                                 : "separate gate, up"},
        {"activation", implementation(s.activation).description},
        {"loss", implementation(s.loss).description},
        {"optimizer", implementation(s.optimizer).description},
        {"weights", s.compute_copies ? "fp32 masters; in bf16 runs the forward reads bf16 copies that the "
                                       "optimizer writes"
                                     : "fp32; in bf16 runs autocast casts them in every forward"},
        {"step", to_string(s.step)}}}};
  if (s.pitfall)
    out["pitfall"] = {{"name", stages::pitfall(*s.pitfall).name}, {"lesson", stages::pitfall(*s.pitfall).lesson}};
  return out;
}

const char* to_string(StepKind kind) {
  switch (kind) {
    case StepKind::kEager: return "eager: op by op through LibTorch's autograd";
    case StepKind::kGraph:
      return "one CUDA/HIP graph: forward, backward and optimizer captured once, replayed every step";
  }
  return "?";
}

}  // namespace tt
