// RMSNorm forward and backward.
//
// One block per row. RMSNorm is memory-bound: the forward reads x once for the sum of squares and once
// more to scale it, the second read being served by L1/L2 (a row is a few KB), so DRAM sees x once.
// The weight gradient sums over rows, deterministically (no float atomics). Up to kMaxOneLaunchRows rows with a
// 16-bit compute dtype, in the backward's own launch: blocks of a second kind each sum a few columns over every row.
// Otherwise each row block of the backward accumulates its rows into a private row of a [num_partials, hidden] fp32
// scratch buffer and a second kernel sums that buffer over blocks in a fixed order.
#include <type_traits>

#include "rms_norm.cuh"

namespace tt::kernels {

namespace {

// A row block of the backward handles rows b, b + row_blocks, ... (these counts were tuned for the two-kernel path;
// the one-launch path takes the same counts, not tuned for it). Capping their number keeps
// the partial-sum scratch (num_partials * hidden * 4 bytes) small next to the activations (2 MB at
// hidden 512, 8 MB at 2048). The cap was 256: at the long-context shape (8192 rows of 512, 128 threads a
// block) that left 8 warps per H100 SM, and one backward took 46 us where its 48 MB of traffic need about
// 16 us; 1024 blocks keep about 30 warps per SM. Below the cap a block takes at least kRowsPerPartial rows:
// with one row each (the workshop's 1024 rows), the weight-gradient kernel read back a scratch buffer as
// large as x, 2 MB in 8 blocks at hidden 512 (its column split then), and took 5.2 us of the backward's 9 (H100, bf16
// v4 step). A floor of kMinBackwardBlocks blocks where there are rows enough: at the workshop's 1024 rows, 4 rows a
// block left 256 blocks (2 a SM); 2 rows a block (512 blocks) made the bf16 v4 step 1.559 ms instead of 1.582 (H100,
// two runs each in one call; the step's RMSNorm kernels, forward included, 170 instead of 195 us), 1 row a block 1.563
// ms. The medium config (2048 rows, 512 blocks at 4 rows) was not faster with 1 or 2 rows a block (34.36-34.46 ms
// against 34.22-34.32; repeats differed by up to 0.10 ms), so the floor leaves it at 4.
constexpr int64_t kMaxBackwardPartials = 1024;
constexpr int64_t kMinBackwardBlocks = 512;
constexpr int64_t kRowsPerPartial = 4;

// Up to this many rows, and with a 16-bit compute dtype, the weight gradient is summed in the backward's own launch
// (rms_norm_backward_kernel): one launch a norm instead of two, 17 fewer kernels in the workshop's v4 bf16 step (180
// instead of 197). Its column blocks read every row, a chain of loads for each row lane, so the chains grow with the
// rows per row lane (rows over a lane count that follows from hidden). Only three shapes were measured (H200, v4, one
// launch against two alternated; session notes dev1129 c2, c3), and the threshold sits between them:
//   bf16 workshop (1,024 rows, 16 a row lane): 1.2792-1.2862 ms against 1.2892-1.2942 (five pairs in two calls);
//   bf16 medium (2,048 rows, 8 a row lane): 30.59-30.75 ms against 30.48-30.60, inside what its repeats differ by;
//   bf16 long-context (8,192 rows, 128 a row lane): 7.20-7.24 ms against 6.94-6.98: slower, two kernels there;
//   fp32 workshop: 6.467-6.480 ms against 6.377-6.384, slower (the backward 13.6 us a call against 6.6 + 6.0 for
//   the two kernels): fp32 keeps two kernels.
// Measured on 80d1a06, where one kernel held both forms (39 registers a thread for both, against 30 for each form now
// built apart: rms_norm_backward_kernel's kOneLaunch). The forms built apart, timed at 1aeab9a (dev1129b c2): workshop
// 1.2825-1.2828 ms against 1.2900-1.2926 (three pairs), medium 30.71/30.93 against 30.79/30.67; long-context and
// fp32 were not timed again.
constexpr int64_t kMaxOneLaunchRows = 2048;

int64_t row_blocks_for(int64_t rows) {
  int64_t blocks = (rows + kRowsPerPartial - 1) / kRowsPerPartial;
  if (blocks < kMinBackwardBlocks) blocks = rows < kMinBackwardBlocks ? rows : kMinBackwardBlocks;
  return blocks < kMaxBackwardPartials ? blocks : kMaxBackwardPartials;
}

bool one_launch(int64_t rows, DType compute) { return rows <= kMaxOneLaunchRows && compute != DType::kFloat32; }

// =================================================================================================
// Kernels
// =================================================================================================

// T is the residual stream's element type, C the compute dtype (rms_norm.cuh). Both loops of a thread visit
// the same columns, so the second reads back the residual_out values this thread itself wrote in the first.
template <typename T, typename C, int kVec>
__global__ void rms_norm_forward_kernel(RmsNormForwardParams params) {
  start_after_previous_kernel();
  const int64_t row = blockIdx.x;
  const int hidden = static_cast<int>(params.hidden);
  const int64_t offset = row * params.hidden;
  const T* x = static_cast<const T*>(params.x) + offset;
  const C* delta = params.delta ? static_cast<const C*>(params.delta) + offset : nullptr;
  T* residual_out = params.residual_out ? static_cast<T*>(params.residual_out) + offset : nullptr;
  C* y = static_cast<C*>(params.y) + offset;
  const int stride = blockDim.x * kVec;

  float sum_squares = 0.0f;
  for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
    Pack<T, kVec> hs = load_pack<kVec>(x + col);
    if (delta) {
      // Rounded to T before it is squared: the norm sees exactly the residual stream it stores, as it
      // would after a separate add kernel.
      const Pack<C, kVec> ds = load_pack<kVec>(delta + col);
#pragma unroll
      for (int v = 0; v < kVec; ++v) hs.values[v] = from_float<T>(to_float(hs.values[v]) + to_float(ds.values[v]));
      store_pack<kVec>(residual_out + col, hs);
    }
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const float value = to_float(hs.values[v]);
      sum_squares += value * value;
    }
  }
  const float inv_rms = rsqrtf(block_reduce_sum(sum_squares) / static_cast<float>(hidden) + params.eps);
  if (threadIdx.x == 0) params.inv_rms[row] = inv_rms;

