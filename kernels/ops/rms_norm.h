// RMSNorm op layer: input checks, dispatch to the custom kernel on GPU tensors, real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight. x [..., H] (fp32, bf16 or fp16), weight [H]
// (any float dtype). Differentiable in x and weight. CPU tensors take the ATen formulation of the same
// forward and backward.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The residual add fused with the RMSNorm after it, for pre-norm blocks:
//   residual_out = residual + delta,   y = rms_norm(residual_out, weight, eps) in out_dtype.
// One kernel each way: the forward writes both outputs, and the backward adds residual_out's gradient to the
// norm's, writing the sum once in the residual's dtype and once in delta's. With out_dtype bf16 and an fp32
// residual (mixed precision) this also replaces the casts around the norm. delta may be undefined (a block's
// first norm): residual_out is then residual itself. delta must have the residual's shape; out_dtype must be
// the residual's dtype or, for an fp32 residual, bf16 or fp16; delta is taken in out_dtype.
struct AddRmsNormOutput {
  torch::Tensor residual;  // residual + delta
  torch::Tensor normalized;
};
AddRmsNormOutput add_rms_norm(const torch::Tensor& residual, const torch::Tensor& delta, const torch::Tensor& weight,
                              double eps, torch::ScalarType out_dtype);

}  // namespace tt::ops
