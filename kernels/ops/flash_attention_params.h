#pragma once
// The flash attention kernels' parameter blocks, filled from [B, H, S, D] tensors. The op fills them this way for
// every launch (kernels/ops/flash_attention.cpp), and the GPU tests that launch a kernel directly (on guarded or
// garbage-filled buffers) call the same builders, so that a field added to a block is filled in one place.

#include <torch/torch.h>

#include "kernels/flash_attention.cuh"

namespace tt::ops::detail {

// A [B, H, S, D] tensor's batch, head and position strides, in elements (the head dim is contiguous).
kernels::FlashStrides flash_strides(const torch::Tensor& t);

// q, k, v: inputs as the kernels read them (kernel-ready: 16-byte rows, any batch/head/seq strides); out: where the
// output goes, shaped like q; lse: fp32, B x H x S contiguous entries from its data pointer. No RoPE: a caller with
// RoPE tables sets rope_cos/rope_sin and the rotated outputs itself.
kernels::FlashForwardParams flash_forward_params(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                                 const torch::Tensor& out, const torch::Tensor& lse);

// The forward's tensors, the incoming gradient (shaped like out) and where the three gradients go; delta: fp32
// scratch of B x H x S entries; grad_q_accum and grad_q_turns: the fused Hopper backward's dQ sums and turns
// (kernels::hopper_backward_fused), undefined for the kernels that do not use them. No RoPE, as above.
kernels::FlashBackwardParams flash_backward_params(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, const torch::Tensor& out,
                                                   const torch::Tensor& lse, const torch::Tensor& grad_out,
                                                   const torch::Tensor& grad_q, const torch::Tensor& grad_k,
                                                   const torch::Tensor& grad_v, const torch::Tensor& delta,
                                                   const torch::Tensor& grad_q_accum,
                                                   const torch::Tensor& grad_q_turns);

}  // namespace tt::ops::detail