  const T* h = delta ? residual_out : x;
  for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
    const Pack<T, kVec> hs = load_pack<kVec>(h + col);
    const Pack<float, kVec> ws = load_pack<kVec>(params.weight + col);
    Pack<C, kVec> ys;
#pragma unroll
    for (int v = 0; v < kVec; ++v) ys.values[v] = from_float<C>(to_float(hs.values[v]) * inv_rms * ws.values[v]);
    store_pack<kVec>(y + col, ys);
  }
}

// With r = inv_rms and a = grad_y * weight:
//   grad_x = r * (a - x * r^2 * mean(a * x)) [+ grad_residual],   grad_weight = sum over rows of grad_y * x * r.
// One row's term of grad_weight, in the one rounding order both paths use:
__device__ __forceinline__ float weight_grad_term(float grad_y, float x, float inv_rms) {
  return grad_y * (x * inv_rms);
}

// Row blocks compute grad_x a row at a time (grad_x_rows). Up to kMaxOneLaunchRows rows with a 16-bit compute dtype
// (one_launch), column blocks in the same launch sum the weight gradient (weight_gradient_columns below): it needs only
// grad_y, x and the forward's inv_rms, not grad_x, so neither kind of block waits for the other. Otherwise the row
// blocks also write partial sums of it and rms_norm_weight_grad_kernel adds those up.
template <typename T, typename C, int kVec, bool kPartials>
__device__ void grad_x_rows(const RmsNormBackwardParams& params, int64_t row_block, int64_t row_blocks) {
  const int hidden = static_cast<int>(params.hidden);
  const int stride = blockDim.x * kVec;
  // kPartials: this block's partial row of the weight gradient. Each thread owns the same columns of it for every
  // row the block visits, so the read-modify-write below needs no synchronisation; the row stays in L2 between visits.
  float* partial = kPartials ? params.weight_grad_partial + row_block * params.hidden : nullptr;

  for (int64_t row = row_block; row < params.rows; row += row_blocks) {
    const int64_t offset = row * params.hidden;
    const T* x = static_cast<const T*>(params.x) + offset;
    const C* grad_y = static_cast<const C*>(params.grad_y) + offset;
    const T* grad_residual = params.grad_residual ? static_cast<const T*>(params.grad_residual) + offset : nullptr;
    T* grad_x = static_cast<T*>(params.grad_x) + offset;
    C* grad_delta = params.grad_delta ? static_cast<C*>(params.grad_delta) + offset : nullptr;
    const float inv_rms = params.inv_rms[row];

    float dot = 0.0f;
    for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
      const Pack<T, kVec> xs = load_pack<kVec>(x + col);
      const Pack<C, kVec> gs = load_pack<kVec>(grad_y + col);
      const Pack<float, kVec> ws = load_pack<kVec>(params.weight + col);
#pragma unroll
      for (int v = 0; v < kVec; ++v) dot += to_float(gs.values[v]) * ws.values[v] * to_float(xs.values[v]);
    }
    const float coefficient = inv_rms * inv_rms * block_reduce_sum(dot) / static_cast<float>(hidden);

    // The first row a block visits initialises its partial row, so the scratch needs no zeroing pass.
    const bool first_row = row == row_block;
    for (int col = threadIdx.x * kVec; col < hidden; col += stride) {
      const Pack<T, kVec> xs = load_pack<kVec>(x + col);
      const Pack<C, kVec> gs = load_pack<kVec>(grad_y + col);
      const Pack<float, kVec> ws = load_pack<kVec>(params.weight + col);
      Pack<T, kVec> rs;
      if (grad_residual) rs = load_pack<kVec>(grad_residual + col);
      Pack<float, kVec> acc;
      if constexpr (kPartials) {
        if (first_row) {
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc.values[v] = 0.0f;
        } else {
          acc = load_pack<kVec>(partial + col);
        }
      }
      Pack<T, kVec> dxs;
      Pack<C, kVec> dds;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float xv = to_float(xs.values[v]);
        const float gv = to_float(gs.values[v]);
        // The norm's part is rounded to T before the residual gradient joins it, as autograd's sum of the two
        // gradients of a separate add would.
        T dx = from_float<T>(inv_rms * (gv * ws.values[v] - xv * coefficient));
        if (grad_residual) dx = from_float<T>(to_float(dx) + to_float(rs.values[v]));
        dxs.values[v] = dx;
        dds.values[v] = from_float<C>(to_float(dx));
        if constexpr (kPartials) acc.values[v] += weight_grad_term(gv, xv, inv_rms);
      }
      store_pack<kVec>(grad_x + col, dxs);
      if (grad_delta) store_pack<kVec>(grad_delta + col, dds);
      if constexpr (kPartials) store_pack<kVec>(partial + col, acc);
    }
  }
}

