#include "apps/train/profiling.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <stdexcept>

#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/profiler/stubs/base.h>

#include "apps/results/text.h"
#include "apps/train/device.h"

namespace tt {
namespace {

constexpr size_t kMaxNameColumn = 96;

const char* kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::kKernel: return "kernel";
    case EventKind::kMemcpy: return "memcpy";
    case EventKind::kMemset: return "memset";
    case EventKind::kCpuOp: return "cpu_op";
  }
  return "?";
}

// A collective's kernel: NCCL names them ncclDevKernel_* (ncclKernel_* before 2.19); RCCL keeps the names.
bool is_collective(const std::pair<std::string, EventKind>& key) {
  return key.second == EventKind::kKernel && key.first.rfind("nccl", 0) == 0;
}

struct Totals {
  int64_t calls = 0;
  double total_ns = 0;
};
using TotalsByName = std::map<std::pair<std::string, EventKind>, Totals>;

// Self time of nested CPU ops: on each thread, an op's time minus the time of the ops it encloses, so the
// table's rows add up to the time covered by top-level ops instead of counting aten::linear and the
// aten::mm inside it twice.
void add_cpu_self_times(const std::vector<ProfiledEvent>& events, TotalsByName& totals) {
  std::map<uint64_t, std::vector<const ProfiledEvent*>> by_thread;
  for (const auto& e : events)
    if (e.kind == EventKind::kCpuOp && e.end_ns >= e.start_ns) by_thread[e.thread].push_back(&e);
  for (auto& [thread, list] : by_thread) {
    std::sort(list.begin(), list.end(), [](const ProfiledEvent* a, const ProfiledEvent* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
    });
    std::vector<double> self(list.size());
    std::vector<size_t> open;  // indices of the enclosing ops
    for (size_t i = 0; i < list.size(); ++i) {
      const ProfiledEvent& e = *list[i];
      while (!open.empty() && list[open.back()]->end_ns <= e.start_ns) open.pop_back();
      self[i] = static_cast<double>(e.end_ns - e.start_ns);
      if (!open.empty()) {
        const ProfiledEvent& parent = *list[open.back()];
        self[open.back()] -= static_cast<double>(std::min(e.end_ns, parent.end_ns) - e.start_ns);
      }
      open.push_back(i);
    }
    for (size_t i = 0; i < list.size(); ++i) {
      auto& t = totals[{list[i]->name, EventKind::kCpuOp}];
      t.calls += 1;
      t.total_ns += std::max(0.0, self[i]);
    }
  }
}

std::string shorten(const std::string& name) {
  return name.size() <= kMaxNameColumn ? name : name.substr(0, kMaxNameColumn - 3) + "...";
}

std::vector<ProfiledEvent> convert(const std::vector<torch::autograd::profiler::KinetoEvent>& kineto_events) {
  using libkineto::ActivityType;
  std::vector<ProfiledEvent> events;
  events.reserve(kineto_events.size());
  for (const auto& k : kineto_events) {
    EventKind kind;
    switch (static_cast<ActivityType>(k.activityType())) {
      case ActivityType::CONCURRENT_KERNEL: kind = EventKind::kKernel; break;
      case ActivityType::GPU_MEMCPY: kind = EventKind::kMemcpy; break;
      case ActivityType::GPU_MEMSET: kind = EventKind::kMemset; break;
      case ActivityType::CPU_OP: kind = EventKind::kCpuOp; break;
      default: continue;  // runtime calls, user annotations, ...: in the trace, not in the table
    }
    events.push_back(
        {k.name(), kind, k.startThreadId(), static_cast<int64_t>(k.startNs()), static_cast<int64_t>(k.endNs())});
  }
  return events;
}

}  // namespace

std::string trace_path_for(const std::string& result_path) {
  std::filesystem::path p(result_path);
  p.replace_extension();
  return p.string() + ".trace.json";
}

