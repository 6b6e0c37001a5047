// Embedding op layer: the table lookup with our backward kernel.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// weight[ids]: weight [vocab, dim] (fp32 on the GPU path), ids of any shape (Long); returns [..., dim].
// Differentiable in weight: the forward is ATen's lookup, the backward our kernel on GPU tensors
// (kernels/embedding.cuh: every row of the gradient written once, in a fixed order, no zeroing pass) and
// ATen's embedding_dense_backward on CPU tensors.
torch::Tensor embedding(const torch::Tensor& weight, const torch::Tensor& ids);

}  // namespace tt::ops