// A column block's kWeightGradColumns columns are kWeightGradColumns / kVec threads wide, one pack each; the block's
// other threads split the rows: row lane l sums rows l, l + row_lanes, ... in that order. The row lanes of a warp are
// then added by a fixed xor tree, and the warps' sums in warp order. A column block has the row blocks' size (one
// launch, one block size: row_block_threads), so its number of row lanes, the length of its chains and its summation
// order follow from hidden, the pack width and the warp size: the same order in every run on one kind of GPU, so the
// gradient is bitwise reproducible there. Eight columns, as in the second kernel: one 32-byte sector of each row of
// an fp32 x (half of one of a 16-bit grad_y); not tuned.
constexpr int kWeightGradColumns = 8;

template <typename T, typename C, int kVec>
__device__ void weight_gradient_columns(const RmsNormBackwardParams& params, int64_t column_block) {
  static_assert(kWeightGradColumns % kVec == 0, "a column block is whole packs wide");
  constexpr int kColumnThreads = kWeightGradColumns / kVec;
  static_assert(warp_size() % kColumnThreads == 0, "a warp holds whole rows of a column block");
  __shared__ float warp_sums[kMaxBlockThreads / warp_size()][kWeightGradColumns];
  const int64_t first_col = column_block * kWeightGradColumns;
  const int64_t col = first_col + threadIdx.x % kColumnThreads * kVec;
  const int64_t row_lanes = blockDim.x / kColumnThreads;
  float sums[kVec] = {};
  // The wide path keeps hidden a multiple of kVec, so a pack is wholly inside the row or wholly past its end.
  if (col < params.hidden) {
    const T* x = static_cast<const T*>(params.x) + col;
    const C* grad_y = static_cast<const C*>(params.grad_y) + col;
    // kUnroll rows' loads in flight before their adds, which still run in row order. Not timed alone: 4 took the
    // kernel from 30 to 48 registers a thread (fp32 residual, bf16 compute), which its row blocks would pay too.
    constexpr int kUnroll = 2;
    int64_t row = threadIdx.x / kColumnThreads;
    for (; row + (kUnroll - 1) * row_lanes < params.rows; row += kUnroll * row_lanes) {
      Pack<T, kVec> xs[kUnroll];
      Pack<C, kVec> gs[kUnroll];
      float inv_rms[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = row + u * row_lanes;
        xs[u] = load_pack<kVec>(x + r * params.hidden);
        gs[u] = load_pack<kVec>(grad_y + r * params.hidden);
        inv_rms[u] = params.inv_rms[r];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int v = 0; v < kVec; ++v)
          sums[v] += weight_grad_term(to_float(gs[u].values[v]), to_float(xs[u].values[v]), inv_rms[u]);
    }
    for (; row < params.rows; row += row_lanes) {
      const Pack<T, kVec> xs = load_pack<kVec>(x + row * params.hidden);
      const Pack<C, kVec> gs = load_pack<kVec>(grad_y + row * params.hidden);
      const float inv_rms = params.inv_rms[row];
#pragma unroll
      for (int v = 0; v < kVec; ++v)
        sums[v] += weight_grad_term(to_float(gs.values[v]), to_float(xs.values[v]), inv_rms);
    }
  }
  // Lanes kColumnThreads apart hold the same columns.
  for (int offset = kColumnThreads; offset < warp_size(); offset *= 2)
#pragma unroll
    for (int v = 0; v < kVec; ++v) sums[v] += shfl_xor(sums[v], offset);
  const int lane = static_cast<int>(threadIdx.x) % warp_size();
  const int warp = static_cast<int>(threadIdx.x) / warp_size();
  if (lane < kColumnThreads)
#pragma unroll
    for (int v = 0; v < kVec; ++v) warp_sums[warp][lane * kVec + v] = sums[v];
  __syncthreads();
  if (threadIdx.x < kWeightGradColumns && first_col + threadIdx.x < params.hidden) {
    float total = 0.0f;
    const int warps = static_cast<int>(blockDim.x) / warp_size();
    for (int w = 0; w < warps; ++w) total += warp_sums[w][threadIdx.x];
    params.grad_weight[first_col + threadIdx.x] = total;
  }
}

