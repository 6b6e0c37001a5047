// Flash attention launchers: causal softmax(q k^T / sqrt(D)) v for q [B, Hq, S, D] and k, v [B, Hkv, S, D],
// grouped-query (query head h reads key/value head h / (Hq / Hkv)), without materialising the S x S scores,
// optionally with RoPE applied to q and k as they are loaded.
// Plain pointers and strides; inputs are checked by the op layer (kernels/ops/flash_attention.cpp).
//
// Three generations of kernels implement it (README's attention page measures the steps between them):
//  * register tiles (flash_attention.cu): after FlashAttention-2, scores and probabilities never leave
//    registers, tiles stream in through cp.async; bf16/fp16 on NVIDIA sm_80+;
//  * shared-memory tiles (flash_attention_tiled.cu): every score tile goes through shared memory in fp32,
//    vendor-neutral (WMMA, MFMA or FMA units); fp32 everywhere, and every dtype on AMD;
//  * Hopper (flash_attention_hopper.cu): after FlashAttention-3, TMA loads by a producer warpgroup and wgmma
//    products by two or three consumer warpgroups; a persistent forward, and a deterministic backward on wgmma
//    (one fused kernel at head_dim 64 from 1,024 positions, dQ summed over key blocks in a fixed order; the
//    register generation's two kernels elsewhere, in one grid below 4,096 positions); bf16/fp16, head_dim 64 and
//    128, no RoPE, NVIDIA sm_90a builds on sm_90 GPUs.
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

// Element strides of one [B, H, S, D] operand's batch, head and sequence dims; the head dim (D) itself is
// contiguous. That lets q, k and v be views into a fused QKV projection, and the output be written in
// [B, S, H, D] order, without a copy. Rows move in 16-byte accesses: every data pointer and every stride must
// be a multiple of 16 bytes (8 bf16/fp16 elements, 4 fp32 elements).
struct FlashStrides {
  int64_t batch;
  int64_t head;
  int64_t seq;
};

struct FlashForwardParams {
  const void* q;  // [batch, q_heads, seq, head_dim], dtype
  const void* k;  // [batch, kv_heads, seq, head_dim], dtype
  const void* v;  // [batch, kv_heads, seq, head_dim], dtype
  void* out;      // [batch, q_heads, seq, head_dim], dtype
  FlashStrides q_strides;
  FlashStrides k_strides;
  FlashStrides v_strides;
  FlashStrides out_strides;
  float* lse;  // [batch, q_heads, seq], contiguous: log-sum-exp of each query's scaled scores, for the backward
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;  // divides q_heads
  int64_t seq;
  int64_t head_dim;  // 16, 32, 64 or 128
  // RoPE on q and k as they are loaded (register tiles only): fp32 tables [>= seq, head_dim / 2], contiguous and
  // 16-byte aligned, rotating consecutive pairs (x0, x1) of position s by angle (cos, sin)[s] as tt::ops::rope
  // does. nullptr: q and k are used as they are.
  const float* rope_cos;
  const float* rope_sin;
  // With RoPE: where the rotated q and k are written, shaped like q and k (the backward reads them).
  void* q_rotated;
  void* k_rotated;
  FlashStrides q_rotated_strides;
  FlashStrides k_rotated_strides;
};

struct FlashBackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* out;       // the forward's output
  const void* grad_out;  // same shape as out
  const float* lse;      // from the forward
  void* grad_q;          // shaped like q
  void* grad_k;          // shaped like k
  void* grad_v;          // shaped like v
  FlashStrides q_strides;
  FlashStrides k_strides;
  FlashStrides v_strides;
  FlashStrides out_strides;
  FlashStrides grad_out_strides;
  FlashStrides grad_q_strides;
  FlashStrides grad_k_strides;
  FlashStrides grad_v_strides;
  float* delta;  // [batch, q_heads, seq] scratch, contiguous: rowsum(grad_out * out)
  // The fused Hopper backward's scratch (nullptr for the others; hopper_backward_fused says where): dQ summed over
  // key blocks in fp32, [batch, q_heads, hopper_grad_q_tiles(seq) * kHopperGradQTileRows, head_dim] floats in whole
  // query tiles (each tile in the kernel's own order), and a turn counter per tile, [batch, q_heads,
  // hopper_grad_q_tiles(seq)], both contiguous (the prologue kernel zeroes them).
  float* grad_q_accum;
  int* grad_q_turns;
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t seq;
  int64_t head_dim;
  // RoPE, as in FlashForwardParams: q and k are then the forward's q_rotated and k_rotated, and grad_q and
  // grad_k are rotated back, to be those of the unrotated q and k.
  const float* rope_cos;
  const float* rope_sin;
};

enum class FlashKernel {
  kRegisterTiles,      // flash_attention.cu
  kSharedMemoryTiles,  // flash_attention_tiled.cu
  kHopper              // flash_attention_hopper.cu
};

// The kernel generation that serves `dtype` in this build: register tiles for bf16/fp16 on CUDA builds,
// shared-memory tiles otherwise.
FlashKernel default_flash_kernel(DType dtype);

// Whether `kernel` exists for `dtype` in this build (for kHopper: and on the current GPU).
bool flash_kernel_available(FlashKernel kernel, DType dtype);

