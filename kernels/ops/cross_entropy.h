// Fused softmax cross-entropy op layer: input checks, dispatch to the custom kernel on GPU tensors,
// real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// Mean over rows whose label != ignore_index of -log softmax(logits[row])[label]. logits [N, V] (fp32,
// bf16 or fp16; the loss is accumulated in fp32 and returned as an fp32 scalar), labels [N] int64.
// Differentiable in logits.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, int64_t ignore_index);

// The output head and the loss in one op: cross_entropy(hidden @ weight^T, labels), taken chunk_rows rows at a
// time so that the [N, V] logits and their gradient never exist whole, only one [chunk_rows, V] buffer in
// hidden's dtype. The forward computes the gradients too, since it holds each chunk's logits: our kernels turn
// them into their own gradient in place, and two GEMMs take it to hidden's and weight's gradient (weight's
// accumulated over chunks in weight's dtype). The backward only scales those by the incoming gradient.
// hidden [N, H] and weight [V, H] of one dtype (fp32, bf16 or fp16), labels [N] int64; an fp32 scalar loss
// (fp64 for fp64 inputs). Autocast does not apply inside: cast the inputs as the head's GEMM would.
torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                   const torch::Tensor& labels, int64_t ignore_index, int64_t chunk_rows);

}  // namespace tt::ops
