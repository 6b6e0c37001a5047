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

// Programmatic dependent launch of our kernels (launch_after_previous, in the GPU part below): on by default,
// off for the whole process with TT_PROGRAMMATIC_LAUNCH=0 in the environment or set_programmatic_launch(false)
// (tests compare both; kernel times in a profile mean something else with it on: docs/training.md). Defined in
// vendor.cu. An environment value other than 0 or 1 is refused (std::invalid_argument) at the first of these
// calls. programmatic_launch_available: on, and the current GPU runs this build's sm_90a code (an sm_90 GPU, a
// build whose architectures include 9.0a), the only code of ours that waits; remembered per device.
void set_programmatic_launch(bool on);
bool programmatic_launch_enabled();
// The environment's value read as the switch: unset or empty is on; anything but 0 or 1 is refused.
bool programmatic_launch_setting_from(const char* value);
bool programmatic_launch_available();

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
#include <mma.h>
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

// Lets `kernel` be launched with `bytes` of dynamic shared memory. NVIDIA requires this opt-in above 48 KB
// per block; AMD has no such limit below its 64 KB of LDS per workgroup, and accepts the call.
template <typename Kernel>
inline LaunchStatus allow_dynamic_shared_memory(Kernel* kernel, int bytes) {
#if defined(__HIP__)
  const gpuError_t error =
      hipFuncSetAttribute(reinterpret_cast<const void*>(kernel), hipFuncAttributeMaxDynamicSharedMemorySize, bytes);
#else
  const gpuError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
#endif
  return error == kGpuSuccess ? LaunchStatus{} : LaunchStatus{gpu_error_string(error)};
}

// =================================================================================================
// Programmatic dependent launch (NVIDIA sm_90+)
// =================================================================================================
//
// A kernel launched by launch_after_previous() may start while the kernel before it on the stream is still
// finishing: the launch itself and the placing of its blocks on SMs overlap the other's last blocks and its
// completion. What must not overlap is left to the kernel: each one launched this way begins with
// start_after_previous_kernel(), which waits until the previous kernel has completed and its writes are visible
// (griddepcontrol.wait), before any of its own global reads or writes; then lets the kernel after it launch the
// same way (griddepcontrol.launch_dependents: that kernel launches once every block of this one has issued it or
// exited). Because that comes after the wait, no kernel starts before the one two places earlier has completed.
// A kernel whose successor should not share its SMs for long calls the two halves itself, the second later
// (the attention's dQ kernel: flash_attention.cu). Where the launch is not programmatic (HIP,
// programmatic_launch_available() false, kernels of other libraries) both instructions do nothing, and the stream
// orders kernels as usual.

// griddepcontrol.wait: before this kernel's first global read or write.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// griddepcontrol.launch_dependents: only after wait_for_previous_kernel().
__device__ __forceinline__ void let_next_kernel_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void start_after_previous_kernel() {
  wait_for_previous_kernel();
  let_next_kernel_launch();
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), as a programmatic dependent launch where available.
// The kernel must begin with start_after_previous_kernel() (or wait_for_previous_kernel()). A rejected launch is
// reported, as any other, by the next last_launch_status().
template <typename... Params, typename... Args>
inline void launch_after_previous(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                  gpuStream_t stream, const Args&... args) {
#if !defined(__HIP__)
  if (programmatic_launch_available()) {
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    (void)cudaLaunchKernelEx(&config, kernel, args...);
    return;
  }
#endif
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
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

// Lanes of the calling warp whose predicate holds, bit l for lane l (64 bits: AMD's wavefronts are 64 lanes).
// Every lane of the warp must call it.
__device__ __forceinline__ unsigned long long warp_ballot(bool predicate) {
#if defined(__HIP__)
  // ROCm 5 has no _sync ballot; a wavefront executes in lockstep, so none is needed.
  return __ballot(predicate);
#else
  return __ballot_sync(0xffffffffu, predicate);
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

// =================================================================================================
// 16x16 matrix tiles: one warp's fp32 accumulator C += A B for 16x16x16 operands in shared memory
// =================================================================================================
//
// MmaTile<T> picks the unit per element type and target, at compile time:
//  * bf16/fp16 on NVIDIA sm_80+: tensor cores through nvcuda::wmma (m16n16k16, fp32 accumulators);
//  * bf16/fp16 on AMD CDNA2/CDNA3 (gfx90a, gfx94x): matrix cores through the MFMA builtins
//    v_mfma_f32_16x16x16{bf16_1k,f16} (wave64);
//  * everything else (fp32 everywhere, 16-bit types on other targets): the FMA units.
// Every implementation has the same interface. All lanes of the warp call each member together.
//   kElements             accumulator values per lane; operator[] reaches them in the implementation's
//                         layout, which kernels must not assume (WMMA leaves it unspecified): to know the
//                         row of a value, load() a tile holding row indices and read it back.
//   zero(), load(c, ldc), store(c, ldc)    fp32 row-major 16x16 in memory, ldc a multiple of 4.
//   mma_ab(a, lda, b, ldb)     C += A B,   A row-major (a[m * lda + k]), B row-major (b[k * ldb + n]);
//   mma_abt(a, lda, b, ldb)    C += A B^T, B given as its transpose, row-major (b[n * ldb + k]).
// Operand pointers must be 32-byte aligned and lda/ldb multiples of 8 elements (WMMA's rules).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define TT_MMA_WMMA 1
#elif defined(__HIP_DEVICE_COMPILE__) && (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || \
                                          defined(__gfx942__))
#define TT_MMA_MFMA 1
#endif

// Lane of the calling thread within its warp; the kernels that use these tiles launch 1-D blocks.
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % warp_size(); }