// Writes out and lse. Memory: O(seq) per head; the scores live one tile at a time in shared memory.
LaunchStatus flash_attention_forward(const FlashForwardParams& params, DType dtype, void* stream,
                                     FlashKernel kernel);

// Writes grad_q, grad_k and grad_v, bitwise reproducible: FlashAttention-2's two-kernel scheme, no atomics (the
// Hopper generation at head_dim 64: one kernel, dQ's shares added by bulk reductions in a fixed order).
LaunchStatus flash_attention_backward(const FlashBackwardParams& params, DType dtype, void* stream,
                                      FlashKernel kernel);

// The shared-memory generation (flash_attention_tiled.cu); the two entry points above dispatch to it.
// rope_cos/rope_sin must be nullptr.
LaunchStatus flash_attention_forward_tiled(const FlashForwardParams& params, DType dtype, void* stream);
LaunchStatus flash_attention_backward_tiled(const FlashBackwardParams& params, DType dtype, void* stream);

// The Hopper generation (flash_attention_hopper.cu), which the two entry points above dispatch to; it refuses
// RoPE and head dims other than 64 and 128. hopper_flash_present: the current GPU is sm_90 and this build
// has the kernels' sm_90a code.
LaunchStatus flash_attention_forward_hopper(const FlashForwardParams& params, DType dtype, void* stream);
LaunchStatus flash_attention_backward_hopper(const FlashBackwardParams& params, DType dtype, void* stream);
bool hopper_flash_present();
// Whether the Hopper backward at this head_dim and length is the fused kernel (five products per tile pair; dQ
// summed over key blocks in turns), which needs FlashBackwardParams' grad_q_accum and grad_q_turns; elsewhere two
// kernels run without them. The fused kernel exists at head dim 64 (at 128 its block does not fit shared memory),
// and runs from kHopperFusedBackwardFromSeq positions: below, its prologue and epilogue cost more than its two saved
// products (H100, docs/attention.md).
constexpr bool hopper_backward_fusable(int64_t head_dim) { return head_dim == 64; }
constexpr int64_t kHopperFusedBackwardFromSeq = 1024;
constexpr bool hopper_backward_fused(int64_t head_dim, int64_t seq) {
  return hopper_backward_fusable(head_dim) && seq >= kHopperFusedBackwardFromSeq;
}
// Elsewhere FlashAttention-2's scheme: a dQ kernel and a dK/dV kernel. Below kHopperTwoBackwardKernelsFromSeq
// positions their blocks run in one grid, after a prologue that writes delta (hopper_backward_one_grid): where the
// key blocks are about one wave of SMs, the dK/dV kernel on its own waits for its longest block (the first key block
// sees every query) with the SMs of the short ones idle, and the dQ items fill them. At 4,096 positions (head dim
// 128) the dK/dV blocks already balance over two waves, and the one grid measured 0.7-3.2% slower than the two
// kernels (H200, alternated three times; inferred, not profiled: the prologue's extra pass over O and dO;
// docs/attention.md).
constexpr int64_t kHopperTwoBackwardKernelsFromSeq = 4096;
constexpr bool hopper_backward_one_grid(int64_t head_dim, int64_t seq) {
  return !hopper_backward_fused(head_dim, seq) && seq < kHopperTwoBackwardKernelsFromSeq;
}
// The fused kernel's query tiles, each with one turn counter.
constexpr int64_t kHopperGradQTileRows = 64;
constexpr int64_t hopper_grad_q_tiles(int64_t seq) { return (seq + kHopperGradQTileRows - 1) / kHopperGradQTileRows; }

#if defined(__CUDACC__) || defined(__HIP__)
// =================================================================================================
// Shared by the generations' sources (flash_attention.cu, flash_attention_tiled.cu, flash_attention_hopper.cu)
// =================================================================================================
namespace flash {

template <typename T>
__device__ inline const T* head_ptr(const void* base, const FlashStrides& strides, int64_t batch, int64_t head) {
  return static_cast<const T*>(base) + batch * strides.batch + head * strides.head;
}
template <typename T>
__device__ inline T* head_ptr(void* base, const FlashStrides& strides, int64_t batch, int64_t head) {
  return static_cast<T*>(base) + batch * strides.batch + head * strides.head;
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 1/sqrt(D). The kernels fold log2(e) into it and use exp2 for exp.
template <int kD>
__device__ inline float softmax_scale() {
  return 1.0f / sqrtf(static_cast<float>(kD));
}

// Sum over the kLanes consecutive lanes that share a row (kLanes divides every warp width): a butterfly, so all
// of them end with the same value, combined in the same order on every run.
template <int kLanes>
__device__ inline float lanes_sum(float value) {
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) value += shfl_xor(value, offset);
  return value;
}

inline unsigned blocks_for(int64_t rows, int rows_per_block) {
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}

// The one switch from the runtime head_dim to the kernels' compile-time one: calls f with
// std::integral_constant<int, head_dim>, or returns false for a head_dim without kernels.
template <typename F>
bool dispatch_head_dim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 16: f(std::integral_constant<int, 16>{}); return true;  // small teaching models (configs/smoke.json)
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

constexpr const char* kUnsupportedHeadDim = "flash attention kernels exist for head_dim 16, 32, 64 and 128 only";

}  // namespace flash
#endif  // defined(__CUDACC__) || defined(__HIP__)

}  // namespace tt::kernels
