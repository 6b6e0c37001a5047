// Multi-tensor AdamW: fp32 master weights and moments, decoupled weight decay, bias correction from a
// step counter on the device, optional global-norm gradient clipping computed on the device, and the
// low-precision compute copies of the weights written in the same pass.
//
// Why on the device: a CUDA/HIP graph replays the same kernel arguments every step, so anything that
// changes from step to step (the step count, the clip factor) has to live in device memory. Why a list of
// pointers in the kernel arguments: the whole model's parameters in one or two launches instead of a
// dozen elementwise kernels per parameter, and no pointer table to upload when eager steps allocate
// fresh gradients.
//
// The update is memory-bound (about 30 bytes per parameter: read master, gradient, two moments; write
// master, two moments, copy); each thread keeps kIlp independent elements in flight so loads overlap.
#include "adamw.cuh"

namespace tt::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kIlp = 4;
constexpr int kPrepareThreads = 256;

// =================================================================================================
// Kernels
// =================================================================================================

// The list entry that block `block` works on, and the first element of its chunk.
__device__ __forceinline__ int tensor_of_block(const AdamWTensorList& list, int64_t block) {
  int lo = 0, hi = list.count - 1;
  while (lo < hi) {  // the last i with first_block[i] <= block
    const int mid = (lo + hi + 1) / 2;
    if (list.first_block[mid] <= block) lo = mid; else hi = mid - 1;
  }
  return lo;
}

template <typename C>
__device__ __forceinline__ float gradient_at(const AdamWTensor& t, int64_t j) {
  float g = 0.0f;
  if (t.grad) g += t.grad[j];
  if (t.copy_grad) g += to_float(static_cast<const C*>(t.copy_grad)[j]);
  return g;
}

// Sum of squared gradients over each block's chunk, one partial per block, in a fixed order.
template <typename C>
__global__ void __launch_bounds__(kThreads) adamw_norm_kernel(AdamWTensorList list, float* partials) {
  const int i = tensor_of_block(list, blockIdx.x);
  const AdamWTensor& t = list.tensors[i];
  const int64_t start = (blockIdx.x - list.first_block[i]) * kAdamWChunk;
  const int64_t end = start + kAdamWChunk < t.numel ? start + kAdamWChunk : t.numel;
  float sum = 0.0f;
  for (int64_t j = start + threadIdx.x; j < end; j += kThreads) {
    const float g = gradient_at<C>(t, j);
    sum += g * g;
  }
  sum = block_reduce_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One block: the global norm from the partials (fixed order), the clip factor, the step counter and the
// bias corrections for this step.
__global__ void __launch_bounds__(kPrepareThreads)
    adamw_prepare_kernel(const float* partials, int64_t num_partials, AdamWHyper hyper, AdamWDeviceState* state) {
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < num_partials; j += kPrepareThreads) sum += partials[j];
  sum = block_reduce_sum(sum);
  if (threadIdx.x != 0) return;
  const float norm = sqrtf(sum);
  const float step = state->step + 1.0f;
  state->step = step;
  state->grad_norm = norm;
  state->clip_scale =
      hyper.max_grad_norm > 0.0 ? fminf(1.0f, static_cast<float>(hyper.max_grad_norm) / (norm + 1e-6f)) : 1.0f;
  // In double: 1 - beta2^t loses most of its digits in fp32 for beta2 near 1 and small t.
  const double bias_correction1 = 1.0 - pow(hyper.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - pow(hyper.beta2, static_cast<double>(step));
  state->step_size = static_cast<float>(hyper.lr / bias_correction1);
  state->bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
}

template <typename C>
__global__ void __launch_bounds__(kThreads)
    adamw_update_kernel(AdamWTensorList list, AdamWHyper hyper, const AdamWDeviceState* state) {
  const int i = tensor_of_block(list, blockIdx.x);
  const AdamWTensor& t = list.tensors[i];
  const int64_t start = (blockIdx.x - list.first_block[i]) * kAdamWChunk;
  const int64_t end = start + kAdamWChunk < t.numel ? start + kAdamWChunk : t.numel;
  const float clip_scale = state->clip_scale;
  const float step_size = state->step_size;
  const float bias_correction2_sqrt = state->bias_correction2_sqrt;
  // The same expression order as torch::optim::AdamW: decay, moments, then the bias-corrected step.
  const float decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  const float beta1 = static_cast<float>(hyper.beta1), one_minus_beta1 = static_cast<float>(1.0 - hyper.beta1);
  const float beta2 = static_cast<float>(hyper.beta2), one_minus_beta2 = static_cast<float>(1.0 - hyper.beta2);
  const float eps = static_cast<float>(hyper.eps);
  float* __restrict__ param = t.param;
  float* __restrict__ exp_avg = t.exp_avg;
  float* __restrict__ exp_avg_sq = t.exp_avg_sq;
  C* __restrict__ copy = static_cast<C*>(t.copy);

  for (int64_t base = start + threadIdx.x; base < end; base += kThreads * kIlp) {
    float p[kIlp], g[kIlp], m[kIlp], v[kIlp];
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t j = base + k * kThreads;
      if (j < end) {
        p[k] = param[j];
        g[k] = gradient_at<C>(t, j) * clip_scale;
        m[k] = exp_avg[j];
        v[k] = exp_avg_sq[j];
      }
    }
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t j = base + k * kThreads;
      if (j >= end) continue;
      const float decayed = p[k] * decay;
      const float m_new = beta1 * m[k] + one_minus_beta1 * g[k];
      const float v_new = beta2 * v[k] + one_minus_beta2 * g[k] * g[k];
      const float denom = sqrtf(v_new) / bias_correction2_sqrt + eps;
      const float p_new = decayed - step_size * m_new / denom;
      param[j] = p_new;
      exp_avg[j] = m_new;
      exp_avg_sq[j] = v_new;
      if (copy) copy[j] = from_float<C>(p_new);
    }
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

int64_t blocks_of(const AdamWTensorList& list) { return list.first_block[list.count]; }

}  // namespace

int64_t adamw_norm_partials(const AdamWTensorList* lists, int num_lists) {
  int64_t total = 0;
  for (int l = 0; l < num_lists; ++l) total += blocks_of(lists[l]);
  return total;
}

LaunchStatus adamw_step(const AdamWTensorList* lists, int num_lists, const AdamWHyper& hyper,
                        AdamWDeviceState* state, float* partials, DType copy_dtype, void* stream) {
  const gpuStream_t s = to_stream(stream);
  const bool clip = hyper.max_grad_norm > 0.0;
  int64_t num_partials = 0;
  dispatch_dtype(copy_dtype, [&](auto element) {
    using C = decltype(element);
    if (clip) {
      for (int l = 0; l < num_lists; ++l) {
        const int64_t blocks = blocks_of(lists[l]);
        if (blocks == 0) continue;
        adamw_norm_kernel<C><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(lists[l], partials + num_partials);
        num_partials += blocks;
      }
    }
    adamw_prepare_kernel<<<1, kPrepareThreads, 0, s>>>(partials, num_partials, hyper, state);
    for (int l = 0; l < num_lists; ++l) {
      const int64_t blocks = blocks_of(lists[l]);
      if (blocks == 0) continue;
      adamw_update_kernel<C><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(lists[l], hyper, state);
    }
  });
  return last_launch_status();
}

}  // namespace tt::kernels
