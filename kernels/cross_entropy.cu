// Fused softmax cross-entropy forward and backward.
//
// The unfused form (log_softmax, then gather, then mean) writes and rereads a [rows, vocab] tensor of
// log-probabilities; at vocab 32000 that tensor is the largest activation of a small model. Here the
// forward reads each row of logits once and writes 8 bytes per row (its logsumexp and loss), and the
// backward reads the row again and writes the gradient directly, recomputing each probability from the
// saved logsumexp.
#include <cfloat>
#include <cmath>
#include <initializer_list>

#include "cross_entropy.cuh"

namespace tt::kernels {

namespace {

// =================================================================================================
// Kernels
// =================================================================================================

// One block per row. Each thread keeps a running (max m, sum s of exp(x - m)) over its strided share of
// the row, rescaling s whenever m grows ("online softmax"): one exp per element and a single pass over
// the logits. The block then combines the threads' pairs: the row max M, then sum of s * exp(m - M).
template <typename T, int kVec>
__global__ void cross_entropy_forward_kernel(CrossEntropyForwardParams params) {
  start_after_previous_kernel();
  const int64_t row = blockIdx.x;
  const int vocab = static_cast<int>(params.vocab);
  const T* logits = static_cast<const T*>(params.logits) + row * params.vocab;

  // -FLT_MAX rather than -inf: a -inf logit then contributes exp(-inf) = 0 instead of exp(-inf + inf),
  // a NaN. A row of only -inf logits still ends as lse = -inf and a NaN loss, as in LibTorch.
  float running_max = -FLT_MAX;
  float running_sum = 0.0f;
  for (int col = threadIdx.x * kVec; col < vocab; col += blockDim.x * kVec) {
    const Pack<T, kVec> xs = load_pack<kVec>(logits + col);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const float x = to_float(xs.values[v]);
      if (x > running_max) {
        running_sum = running_sum * expf(running_max - x) + 1.0f;
        running_max = x;
      } else {
        running_sum += expf(x - running_max);
      }
    }
  }
  const float row_max = block_reduce_max(running_max);
  const float row_sum = block_reduce_sum(running_sum * expf(running_max - row_max));