// FMA units. Lane l holds rows 2 * (l / kColGroups) + {0, 1} and kCols consecutive columns starting at
// kCols * (l % kColGroups): a 2 x kCols block, so each k step loads 2 values of A and kCols of B for
// 2 * kCols multiply-adds.
template <typename T>
struct FmaTile {
  static constexpr int kCols = 128 / warp_size();
  static constexpr int kColGroups = 16 / kCols;
  static constexpr int kElements = 2 * kCols;
  float x[kElements];

  __device__ float& operator[](int i) { return x[i]; }
  __device__ static int row0() { return 2 * (lane_id() / kColGroups); }
  __device__ static int col0() { return kCols * (lane_id() % kColGroups); }

  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < kElements; ++i) x[i] = 0.0f;
  }
  __device__ void load(const float* c, int ldc) {
#pragma unroll
    for (int i = 0; i < kElements; ++i) x[i] = c[(row0() + i / kCols) * ldc + col0() + i % kCols];
  }
  __device__ void store(float* c, int ldc) const {
#pragma unroll
    for (int i = 0; i < kElements; ++i) c[(row0() + i / kCols) * ldc + col0() + i % kCols] = x[i];
  }
  __device__ void mma_ab(const T* a, int lda, const T* b, int ldb) {
    const T* a_row = a + row0() * lda;
    const T* b_col = b + col0();
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const float a0 = to_float(a_row[k]);
      const float a1 = to_float(a_row[lda + k]);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float bv = to_float(b_col[k * ldb + c]);
        x[c] += a0 * bv;
        x[kCols + c] += a1 * bv;
      }
    }
  }
  __device__ void mma_abt(const T* a, int lda, const T* b, int ldb) {
    const T* a_row = a + row0() * lda;
    const T* b_row = b + col0() * ldb;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const float a0 = to_float(a_row[k]);
      const float a1 = to_float(a_row[lda + k]);
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float bv = to_float(b_row[c * ldb + k]);
        x[c] += a0 * bv;
        x[kCols + c] += a1 * bv;
      }
    }
  }
};

#if defined(TT_MMA_WMMA)
template <typename T>
struct WmmaTile {
  using Accumulator = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
  template <typename Layout>
  using OperandB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, Layout>;
  using OperandA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major>;
  static constexpr int kElements = Accumulator::num_elements;
  Accumulator acc;

  __device__ float& operator[](int i) { return acc.x[i]; }
  __device__ void zero() { nvcuda::wmma::fill_fragment(acc, 0.0f); }
  __device__ void load(const float* c, int ldc) { nvcuda::wmma::load_matrix_sync(acc, c, ldc, nvcuda::wmma::mem_row_major); }
  __device__ void store(float* c, int ldc) const {
    nvcuda::wmma::store_matrix_sync(c, acc, ldc, nvcuda::wmma::mem_row_major);
  }
  __device__ void mma_ab(const T* a, int lda, const T* b, int ldb) {
    OperandA fa;
    OperandB<nvcuda::wmma::row_major> fb;
    nvcuda::wmma::load_matrix_sync(fa, a, lda);
    nvcuda::wmma::load_matrix_sync(fb, b, ldb);
    nvcuda::wmma::mma_sync(acc, fa, fb, acc);
  }
  // B^T stored row-major is B stored column-major.
  __device__ void mma_abt(const T* a, int lda, const T* b, int ldb) {
    OperandA fa;
    OperandB<nvcuda::wmma::col_major> fb;
    nvcuda::wmma::load_matrix_sync(fa, a, lda);
    nvcuda::wmma::load_matrix_sync(fb, b, ldb);
    nvcuda::wmma::mma_sync(acc, fa, fb, acc);
  }
};
#endif

