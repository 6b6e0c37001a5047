// What makes a result comparable: the machine, the GPU, the software versions and the source commit.
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace tt {

struct SystemInfo {
  std::string backend;         // cuda | hip | none (what our kernels were compiled for)
  std::string device;          // cpu | cuda:0
  std::string device_name;     // GPU name, or "cpu"
  int64_t device_memory_mb = 0;
  std::string driver_version;  // GPU driver API version, "" on the CPU
  std::string runtime_version; // CUDA/HIP runtime version LibTorch was built with
  std::string libtorch_version;
  std::string compiler;
  std::string git_commit;
  std::string hostname;
  std::string timestamp;       // UTC, ISO 8601
  // Whether our kernels were launched as programmatic dependent launches (kernels/vendor.cuh: sm_90 with an sm_90a
  // build, unless TT_PROGRAMMATIC_LAUNCH=0); profiles' kernel times then include each kernel's wait for the one
  // before it.
  bool programmatic_launch = false;
};

SystemInfo collect_system_info(const torch::Device& device);
nlohmann::json to_json(const SystemInfo& info);
std::string utc_timestamp(bool compact = false);

// The `--doctor` report: backend, GPU, LibTorch, which profilers are on PATH.
std::string doctor_report();

}  // namespace tt
