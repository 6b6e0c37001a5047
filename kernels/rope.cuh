// RoPE launchers: rotate consecutive pairs (x0, x1) of the head dim of q [B, S, Hq, D] and
// k [B, S, Hkv, D] by the angles of fp32 cos/sin tables [S, D/2], both tensors in one launch, and
// optionally copy a third tensor v unrotated in the same launch (the backward of the fused-QKV form
// writes dq, dk and dv into one [B, S, Hq + 2 Hkv, D] gradient that way, with no concatenation pass).
// Plain pointers and strides; inputs are checked by the op layer (kernels/ops/rope.cpp).
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

// Strides are in elements, for the batch, sequence and head dims, of the input and of the output; the
// head dim itself must be contiguous in both. That lets inputs be views into a fused QKV projection
// and outputs be views into one fused gradient, without a copy.
struct RopeTensor {
  const void* in;
  void* out;
  int64_t heads;  // 0: no such tensor
  int64_t in_stride_batch;
  int64_t in_stride_seq;
  int64_t in_stride_head;
  int64_t out_stride_batch;
  int64_t out_stride_seq;
  int64_t out_stride_head;
};

struct RopeParams {
  RopeTensor q;
  RopeTensor k;
  RopeTensor v;      // copied, not rotated; heads = 0 when there is none
  const float* cos;  // [seq, head_dim / 2], contiguous
  const float* sin;  // [seq, head_dim / 2], contiguous
  int64_t batch;
  int64_t seq;
  int64_t head_dim;  // even
};

// (x0, x1) -> (x0 c - x1 s, x0 s + x1 c).
LaunchStatus rope_forward(const RopeParams& params, DType dtype, void* stream);

// The rotation is orthogonal, so the gradient is the incoming gradient rotated by the opposite angle;
// pass the output gradients as `in` and the input gradients as `out`.
LaunchStatus rope_backward(const RopeParams& params, DType dtype, void* stream);

}  // namespace tt::kernels