#if defined(TT_MMA_MFMA)
// Register layout of v_mfma_f32_16x16x16{bf16_1k,f16} on a 64-lane wave (AMD's matrix instruction
// calculator, CDNA2/CDNA3): with r = lane % 16 and q = 4 * (lane / 16), lane holds A[r][q + j] and
// B[q + j][r] for j = 0..3, and the result D[q + j][r]. Compiled with ROCm 5.2's hipcc for gfx90a and
// gfx940; not yet run on an AMD GPU.
template <typename T>
struct MfmaTile {
  using Accumulator = float __attribute__((ext_vector_type(4)));
  static constexpr int kElements = 4;
  float x[kElements];

  __device__ float& operator[](int i) { return x[i]; }
  __device__ static int r() { return lane_id() % 16; }
  __device__ static int q() { return 4 * (lane_id() / 16); }

  __device__ void zero() {
#pragma unroll
    for (int j = 0; j < kElements; ++j) x[j] = 0.0f;
  }
  __device__ void load(const float* c, int ldc) {
#pragma unroll
    for (int j = 0; j < kElements; ++j) x[j] = c[(q() + j) * ldc + r()];
  }
  __device__ void store(float* c, int ldc) const {
#pragma unroll
    for (int j = 0; j < kElements; ++j) c[(q() + j) * ldc + r()] = x[j];
  }
  __device__ void mma_ab(const T* a, int lda, const T* b, int ldb) {
    multiply(a + r() * lda + q(), 1, b + q() * ldb + r(), ldb);
  }
  __device__ void mma_abt(const T* a, int lda, const T* b, int ldb) {
    multiply(a + r() * lda + q(), 1, b + r() * ldb + q(), 1);
  }

 private:
  // a_step / b_step: distance between this lane's 4 consecutive k values of A and of B.
  __device__ void multiply(const T* a, int a_step, const T* b, int b_step) {
    Accumulator c = {x[0], x[1], x[2], x[3]};
    if constexpr (std::is_same_v<T, bf16>) {
      using Operand = short __attribute__((ext_vector_type(4)));
      Operand va, vb;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        va[j] = __builtin_bit_cast(short, a[j * a_step]);
        vb[j] = __builtin_bit_cast(short, b[j * b_step]);
      }
      c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(va, vb, c, 0, 0, 0);
    } else {
      static_assert(std::is_same_v<T, fp16>, "MfmaTile: bf16 or fp16 operands");
      using Operand = _Float16 __attribute__((ext_vector_type(4)));
      Operand va, vb;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        va[j] = __builtin_bit_cast(_Float16, a[j * a_step]);
        vb[j] = __builtin_bit_cast(_Float16, b[j * b_step]);
      }
      c = __builtin_amdgcn_mfma_f32_16x16x16f16(va, vb, c, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kElements; ++j) x[j] = c[j];
  }
};
#endif

template <typename T>
struct MmaTileFor {
  using type = FmaTile<T>;
};
#if defined(TT_MMA_WMMA)
template <>
struct MmaTileFor<bf16> {
  using type = WmmaTile<bf16>;
};
template <>
struct MmaTileFor<fp16> {
  using type = WmmaTile<fp16>;
};
#elif defined(TT_MMA_MFMA)
template <>
struct MmaTileFor<bf16> {
  using type = MfmaTile<bf16>;
};
template <>
struct MmaTileFor<fp16> {
  using type = MfmaTile<fp16>;
};
#endif

template <typename T>
using MmaTile = typename MmaTileFor<T>::type;