__host__ __device__ constexpr int64_t column_blocks_for(int64_t hidden) {
  return (hidden + kWeightGradColumns - 1) / kWeightGradColumns;
}

// kOneLaunch: blocks [0, column_blocks_for(hidden)) are column blocks, first so that their longer chains start first,
// the rest row blocks. Otherwise the two-kernel path's first kernel: row blocks that write partial sums, compiled
// without the column blocks' code, so that it keeps the registers it had before the one-launch form existed (30 a
// thread instead of 39 for an fp32 residual with bf16 compute: nvcc sizes a kernel's registers for its largest path).
template <typename T, typename C, int kVec, bool kOneLaunch>
__global__ void rms_norm_backward_kernel(RmsNormBackwardParams params) {
  start_after_previous_kernel();
  if constexpr (kOneLaunch) {
    const int64_t column_blocks = column_blocks_for(params.hidden);
    const int64_t block = blockIdx.x;
    if (block < column_blocks) {
      weight_gradient_columns<T, C, kVec>(params, block);
    } else {
      grad_x_rows<T, C, kVec, false>(params, block - column_blocks, gridDim.x - column_blocks);
    }
  } else {
    grad_x_rows<T, C, kVec, true>(params, blockIdx.x, gridDim.x);
  }
}

// The two-kernel path's second kernel: grad_weight[col] = sum over b of partial[b, col], always in the same order
// (below).
// A block covers kWeightGradColumns consecutive columns (one 32-byte sector of each partial row when hidden is a
// multiple of 8) with kWeightGradLanes threads per column; lane l sums partials l, l + kWeightGradLanes, ..., then lane
// 0 adds the lane results in lane order. Each lane's sum is a chain of L2 trips, so the split favours many short chains
// side by side. At the workshop's 512 partial rows of 512 columns, 32 columns x 16 lanes a block (16 blocks, 32 loads a
// lane) made the bf16 v4 step 1.3019-1.3024 ms, and 8 x 64 (64 blocks, 8 loads a lane, all in flight at once)
// 1.2922-1.2936 ms: H200, alternated x3 in one call. Long-context and medium, old split then new, did not differ
// beyond their repeats (6.943-6.989 and 6.943-6.944 ms; 30.81-30.88 and 30.79-30.82 ms).
constexpr int kWeightGradLanes = 64;
static_assert(kWeightGradColumns * kWeightGradLanes % kMaxWarpSize == 0 &&
                  kWeightGradColumns * kWeightGradLanes <= kMaxBlockThreads,
              "whole warps on both vendors, within a block");

