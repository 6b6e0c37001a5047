// A named range around a part of the step (forward, backward, optimizer, a layer): NVTX with a CUDA
// LibTorch and ROCTX with a ROCm one (what nsys, ncu and rocprofv3 show; free when no tool listens), and
// a user annotation in the built-in --profile (Kineto) trace.
#pragma once

#include <ATen/record_function.h>

namespace tt {

class ScopedRange {
 public:
  explicit ScopedRange(const char* name);
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  bool active_;
  at::RecordFunction record_;  // inactive (and cheap) unless a profiler records
};

}  // namespace tt
