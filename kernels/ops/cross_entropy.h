// Fused softmax cross-entropy op layer: input checks, dispatch to the custom kernel on GPU tensors,
// real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// Mean over rows whose label != ignore_index of -log softmax(logits[row])[label]. logits [N, V] (fp32,
// bf16 or fp16; the loss is accumulated in fp32 and returned as an fp32 scalar), labels [N] int64.
// Differentiable in logits.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, int64_t ignore_index);

}  // namespace tt::ops
