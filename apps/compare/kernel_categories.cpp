#include "apps/compare/kernel_categories.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <stdexcept>

namespace tt {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool has(const std::string& haystack, const char* needle) { return haystack.find(needle) != std::string::npos; }

bool has_any(const std::string& haystack, std::initializer_list<const char*> needles) {
  return std::any_of(needles.begin(), needles.end(), [&](const char* n) { return has(haystack, n); });
}

// ATen's warp softmax serves softmax and log-softmax alike; its fifth template argument (is_log_softmax)
// tells them apart: softmax_warp_forward<float, float, float, 8, true, false>. In this model log-softmax
// is the loss (cross-entropy), softmax the attention's.
bool is_log_softmax_warp(const std::string& name) {
  const size_t open = name.find('<', name.find("softmax_warp_"));
  if (open == std::string::npos) return false;
  size_t start = open + 1;
  for (int arg = 0; arg < 4; ++arg) {
    start = name.find(',', start);
    if (start == std::string::npos) return false;
    ++start;
  }
  while (start < name.size() && name[start] == ' ') ++start;
  return name.compare(start, 4, "true") == 0;
}

}  // namespace

const std::vector<KernelCategory>& kernel_categories() {
  static const std::vector<KernelCategory> all = {KernelCategory::kGemm,          KernelCategory::kAttention,
                                                  KernelCategory::kNormalisation, KernelCategory::kActivation,
                                                  KernelCategory::kRope,          KernelCategory::kLoss,
                                                  KernelCategory::kOptimizer,     KernelCategory::kCopyFill,
                                                  KernelCategory::kCommunication, KernelCategory::kOther};
  return all;
}

const char* to_string(KernelCategory category) {
  switch (category) {
    case KernelCategory::kGemm: return "GEMM";
    case KernelCategory::kAttention: return "attention";
    case KernelCategory::kNormalisation: return "normalisation";
    case KernelCategory::kActivation: return "activation";
    case KernelCategory::kRope: return "RoPE";
    case KernelCategory::kLoss: return "loss";
    case KernelCategory::kOptimizer: return "optimizer";
    case KernelCategory::kCopyFill: return "copies and fills";
    case KernelCategory::kCommunication: return "communication";
    case KernelCategory::kOther: return "other";
  }
  return "other";
}

// The order of the tests matters where names overlap: attention before GEMM (memory-efficient attention's
// kernels are fmha_cutlass*, cuDNN's carry "gemm"-like tile names), loss before attention (log-softmax is
// the loss's), optimizer before normalisation (gradient clipping's LpNorm is the optimizer's).
KernelCategory categorize_kernel(const std::string& raw_name, const std::string& kind) {
  const std::string name = lower(raw_name);
  // NCCL's kernels (ncclDevKernel_*, ncclKernel_* before 2.19); RCCL keeps the names.
  if (kind == "comm" || name.rfind("nccl", 0) == 0 || name.rfind("rccl", 0) == 0) return KernelCategory::kCommunication;
  if (kind == "memcpy" || kind == "memset") return KernelCategory::kCopyFill;
  // Ours (cross_entropy_*_kernel), ATen's nll_loss and log-softmax (cunn_SoftMaxForward<..., LogSoftMax...>).
  if (has_any(name, {"cross_entropy", "crossentropy", "nll_loss", "logsoftmax", "log_softmax"}) ||
      (has(name, "softmax_warp_") && is_log_softmax_warp(name)))
    return KernelCategory::kLoss;
  // Ours (flash_*_kernel), ATen's flash and memory-efficient kernels (pytorch_flash::flash_fwd_kernel,
  // fmha_cutlassF_*), cuDNN's (cudnn_generated_fort_native_sdpa_*), CK's (ck_tile FmhaFwdKernel), and the
  // softmax of attention written out (v1's math path).
  if (has_any(name, {"flash", "fmha", "sdpa", "attention", "attn", "softmax"})) return KernelCategory::kAttention;
  // ATen's fused AdamW (FusedAdamMathFunctor), ours (adamw_*_kernel), gradient clipping's norms
  // (multi_tensor_apply_kernel<..., LpNormFunctor<...>>, lpnorm_cleanup).
  if (has_any(name, {"adam", "lpnorm"})) return KernelCategory::kOptimizer;
  // Ours (rms_norm_*_kernel), ATen's fused RMS/layer norm (vectorized_layer_norm_kernel,
  // GammaBetaBackwardCUDAKernel, layer_norm_grad_input_kernel).
  if (has_any(name, {"rms_norm", "rmsnorm", "layer_norm", "layernorm", "gammabetabackward"}))
    return KernelCategory::kNormalisation;
  // Ours (rope_kernel, rope_qkv_*); "rope" alone would also match "property".
  if (name.rfind("rope", 0) == 0 || has_any(name, {"rope_", "_rope", " rope", "::rope", "rotary"}))
    return KernelCategory::kRope;
  // Ours (swiglu_*_kernel, naive_swiglu_*), ATen's silu_kernel / silu_backward_kernel, and GELU.
  if (has_any(name, {"swiglu", "silu", "gelu"})) return KernelCategory::kActivation;
  // cuBLAS on Hopper (nvjet_*, sm90_xmma_gemm_*), older cuBLAS (ampere_sgemm_*, sm80_xmma_gemm_*, gemv*,
  // splitKreduce), CUTLASS (cutlass::Kernel2<cutlass_80_tensorop_*gemm*>), rocBLAS/hipBLASLt's Tensile
  // (Cijk_Ailk_Bljk_*), CK (ck::kernel_gemm_xdl_*), our naive_matmul_kernel.
  if (name.rfind("nvjet", 0) == 0 ||
      has_any(name, {"cijk_", "gemm", "gemv", "xmma", "cutlass", "splitkreduce", "matmul", "wgmma"}))
    return KernelCategory::kGemm;
  // ATen's copies and fills (direct_copy_kernel_cuda, FillFunctor, CatArrayBatchedCopy, bfloat16_copy_kernel).
  if (has_any(name, {"copy", "fill", "memcpy", "memset"})) return KernelCategory::kCopyFill;
  return KernelCategory::kOther;
}