nlohmann::json summarize_profile(const std::vector<ProfiledEvent>& events, int64_t steps, bool gpu) {
  if (steps < 1) throw std::invalid_argument("summarize_profile: steps must be >= 1, got " + std::to_string(steps));
  TotalsByName totals;
  int64_t kernels = 0;
  if (gpu) {
    for (const auto& e : events) {
      if (e.kind == EventKind::kCpuOp || e.end_ns < e.start_ns) continue;
      auto& t = totals[{e.name, e.kind}];
      t.calls += 1;
      t.total_ns += static_cast<double>(e.end_ns - e.start_ns);
      if (e.kind == EventKind::kKernel) ++kernels;
    }
  } else {
    add_cpu_self_times(events, totals);
  }
  // GPU busy: the union of the activities' intervals. Kernels on two streams at once (the optimizer overlapped
  // with the backward) count once here and twice in the sum of their times.
  double busy_ns = 0;
  if (gpu) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const auto& e : events)
      if (e.kind != EventKind::kCpuOp && e.end_ns >= e.start_ns) spans.emplace_back(e.start_ns, e.end_ns);
    std::sort(spans.begin(), spans.end());
    int64_t open_start = 0, open_end = 0;
    bool open = false;
    for (const auto& [start, end] : spans) {
      if (open && start <= open_end) {
        open_end = std::max(open_end, end);
        continue;
      }
      if (open) busy_ns += static_cast<double>(open_end - open_start);
      open_start = start, open_end = end, open = true;
    }
    if (open) busy_ns += static_cast<double>(open_end - open_start);
  }
  double total_ns = 0, communication_ns = 0;
  for (const auto& [key, t] : totals) {
    total_ns += t.total_ns;
    if (is_collective(key)) communication_ns += t.total_ns;
  }

  std::vector<std::pair<std::pair<std::string, EventKind>, Totals>> rows(totals.begin(), totals.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.total_ns > b.second.total_ns; });
  nlohmann::json hotspots = nlohmann::json::array();
  for (const auto& [key, t] : rows) {
    hotspots.push_back({{"name", key.first},
                        {"kind", is_collective(key) ? "comm" : kind_name(key.second)},
                        {"calls", t.calls},
                        {"total_us", t.total_ns / 1e3},
                        {"mean_us", t.total_ns / 1e3 / static_cast<double>(t.calls)},
                        {"share", total_ns > 0 ? t.total_ns / total_ns : 0.0}});
  }
  const double n = static_cast<double>(steps);
  return {
      {"steps", steps},
      {"basis", gpu ? "gpu_time" : "cpu_self_time"},
      {"basis_note",
       gpu ? "GPU activities (kernels, memcpy, memset) by device time; rows add up to total_gpu_us"
           : "CPU run: no GPU kernels. ATen ops by self time (nested ops subtracted); rows add up to total_us"},
      {"total_us", total_ns / 1e3},
      {"total_gpu_us", gpu ? nlohmann::json(total_ns / 1e3) : nlohmann::json(nullptr)},
      {"gpu_time_per_step_ms", gpu ? nlohmann::json(total_ns / 1e6 / n) : nlohmann::json(nullptr)},
      {"gpu_busy_per_step_ms", gpu ? nlohmann::json(busy_ns / 1e6 / n) : nlohmann::json(nullptr)},
      {"gpu_concurrent_per_step_ms", gpu ? nlohmann::json((total_ns - busy_ns) / 1e6 / n) : nlohmann::json(nullptr)},
      {"gpu_kernels", kernels},
      {"kernels_per_step", gpu ? nlohmann::json(static_cast<double>(kernels) / n) : nlohmann::json(nullptr)},
      {"communication_ms_per_step", gpu ? nlohmann::json(communication_ns / 1e6 / n) : nlohmann::json(nullptr)},
      {"hotspots", hotspots},
  };
}