// =================================================================================================
// Register fragments of mma.sync.m16n8k16 (NVIDIA sm_80+): the vocabulary of the register-resident
// flash attention kernels (kernels/flash_attention.cu)
// =================================================================================================
//
// Unlike MmaTile above, these kernels depend on where each value lives, so the layout is stated once here
// (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). With g = lane / 4, t = lane % 4:
//   A (16 x 16, row-major, 4 registers of 2 elements):  a0 = (g, 2t..2t+1)      a1 = (g + 8, 2t..2t+1)
//                                                       a2 = (g, 2t+8..2t+9)    a3 = (g + 8, 2t+8..2t+9)
//   B (16 x 8, 2 registers of 2 elements):              b0 = (k 2t..2t+1, n g)   b1 = (k 2t+8..2t+9, n g)
//   C (16 x 8, fp32, 4 values):                         c0, c1 = (g, 2t..2t+1)   c2, c3 = (g + 8, 2t..2t+1)
// Two C fragments side by side (16 x 16) hold exactly the values an A fragment needs, in the same lanes:
// a softmax's probabilities become the A operand of the next product without leaving registers. A row is
// shared by the 4 lanes of a quad, so row reductions are two xor-shuffles (quad_max, quad_sum).
// ldmatrix.x4 loads four 8 x 8 matrices of 16-bit values from shared memory, lanes 8i..8i+7 giving the
// row addresses of matrix i, which lands in register i: one instruction fills an A fragment or two B
// fragments; with .trans each matrix arrives transposed (B fragments of a row-major [k][n] operand).
// cp.async copies 16 bytes global -> shared without passing through registers, so loads of the next tile
// overlap the products on the current one; its zero-fill form pads rows past the end of a sequence.
// mma.sync is defined on 32-lane warps, hence kMmaLanes rather than warp_size(); HIP builds do not use
// this section (their kernels are the shared-memory tiles above: see README).

#if defined(__CUDACC__) && !defined(__HIP__)
#define TT_MMA_SYNC 1

constexpr int kMmaLanes = 32;

__device__ __forceinline__ uint32_t shared_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// Four 8 x 8 matrices: register i from the rows whose addresses lanes 8i..8i+7 give.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a b for one 16 x 8 x 16 product, fp32 accumulators, T = bf16 or fp16 operands.
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, fp16>, "mma_16x8x16: bf16 or fp16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The 16 bits of a T, and back (mma.sync takes its operands as 32-bit registers of two 16-bit values).
__device__ __forceinline__ uint16_t bits_of(bf16 value) { return __bfloat16_as_ushort(value); }
__device__ __forceinline__ uint16_t bits_of(fp16 value) { return __half_as_ushort(value); }
template <typename T>
__device__ __forceinline__ T from_bits(uint16_t bits) {
  if constexpr (std::is_same_v<T, bf16>) {
    return __ushort_as_bfloat16(bits);
  } else {
    return __ushort_as_half(bits);
  }
}

// Two fp32 values rounded (to nearest even) into one register of two T, `low` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float low, float high) {
  return static_cast<uint32_t>(bits_of(from_float<T>(low))) | (static_cast<uint32_t>(bits_of(from_float<T>(high))) << 16);
}

// The pair a 32-bit register holds, as fp32.
template <typename T>
__device__ __forceinline__ void unpack_pair(uint32_t pair, float& low, float& high) {
  low = to_float(from_bits<T>(static_cast<uint16_t>(pair & 0xffffu)));
  high = to_float(from_bits<T>(static_cast<uint16_t>(pair >> 16)));
}

// 16 bytes global -> shared, asynchronously; `valid` false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
               "r"(valid ? 16 : 0));
}
// 4 bytes (a float of a row statistic); `valid` false writes zero.
__device__ __forceinline__ void cp_async_4(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared), "l"(global), "r"(valid ? 4 : 0));
}
// Closes the group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending committed groups are still in flight (this thread's copies only: a block
// barrier must follow before other threads read them).
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The value `lane` of the warp holds.
__device__ __forceinline__ float shfl_from(float value, int lane) { return __shfl_sync(0xffffffffu, value, lane); }

// Reductions over the 4 lanes of a quad, which share the rows of a C fragment.
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, shfl_xor(value, 1));
  return fmaxf(value, shfl_xor(value, 2));
}
__device__ __forceinline__ float quad_sum(float value) {
  value += shfl_xor(value, 1);
  return value + shfl_xor(value, 2);
}

// 2^x in one instruction of the special-function unit (ex2.approx.ftz): a result below 2^-126 becomes 0.
// Without -use_fast_math, exp2f wraps the same instruction in three more (a compare and two multiplies that keep
// subnormal results), and a softmax pays them for every score. A probability below 2^-126 is far below the fp32
// rounding of the row it belongs to: the forward's unnormalised row sums to at least 1 (its largest term is 1), the
// backward's recomputed P to 1. So flushing it to zero changes nothing measurable. FlashAttention gets the same
// single instruction by building with -use_fast_math.
__device__ __forceinline__ float exp2_flush_subnormal(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#endif  // NVIDIA

}  // namespace tt::kernels

#endif  // defined(__CUDACC__) || defined(__HIP__)
