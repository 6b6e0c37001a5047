// The process-wide switch of programmatic dependent launch (vendor.cuh, "Programmatic dependent launch"): read
// once from TT_PROGRAMMATIC_LAUNCH, settable by tests; whether the current GPU runs kernels that wait is asked once
// per device.
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "vendor.cuh"

namespace tt::kernels {

namespace {

std::atomic<bool>& programmatic_launch_setting() {
  static std::atomic<bool> on{programmatic_launch_setting_from(std::getenv("TT_PROGRAMMATIC_LAUNCH"))};
  return on;
}

}  // namespace

bool programmatic_launch_setting_from(const char* value) {
  if (value == nullptr || *value == '\0') return true;
  const std::string v(value);
  if (v != "0" && v != "1")
    throw std::invalid_argument("TT_PROGRAMMATIC_LAUNCH='" + v + "' is not allowed: 0 (off) or 1 (on, the default)");
  return v == "1";
}

void set_programmatic_launch(bool on) { programmatic_launch_setting() = on; }

bool programmatic_launch_enabled() { return programmatic_launch_setting(); }

bool programmatic_launch_available() {
  if (!programmatic_launch_enabled()) return false;
#if defined(TT_SM90A_IN_BUILD)
  // The wait (griddepcontrol.wait) is compiled only into code for sm_90 and later. A launch may overlap only a
  // kernel that has it: this build's sm_90a code, which is what an sm_90 GPU runs. Another GPU could run code
  // JIT-compiled from older PTX, without the wait, so it launches the usual way.
  enum Known { kUnknown, kYes, kNo };
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    (void)cudaGetLastError();
    return false;
  }
  if (known[device] == kUnknown) {
    int major = 0, minor = 0;
    const bool asked = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                       cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
    if (!asked) (void)cudaGetLastError();
    known[device] = asked && major == 9 && minor == 0 ? kYes : kNo;
  }
  return known[device] == kYes;
#else
  return false;  // no sm_90a code in this build (or not a CUDA build)
#endif
}

}  // namespace tt::kernels
