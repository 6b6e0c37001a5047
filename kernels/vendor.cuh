// Vendor layer for the kernels: every .cu file is written once and compiles as CUDA (nvcc) or as HIP
// (hipcc, or CMake's HIP language). Only this header knows which vendor it is building for.
//
// Two parts:
//  * the launcher vocabulary (dtype tag, launch status, block-size limits): plain C++, so the op layer,
//    which is compiled by the host compiler without GPU headers, can include the launcher declarations;
//  * the device vocabulary (runtime names, 16-bit float types and conversions, warp size, shuffles and
//    the reductions built on them): seen only by a GPU compiler.
#pragma once

#include <cstdint>

namespace tt::kernels {

// =================================================================================================
// Launcher vocabulary (host compiler and GPU compiler alike)
// =================================================================================================

// Element type of the activation tensors a launcher reads and writes. Launchers take `void*` data
// pointers and this tag, and instantiate the matching kernel template, so that no vendor type (nor
// any LibTorch type) appears in a launcher's signature.
enum class DType { kFloat32, kBFloat16, kFloat16 };

// What a launcher reports: nullptr when every launch was accepted, otherwise the runtime's message.
// Launches are asynchronous, so this catches configuration errors, not faults inside a kernel.
struct LaunchStatus {
  const char* error = nullptr;
  bool ok() const { return error == nullptr; }
};

// The largest wave on any GPU we target (AMD CDNA runs 64 lanes per wave, NVIDIA 32 per warp).
// Host code sizes every block as a multiple of this, so a block is a whole number of warps on both
// vendors. Host code must never use the device-side warp_size() below: see its comment.
constexpr int kMaxWarpSize = 64;
constexpr int kMaxBlockThreads = 1024;

// Rounds `threads` up to whole waves and clamps it into [kMaxWarpSize, max_threads].
constexpr int block_threads_for(int64_t threads, int max_threads) {
  const int64_t rounded = (threads + kMaxWarpSize - 1) / kMaxWarpSize * kMaxWarpSize;
  return static_cast<int>(rounded < kMaxWarpSize ? kMaxWarpSize : rounded > max_threads ? max_threads : rounded);
}

}  // namespace tt::kernels

#if defined(__CUDACC__) || defined(__HIP__)

#include <initializer_list>
#include <type_traits>

#if defined(__HIP__)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
// ROCm 6 introduced the CUDA-like __hip_bfloat16; ROCm 5 (Debian's hipcc) only has hip_bfloat16.
#if HIP_VERSION_MAJOR >= 6
#include <hip/hip_bf16.h>
#define TT_HIP_NATIVE_BF16 1
#else
#include <hip/hip_bfloat16.h>
#endif
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

namespace tt::kernels {

// =================================================================================================
// Runtime names
// =================================================================================================

#if defined(__HIP__)
using gpuStream_t = hipStream_t;
using gpuError_t = hipError_t;
inline gpuError_t gpu_get_last_error() { return hipGetLastError(); }
inline const char* gpu_error_string(gpuError_t error) { return hipGetErrorString(error); }
constexpr gpuError_t kGpuSuccess = hipSuccess;
#else
using gpuStream_t = cudaStream_t;
using gpuError_t = cudaError_t;
inline gpuError_t gpu_get_last_error() { return cudaGetLastError(); }
inline const char* gpu_error_string(gpuError_t error) { return cudaGetErrorString(error); }
constexpr gpuError_t kGpuSuccess = cudaSuccess;
#endif

// The op layer hands the current LibTorch stream over as an opaque pointer.
inline gpuStream_t to_stream(void* stream) { return static_cast<gpuStream_t>(stream); }

// Call right after a group of launches. Reading (and clearing) the runtime's last error reports an
// invalid configuration (too many threads, too much shared memory, no kernel image for this GPU).
inline LaunchStatus last_launch_status() {
  const gpuError_t error = gpu_get_last_error();
  return error == kGpuSuccess ? LaunchStatus{} : LaunchStatus{gpu_error_string(error)};
}

// =================================================================================================
// 16-bit float types and conversions. All arithmetic is done in fp32; these only load and store.
// =================================================================================================

using fp16 = __half;
#if defined(__HIP__) && !defined(TT_HIP_NATIVE_BF16)
using bf16 = hip_bfloat16;
#elif defined(__HIP__)
using bf16 = __hip_bfloat16;
#else
using bf16 = __nv_bfloat16;
#endif

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(fp16 value) { return __half2float(value); }
__device__ __forceinline__ float to_float(bf16 value) {
#if defined(__HIP__) && !defined(TT_HIP_NATIVE_BF16)
  return static_cast<float>(value);
#else
  return __bfloat162float(value);
#endif
}

// Round to nearest even, as LibTorch does, so a kernel's output rounds the same way as the reference's.
template <typename T>
__device__ __forceinline__ T from_float(float value) {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else if constexpr (std::is_same_v<T, fp16>) {
    return __float2half(value);
  } else {
    static_assert(std::is_same_v<T, bf16>, "from_float: unsupported element type");
#if defined(__HIP__) && !defined(TT_HIP_NATIVE_BF16)
    return bf16(value);
#else
    return __float2bfloat16(value);
#endif
  }
}

// Calls f(T{}) with the element type T that the launcher's dtype tag names: the one place where the runtime
// tag becomes a template parameter (flash-attention's static_switch.h does the same for its flags).
template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: f(float{}); break;
    case DType::kBFloat16: f(bf16{}); break;
    case DType::kFloat16: f(fp16{}); break;
  }
}

