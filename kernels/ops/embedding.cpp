// Embedding op layer: checks inputs, looks rows up with ATen, and runs our backward kernel on GPU tensors
// (ATen's embedding_dense_backward on CPU tensors, the reference the GPU tests compare with).
#include "kernels/ops/embedding.h"

#include <c10/core/DeviceGuard.h>

#include <limits>

#include "kernels/ops/common.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/embedding.cuh"
#endif

namespace tt::ops {
namespace {

void check_inputs(const torch::Tensor& weight, const torch::Tensor& ids) {
  TORCH_CHECK(weight.defined() && ids.defined(), "tt::ops::embedding: weight and ids must be defined tensors");
  TORCH_CHECK(weight.dim() == 2, "tt::ops::embedding: weight must have shape [vocab, dim], got ", weight.sizes());
  TORCH_CHECK(ids.scalar_type() == torch::kLong, "tt::ops::embedding: ids must be Long, got ", ids.scalar_type());
  TORCH_CHECK(ids.device() == weight.device(), "tt::ops::embedding: ids are on ", ids.device(), " but weight is on ",
              weight.device());
  if (weight.is_cpu()) return;
  detail::check_gpu_input("embedding", "weight", weight);
#ifdef TT_HAVE_GPU_KERNELS
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32,
              "tt::ops::embedding: the GPU backward writes an fp32 gradient, so weight must be Float, got ",
              weight.scalar_type());
  TORCH_CHECK(
      ids.numel() <= std::numeric_limits<int32_t>::max() && weight.size(0) <= std::numeric_limits<int32_t>::max(),
      "tt::ops::embedding: the GPU kernel handles at most 2^31 - 1 ids and table rows, got ", ids.numel(), " ids and ",
      weight.size(0), " rows");
#endif
}

#ifdef TT_HAVE_GPU_KERNELS
// ids contiguous; grad_out [..., dim], the gradient of the fp32 lookup (copied contiguous fp32 if it is not). The
// ids are in [0, vocab): the forward's at::embedding refused any other (the kernel would skip one silently).
torch::Tensor backward_gpu(const torch::Tensor& grad_out, const torch::Tensor& ids, int64_t vocab) {
  c10::DeviceGuard guard(grad_out.device());
  const int64_t dim = grad_out.size(-1);
  auto grad = grad_out.to(torch::kFloat32).contiguous();
  auto grad_weight = torch::empty({vocab, dim}, grad.options());
  kernels::EmbeddingBackwardParams params{};
  params.ids = ids.data_ptr<int64_t>();
  params.grad_out = grad.data_ptr<float>();
  params.grad_weight = grad_weight.data_ptr<float>();
  params.tokens = ids.numel();
  params.vocab = vocab;
  params.dim = dim;
  detail::check_launch("embedding", kernels::embedding_backward(params, detail::current_stream(grad)),
                       "embedding_backward");
  return grad_weight;
}
#endif

}  // namespace

// Saves the ids (contiguous) and the table's row count: the backward needs nothing else.
struct EmbeddingFunction : torch::autograd::Function<EmbeddingFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight, const torch::Tensor& ids) {
    check_inputs(weight, ids);
    const auto flat_ids = ids.contiguous();
    ctx->save_for_backward({flat_ids});
    ctx->saved_data["vocab"] = weight.size(0);
    return at::embedding(weight, flat_ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto ids = ctx->get_saved_variables()[0];
    const int64_t vocab = ctx->saved_data["vocab"].toInt();
    const auto& grad = grad_outputs[0];
    if (ids.is_cpu())
      return {at::embedding_dense_backward(grad, ids, vocab, /*padding_idx=*/-1, /*scale_grad_by_freq=*/false),
              torch::Tensor()};
#ifdef TT_HAVE_GPU_KERNELS
    return {backward_gpu(grad, ids, vocab), torch::Tensor()};
#else
    return {torch::Tensor(), torch::Tensor()};
#endif
  }
};

torch::Tensor embedding(const torch::Tensor& weight, const torch::Tensor& ids) {
  return EmbeddingFunction::apply(weight, ids);
}

}  // namespace tt::ops