  if (threadIdx.x == 0) {
    const float log_sum = logf(row_sum);
    const int64_t label = params.labels[row];
    float loss = 0.0f;
    if (label != params.ignore_index) {
      // (max - x) + log_sum rather than lse - x: when the row is confidently right, lse and x are
      // close large numbers and their difference would keep only the rounding error of lse.
      loss = label >= 0 && label < params.vocab ? (row_max - to_float(logits[label])) + log_sum : NAN;
    }
    params.lse[row] = row_max + log_sum;
    params.row_loss[row] = loss;
  }
}

// A single block sums the per-row losses and counts the valid rows. Thread t always takes rows
// t, t + blockDim.x, ..., and block_reduce combines the threads in a fixed order, so the mean is
// bitwise reproducible. The count is a float: exact up to 2^24 rows, far beyond a batch's.
__global__ void cross_entropy_mean_kernel(CrossEntropyForwardParams params) {
  start_after_previous_kernel();
  float sum = 0.0f;
  float count = 0.0f;
  for (int64_t row = threadIdx.x; row < params.rows; row += blockDim.x) {
    if (params.labels[row] != params.ignore_index) {
      sum += params.row_loss[row];
      count += 1.0f;
    }
  }
  sum = block_reduce_sum(sum);
  count = block_reduce_sum(count);
  if (threadIdx.x == 0) {
    *params.loss = sum / count;  // 0 / 0 = NaN when every row is ignored, as LibTorch's mean gives
    *params.num_valid = count;
  }
}

template <typename T, int kVec>
__global__ void cross_entropy_backward_kernel(CrossEntropyBackwardParams params) {
  start_after_previous_kernel();
  const int64_t row = blockIdx.x;
  const int vocab = static_cast<int>(params.vocab);
  const T* logits = static_cast<const T*>(params.logits) + row * params.vocab;
  T* grad = static_cast<T*>(params.grad_logits) + row * params.vocab;
  const int64_t label = params.labels[row];
  const int stride = blockDim.x * kVec;

  // The branch is uniform across the block: ignored rows only write zeros.
  if (label == params.ignore_index) {
    Pack<T, kVec> zeros;
#pragma unroll
    for (int v = 0; v < kVec; ++v) zeros.values[v] = from_float<T>(0.0f);
    for (int col = threadIdx.x * kVec; col < vocab; col += stride) store_pack<kVec>(grad + col, zeros);
    return;
  }

  // Each element is read, then written, by the same thread, so grad_logits may alias logits.
  const float scale = (params.grad_loss ? *params.grad_loss : 1.0f) / *params.num_valid;
  const float lse = params.lse[row];
  for (int col = threadIdx.x * kVec; col < vocab; col += stride) {
    const Pack<T, kVec> xs = load_pack<kVec>(logits + col);
    Pack<T, kVec> gs;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const float prob = expf(to_float(xs.values[v]) - lse);
      const float target = col + v == label ? 1.0f : 0.0f;
      gs.values[v] = from_float<T>((prob - target) * scale);
    }
    store_pack<kVec>(grad + col, gs);
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

// Up to 512 threads per row: at vocab 32000 in bf16 that is 8 accesses of 16 bytes per thread, enough
// to keep the loads in flight, while small vocabularies get fewer threads rather than idle ones.
template <int kVec>
int row_block_threads(int64_t vocab) {
  return block_threads_for((vocab + kVec - 1) / kVec, 512);
}

// The mean reads 16 bytes per row; one block of 1024 threads covers the rows of any batch in a few
// strides, and a second kernel is cheaper than a grid-wide reduction that stays deterministic.
constexpr int kMeanThreads = 1024;

template <typename T>
void forward_for_type(const CrossEntropyForwardParams& params, gpuStream_t stream) {
  const unsigned grid = static_cast<unsigned>(params.rows);
  if (use_wide<T>(params.vocab, {params.logits})) {
    constexpr int kVec = kWideVec<T>;
    launch_after_previous(cross_entropy_forward_kernel<T, kVec>, grid, row_block_threads<kVec>(params.vocab), 0, stream,
                          params);
  } else {
    launch_after_previous(cross_entropy_forward_kernel<T, 1>, grid, row_block_threads<1>(params.vocab), 0, stream,
                          params);
  }
}

template <typename T>
void backward_for_type(const CrossEntropyBackwardParams& params, gpuStream_t stream) {
  const unsigned grid = static_cast<unsigned>(params.rows);
  if (use_wide<T>(params.vocab, {params.logits, params.grad_logits})) {
    constexpr int kVec = kWideVec<T>;
    launch_after_previous(cross_entropy_backward_kernel<T, kVec>, grid, row_block_threads<kVec>(params.vocab), 0,
                          stream, params);
  } else {
    launch_after_previous(cross_entropy_backward_kernel<T, 1>, grid, row_block_threads<1>(params.vocab), 0, stream,
                          params);
  }
}

}  // namespace

LaunchStatus cross_entropy_forward(const CrossEntropyForwardParams& params, DType dtype, void* stream) {
  const gpuStream_t s = to_stream(stream);
  if (params.rows > 0) {
    dispatch_dtype(dtype, [&](auto element) { forward_for_type<decltype(element)>(params, s); });
  }
  // Runs even for zero rows, so the loss is defined (NaN, like an empty mean) rather than left unwritten.
  if (params.loss) launch_after_previous(cross_entropy_mean_kernel, 1, kMeanThreads, 0, s, params);
  return last_launch_status();
}

LaunchStatus cross_entropy_backward(const CrossEntropyBackwardParams& params, DType dtype, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) { backward_for_type<decltype(element)>(params, s); });
  return last_launch_status();
}

}  // namespace tt::kernels
