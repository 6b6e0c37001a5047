// Positive controls for scripts/gpu_validate.sh's sanitizer part: one kernel per compute-sanitizer tool with the
// one bug that tool exists to find. A clean report on our kernels means something only if the same tool, with
// the same kernel-name filter, reports the planted bug here; the script runs the control first and gives no
// verdict for a tool that misses it. The kernels live in tt::kernels, as ours do, so the filter that selects
// our kernels (and leaves cuBLAS's and ATen's alone) selects these too.
//
// Usage: tt_sanitizer_controls memcheck|racecheck|synccheck|initcheck. Without the sanitizer each control runs
// to completion and exits 0 (the bugs are silent, which is why the tools exist); NVIDIA only.
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

namespace tt::kernels::sanitizer_control {

constexpr int kThreads = 64;  // two warps: the race and the barrier cross a warp boundary

// memcheck: every thread writes its element and thread 0 also one past the end of the allocation.
__global__ void out_of_bounds_write(int* data, int n) {
  if (threadIdx.x < n) data[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (threadIdx.x == 0) data[n] = -1;
}

// racecheck: every thread writes its shared cell and reads the one the other warp writes, with no barrier
// between the write and the read.
__global__ void shared_memory_race(int* out) {
  __shared__ int cells[kThreads];
  cells[threadIdx.x] = static_cast<int>(threadIdx.x);
  out[threadIdx.x] = cells[(threadIdx.x + kThreads / 2) % kThreads];
}

// synccheck: a block barrier that only part of the block (and part of the second warp) reaches.
__global__ void divergent_barrier(int* out) {
  if (threadIdx.x < kThreads - 16) __syncthreads();
  out[threadIdx.x] = 1;
}

// initcheck: reads device memory that nothing ever wrote.
__global__ void uninitialised_read(const int* never_written, int* out) {
  out[threadIdx.x] = never_written[threadIdx.x] + 1;
}

}  // namespace tt::kernels::sanitizer_control

namespace {

bool ok(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  std::fprintf(stderr, "tt_sanitizer_controls: %s: %s\n", what, cudaGetErrorString(status));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  namespace control = tt::kernels::sanitizer_control;
  const char* tool = argc == 2 ? argv[1] : "";
  int* data = nullptr;
  int* out = nullptr;
  // Exactly kThreads ints, so that one past the end is outside the allocation.
  if (!ok(cudaMalloc(&data, control::kThreads * sizeof(int)), "cudaMalloc") ||
      !ok(cudaMalloc(&out, control::kThreads * sizeof(int)), "cudaMalloc") ||
      !ok(cudaMemset(out, 0, control::kThreads * sizeof(int)), "cudaMemset"))
    return 2;
  if (std::strcmp(tool, "memcheck") == 0) {
    control::out_of_bounds_write<<<1, control::kThreads>>>(data, control::kThreads);
  } else if (std::strcmp(tool, "racecheck") == 0) {
    control::shared_memory_race<<<1, control::kThreads>>>(out);
  } else if (std::strcmp(tool, "synccheck") == 0) {
    control::divergent_barrier<<<1, control::kThreads>>>(out);
  } else if (std::strcmp(tool, "initcheck") == 0) {
    control::uninitialised_read<<<1, control::kThreads>>>(data, out);
  } else {
    std::fprintf(stderr, "usage: %s memcheck|racecheck|synccheck|initcheck (got '%s')\n", argv[0], tool);
    return 2;
  }
  // A launch or execution error here is the control doing its job under memcheck; report it, exit 1.
  const bool ran = ok(cudaGetLastError(), "launch") && ok(cudaDeviceSynchronize(), "kernel");
  cudaFree(data);
  cudaFree(out);
  std::printf("control for %s %s\n", tool, ran ? "ran" : "failed");
  return ran ? 0 : 1;
}
