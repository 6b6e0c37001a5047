// RMSNorm forward and backward.
//
// One block per row. RMSNorm is memory-bound: the forward reads x once for the sum of squares and once
// more to scale it, the second read being served by L1/L2 (a row is a few KB), so DRAM sees x once.
// The weight gradient sums over rows; to keep it deterministic without float atomics, each block of the
// backward accumulates its rows into a private row of a [num_partials, hidden] fp32 scratch buffer and a
// second kernel sums that buffer over blocks in a fixed order.
#include "rms_norm.cuh"

namespace tt::kernels {

namespace {

// A block of the backward handles rows blockIdx.x, blockIdx.x + gridDim.x, ... Capping the grid keeps
// the partial-sum scratch (num_partials * hidden * 4 bytes) small next to the activations (2 MB at
// hidden 512, 8 MB at 2048). The cap was 256: at the long-context shape (8192 rows of 512, 128 threads a
// block) that left 8 warps per H100 SM, and one backward took 46 us where its 48 MB of traffic need about
// 16 us; 1024 blocks keep about 30 warps per SM.
constexpr int64_t kMaxBackwardPartials = 1024;

// =================================================================================================
// Kernels
// =================================================================================================

template <typename T, int kVec>
__global__ void rms_norm_forward_kernel(RmsNormForwardParams params) {
  const int64_t row = blockIdx.x;
  const int hidden = static_cast<int>(params.hidden);
  const T* x = static_cast<const T*>(params.x) + row * params.hidden;
  T* y = static_cast<T*>(params.y) + row * params.hidden;
  const int stride = blockDim.x * kVec;

  float sum_squares = 0.0f;
  for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
    const Pack<T, kVec> xs = load_pack<kVec>(x + col);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const float value = to_float(xs.values[v]);
      sum_squares += value * value;
    }
  }
  const float inv_rms = rsqrtf(block_reduce_sum(sum_squares) / static_cast<float>(hidden) + params.eps);
  if (threadIdx.x == 0) params.inv_rms[row] = inv_rms;

  for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
    const Pack<T, kVec> xs = load_pack<kVec>(x + col);
    const Pack<float, kVec> ws = load_pack<kVec>(params.weight + col);
    Pack<T, kVec> ys;
#pragma unroll
    for (int v = 0; v < kVec; ++v) ys.values[v] = from_float<T>(to_float(xs.values[v]) * inv_rms * ws.values[v]);
    store_pack<kVec>(y + col, ys);
  }
}

// With r = inv_rms and a = grad_y * weight:
//   grad_x = r * (a - x * r^2 * mean(a * x)),   grad_weight = sum over rows of grad_y * x * r.
template <typename T, int kVec>
__global__ void rms_norm_backward_kernel(RmsNormBackwardParams params) {
  const int hidden = static_cast<int>(params.hidden);
  const int stride = blockDim.x * kVec;
  // Each thread owns the same columns of this block's partial row for every row it visits, so the
  // read-modify-write below needs no synchronisation; the row stays in L2 between visits.
  float* partial = params.weight_grad_partial + blockIdx.x * params.hidden;

  for (int64_t row = blockIdx.x; row < params.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(params.x) + row * params.hidden;
    const T* grad_y = static_cast<const T*>(params.grad_y) + row * params.hidden;
    T* grad_x = static_cast<T*>(params.grad_x) + row * params.hidden;
    const float inv_rms = params.inv_rms[row];

    float dot = 0.0f;
    for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
      const Pack<T, kVec> xs = load_pack<kVec>(x + col);
      const Pack<T, kVec> gs = load_pack<kVec>(grad_y + col);
      const Pack<float, kVec> ws = load_pack<kVec>(params.weight + col);
#pragma unroll
      for (int v = 0; v < kVec; ++v) dot += to_float(gs.values[v]) * ws.values[v] * to_float(xs.values[v]);
    }
    const float coefficient = inv_rms * inv_rms * block_reduce_sum(dot) / static_cast<float>(hidden);

    // The first row a block visits initialises its partial row, so the scratch needs no zeroing pass.
    const bool first_row = row == blockIdx.x;
    for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
      const Pack<T, kVec> xs = load_pack<kVec>(x + col);
      const Pack<T, kVec> gs = load_pack<kVec>(grad_y + col);
      const Pack<float, kVec> ws = load_pack<kVec>(params.weight + col);
      Pack<float, kVec> acc;
      if (first_row) {
#pragma unroll
        for (int v = 0; v < kVec; ++v) acc.values[v] = 0.0f;
      } else {
        acc = load_pack<kVec>(partial + col);
      }
      Pack<T, kVec> dxs;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float xv = to_float(xs.values[v]);
        const float gv = to_float(gs.values[v]);
        dxs.values[v] = from_float<T>(inv_rms * (gv * ws.values[v] - xv * coefficient));
        acc.values[v] += gv * (xv * inv_rms);
      }
      store_pack<kVec>(grad_x + col, dxs);
      store_pack<kVec>(partial + col, acc);
    }
  }
}

