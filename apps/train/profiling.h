// Built-in profiling (`--profile`): records a few extra training steps with LibTorch's Kineto profiler,
// writes a Chrome/Perfetto trace and turns the recorded events into a hotspot table for the result JSON.
// Vendor-neutral: on ROCm builds of LibTorch, Kineto's "CUDA" activity records HIP kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

namespace tt {

constexpr int64_t kDefaultProfileSteps = 3;

struct ProfileRequest {
  int64_t steps = 0;       // 0: no profiling
  std::string trace_path;  // Chrome/Perfetto trace JSON written by the profiler
};

// "<dir>/<stem>.trace.json" for a result file "<dir>/<stem>.json".
std::string trace_path_for(const std::string& result_path);

// One recorded event, reduced to what the hotspot table needs.
enum class EventKind { kKernel, kMemcpy, kMemset, kCpuOp };
struct ProfiledEvent {
  std::string name;
  EventKind kind = EventKind::kCpuOp;
  uint64_t thread = 0;  // CPU ops: the recording thread (for self time)
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// The result JSON's "profile" object. On a GPU (gpu = true) the hotspots are the GPU activities
// (kernels, memcpy, memset) by device time, and their totals add up to total_gpu_us. On the CPU there
// are no kernels: the hotspots are ATen ops by self time (time not spent in nested ops), which add up to
// the time covered by top-level ops. Sorted by total time, all entries (the printout shows the top ones).
// The collectives' kernels (NCCL's, and RCCL's, which keep NCCL's names) are rows of kind "comm", and their
// time per step is communication_ms_per_step.
nlohmann::json summarize_profile(const std::vector<ProfiledEvent>& events, int64_t steps, bool gpu);

// The printed table: a header line and the `top` largest hotspots.
std::string format_hotspots(const nlohmann::json& profile, size_t top = 15);

// Runs `run_step` request.steps times under the Kineto profiler (CPU activity, plus GPU activity when
// device is a GPU), synchronising before and after so the window holds exactly those steps. Saves the
// trace to request.trace_path, prints the hotspot table on `log` and returns summarize_profile()'s JSON
// with "trace" and "window_ms" added. Throws std::runtime_error when the trace cannot be written.
nlohmann::json record_profile(const torch::Device& device, const ProfileRequest& request,
                              const std::function<void()>& run_step, std::ostream& log);

}  // namespace tt
