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
// The update is memory-bound (28 bytes per parameter: read master, gradient, two moments; write master,
// two moments, and in bf16 read a bf16 gradient and write the copy instead of reading an fp32 gradient;
// 20 bytes with the moments in bf16).
// Each thread moves 16-byte packs of four fp32 elements, kIlp packs in flight, where alignment allows:
// scalar accesses with the same in-flight depth reached 2.2 TB/s on an H100 (389 us for the workshop
// model's 31M parameters in bf16), short of its 3.35 TB/s.
#include "adamw.cuh"

namespace tt::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kIlp = 2;  // packs in flight per thread: 2 x 16 bytes from each of four fp32 arrays
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
  start_after_previous_kernel();
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

// One block: the global norm from the partials (fixed order), the clip factor, the step counter, this
// step's learning rate from the schedule, and the bias corrections for this step.
__global__ void __launch_bounds__(kPrepareThreads)
    adamw_prepare_kernel(const float* partials, int64_t num_partials, AdamWHyper hyper, AdamWDeviceState* state) {
  start_after_previous_kernel();
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
  // In double, then rounded once, as the constants were when the rate came from the host: the constant
  // schedule returns peak_lr exactly, so its updates are bitwise those of a fixed rate.
  const double lr = lr_at(hyper.schedule, static_cast<double>(step));
  state->lr = static_cast<float>(lr);
  state->decay = static_cast<float>(1.0 - lr * hyper.weight_decay);
  state->step_size = static_cast<float>(lr / bias_correction1);
  state->bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
}

// One element's update, in the same expression order as torch::optim::AdamW: decay, moments, then the
// bias-corrected step.
struct AdamWMath {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt;

  __device__ __forceinline__ void apply(float& p, float g, float& m, float& v) const {
    m = beta1 * m + one_minus_beta1 * g;
    v = beta2 * v + one_minus_beta2 * g * g;
    const float denom = sqrtf(v) / bias_correction2_sqrt + eps;
    p = p * decay - step_size * m / denom;
  }
};

// Whether every array of tensor t may be read kVec elements at a time from any multiple of kVec.
template <typename C, typename S, int kVec>
__device__ __forceinline__ bool packs_fit(const AdamWTensor& t) {
  const auto aligned = [](const void* ptr, size_t bytes) {
    return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  return t.numel % kVec == 0 && aligned(t.param, 4 * kVec) && aligned(t.grad, 4 * kVec) &&
         aligned(t.exp_avg, sizeof(S) * kVec) && aligned(t.exp_avg_sq, sizeof(S) * kVec) &&
         aligned(t.copy_grad, sizeof(C) * kVec) && aligned(t.copy, sizeof(C) * kVec);
}

// kVec moments of type S from ptr, as floats.
template <int kVec, typename S>
__device__ __forceinline__ Pack<float, kVec> load_moments(const S* ptr) {
  const Pack<S, kVec> stored = load_pack<kVec>(ptr);
  Pack<float, kVec> out;
#pragma unroll
  for (int e = 0; e < kVec; ++e) out.values[e] = to_float(stored.values[e]);
  return out;
}

template <int kVec, typename S>
__device__ __forceinline__ void store_moments(S* ptr, const Pack<float, kVec>& values) {
  Pack<S, kVec> stored;
#pragma unroll
  for (int e = 0; e < kVec; ++e) stored.values[e] = from_float<S>(values.values[e]);
  store_pack<kVec>(ptr, stored);
}

// Elements [start, end) of t, kVec at a time (16-byte loads of fp32 for kVec = 4), with kIlp packs in
// flight per thread. Moments of type S: fp32, or bf16 (8 bytes fewer per parameter; the update itself
// computes in fp32, with the moments as loaded, and rounds only what it stores).
template <typename C, typename S, int kVec>
__device__ __forceinline__ void update_range(const AdamWTensor& t, int64_t start, int64_t end, const AdamWMath& math,
                                             float clip_scale) {
  const S* exp_avg = static_cast<const S*>(t.exp_avg);
  const S* exp_avg_sq = static_cast<const S*>(t.exp_avg_sq);
  for (int64_t base = start + threadIdx.x * kVec; base < end; base += kThreads * kVec * kIlp) {
    Pack<float, kVec> p[kIlp], g[kIlp], m[kIlp], v[kIlp];
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t j = base + static_cast<int64_t>(k) * kThreads * kVec;
      if (j >= end) continue;
      p[k] = load_pack<kVec>(t.param + j);
      m[k] = load_moments<kVec>(exp_avg + j);
      v[k] = load_moments<kVec>(exp_avg_sq + j);
#pragma unroll
      for (int e = 0; e < kVec; ++e) g[k].values[e] = 0.0f;
      if (t.grad) g[k] = load_pack<kVec>(t.grad + j);
      if (t.copy_grad) {
        const Pack<C, kVec> cg = load_pack<kVec>(static_cast<const C*>(t.copy_grad) + j);
#pragma unroll
        for (int e = 0; e < kVec; ++e) g[k].values[e] += to_float(cg.values[e]);
      }
    }
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t j = base + static_cast<int64_t>(k) * kThreads * kVec;
      if (j >= end) continue;
      Pack<C, kVec> copy;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        math.apply(p[k].values[e], g[k].values[e] * clip_scale, m[k].values[e], v[k].values[e]);
        copy.values[e] = from_float<C>(p[k].values[e]);
      }
      store_pack<kVec>(t.param + j, p[k]);
      store_moments<kVec>(static_cast<S*>(t.exp_avg) + j, m[k]);
      store_moments<kVec>(static_cast<S*>(t.exp_avg_sq) + j, v[k]);
      if (t.copy) store_pack<kVec>(static_cast<C*>(t.copy) + j, copy);
    }
  }
}

