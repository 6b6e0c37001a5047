// The naive SwiGLU MLP kernels: what "write it all yourself" gives next to cuBLAS/hipBLASLt.
//
// One thread per output element, no tiling, no shared memory, no tensor cores: every thread reads a whole
// row of x and two whole rows of W from global memory (through the caches), so the kernels are bound by
// load instructions and reach a small fraction of the GPU's FLOP/s. They are correct (tested against
// LibTorch, forward and both gradients) and slow on purpose; the stage that uses them exists to be
// measured against v3, which leaves the GEMMs to the vendor library.
#include "naive_swiglu.cuh"

namespace tt::kernels {

namespace {

// =================================================================================================
// Kernels
// =================================================================================================

constexpr int kBlockThreads = 256;

// Consecutive threads take consecutive f of one row, so they share the x row (a broadcast) and read W
// rows hidden elements apart.
template <typename T>
__global__ void naive_swiglu_forward_kernel(NaiveSwigluForwardParams params) {
  const T* x = static_cast<const T*>(params.x);
  const T* w = static_cast<const T*>(params.weight);
  T* out = static_cast<T*>(params.out);
  T* gate_up = static_cast<T*>(params.gate_up);
  const int64_t total = params.rows * params.ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / params.ffn, f = i % params.ffn;
    const T* x_row = x + row * params.hidden;
    const T* gate_w = w + f * params.hidden;
    const T* up_w = w + (params.ffn + f) * params.hidden;
    float gate = 0.0f, up = 0.0f;
    for (int64_t h = 0; h < params.hidden; ++h) {
      const float xv = to_float(x_row[h]);
      gate += xv * to_float(gate_w[h]);
      up += xv * to_float(up_w[h]);
    }
    // The stored projections are rounded to T, as a GEMM in T would store them; the output is computed
    // from the rounded values, so that the backward (which reads them) sees what the forward used.
    const T gate_t = from_float<T>(gate), up_t = from_float<T>(up);
    gate_up[row * 2 * params.ffn + f] = gate_t;
    gate_up[row * 2 * params.ffn + params.ffn + f] = up_t;
    const float g = to_float(gate_t);
    out[i] = from_float<T>(g / (1.0f + expf(-g)) * to_float(up_t));
  }
}

template <typename T>
__global__ void naive_matmul_kernel(NaiveMatmulParams params) {
  const T* a = static_cast<const T*>(params.a);
  const T* b = static_cast<const T*>(params.b);
  T* c = static_cast<T*>(params.c);
  const int64_t total = params.m * params.n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / params.n, col = i % params.n;
    float sum = 0.0f;
    for (int64_t k = 0; k < params.k; ++k)
      sum += to_float(a[row * params.a_stride_0 + k * params.a_stride_1]) *
             to_float(b[k * params.b_stride_0 + col * params.b_stride_1]);
    c[i] = from_float<T>(sum);
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

// One thread per element up to a grid of 65535 blocks; beyond that the grid-stride loops take over.
unsigned grid_for(int64_t elements) {
  const int64_t blocks = (elements + kBlockThreads - 1) / kBlockThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace

LaunchStatus naive_swiglu_forward(const NaiveSwigluForwardParams& params, DType dtype, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) {
    naive_swiglu_forward_kernel<decltype(element)><<<grid_for(params.rows * params.ffn), kBlockThreads, 0, s>>>(params);
  });
  return last_launch_status();
}

LaunchStatus naive_matmul(const NaiveMatmulParams& params, DType dtype, void* stream) {
  if (params.m == 0 || params.n == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) {
    naive_matmul_kernel<decltype(element)><<<grid_for(params.m * params.n), kBlockThreads, 0, s>>>(params);
  });
  return last_launch_status();
}

}  // namespace tt::kernels
