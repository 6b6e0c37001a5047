// What every op in kernels/ops/ shares: whether this build has GPU kernels, the dtype tag and stream the
// launchers take, and turning a failed launch into an error that names the op and the kernel.
#pragma once

#include <ATen/DeviceAccelerator.h>
#include <torch/torch.h>

#include "kernels/vendor.cuh"

#if defined(TT_BACKEND_CUDA) || defined(TT_BACKEND_HIP)
#define TT_HAVE_GPU_KERNELS 1
#endif

namespace tt::ops {

// Every op's autograd Function takes these.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Our kernels as programmatic dependent launches on sm_90+ (kernels/vendor.cuh): on by default, off for the whole
// process here or with TT_PROGRAMMATIC_LAUNCH=0. Builds without GPU kernels have nothing to switch.
#ifdef TT_HAVE_GPU_KERNELS
inline void set_programmatic_launch(bool on) { kernels::set_programmatic_launch(on); }
inline bool programmatic_launch_enabled() { return kernels::programmatic_launch_enabled(); }
inline bool programmatic_launch_available() { return kernels::programmatic_launch_available(); }
#else
inline void set_programmatic_launch(bool) {}
inline bool programmatic_launch_enabled() { return false; }
inline bool programmatic_launch_available() { return false; }
#endif
// Refuses a TT_PROGRAMMATIC_LAUNCH other than 0 or 1 (std::invalid_argument naming it): the apps call this before
// any GPU work. Builds without GPU kernels accept any value.
inline void check_programmatic_launch_environment() { (void)programmatic_launch_enabled(); }

}  // namespace tt::ops

namespace tt::ops::detail {

// Callers admit only Float, BFloat16 and Half to the GPU path (their check_inputs).
inline kernels::DType kernel_dtype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16: return kernels::DType::kBFloat16;
    case torch::kFloat16: return kernels::DType::kFloat16;
    default: return kernels::DType::kFloat32;
  }
}

// LibTorch's current stream on the tensor's device, as the opaque handle the launchers take.
inline void* current_stream(const torch::Tensor& t) {
  return at::accelerator::getCurrentStream(t.device().index()).native_handle();
}

// What every GPU path checks first: that this build has kernels at all, and that `what` (the tensor's name
// in the message) has an activation dtype the kernels are instantiated for.
inline void check_gpu_input(const char* op, const char* what, const torch::Tensor& t) {
#ifdef TT_HAVE_GPU_KERNELS
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kFloat16, "tt::ops::", op,
              ": the GPU kernel supports ", what, " of dtype Float, BFloat16 or Half, got ", dtype);
#else
  TORCH_CHECK(false, "tt::ops::", op, ": ", what, " is on ", t.device(),
              " but this build has no GPU kernels (CMake found neither CUDA nor HIP)");
#endif
}

inline void check_launch(const char* op, const kernels::LaunchStatus& status, const char* kernel) {
  TORCH_CHECK(status.ok(), "tt::ops::", op, ": launching ", kernel, " failed: ", status.error);
}

}  // namespace tt::ops::detail
