// SwiGLU forward and backward.
//
// One block per row, threads striding over the row's F columns with 16-byte accesses where alignment
// allows. Fusing the activation saves the round trips of the unfused form (silu writes a temporary,
// the multiply reads it back; the backward needs several more), and reading gate and up straight from
// the GEMM's [rows, 2F] output saves the copies that splitting it into two contiguous tensors costs.
// Math is fp32 whatever the storage type, rounding once on store.
#include <initializer_list>

#include "swiglu.cuh"

namespace tt::kernels {

namespace {

// =================================================================================================
// Kernels
// =================================================================================================

// expf rather than the fast __expf: the kernel is memory-bound, so the accurate one is free, and it
// keeps fp32 results within a few ulp of LibTorch's.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float swiglu_value(float g, float u) { return g * sigmoid(g) * u; }

// d silu(g) / dg = sig + g * sig * (1 - sig) = sig * (1 + g * (1 - sig)).
__device__ __forceinline__ void swiglu_grads(float go, float g, float u, float& grad_gate, float& grad_up) {
  const float sig = sigmoid(g);
  grad_gate = go * u * sig * (1.0f + g * (1.0f - sig));
  grad_up = go * g * sig;
}

template <typename T, int kVec>
__global__ void swiglu_forward_kernel(SwigluForwardParams params) {
  start_after_previous_kernel();
  const int64_t row = blockIdx.x;
  const int ffn = static_cast<int>(params.ffn);
  const T* gate = static_cast<const T*>(params.gate_up) + row * 2 * params.ffn;
  const T* up = gate + params.ffn;
  T* out = static_cast<T*>(params.out) + row * params.ffn;

  for (int col = threadIdx.x * kVec; col < ffn; col += blockDim.x * kVec) {
    const Pack<T, kVec> gs = load_pack<kVec>(gate + col);
    const Pack<T, kVec> us = load_pack<kVec>(up + col);
    Pack<T, kVec> outs;
#pragma unroll
    for (int v = 0; v < kVec; ++v) outs.values[v] = from_float<T>(swiglu_value(to_float(gs.values[v]), to_float(us.values[v])));
    store_pack<kVec>(out + col, outs);
  }
}

template <typename T, int kVec>
__global__ void swiglu_backward_kernel(SwigluBackwardParams params) {
  start_after_previous_kernel();
  const int64_t row = blockIdx.x;
  const int ffn = static_cast<int>(params.ffn);
  const T* grad_out = static_cast<const T*>(params.grad_out) + row * params.ffn;
  const T* gate = static_cast<const T*>(params.gate_up) + row * 2 * params.ffn;
  const T* up = gate + params.ffn;
  T* grad_gate = static_cast<T*>(params.grad_gate_up) + row * 2 * params.ffn;
  T* grad_up = grad_gate + params.ffn;

  for (int col = threadIdx.x * kVec; col < ffn; col += blockDim.x * kVec) {
    const Pack<T, kVec> gos = load_pack<kVec>(grad_out + col);
    const Pack<T, kVec> gs = load_pack<kVec>(gate + col);
    const Pack<T, kVec> us = load_pack<kVec>(up + col);
    Pack<T, kVec> grad_gates;
    Pack<T, kVec> grad_ups;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      float grad_gate, grad_up;
      swiglu_grads(to_float(gos.values[v]), to_float(gs.values[v]), to_float(us.values[v]), grad_gate, grad_up);
      grad_gates.values[v] = from_float<T>(grad_gate);
      grad_ups.values[v] = from_float<T>(grad_up);
    }
    store_pack<kVec>(grad_gate + col, grad_gates);
    store_pack<kVec>(grad_up + col, grad_ups);
  }
}

// The strided path: consecutive threads take consecutive columns of a row, so with a transposed gate_up
// (col_stride = rows) neighbouring threads read addresses rows elements apart and every warp-wide load
// touches as many memory segments as it has lanes.
template <typename T>
__global__ void swiglu_strided_forward_kernel(SwigluStridedParams params) {
  start_after_previous_kernel();
  const T* gate_up = static_cast<const T*>(params.gate_up);
  T* out = static_cast<T*>(params.out);
  const int64_t total = params.rows * params.ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / params.ffn, col = i % params.ffn;
    const T* row_ptr = gate_up + row * params.row_stride;
    out[i] = from_float<T>(swiglu_value(to_float(row_ptr[col * params.col_stride]),
                                        to_float(row_ptr[(params.ffn + col) * params.col_stride])));
  }
}