std::string short_kernel_name(const std::string& name, size_t width) {
  std::string out = name.rfind("void ", 0) == 0 ? name.substr(5) : name;
  for (const std::string noise : {"at::native::", "(anonymous namespace)::", "std::"})
    for (size_t at = out.find(noise); at != std::string::npos; at = out.find(noise, at)) out.erase(at, noise.size());
  return out.size() <= width ? out : out.substr(0, width - 3) + "...";
}

bool has_gpu_profile(const nlohmann::json& result) {
  if (!result.contains("profile") || !result["profile"].is_object()) return false;
  const auto& p = result["profile"];
  return p.value("basis", std::string()) == "gpu_time" && p.contains("hotspots") && p["hotspots"].is_array() &&
         p.contains("steps") && p["steps"].is_number() && p["steps"].get<double>() > 0;
}

TimeBreakdown time_breakdown(const nlohmann::json& result) {
  if (!has_gpu_profile(result))
    throw std::runtime_error(
        "time_breakdown: the result has no GPU profile (field \"profile\" with basis \"gpu_time\", hotspots and "
        "steps >= 1; a run with --profile on a GPU writes it)");
  const auto& profile = result["profile"];
  const double steps = profile["steps"].get<double>();
  TimeBreakdown out;
  std::map<std::string, double> other;
  for (const auto& h : profile["hotspots"]) {
    const std::string name = h.value("name", std::string());
    const double ms = h.value("total_us", 0.0) / 1e3 / steps;
    const KernelCategory category = categorize_kernel(name, h.value("kind", std::string("kernel")));
    out.ms_per_step[static_cast<size_t>(category)] += ms;
    out.gpu_busy_ms += ms;
    if (category == KernelCategory::kOther) other[name] += ms;
  }
  out.other_kernels.assign(other.begin(), other.end());
  std::stable_sort(out.other_kernels.begin(), out.other_kernels.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  if (profile.contains("gpu_busy_per_step_ms") && profile["gpu_busy_per_step_ms"].is_number()) {
    const double kernels_ms = out.gpu_busy_ms;
    out.gpu_busy_ms = std::min(kernels_ms, profile["gpu_busy_per_step_ms"].get<double>());
    out.concurrent_ms = kernels_ms - out.gpu_busy_ms;
  }
  out.step_ms = result.at("summary").at("step_ms").at("median").get<double>();
  out.host_gap_ms = std::max(0.0, out.step_ms - out.gpu_busy_ms);
  return out;
}

}  // namespace tt
