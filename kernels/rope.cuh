// RoPE launchers: rotate consecutive pairs (x0, x1) of the head dim of q [B, S, Hq, D] and
// k [B, S, Hkv, D] by the angles of fp32 cos/sin tables [S, D/2], both tensors in one launch.
// Plain pointers and strides; inputs are checked by the op layer (kernels/ops/rope.cpp).
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

// Input strides are in elements, for the batch, sequence and head dims; the head dim itself must be
// contiguous. That lets q and k be views into a fused QKV projection without a copy. Outputs are
// contiguous [B, S, H, D].
struct RopeTensor {
  const void* in;
  void* out;
  int64_t heads;
  int64_t stride_batch;
  int64_t stride_seq;
  int64_t stride_head;
};

struct RopeParams {
  RopeTensor q;
  RopeTensor k;
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
