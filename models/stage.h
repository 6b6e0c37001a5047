// A stage is a choice of component implementations for the one shared model skeleton and training loop.
// The executables differ only in the StageSpec they pass.
//
// This file pair is also the catalog: for every component, the list of implementations a stage can
// choose from, each with its name, what it is, and the function that runs it. The model's components
// (models/components.cpp) call through these entries, the result files describe a stage with them, and
// the kernel benchmark (apps/bench/) times every entry of a family side by side. Adding an
// implementation (a new kernel, say) means one enum value, one catalog entry, and choosing it in a stage.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "kernels/ops/rope.h"
#include "models/config.h"

namespace tt {

// ---- What each component can be ---------------------------------------------------------------------

// kOurKernel: ATen's lookup, our backward kernel (tt::ops::embedding: every row written once, no zeroing pass).
enum class EmbeddingKind { kReference, kOurKernel };
// kOurFusedResidual: our kernel with the residual add before the norm done inside it (tt::ops::add_rms_norm).
enum class NormKind { kReference, kAtenFused, kOurKernel, kOurFusedResidual };
// kOurKernelOnQkv: our kernel reading the fused QKV projection's output directly (tt::ops::rope_qkv).
// kInOurAttention: up to kRopeInAttentionMaxSeq positions, no RoPE pass and no attention kind of the stage's:
// our flash attention rotates q and k as it loads them (tt::ops::flash_attention_rope), reading them unrotated
// from the fused QKV projection's output. Longer sequences, and decoding with a KV cache, rotate with
// tt::ops::rope_qkv and run the stage's attention kind. Needs the fused QKV projection.
enum class RopeKind { kReference, kCachedTables, kOurKernel, kOurKernelOnQkv, kInOurAttention };
// kOurFlashSharedMemory: the first generation of our kernel, kept for kernel_bench's step-by-step table; no stage
// uses it. kOurFlashRegisterTiles: the second generation (mma.sync, bf16/fp16 on NVIDIA), which kOurFlash runs
// except where the Hopper generation applies; kept selectable for kernel_bench's table.
// kOurFlashWhereFaster (v4's rule): our kernel where kernel_bench measured it at least as fast as cuDNN
// (our_attention_measured_faster), SDPA everywhere else.
enum class AttentionKind {
  kMaskedMatmul,
  kSdpa,
  kOurFlash,
  kOurFlashSharedMemory,
  kOurFlashRegisterTiles,
  kOurFlashWhereFaster
};
enum class ActivationKind { kReference, kOurKernel, kOurKernelStrided };
// kOurFusedLinear: the output head's GEMM and our loss kernels chunk by chunk (tt::ops::linear_cross_entropy).
enum class LossKind { kReference, kOurKernel, kOurFusedLinear };
enum class OptimizerKind { kTorchAdamW, kAtenFusedAdamW, kOurAdamW };

// How a training step runs: op by op through LibTorch's autograd, or captured once as a CUDA/HIP graph
// (forward, backward and optimizer) and replayed every step. The step runners are in apps/train/.
enum class StepKind { kEager, kGraph };

// The performance-debugging exercise (README, "The debugging exercise"): v3_custom with one mistake put
// back, each measured against v3 as shipped (kNone). Where each acts: kMissingInit in Trainer (no
// init_weights), kNonContiguous and kNaiveSwiglu in the MLP, kNoSyncTiming in the result file (the host
// clock the loop reads anyway, reported beside the device events).
enum class Pitfall { kNone, kMissingInit, kNonContiguous, kNoSyncTiming, kNaiveSwiglu };

struct StageSpec {
  std::string name;
  std::string summary;
  EmbeddingKind embedding = EmbeddingKind::kReference;
  NormKind norm = NormKind::kReference;
  RopeKind rope = RopeKind::kReference;
  AttentionKind attention = AttentionKind::kMaskedMatmul;
  bool fused_qkv = false;      // one [q; k; v] weight and one GEMM
  bool fused_gate_up = false;  // one [gate; up] weight and one GEMM
  ActivationKind activation = ActivationKind::kReference;
  LossKind loss = LossKind::kReference;
  OptimizerKind optimizer = OptimizerKind::kTorchAdamW;
  // bf16 runs: the forward reads bf16 copies of the weights that the optimizer writes in its update pass,
  // instead of autocast casting the fp32 weights every step (TransformerImpl::enable_compute_copies).
  // Needs the optimizer that writes them, kOurAdamW.
  bool compute_copies = false;
  StepKind step = StepKind::kEager;
  // Set only for a run of the debugging exercise (--pitfall, kNone included); result files then say which.
  std::optional<Pitfall> pitfall;
};

namespace stages {
StageSpec v1_baseline();
StageSpec v2_fused();
StageSpec v3_custom();
StageSpec v4_ultra();
std::vector<StageSpec> all();
// nullptr when no stage has that name.
const StageSpec* find(const std::string& name);
std::string names();  // "v1_baseline, v2_fused, v3_custom, v4_ultra"

// The pitfalls of the debugging exercise, in the exercise's order, with their --pitfall names and what
// each teaches.
struct PitfallEntry {
  Pitfall kind;
  const char* name;    // "missing-init", ...; "none" for v3 as shipped
  const char* lesson;  // one line, for result files and the summary table
};
const std::vector<PitfallEntry>& pitfalls();
const PitfallEntry& pitfall(Pitfall kind);
// Throws ConfigError naming the value and the allowed names.
Pitfall parse_pitfall(const std::string& name);
std::string pitfall_names();  // "missing-init, non-contiguous, no-sync-timing, naive-swiglu, none"
// `spec` with the pitfall put back; throws ConfigError for a stage other than v3_custom (the exercise's
// stage: the pitfalls swap components that only it has).
StageSpec with_pitfall(StageSpec spec, Pitfall kind);
}  // namespace stages

// ---- The catalog ----------------------------------------------------------------------------------------

// RopeKind::kInOurAttention's rule, read off kernel_bench attention_rope (H100, bf16, forward and forward +
// backward): RoPE in our kernel's load beats tt::ops::rope_qkv + SDPA (cuDNN) at 128 positions (workshop:
// forward 12.6 against 14.1 us) and loses at 512 and beyond (medium, forward + backward 204 against about 145 us;
// long-context 1,032 against 433 us); lengths in between were not measured.
constexpr int64_t kRopeInAttentionMaxSeq = 128;

// Whether a stage's attention over `seq` positions (no KV cache) is our kernel with RoPE in its load.
bool rope_in_our_attention(RopeKind rope, int64_t seq);

// AttentionKind::kOurFlashWhereFaster's rule, read off kernel_bench attention_rope (tt::ops::rope_qkv, then ours
// or SDPA (cuDNN); H200, 2026-11-28, after the softmax backward's mask became two instances; bf16 and fp16, forward
// + backward, two runs in one call). Ours was at least as fast as cuDNN at every length measured, at head dim 64
// (medium's 512 positions 108.9-110.8 against 141.0-230.8 us, 1024 280.2-281.9 against 311.6-413.5, 2048 422.6-423.5
// against 454.4-457.4, long-context's 4096 381.8-382.9 against 421.0-422.8) and 128 (1024 210.2-211.9 against
// 262.6-314.8, 2048 337.1-339.6 against 385.4-388.9, 4096 1,052.2-1,084.8 against 1,100.1-1,104.7 in bf16 and
// 1,103.0-1,108.4 against 1,111.6-1,135.8 in fp16: level there, the margin inside ours' spread). So ours wherever the
// Hopper generation runs. (At 4096 and head dim 128 the attention alone, on contiguous inputs, was level with cuDNN in
// the same call; by our reading, rope_qkv's strided outputs slow cuDNN more than ours.) Not measured: the lengths
// between those, beyond 4096 positions, and 129 to 511 at head dim 64 and to 1023 at 128 (an H100 measured head dim
// 64 at 256, attention alone: ours 92.3-93.4 against 104.1-143.1 us). Before that change the rule had stopped at 1024
// positions but for head dim 64 from 4096 (cuDNN faster at d64-s2048 and d128-s2048).

// Whether our flash attention takes the place of SDPA for these inputs under kOurFlashWhereFaster: wherever our
// default runs the Hopper generation (ops::flash_attention_default_is_hopper: bf16/fp16, head dim 64 or 128, an
// sm_90 GPU with an sm_90a build, from 129 positions).
bool our_attention_measured_faster(torch::ScalarType dtype, int64_t head_dim, int64_t seq, const torch::Device& device);

// The shapes an attention call sees in a run, for describing which backend it picks.
struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

// The residual add and the norm after it, as pre-norm blocks use them: residual_out = residual + delta
// (residual itself when delta is undefined), normalized = norm(residual_out) [..., H] with weight [H]. Under
// autocast, kinds may return `normalized` already in the autocast dtype (the next GEMM's input).
struct ResidualNorm {
  torch::Tensor residual;
  torch::Tensor normalized;
};
// The token embedding: the table [V, H] looked up at ids [...] -> [..., H], differentiable in the table.
using EmbeddingFn = torch::Tensor (*)(const torch::Tensor& weight, const torch::Tensor& ids);
using NormFn = ResidualNorm (*)(const torch::Tensor& residual, const torch::Tensor& delta, const torch::Tensor& weight,
                                double eps);
// q [B, S, Hq, D], k [B, S, Hkv, D], cos/sin fp32 [S, D / 2] -> rotated (q, k).
using RopeFn = std::pair<torch::Tensor, torch::Tensor> (*)(const torch::Tensor& q, const torch::Tensor& k,
                                                           const torch::Tensor& cos, const torch::Tensor& sin);
// The same on a fused QKV projection's output viewed as qkv [B, S, Hq + 2 Hkv, D] -> rotated q and k, and v.
using RopeQkvFn = ops::RotatedQkv (*)(const torch::Tensor& qkv, int64_t n_heads, int64_t n_kv_heads,
                                      const torch::Tensor& cos, const torch::Tensor& sin);
// Causal attention, q [B, Hq, S, D], k/v [B, Hkv, S, D] with Hq a multiple of Hkv -> [B, Hq, S, D].
using AttentionFn = torch::Tensor (*)(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);
// The attention library's own choices for a run (result file fields), {} when there are none.
using AttentionBackendFn = nlohmann::json (*)(const AttentionShape& shape, Precision precision,
                                              const torch::Device& device);
// The fused [gate | up] projection output [..., 2F] -> silu(gate) * up [..., F].
using ActivationFn = torch::Tensor (*)(const torch::Tensor& gate_up);
// The output head and the loss: hidden [N, H], the head's weight [V, H], labels [N] -> mean cross-entropy of
// the logits hidden @ weight^T over the rows whose label is not ignore_index.
using LossFn = torch::Tensor (*)(const torch::Tensor& hidden, const torch::Tensor& head_weight,
                                 const torch::Tensor& labels, int64_t ignore_index);

template <class Kind, class Fn>
struct Implementation {
  Kind kind;
  const char* name;         // short, for tables and the benchmark: "tt::ops::rms_norm"
  const char* description;  // what it is, for result files
  Fn fn;
};

// fn rotates q and k from separate projections; on_qkv reads them from the fused projection's output.
struct RopeImplementation : Implementation<RopeKind, RopeFn> {
  RopeQkvFn on_qkv;
};

struct AttentionImplementation : Implementation<AttentionKind, AttentionFn> {
  AttentionBackendFn backend;
};

// The optimizer is built by the training layer (apps/train/optimizer.h); the catalog only names it.
struct OptimizerImplementation {
  OptimizerKind kind;
  const char* name;
  const char* description;
};

const std::vector<Implementation<EmbeddingKind, EmbeddingFn>>& embedding_implementations();
const std::vector<Implementation<NormKind, NormFn>>& norm_implementations();
const std::vector<RopeImplementation>& rope_implementations();
const std::vector<AttentionImplementation>& attention_implementations();
const std::vector<Implementation<ActivationKind, ActivationFn>>& activation_implementations();
const std::vector<Implementation<LossKind, LossFn>>& loss_implementations();
const std::vector<OptimizerImplementation>& optimizer_implementations();

// The catalog entry of a kind.
const Implementation<EmbeddingKind, EmbeddingFn>& implementation(EmbeddingKind kind);
const Implementation<NormKind, NormFn>& implementation(NormKind kind);
const RopeImplementation& implementation(RopeKind kind);
const AttentionImplementation& implementation(AttentionKind kind);
const Implementation<ActivationKind, ActivationFn>& implementation(ActivationKind kind);
const Implementation<LossKind, LossFn>& implementation(LossKind kind);
const OptimizerImplementation& implementation(OptimizerKind kind);

// The stage as result files record it: name, summary and what each component is.
nlohmann::json to_json(const StageSpec& spec);
const char* to_string(StepKind kind);

}  // namespace tt
