#include "apps/train/system_info.h"

#include <torch/version.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "apps/train/device.h"
#include "kernels/ops/common.h"

#if defined(TT_BACKEND_CUDA)
#include <cuda_runtime_api.h>
#elif defined(TT_BACKEND_HIP)
#include <hip/hip_runtime_api.h>
#endif

namespace tt {
namespace {

std::string run_command(const std::string& command) {
  std::array<char, 256> buffer{};
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  while (fgets(buffer.data(), buffer.size(), pipe)) out += buffer.data();
  pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string version_string(int v) {
  // CUDA and HIP encode versions as major * 1000 + minor * 10 (CUDA) or major * 1e7 + minor * 1e5 (HIP).
#if defined(TT_BACKEND_HIP)
  return std::to_string(v / 10000000) + "." + std::to_string((v / 100000) % 100);
#else
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
#endif
}

void gpu_details(SystemInfo& info, int index) {
#if defined(TT_BACKEND_CUDA)
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) == cudaSuccess)
    info.device_name = prop.name;
  else
    (void)cudaGetLastError();  // a failed query must not be reported by the next kernel launch's check
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) info.driver_version = "CUDA driver API " + version_string(driver);
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info.runtime_version = "CUDA runtime " + version_string(runtime);
#elif defined(TT_BACKEND_HIP)
  hipDeviceProp_t prop{};
  if (hipGetDeviceProperties(&prop, index) == hipSuccess)
    info.device_name = prop.name;
  else
    (void)hipGetLastError();  // a failed query must not be reported by the next kernel launch's check
  int driver = 0, runtime = 0;
  if (hipDriverGetVersion(&driver) == hipSuccess) info.driver_version = "HIP driver " + version_string(driver);
  if (hipRuntimeGetVersion(&runtime) == hipSuccess) info.runtime_version = "HIP runtime " + version_string(runtime);
#else
  (void)index;
  info.device_name = "unknown GPU (built without a GPU backend)";
#endif
}

}  // namespace

std::string utc_timestamp(bool compact) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, compact ? "%Y%m%d-%H%M%S" : "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

SystemInfo collect_system_info(const torch::Device& device) {
  SystemInfo info;
  info.backend = TT_GPU_BACKEND_NAME;
  info.device = device.str();
  info.device_name = "cpu";
  if (device.is_cuda()) {
    gpu_details(info, index_of(device));
    info.device_memory_mb = total_device_memory(device) >> 20;
    const c10::DeviceGuard on_device(device);
    info.programmatic_launch = ops::programmatic_launch_available();
  }
  info.libtorch_version = TORCH_VERSION;
#if defined(__clang__)
  info.compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "gcc " __VERSION__;
#endif
  info.git_commit = run_command("git -C '" TT_SOURCE_DIR "' rev-parse --short=12 HEAD 2>/dev/null");
  if (!info.git_commit.empty() &&
      !run_command("git -C '" TT_SOURCE_DIR "' status --porcelain --untracked-files=no 2>/dev/null").empty())
    info.git_commit += "-dirty";
  if (info.git_commit.empty()) info.git_commit = "unknown";
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) info.hostname = host;
  info.timestamp = utc_timestamp();
  return info;
}

nlohmann::json to_json(const SystemInfo& i) {
  return {{"backend", i.backend},
          {"device", i.device},
          {"device_name", i.device_name},
          {"device_memory_mb", i.device_memory_mb},
          {"driver_version", i.driver_version},
          {"runtime_version", i.runtime_version},
          {"libtorch_version", i.libtorch_version},
          {"compiler", i.compiler},
          {"git_commit", i.git_commit},
          {"hostname", i.hostname},
          {"timestamp", i.timestamp},
          {"programmatic_launch", i.programmatic_launch}};
}

std::string doctor_report() {
  std::ostringstream out;
  out << "TinyTransformer doctor\n";
  out << "  kernels compiled for : " << TT_GPU_BACKEND_NAME << "\n";
  out << "  LibTorch             : " << TORCH_VERSION << "\n";
  const bool gpu = torch::cuda::is_available();
  out << "  GPU visible          : " << (gpu ? "yes (" + std::to_string(torch::cuda::device_count()) + ")" : "no") << "\n";
  if (gpu) {
    auto info = collect_system_info(torch::Device(torch::kCUDA, 0));
    out << "  GPU 0                : " << info.device_name << ", " << info.device_memory_mb << " MB\n";
    out << "  driver / runtime     : " << info.driver_version << " / " << info.runtime_version << "\n";
  }
  out << "  profilers on PATH    :\n";
  for (const char* tool : {"rocprofv3", "rocprof-compute", "rocprof-sys-run", "nsys", "ncu"}) {
    std::string where = run_command(std::string("command -v ") + tool + " 2>/dev/null");
    out << "    " << tool << std::string(16 - std::string(tool).size(), ' ') << ": "
        << (where.empty() ? "not found" : where) << "\n";
  }
  return out.str();
}

}  // namespace tt
