// Vendor-neutral device helpers for the training loop: device choice, step timing with device events,
// caching-allocator memory statistics (the mixed-precision scope is models/precision.h, included here for
// every caller). Nothing here includes CUDA or HIP headers; on ROCm builds of LibTorch the "cuda" device is
// the HIP device.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/config.h"
#include "models/precision.h"  // AutocastScope, compute_dtype: the run's precision

namespace tt {

// "auto" picks the GPU when LibTorch sees one. Throws with a clear message for "cuda" without a GPU.
torch::Device resolve_device(const std::string& requested);
// A GPU's index for runtime and allocator queries: torch::kCUDA alone (index -1) means the current device,
// which those queries would refuse (or, in the CUDA runtime, fail and leave the error for the next launch check).
c10::DeviceIndex index_of(const torch::Device& device);
void synchronize(const torch::Device& device);

// Timestamps a sequence of points in one step. On a GPU each mark records an event on the current
// stream (no host sync); durations are read after the events completed. On the CPU, a steady clock.
// Every mark also reads the host's steady clock, without a sync: on a GPU that measures when the host
// got past the point (launches queued), not when the device did (the debugging exercise's timing pitfall).
class StepTimer {
 public:
  StepTimer(const torch::Device& device, size_t marks);
  void mark(size_t index);
  // Milliseconds between marks a and b; blocks until mark b has completed on the device.
  double elapsed_ms(size_t a, size_t b);
  // Milliseconds between marks a and b by the host clock; never blocks. Equals elapsed_ms on the CPU.
  double host_elapsed_ms(size_t a, size_t b) const;

 private:
  torch::Device device_;
  std::vector<c10::Event> events_;
  std::vector<std::chrono::steady_clock::time_point> times_;
};

struct MemoryStats {
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
};
void reset_peak_memory(const torch::Device& device);
MemoryStats peak_memory(const torch::Device& device);  // zeros on the CPU
int64_t total_device_memory(const torch::Device& device);  // 0 on the CPU
// Bytes in use on the device as its driver sees them (total - free): every pool, context and workspace of
// this process (and of any other on the same GPU). 0 on the CPU.
int64_t device_memory_in_use(const torch::Device& device);

// TF32 for fp32 matmuls and convolutions is process-wide state in LibTorch; every trainer (and --eval-only)
// sets it from its own config, so one run (or test) never inherits another's.
void set_allow_tf32(bool allow);

}  // namespace tt