template <typename T>
__global__ void swiglu_strided_backward_kernel(SwigluStridedParams params) {
  start_after_previous_kernel();
  const T* gate_up = static_cast<const T*>(params.gate_up);
  const T* grad_out = static_cast<const T*>(params.grad_out);
  T* grad_gate_up = static_cast<T*>(params.out);
  const int64_t total = params.rows * params.ffn;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / params.ffn, col = i % params.ffn;
    const T* row_ptr = gate_up + row * params.row_stride;
    float grad_gate, grad_up;
    swiglu_grads(to_float(grad_out[i]), to_float(row_ptr[col * params.col_stride]),
                 to_float(row_ptr[(params.ffn + col) * params.col_stride]), grad_gate, grad_up);
    grad_gate_up[row * 2 * params.ffn + col] = from_float<T>(grad_gate);
    grad_gate_up[row * 2 * params.ffn + params.ffn + col] = from_float<T>(grad_up);
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

// Rows of F = 2048 (the workshop shape) in bf16 take 256 threads of one 16-byte access each; longer
// rows loop. A block of up to 256 threads lets several rows share an SM.
template <int kVec>
int row_block_threads(int64_t ffn) {
  return block_threads_for((ffn + kVec - 1) / kVec, 256);
}

// gate_up's row length 2F is a multiple of kVec whenever F is, so use_wide's test on F plus the base
// pointers covers gate, up and every row.

template <typename T>
void forward_for_type(const SwigluForwardParams& params, gpuStream_t stream) {
  const unsigned grid = static_cast<unsigned>(params.rows);
  if (use_wide<T>(params.ffn, {params.gate_up, params.out})) {
    constexpr int kVec = kWideVec<T>;
    launch_after_previous(swiglu_forward_kernel<T, kVec>, grid, row_block_threads<kVec>(params.ffn), 0, stream, params);
  } else {
    launch_after_previous(swiglu_forward_kernel<T, 1>, grid, row_block_threads<1>(params.ffn), 0, stream, params);
  }
}

template <typename T>
void backward_for_type(const SwigluBackwardParams& params, gpuStream_t stream) {
  const unsigned grid = static_cast<unsigned>(params.rows);
  if (use_wide<T>(params.ffn, {params.grad_out, params.gate_up, params.grad_gate_up})) {
    constexpr int kVec = kWideVec<T>;
    launch_after_previous(swiglu_backward_kernel<T, kVec>, grid, row_block_threads<kVec>(params.ffn), 0, stream,
                          params);
  } else {
    launch_after_previous(swiglu_backward_kernel<T, 1>, grid, row_block_threads<1>(params.ffn), 0, stream, params);
  }
}

constexpr int kStridedBlockThreads = 256;

// One thread per element up to a grid of 65535 blocks; beyond that the grid-stride loop takes over.
unsigned strided_grid(const SwigluStridedParams& params) {
  const int64_t blocks = (params.rows * params.ffn + kStridedBlockThreads - 1) / kStridedBlockThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace

LaunchStatus swiglu_strided_forward(const SwigluStridedParams& params, DType dtype, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) {
    launch_after_previous(swiglu_strided_forward_kernel<decltype(element)>, strided_grid(params), kStridedBlockThreads,
                          0, s, params);
  });
  return last_launch_status();
}

LaunchStatus swiglu_strided_backward(const SwigluStridedParams& params, DType dtype, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) {
    launch_after_previous(swiglu_strided_backward_kernel<decltype(element)>, strided_grid(params), kStridedBlockThreads,
                          0, s, params);
  });
  return last_launch_status();
}

LaunchStatus swiglu_forward(const SwigluForwardParams& params, DType dtype, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) { forward_for_type<decltype(element)>(params, s); });
  return last_launch_status();
}

LaunchStatus swiglu_backward(const SwigluBackwardParams& params, DType dtype, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) { backward_for_type<decltype(element)>(params, s); });
  return last_launch_status();
}

}  // namespace tt::kernels