// Block b of the grid updates chunks b, b + gridDim.x, ...: one chunk each when the grid covers them all.
template <typename C, typename S>
__global__ void __launch_bounds__(kThreads)
    adamw_update_kernel(AdamWTensorList list, AdamWHyper hyper, const AdamWDeviceState* state) {
  start_after_previous_kernel();
  const AdamWMath math{state->decay,
                       static_cast<float>(hyper.beta1),
                       static_cast<float>(1.0 - hyper.beta1),
                       static_cast<float>(hyper.beta2),
                       static_cast<float>(1.0 - hyper.beta2),
                       static_cast<float>(hyper.eps),
                       state->step_size,
                       state->bias_correction2_sqrt};
  const float clip_scale = state->clip_scale;
  for (int64_t block = blockIdx.x; block < list.first_block[list.count]; block += gridDim.x) {
    const int i = tensor_of_block(list, block);
    const AdamWTensor& t = list.tensors[i];
    const int64_t start = (block - list.first_block[i]) * kAdamWChunk;
    const int64_t end = start + kAdamWChunk < t.numel ? start + kAdamWChunk : t.numel;
    // Chunks start at multiples of kAdamWChunk, a multiple of 4: aligned tensors stay aligned per chunk.
    if (packs_fit<C, S, 4>(t)) {
      update_range<C, S, 4>(t, start, end, math, clip_scale);
    } else {
      update_range<C, S, 1>(t, start, end, math, clip_scale);
    }
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

int64_t blocks_of(const AdamWTensorList& list) { return list.first_block[list.count]; }

}  // namespace

LaunchStatus adamw_norm(const AdamWTensorList* lists, int num_lists, float* partials, DType copy_dtype, void* stream) {
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(copy_dtype, [&](auto element) {
    using C = decltype(element);
    for (int l = 0; l < num_lists; ++l) {
      const int64_t blocks = blocks_of(lists[l]);
      if (blocks == 0) continue;
      launch_after_previous(adamw_norm_kernel<C>, static_cast<unsigned>(blocks), kThreads, 0, s, lists[l], partials);
      partials += blocks;
    }
  });
  return last_launch_status();
}

LaunchStatus adamw_prepare(const float* partials, int64_t num_partials, const AdamWHyper& hyper,
                           AdamWDeviceState* state, void* stream) {
  launch_after_previous(adamw_prepare_kernel, 1, kPrepareThreads, 0, to_stream(stream), partials, num_partials, hyper,
                        state);
  return last_launch_status();
}

LaunchStatus adamw_update(const AdamWTensorList* lists, int num_lists, const AdamWHyper& hyper,
                          const AdamWDeviceState* state, DType copy_dtype, DType state_dtype, int64_t max_blocks,
                          void* stream) {
  const gpuStream_t s = to_stream(stream);
  auto launch = [&](auto copy_element, auto state_element) {
    using C = decltype(copy_element);
    using S = decltype(state_element);
    for (int l = 0; l < num_lists; ++l) {
      int64_t blocks = blocks_of(lists[l]);
      if (blocks == 0) continue;
      if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
      launch_after_previous(adamw_update_kernel<C, S>, static_cast<unsigned>(blocks), kThreads, 0, s, lists[l], hyper,
                            state);
    }
  };
  dispatch_dtype(copy_dtype, [&](auto copy_element) {
    if (state_dtype == DType::kBFloat16) {
      launch(copy_element, bf16{});
    } else {
      launch(copy_element, float{});
    }
  });
  return last_launch_status();
}

}  // namespace tt::kernels
