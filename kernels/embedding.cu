// Embedding backward: one block per kRows rows of the table. The block finds, in ascending order, the
// positions that looked one of its rows up (a scan of the ids, a tile of block-size ids at a time, warps taking
// their matches' places in order by ballot), and then sums, row by row, those positions' gradient rows column by
// column in that order. ATen's embedding_dense_backward zeroes the table's gradient in a pass of its own and then
// sums into it (for many ids, after sorting them: about twenty kernels); writing every row once, zeros included,
// needs neither. Rows looked up at more positions than the shared list holds are summed in several passes, each adding
// to the rows it wrote before.
#include "embedding.cuh"

namespace tt::kernels {
namespace {

constexpr int kThreads = 128;        // a multiple of kMaxWarpSize: whole warps on both vendors
constexpr int kListCapacity = 1024;  // positions held in shared memory per pass (a multiple of kThreads)
static_assert(kThreads % kMaxWarpSize == 0 && kListCapacity % kThreads == 0, "whole warps, whole tiles");

template <int kVec, int kRows>
__global__ void __launch_bounds__(kThreads) embedding_backward_kernel(EmbeddingBackwardParams p) {
  start_after_previous_kernel();
  static_assert(kRows <= INT8_MAX, "rows_of holds a row of the block in an int8_t");
  // The listed positions, ascending (tokens < 2^31: the op checks), and which of the block's rows each looked up.
  __shared__ int positions[kListCapacity];
  __shared__ int8_t rows_of[kListCapacity];
  __shared__ int warp_counts[kThreads / warp_size()];
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int rows = static_cast<int>(p.vocab - row0 < kRows ? p.vocab - row0 : kRows);
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x) / warp_size();
  const int warps = kThreads / warp_size();

  int64_t next = 0;  // the first id not yet scanned
  bool first_pass = true;
  do {
    // Collect positions until the list could overflow with another tile.
    int count = 0;
    for (; next < p.tokens && count + kThreads <= kListCapacity; next += kThreads) {
      const int64_t i = next + threadIdx.x;
      const int64_t r = i < p.tokens ? p.ids[i] - row0 : -1;
      const bool hit = r >= 0 && r < rows;
      const unsigned long long lanes = warp_ballot(hit);
      if (lane == 0) warp_counts[warp] = __popcll(lanes);
      __syncthreads();
      int slot = count;  // matches of lower warps in this tile, then of lower lanes in this warp
      for (int w = 0; w < warp; ++w) slot += warp_counts[w];
      if (hit) {
        slot += __popcll(lanes & ((1ull << lane) - 1));
        positions[slot] = static_cast<int>(i);
        rows_of[slot] = static_cast<int8_t>(r);
      }
      for (int w = 0; w < warps; ++w) count += warp_counts[w];
      __syncthreads();  // warp_counts is rewritten by the next tile
    }
    // Each row: the sum of its listed positions' rows, in list order, onto what earlier passes wrote (or zeros).
    for (int r = 0; r < rows; ++r) {
      float* out = p.grad_weight + (row0 + r) * p.dim;
      for (int64_t col = static_cast<int64_t>(threadIdx.x) * kVec; col < p.dim; col += kThreads * kVec) {
        Pack<float, kVec> acc;
        if (first_pass) {
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc.values[v] = 0.0f;
        } else {
          acc = load_pack<kVec>(out + col);
        }
        for (int m = 0; m < count; ++m) {
          if (rows_of[m] != r) continue;
          const Pack<float, kVec> g = load_pack<kVec>(p.grad_out + static_cast<int64_t>(positions[m]) * p.dim + col);
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc.values[v] += g.values[v];
        }
        store_pack<kVec>(out + col, acc);
      }
    }
    first_pass = false;
    __syncthreads();  // every thread is done with the list before the next pass refills it
  } while (next < p.tokens);
}

// Rows per block: one, unless that makes more than kManyBlocks blocks; then eight, so that each scan of the ids
// serves eight rows. Each block's scan is a chain of waits on memory, hidden only by other blocks: a 1,000-row
// table at 8,192 ids took 47 us with a block per row and 91 us with eight rows per block (125 blocks, in v4's
// profile); a 32,000-row one at 2,048 ids, 204.0 us forward + backward with a block per row and 136.1 with eight
// (kernel_bench; H100). kManyBlocks lies between those two sizes and was not tuned further.
constexpr int64_t kManyBlocks = 8192;
constexpr int kRowsWhenMany = 8;

template <int kVec>
void launch(const EmbeddingBackwardParams& params, gpuStream_t stream) {
  if (params.vocab > kManyBlocks) {
    const auto blocks = static_cast<unsigned>((params.vocab + kRowsWhenMany - 1) / kRowsWhenMany);
    launch_after_previous(embedding_backward_kernel<kVec, kRowsWhenMany>, blocks, kThreads, 0, stream, params);
  } else {
    launch_after_previous(embedding_backward_kernel<kVec, 1>, static_cast<unsigned>(params.vocab), kThreads, 0, stream,
                          params);
  }
}

}  // namespace

LaunchStatus embedding_backward(const EmbeddingBackwardParams& params, void* stream) {
  if (params.vocab == 0 || params.dim == 0) return {};
  const gpuStream_t s = to_stream(stream);
  if (use_wide<float>(params.dim, {params.grad_out, params.grad_weight})) {
    launch<kWideVec<float>>(params, s);
  } else {
    launch<1>(params, s);
  }
  return last_launch_status();
}

}  // namespace tt::kernels