__global__ void rms_norm_weight_grad_kernel(const float* partial, int64_t num_partials, int64_t hidden,
                                            float* grad_weight) {
  start_after_previous_kernel();
  __shared__ float lane_sums[kWeightGradLanes][kWeightGradColumns];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWeightGradColumns + threadIdx.x;
  float sum = 0.0f;
  if (col < hidden) {
    // kUnroll loads in flight before their adds, which still run in the order b, b + kWeightGradLanes, ... (the
    // same sum, bit for bit): the partial rows lie hidden * 4 bytes apart, so each load is its own trip to L2. Not
    // timed alone; the step times quoted above kMinBackwardBlocks were measured with it.
    constexpr int kUnroll = 8;
    int64_t b = threadIdx.y;
    for (; b + (kUnroll - 1) * kWeightGradLanes < num_partials; b += kUnroll * kWeightGradLanes) {
      float values[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) values[u] = partial[(b + u * kWeightGradLanes) * hidden + col];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += values[u];
    }
    for (; b < num_partials; b += kWeightGradLanes) sum += partial[b * hidden + col];
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

// The pack width is the residual type's (the wider of the two, 16 bytes); the compute-dtype rows then move
// in packs of as many elements, which must be aligned for that too.
template <typename T, typename C>
bool use_wide_rows(int64_t hidden, std::initializer_list<const void*> residual_rows,
                   std::initializer_list<const void*> compute_rows, std::initializer_list<const float*> fp32_rows) {
  if (!use_wide<T>(hidden, residual_rows, fp32_rows)) return false;
  for (const void* p : compute_rows)
    if (!is_pack_aligned<C, kWideVec<T>>(p)) return false;
  return true;
}

// Calls f(T{}, C{}) for the pairs rms_norm.cuh names; the others are never instantiated.
template <typename F>
void dispatch_pair(DType residual, DType compute, F&& f) {
  dispatch_dtype(residual, [&](auto t) {
    dispatch_dtype(compute, [&](auto c) {
      using T = decltype(t);
      using C = decltype(c);
      if constexpr (std::is_same_v<T, C> || std::is_same_v<T, float>) f(t, c);
    });
  });
}

template <typename T, typename C>
void forward_for_types(const RmsNormForwardParams& params, gpuStream_t stream) {
  const bool wide =
      use_wide_rows<T, C>(params.hidden, {params.x, params.residual_out}, {params.delta, params.y}, {params.weight});
  auto launch = [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    launch_after_previous(rms_norm_forward_kernel<T, C, kVec>, static_cast<unsigned>(params.rows),
                          row_block_threads<kVec>(params.hidden), 0, stream, params);
  };
  if (wide) {
    launch(std::integral_constant<int, kWideVec<T>>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

template <typename T, typename C>
void backward_for_types(const RmsNormBackwardParams& params, gpuStream_t stream) {
  const bool wide = use_wide_rows<T, C>(params.hidden, {params.x, params.grad_residual, params.grad_x},
                                        {params.grad_y, params.grad_delta}, {params.weight, params.weight_grad_partial});
  const bool column_sums = params.num_partials == 0;  // rms_norm_backward checked it against one_launch
  const int64_t blocks = (column_sums ? column_blocks_for(params.hidden) : 0) + row_blocks_for(params.rows);
  auto launch = [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    auto* kernel = rms_norm_backward_kernel<T, C, kVec, false>;
    // fp32 compute never takes one launch (one_launch), so that form is not built for it.
    if constexpr (!std::is_same_v<C, float>)
      if (column_sums) kernel = rms_norm_backward_kernel<T, C, kVec, true>;
    launch_after_previous(kernel, static_cast<unsigned>(blocks), row_block_threads<kVec>(params.hidden), 0, stream,
                          params);
  };
  if (wide) {
    launch(std::integral_constant<int, kWideVec<T>>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

}  // namespace

LaunchStatus rms_norm_forward(const RmsNormForwardParams& params, DType residual, DType compute, void* stream) {
  if (params.rows == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_pair(residual, compute, [&](auto t, auto c) { forward_for_types<decltype(t), decltype(c)>(params, s); });
  return last_launch_status();
}

int64_t rms_norm_backward_num_partials(int64_t rows, DType compute) {
  return one_launch(rows, compute) ? 0 : row_blocks_for(rows);
}

LaunchStatus rms_norm_backward(const RmsNormBackwardParams& params, DType residual, DType compute, void* stream) {
  // Empty input: nothing to launch (the op layer returns a zero weight gradient for it).
  if (params.rows == 0) return {};
  // The path, the grid and the scratch follow from num_partials: a value from anywhere else would write past the
  // scratch or leave the gradient unwritten.
  if (params.num_partials != rms_norm_backward_num_partials(params.rows, compute) ||
      (params.num_partials > 0) != (params.weight_grad_partial != nullptr))
    return {
        "rms_norm_backward: num_partials must be rms_norm_backward_num_partials(rows, compute), with a scratch "
        "buffer (of that many rows) exactly when it is above 0"};
  const gpuStream_t s = to_stream(stream);
  dispatch_pair(residual, compute, [&](auto t, auto c) { backward_for_types<decltype(t), decltype(c)>(params, s); });
  if (params.num_partials == 0) return last_launch_status();  // one launch: the column blocks summed it
  const dim3 block(kWeightGradColumns, kWeightGradLanes);
  const dim3 grid(static_cast<unsigned>(column_blocks_for(params.hidden)));
  launch_after_previous(rms_norm_weight_grad_kernel, grid, block, 0, s, params.weight_grad_partial, params.num_partials,
                        params.hidden, params.grad_weight);
  return last_launch_status();
}

}  // namespace tt::kernels
