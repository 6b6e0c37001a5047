// Where a step's GPU time goes: each profiled kernel's name mapped to what it does (GEMM, attention, ...),
// and a result's GPU time per step split by those categories, with the host gap (step time - GPU busy)
// beside it. The name rule lives here and nowhere else; compare's table, chart and report.html use it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tt {

enum class KernelCategory {
  kGemm,
  kAttention,
  kNormalisation,
  kActivation,
  kRope,
  kLoss,
  kOptimizer,
  kCopyFill,
  kCommunication,
  kOther,
};
constexpr size_t kKernelCategoryCount = static_cast<size_t>(KernelCategory::kOther) + 1;

// Every category, in the order the table and the stacked bars show them.
const std::vector<KernelCategory>& kernel_categories();
const char* to_string(KernelCategory category);

// The category of one profiled GPU activity: `kind` is the hotspot's kind ("kernel", "memcpy", "memset",
// "comm"; apps/train/profiling.h), `name` the kernel's name as Kineto records it (CUDA or HIP, demangled
// or not). Names the rule does not know are kOther.
KernelCategory categorize_kernel(const std::string& name, const std::string& kind = "kernel");

// A kernel's name shortened for a line of text: without "void ", the return type's and ATen's namespaces
// ("at::native::", "(anonymous namespace)::", "std::"), cut to `width` characters.
std::string short_kernel_name(const std::string& name, size_t width = 110);

// One result's GPU time per step by category, from its "profile" object (GPU runs only).
struct TimeBreakdown {
  double ms_per_step[kKernelCategoryCount] = {};
  // GPU activity per step: the union of the activities' intervals (profile.gpu_busy_per_step_ms; results
  // written before it existed: the categories' sum).
  double gpu_busy_ms = 0;
  // The categories' sum less gpu_busy_ms: kernel time that ran beside other kernels, on a second stream (our
  // optimizer overlapped with the backward). The categories add up to gpu_busy_ms + concurrent_ms.
  double concurrent_ms = 0;
  double step_ms = 0;      // the measured steps' median (summary.step_ms.median)
  // step_ms - gpu_busy_ms, at least 0: time the GPU waited for the host (launches, syncs), or partly that the
  // measured steps ran slower than the profiled ones (docs/running.md#where-the-time-goes).
  double host_gap_ms = 0;
  // Kernels in kOther by GPU time, largest first: name and ms per step (the rule's blind spots, shown).
  std::vector<std::pair<std::string, double>> other_kernels;
};

// Throws std::runtime_error naming the field when the result has no GPU profile ("profile" missing, or a
// CPU profile, which has no GPU time). `has_gpu_profile` tells first.
bool has_gpu_profile(const nlohmann::json& result);
TimeBreakdown time_breakdown(const nlohmann::json& result);

}  // namespace tt
