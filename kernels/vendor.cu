// The process-wide switch of programmatic dependent launch (vendor.cuh, "Programmatic dependent launch"): read
// once from TT_PROGRAMMATIC_LAUNCH, settable by tests; whether the current GPU takes it is asked once per device.
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/vendor.cuh"

namespace tt::kernels {

namespace {

bool from_environment() {
  const char* value = std::getenv("TT_PROGRAMMATIC_LAUNCH");
  if (value == nullptr) return true;
  const std::string v(value);
  if (v != "0" && v != "1")
    throw std::invalid_argument("TT_PROGRAMMATIC_LAUNCH must be 0 (off) or 1 (on, the default), got '" + v + "'");
  return v == "1";
}

std::atomic<bool>& setting() {
  static std::atomic<bool> on{from_environment()};
  return on;
}

}  // namespace

void set_programmatic_launch(bool on) { setting() = on; }

bool programmatic_launch_enabled() { return setting(); }

bool programmatic_launch_available() {
#if defined(__HIP__)
  return false;
#else
  if (!setting()) return false;
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // 0 unknown, 1 yes, 2 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    (void)cudaGetLastError();
    return false;
  }
  if (known[device] == 0) {
    int major = 0;
    const bool sm90 =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
    (void)cudaGetLastError();
    known[device] = sm90 ? 1 : 2;
  }
  return known[device] == 1;
#endif
}

}  // namespace tt::kernels