std::string format_hotspots(const nlohmann::json& profile, size_t top) {
  const bool gpu = profile.value("basis", "") == "gpu_time";
  const int64_t steps = profile.value("steps", int64_t{0});
  const double total_ms = profile.value("total_us", 0.0) / 1e3;
  std::string out = "[profile] " + std::to_string(steps) + " extra steps after the measured ones | ";
  if (gpu) {
    out += "GPU time " + strprintf("%.3f ms", total_ms) + " (" +
           strprintf("%.3f ms", total_ms / static_cast<double>(std::max<int64_t>(steps, 1))) + " per step) | " +
           std::to_string(profile.value("gpu_kernels", int64_t{0})) + " kernels (" +
           strprintf("%.1f", profile.value("kernels_per_step", 0.0)) + " per step)\n";
  } else {
    out += "CPU run, no GPU kernels: ATen ops by self time, total " + strprintf("%.3f ms", total_ms) + "\n";
  }
  const auto& hotspots = profile.at("hotspots");
  char line[256];
  std::snprintf(line, sizeof line, "  %6s %10s %7s %10s  %-6s  %s\n", "share", "total ms", "calls", "mean us", "kind",
                gpu ? "kernel / copy" : "op");
  out += line;
  double shown = 0;
  size_t i = 0;
  for (; i < hotspots.size() && i < top; ++i) {
    const auto& h = hotspots[i];
    shown += h.at("share").get<double>();
    std::snprintf(line, sizeof line, "  %5.1f%% %10.3f %7lld %10.2f  %-6s  ", 100.0 * h.at("share").get<double>(),
                  h.at("total_us").get<double>() / 1e3, static_cast<long long>(h.at("calls").get<int64_t>()),
                  h.at("mean_us").get<double>(), h.at("kind").get<std::string>().c_str());
    out += line + shorten(h.at("name").get<std::string>()) + "\n";
  }
  if (hotspots.empty()) out += "  (no events recorded)\n";
  if (i < hotspots.size())
    out += "  ... " + std::to_string(hotspots.size() - i) + " more (" + strprintf("%.1f%%", 100.0 * (1.0 - shown)) +
           " of the time); the result JSON's \"profile.hotspots\" lists all\n";
  return out;
}

nlohmann::json record_profile(const torch::Device& device, const ProfileRequest& request,
                              const std::function<void()>& run_step, std::ostream& log) {
  namespace autograd_profiler = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  if (request.steps < 1)
    throw std::invalid_argument("--profile-steps must be >= 1, got " + std::to_string(request.steps));
  const bool gpu = device.is_cuda();
  // Kineto's CUDA activity is CUPTI on NVIDIA and the ROCm tracer on ROCm builds.
  std::set<ActivityType> activities{ActivityType::CPU};
  if (gpu) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO);

  synchronize(device);  // nothing from the measured steps may leak into the window
  autograd_profiler::prepareProfiler(config, activities);
  autograd_profiler::enableProfiler(config, activities);
  const auto start = std::chrono::steady_clock::now();
  try {
    for (int64_t i = 0; i < request.steps; ++i) run_step();
    synchronize(device);  // GPU work still queued at disable time would be missing from the trace
  } catch (...) {
    autograd_profiler::disableProfiler();
    throw;
  }
  const double window_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  auto result = autograd_profiler::disableProfiler();
  if (!result) throw std::runtime_error("the Kineto profiler returned no result");

  const std::filesystem::path trace(request.trace_path);
  if (trace.has_parent_path()) std::filesystem::create_directories(trace.parent_path());
  std::filesystem::remove(trace);
  result->save(request.trace_path);
  if (!std::filesystem::exists(trace) || std::filesystem::file_size(trace) == 0)
    throw std::runtime_error("the profiler could not write its trace to '" + request.trace_path + "'");

  nlohmann::json profile = summarize_profile(convert(result->events()), request.steps, gpu);
  profile["device"] = device.str();
  profile["trace"] = request.trace_path;
  profile["window_ms"] = window_ms;
  profile["note"] =
      "extra training steps after the measured ones, on one repeated batch; not part of step_ms or "
      "summary (profiler overhead would distort them)";
  log << format_hotspots(profile);
  if (!gpu && torch::profiler::impl::cudaStubs()->enabled() && !torch::cuda::is_available())
    log << "[profile] (a Kineto \"gpuGetDeviceCount failed\" error above is harmless: this LibTorch supports GPUs, "
           "this machine has none)\n";
  if (gpu && profile["gpu_kernels"].get<int64_t>() == 0)
    log << "[profile] warning: no GPU kernels were recorded: the GPU activity tracer (CUPTI on NVIDIA, the ROCm "
           "tracer on AMD) is unavailable or in use by another profiler (nsys, ncu, rocprofv3)\n";
  log << "[profile] trace written to " << request.trace_path
      << " (open it in https://ui.perfetto.dev or chrome://tracing)" << std::endl;
  return profile;
}

}  // namespace tt
