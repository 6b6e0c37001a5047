#include "apps/train/device.h"

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>

namespace tt {

torch::Device resolve_device(const std::string& requested) {
  const bool gpu = torch::cuda::is_available();
  if (requested == "cpu") return torch::kCPU;
  if (requested == "cuda") {
    if (!gpu)
      throw std::runtime_error(
          "device \"cuda\" was requested but LibTorch sees no GPU (no driver, no device, or a CPU-only LibTorch); "
          "use --device cpu or --device auto");
    return {torch::kCUDA, 0};
  }
  return gpu ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

c10::DeviceIndex index_of(const torch::Device& device) {
  return device.has_index() ? device.index() : at::accelerator::getDeviceIndex();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) at::accelerator::synchronizeDevice(index_of(device));
}

StepTimer::StepTimer(const torch::Device& device, size_t marks) : device_(device), times_(marks) {
  if (device_.is_cuda()) {
    events_.reserve(marks);
    // BACKEND_DEFAULT keeps timing enabled (LibTorch's default event flag disables it).
    for (size_t i = 0; i < marks; ++i) events_.emplace_back(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
  }
}

void StepTimer::mark(size_t index) {
  if (device_.is_cuda()) events_[index].record(at::accelerator::getCurrentStream(device_.index()));
  times_[index] = std::chrono::steady_clock::now();
}

double StepTimer::elapsed_ms(size_t a, size_t b) {
  if (device_.is_cuda()) {
    events_[b].synchronize();
    return events_[a].elapsedTime(events_[b]);
  }
  return host_elapsed_ms(a, b);
}

double StepTimer::host_elapsed_ms(size_t a, size_t b) const {
  return std::chrono::duration<double, std::milli>(times_[b] - times_[a]).count();
}

void reset_peak_memory(const torch::Device& device) {
  if (device.is_cuda()) at::accelerator::resetPeakStats(index_of(device));
}

MemoryStats peak_memory(const torch::Device& device) {
  if (!device.is_cuda()) return {};
  const auto stats = at::accelerator::getDeviceStats(index_of(device));
  constexpr size_t kAggregate = 0;
  return {stats.allocated_bytes[kAggregate].peak, stats.reserved_bytes[kAggregate].peak};
}

int64_t total_device_memory(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  return static_cast<int64_t>(at::accelerator::getMemoryInfo(index_of(device)).second);
}

void set_allow_tf32(bool allow) {
  const auto precision = allow ? at::Float32Precision::TF32 : at::Float32Precision::IEEE;
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, precision);
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, precision);
}

int64_t device_memory_in_use(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  const auto [free, total] = at::accelerator::getMemoryInfo(index_of(device));
  return static_cast<int64_t>(total - free);
}

}  // namespace tt