// grad_weight[col] = sum over b of partial[b, col], always in the order b = 0, 1, 2, ...
// A block covers kColumns consecutive columns (coalesced reads of each partial row) with kLanes
// threads per column; lane l sums partials l, l + kLanes, ..., then lane 0 adds the kLanes results in
// lane order.
constexpr int kWeightGradColumns = 64;
constexpr int kWeightGradLanes = 8;

__global__ void rms_norm_weight_grad_kernel(const float* partial, int64_t num_partials, int64_t hidden,
                                            float* grad_weight) {
  __shared__ float lane_sums[kWeightGradLanes][kWeightGradColumns];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWeightGradColumns + threadIdx.x;
  float sum = 0.0f;
  if (col < hidden) {
    for (int64_t b = threadIdx.y; b < num_partials; b += kWeightGradLanes) sum += partial[b * hidden + col];
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    float total = 0.0f;
#pragma unroll
    for (int lane = 0; lane < kWeightGradLanes; ++lane) total += lane_sums[lane][threadIdx.x];
    grad_weight[col] = total;
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

// Up to 512 threads: enough lanes to keep a row's loads in flight, while a block still fits several
// times on an SM. Rows shorter than that get fewer threads rather than idle ones.
template <int kVec>
int row_block_threads(int64_t hidden) {
  return block_threads_for((hidden + kVec - 1) / kVec, 512);
}

template <typename T, int kVec>
void launch_forward(const RmsNormForwardParams& params, gpuStream_t stream) {
  rms_norm_forward_kernel<T, kVec>
      <<<static_cast<unsigned>(params.rows), row_block_threads<kVec>(params.hidden), 0, stream>>>(params);
}

template <typename T>
void forward_for_type(const RmsNormForwardParams& params, gpuStream_t stream) {
  if (use_wide<T>(params.hidden, {params.x, params.y}, {params.weight})) {
    launch_forward<T, kWideVec<T>>(params, stream);
  } else {
    launch_forward<T, 1>(params, stream);
  }
}

template <typename T, int kVec>
void launch_backward(const RmsNormBackwardParams& params, gpuStream_t stream) {
  rms_norm_backward_kernel<T, kVec>
      <<<static_cast<unsigned>(params.num_partials), row_block_threads<kVec>(params.hidden), 0, stream>>>(params);
}

template <typename T>
void backward_for_type(const RmsNormBackwardParams& params, gpuStream_t stream) {
  if (use_wide<T>(params.hidden, {params.x, params.grad_y, params.grad_x},
                  {params.weight, params.weight_grad_partial})) {
    launch_backward<T, kWideVec<T>>(params, stream);
  } else {
    launch_backward<T, 1>(params, stream);
  }
}

}  // namespace

LaunchStatus rms_norm_forward(const RmsNormForwardParams& params, DType dtype, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) { forward_for_type<decltype(element)>(params, s); });
  return last_launch_status();
}

int64_t rms_norm_backward_num_partials(int64_t rows) {
  return rows < kMaxBackwardPartials ? rows : kMaxBackwardPartials;
}

LaunchStatus rms_norm_backward(const RmsNormBackwardParams& params, DType dtype, void* stream) {
  // Empty input: nothing to launch (the op layer returns a zero weight gradient for it).
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) { backward_for_type<decltype(element)>(params, s); });
  const dim3 block(kWeightGradColumns, kWeightGradLanes);
  const dim3 grid(static_cast<unsigned>((params.hidden + kWeightGradColumns - 1) / kWeightGradColumns));
  rms_norm_weight_grad_kernel<<<grid, block, 0, s>>>(params.weight_grad_partial, params.num_partials, params.hidden,
                                                     params.grad_weight);
  return last_launch_status();
}

}  // namespace tt::kernels