// =================================================================================================
// Vectorised access: kVec consecutive elements moved by one 16-byte (or narrower) instruction.
// Launchers pick kVec > 1 only when the row length and every pointer allow the alignment.
// =================================================================================================

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T values[kVec];
};

template <int kVec, typename T>
__device__ __forceinline__ Pack<T, kVec> load_pack(const T* ptr) {
  return *reinterpret_cast<const Pack<T, kVec>*>(ptr);
}

template <int kVec, typename T>
__device__ __forceinline__ void store_pack(T* ptr, const Pack<T, kVec>& pack) {
  *reinterpret_cast<Pack<T, kVec>*>(ptr) = pack;
}

// Elements of T in one 16-byte access, the widest single load or store on both vendors.
template <typename T>
constexpr int kWideVec = 16 / sizeof(T);

// True when `ptr` may be accessed as Pack<T, kVec>.
template <typename T, int kVec>
inline bool is_pack_aligned(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % sizeof(Pack<T, kVec>) == 0;
}

// Whether a launcher may take the kWideVec<T> path: rows of `row_length` elements split into whole packs
// (so every row stays aligned once its base pointer is), every `rows` pointer (of T) is pack-aligned, and
// every fp32 companion read kWideVec<T> floats at a time (a weight, say) is aligned for that.
template <typename T>
inline bool use_wide(int64_t row_length, std::initializer_list<const void*> rows,
                     std::initializer_list<const float*> fp32_companions = {}) {
  constexpr int kVec = kWideVec<T>;
  if (row_length % kVec != 0) return false;
  for (const void* p : rows)
    if (!is_pack_aligned<T, kVec>(p)) return false;
  for (const float* p : fp32_companions)
    if (!is_pack_aligned<float, kVec>(p)) return false;
  return true;
}

// =================================================================================================
// Warp size, shuffles and reductions
// =================================================================================================

// Lanes per warp (NVIDIA) or wavefront (AMD) of the architecture this device pass compiles for.
// Device-only on purpose: a HIP compile runs a host pass in which __AMDGCN_WAVEFRONT_SIZE is not
// defined, so a host-side value would silently disagree with the kernel's. Host code
// sizes launches with kMaxWarpSize instead. The host pass still parses this body, hence its fallback.
__device__ constexpr int warp_size() {
#if defined(__HIP__) && defined(__AMDGCN_WAVEFRONT_SIZE)
  return __AMDGCN_WAVEFRONT_SIZE;
#elif defined(__HIP__)
  return kMaxWarpSize;
#else
  return 32;
#endif
}

__device__ __forceinline__ float shfl_xor(float value, int lane_mask) {
#if defined(__HIP__)
  // ROCm 5 has no _sync shuffles; a wavefront executes in lockstep, so none is needed.
  return __shfl_xor(value, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
#endif
}

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Butterfly reduction: every lane ends with the same value, combined in the same fixed order on
// every run (a + b == b + a exactly, so the two partners of each step agree bit for bit).
template <typename Op>
__device__ __forceinline__ float warp_reduce(float value, Op op) {
  for (int offset = warp_size() / 2; offset > 0; offset /= 2) value = op(value, shfl_xor(value, offset));
  return value;
}

// Reduces one value per thread over the whole block and returns the result to every thread.
// Requirements (the launchers guarantee them): blockDim.x is a multiple of kMaxWarpSize and at most
// kMaxBlockThreads, and every thread of the block calls it. Deterministic: the order of operations
// depends only on the block size. Safe to call several times in a row (it syncs before reusing its
// shared scratch).
template <typename Op>
__device__ __forceinline__ float block_reduce(float value, Op op, float identity) {
  __shared__ float warp_results[kMaxBlockThreads / warp_size()];
  const int lane = threadIdx.x % warp_size();
  const int warp = threadIdx.x / warp_size();
  const int num_warps = blockDim.x / warp_size();
  value = warp_reduce(value, op);
  __syncthreads();
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  // Every warp reduces the per-warp results itself, which saves a broadcast through shared memory.
  value = lane < num_warps ? warp_results[lane] : identity;
  return warp_reduce(value, op);
}

__device__ __forceinline__ float block_reduce_sum(float value) { return block_reduce(value, SumOp{}, 0.0f); }
__device__ __forceinline__ float block_reduce_max(float value) { return block_reduce(value, MaxOp{}, -INFINITY); }

}  // namespace tt::kernels

#endif  // defined(__CUDACC__) || defined(__HIP__)
