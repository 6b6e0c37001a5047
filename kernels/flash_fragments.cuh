// The register-resident flash attention's building blocks (kernels/flash_attention.cu), each a step with a
// name: shared tiles filled by cp.async (rows, per-query statistics, RoPE tables) and rotated in place; the
// mma.sync products over a warp's rows with their operands loaded by ldmatrix; where each accumulator value
// lies; the forward's causal mask and online softmax; staging a result for 16-byte stores. The fragment
// layouts are vendor.cuh's "Register fragments" table (g = lane / 4, t = lane % 4), which the ldmatrix
// addresses below are written against. NVIDIA sm_80+ only (TT_MMA_SYNC).
#pragma once

#include "flash_attention.cuh"

#if defined(TT_MMA_SYNC)

namespace tt::kernels::flash {

// Row pitch of a shared [rows][kD] tile, in elements: 16 bytes of padding shift consecutive rows by 4
// banks, so the 8 rows an ldmatrix matrix reads hit 8 different 16-byte bank groups (no conflicts), and
// every row start stays 16-byte aligned for cp.async and ldmatrix.
template <int kD>
constexpr int kPitch = kD + 8;

template <int kD>
constexpr int tile_bytes(int rows) {
  return rows * kPitch<kD> * 2;
}

__device__ __forceinline__ int lane() { return static_cast<int>(threadIdx.x) % kMmaLanes; }
__device__ __forceinline__ int warp() { return static_cast<int>(threadIdx.x) / kMmaLanes; }

// Starts copying rows [row0, row0 + kRows) of one head's [seq, kD] matrix (rows `stride` elements apart)
// into a shared tile; rows at or past `seq` become zeros (they add nothing to any product).
template <int kRows, int kD, int kThreads, typename T>
__device__ void load_rows_async(T* tile, const T* src, int64_t stride, int row0, int seq) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = c % kChunks * 8;
    const bool valid = row0 + r < seq;
    const T* from = src + static_cast<int64_t>(valid ? row0 + r : 0) * stride + col;
    cp_async_16(shared_address(tile + r * kPitch<kD> + col), from, valid);
  }
}

// Starts copying entries [row0, row0 + kRows) of a per-query fp32 statistic (lse or delta), zeros past seq.
template <int kRows, int kThreads>
__device__ void load_stats_async(float* dst, const float* src, int row0, int seq) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const bool valid = row0 + r < seq;
    cp_async_4(shared_address(dst + r), src + (valid ? row0 + r : 0), valid);
  }
}

// Starts copying rows [row0, row0 + kRows) of a RoPE table (kD / 2 floats per row) into shared memory; rows
// past seq become zeros.
template <int kRows, int kD, int kThreads>
__device__ void load_table_rows_async(float* dst, const float* table, int row0, int seq) {
  constexpr int kChunks = kD / 2 / 4;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = c % kChunks * 4;
    const bool valid = row0 + r < seq;
    cp_async_16(shared_address(dst + r * (kD / 2) + col), table + static_cast<int64_t>(valid ? row0 + r : 0) * (kD / 2) + col,
                valid);
  }
}

// RoPE on rows [0, kRows) of a shared tile, row r at position pos0 + r (rows past seq are zeros and stay
// so), by the table rows cos[r], sin[r] (kD / 2 floats each, in global or shared memory). Block-collective; the
// caller puts barriers around it. Each thread rotates 4 consecutive pairs per item (16 bytes of the tile and of
// each table), the items unrolled so that their loads are in flight together.
template <int kRows, int kD, int kThreads, typename T>
__device__ void rotate_rows(T* tile, int pos0, int seq, const float* cos, const float* sin) {
  constexpr int kPairsPerItem = 4;
  constexpr int kItemsPerRow = kD / 2 / kPairsPerItem;
  constexpr int kItems = kRows * kItemsPerRow;
#pragma unroll
  for (int it = 0; it < (kItems + kThreads - 1) / kThreads; ++it) {
    const int item = static_cast<int>(threadIdx.x) + it * kThreads;
    if (kItems % kThreads != 0 && item >= kItems) break;
    const int r = item / kItemsPerRow;
    const int pair = item % kItemsPerRow * kPairsPerItem;
    if (pos0 + r >= seq) continue;
    const int at = r * (kD / 2) + pair;
    const float4 c = *reinterpret_cast<const float4*>(cos + at);
    const float4 s = *reinterpret_cast<const float4*>(sin + at);
    uint4* x = reinterpret_cast<uint4*>(tile + r * kPitch<kD> + 2 * pair);
    uint4 v = *x;
    uint32_t* words = reinterpret_cast<uint32_t*>(&v);
    const float cs[4] = {c.x, c.y, c.z, c.w};
    const float sn[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
    for (int p = 0; p < kPairsPerItem; ++p) {
      float x0, x1;
      unpack_pair<T>(words[p], x0, x1);
      // tt::ops::rope's arithmetic, so the same rounding.
      words[p] = pack_pair<T>(x0 * cs[p] - x1 * sn[p], x0 * sn[p] + x1 * cs[p]);
    }
    *x = v;
  }
}

// ldmatrix addresses (vendor.cuh: lanes 8i..8i+7 give the rows of matrix i, which lands in register i). In the
// table's terms an A fragment is four 8 x 8 matrices: a0 rows g (0-7) columns 0-7, a1 rows 8-15 columns 0-7,
// a2 rows 0-7 columns 8-15, a3 rows 8-15 columns 8-15; a B fragment pair (two 16 x 8 B operands side by side)
// is b0 / b1 for columns n 0-7 (k 0-7, k 8-15) and b2 / b3 for n 8-15.

// The A fragment of rows row0..row0+15, columns col0..col0+15 of a row-major shared tile: lane l gives row
// l % 16 (matrices 0 and 1: rows 0-15 of columns 0-7), at column 8 for lanes 16-31 (matrices 2 and 3).
template <int kD, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int row0, int col0) {
  ldmatrix_x4(a, shared_address(tile + (row0 + lane() % 16) * kPitch<kD> + col0 + lane() / 16 * 8));
}

// B fragments of two 8-column tiles for C += A B^T, B^T given row-major ([n][k], a K tile for Q K^T): rows
// n0..n0+15, columns k0..k0+15. b[0], b[1] serve columns n0..n0+7 of C, b[2], b[3] columns n0+8..n0+15: lane l
// gives row n0 + l % 8, plus 8 for lanes 16-31 (matrices 2, 3), at column k0 + 8 for lanes 8-15 and 24-31.
template <int kD, typename T>
__device__ __forceinline__ void load_b_transposed(uint32_t (&b)[4], const T* tile, int n0, int k0) {
  ldmatrix_x4(b, shared_address(tile + (n0 + lane() / 16 * 8 + lane() % 8) * kPitch<kD> + k0 + lane() / 8 % 2 * 8));
}

// B fragments of two 8-column tiles for C += A B, B row-major ([k][n], a V tile for P V): rows k0..k0+15,
// columns n0..n0+15, transposed on the way by ldmatrix.trans: lane l gives row k0 + l % 8, plus 8 for lanes 8-15
// and 24-31 (matrices 1, 3: the second k half), at column n0 + 8 for lanes 16-31 (matrices 2, 3).
template <int kD, typename T>
__device__ __forceinline__ void load_b(uint32_t (&b)[4], const T* tile, int k0, int n0) {
  ldmatrix_x4_trans(b, shared_address(tile + (k0 + lane() / 8 % 2 * 8 + lane() % 8) * kPitch<kD> + n0 + lane() / 16 * 8));
}

// One 16-column step k of acc[m] [16 x kN] += A_m B^T for kM row fragments: A_m's fragment of columns 16k..16k+15
// is a[m]; B^T [kN x kK] comes from rows b_row0.. of a shared tile, each B fragment loaded once for all kM.
// acc and a point to kM consecutive fragments (one fragment: a pointer to it).
template <typename T, int kD, int kN, int kM>
__device__ __forceinline__ void mma_abt_step(float (*acc)[kN / 8][4], const uint32_t (*a)[4], const T* b_tile,
                                             int b_row0, int k) {
#pragma unroll
  for (int n = 0; n < kN / 16; ++n) {
    uint32_t b[4];
    load_b_transposed<kD>(b, b_tile, b_row0 + 16 * n, 16 * k);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      mma_16x8x16<T>(acc[m][2 * n], a[m], b[0], b[1]);
      mma_16x8x16<T>(acc[m][2 * n + 1], a[m], b[2], b[3]);
    }
  }
}

// acc [16 x kN] += A [16 x kK] B^T, with A's fragments in registers and B^T [kN x kK] rows b_row0.. of a
// shared tile (the backward's form).
template <typename T, int kD, int kK, int kN>
__device__ __forceinline__ void mma_abt(float (&acc)[kN / 8][4], const uint32_t (&a)[kK / 16][4], const T* b_tile,
                                        int b_row0) {
#pragma unroll
  for (int k = 0; k < kK / 16; ++k)
    mma_abt_step<T, kD, kN, 1>(&acc, &a[k], b_tile, b_row0, k);
}

// acc[m] [16 x kN] += A_m [16 x kK] B^T for kM row fragments of a shared A tile (rows a_row0 + 16 m ..), each
// step's A fragments loaded just before it (the forward's form: the A operand is not held in registers whole).
template <typename T, int kD, int kK, int kN, int kM>
__device__ __forceinline__ void mma_abt_rows(float (&acc)[kM][kN / 8][4], const T* a_tile, int a_row0,
                                             const T* b_tile, int b_row0) {
#pragma unroll
  for (int k = 0; k < kK / 16; ++k) {
    uint32_t a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) load_a<kD>(a[m], a_tile, a_row0 + 16 * m, 16 * k);
    mma_abt_step<T, kD, kN, kM>(acc, a, b_tile, b_row0, k);
  }
}

// acc[m] [16 x kD] += A_m [16 x kK] B for kM row fragments whose A operands are in registers, B [kK x kD] from
// rows b_row0.. of a shared tile, each B fragment loaded once for all kM.
// acc and a point to kM consecutive fragments (one fragment: a pointer to it).
template <typename T, int kD, int kK, int kM>
__device__ __forceinline__ void mma_ab_rows(float (*acc)[kD / 8][4], const uint32_t (*a)[kK / 16][4],
                                            const T* b_tile, int b_row0) {
#pragma unroll
  for (int k = 0; k < kK / 16; ++k) {
#pragma unroll
    for (int n = 0; n < kD / 16; ++n) {
      uint32_t b[4];
      load_b<kD>(b, b_tile, b_row0 + 16 * k, 16 * n);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma_16x8x16<T>(acc[m][2 * n], a[m][k], b[0], b[1]);
        mma_16x8x16<T>(acc[m][2 * n + 1], a[m][k], b[2], b[3]);
      }
    }
  }
}

// acc [16 x kD] += A [16 x kK] B for one row fragment: mma_ab_rows with kM = 1 (the backward's form).
template <typename T, int kD, int kK>
__device__ __forceinline__ void mma_ab(float (&acc)[kD / 8][4], const uint32_t (&a)[kK / 16][4], const T* b_tile,
                                       int b_row0) {
  mma_ab_rows<T, kD, kK, 1>(&acc, &a, b_tile, b_row0);
}

// The A fragments of rows row0..row0+15, all kK columns, of a shared tile.
template <int kD, int kK, typename T>
__device__ __forceinline__ void load_a_row(uint32_t (&a)[kK / 16][4], const T* tile, int row0) {
#pragma unroll
  for (int k = 0; k < kK / 16; ++k) load_a<kD>(a[k], tile, row0, 16 * k);
}

// An fp32 accumulator [16 x kN], rounded to T, as the A operand of the next product (see vendor.cuh: the
// two layouts share their lanes).
template <typename T, int kN>
__device__ __forceinline__ void to_a_fragments(uint32_t (&a)[kN / 16][4], const float (&c)[kN / 8][4]) {
#pragma unroll
  for (int k = 0; k < kN / 16; ++k) {
    a[k][0] = pack_pair<T>(c[2 * k][0], c[2 * k][1]);
    a[k][1] = pack_pair<T>(c[2 * k][2], c[2 * k][3]);
    a[k][2] = pack_pair<T>(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[k][3] = pack_pair<T>(c[2 * k + 1][2], c[2 * k + 1][3]);
  }
}

template <int kN>
__device__ __forceinline__ void zero(float (&acc)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
}

// Where value e of 8-column fragment n of a warp's C tile lies: row offset within the warp's 16 rows, and
// column offset within the tile.
__device__ __forceinline__ int c_row(int e) { return lane() / 4 + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int c_col(int n, int e) { return 8 * n + 2 * (lane() % 4) + (e & 1); }

// Multiplies a warp's C tile [16 x kD] by `scale`, rotates each row's pairs back by RoPE's angle at
// position pos0 + row when `cos` is given (the gradient of a rotation is the opposite rotation), and
// writes it, rounded to T, into rows warp_row0.. of a shared staging tile.
template <typename T, int kD>
__device__ void stage_rows(T* staging, int warp_row0, float (&acc)[kD / 8][4], float scale, int pos0, int seq,
                           const float* cos, const float* sin) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp_row0 + c_row(2 * half);
    const int pos = pos0 + row;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      float x0 = acc[n][2 * half] * scale;
      float x1 = acc[n][2 * half + 1] * scale;
      if (cos != nullptr && pos < seq) {
        const int64_t at = static_cast<int64_t>(pos) * (kD / 2) + c_col(n, 0) / 2;
        const float c = cos[at];
        const float s = sin[at];
        const float r0 = x0 * c + x1 * s;
        const float r1 = x1 * c - x0 * s;
        x0 = r0;
        x1 = r1;
      }
      *reinterpret_cast<uint32_t*>(staging + row * kPitch<kD> + c_col(n, 0)) = pack_pair<T>(x0, x1);
    }
  }
}

// Writes rows [0, kRows) of a shared staging tile to global rows row0.. (those in [0, seq): the Hopper forward's
// first query block may start before 0), 16 bytes at a time, shared by kThreads threads of which this is number
// `thread` (the whole block by default).
template <int kRows, int kD, int kThreads, typename T>
__device__ void store_rows(T* dst, int64_t stride, int row0, int seq, const T* staging, int thread) {
  constexpr int kChunks = kD / 8;
  constexpr int kChunkBytes = 8 * static_cast<int>(sizeof(T));
  for (int c = thread; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = c % kChunks * 8;
    if (row0 + r < 0 || row0 + r >= seq) continue;
    // Copied as uint4s: as a Pack of 8 elements, nvcc split some of these copies (a loop counted from a lane's
    // index, in the Hopper kernels) into 4-byte stores.
    auto* to = reinterpret_cast<uint4*>(dst + static_cast<int64_t>(row0 + r) * stride + col);
    const auto* from = reinterpret_cast<const uint4*>(staging + r * kPitch<kD> + col);
#pragma unroll
    for (int v = 0; v < kChunkBytes / 16; ++v) to[v] = from[v];
  }
}
template <int kRows, int kD, int kThreads, typename T>
__device__ void store_rows(T* dst, int64_t stride, int row0, int seq, const T* staging) {
  store_rows<kRows, kD, kThreads>(dst, stride, row0, seq, staging, static_cast<int>(threadIdx.x));
}

// -------------------------------------------------------------------------------------------------
// The forward's softmax steps on a warp's score fragments s[m][n][e]: row fragment m (16 rows), 8-key
// fragment n, value e at query row c_row(e), key column c_col(n, e). Each lane holds 2 rows x 2 keys of every
// fragment; a row's 8 fragments x 4 lanes form its quad.
// -------------------------------------------------------------------------------------------------

// The causal mask for key tile k0: -inf where the key lies after the query or past the end of the sequence
// (rows past the end keep their keys: they are computed and never stored; rows before 0 lose every key). Only
// tiles that cross a warp's diagonal or the sequence's end need it. A row's keys are masked from
// min(query + 1, seq) on; that limit is counted once per row from this lane's first column, c_col(0, 0), so each
// score is one compare of a constant (c_col(n, e) - c_col(0, 0) = 8n + (e & 1)) with it and one select, where the
// key and its two bounds cost four.
template <int kFrags, int kBlockN>
__device__ __forceinline__ void mask_scores(float (&s)[kFrags][kBlockN / 8][4], int k0, int warp_q0, int seq) {
  const int lane_k0 = k0 + c_col(0, 0);
#pragma unroll
  for (int m = 0; m < kFrags; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int limit = min(warp_q0 + 16 * m + c_row(2 * half) + 1, seq) - lane_k0;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e)
          if (8 * n + (e & 1) >= limit) s[m][n][e] = -INFINITY;
    }
}

// One tile of the online softmax's statistics (FlashAttention-2, Algorithm 1): per row, the running maximum over
// the quad takes in this tile's scores; the scores become unnormalised probabilities exp2((s - max) * scale_log2)
// in place; the running sum (this lane's share) is rescaled by alpha = exp2((old max - new max) * scale_log2) and
// takes in the new probabilities. alpha is returned per row for the output rows (rescale_rows), which a caller
// may rescale later: the Hopper forward does so once the product still accumulating into them has finished.
template <int kFrags, int kBlockN>
__device__ __forceinline__ void online_softmax_statistics(float (&s)[kFrags][kBlockN / 8][4],
                                                          float (&row_max)[kFrags][2], float (&row_sum)[kFrags][2],
                                                          float scale_log2, float (&alpha)[kFrags][2]) {
#pragma unroll
  for (int m = 0; m < kFrags; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) tile_max = fmaxf(tile_max, fmaxf(s[m][n][2 * half], s[m][n][2 * half + 1]));
      const float new_max = fmaxf(row_max[m][half], quad_max(tile_max));
      // Tile 0 holds key 0, which every query sees, so new_max is finite from then on; the guard keeps
      // -inf - -inf out of a row that has seen nothing: a row before position 0 (the Hopper forward's first query
      // block may start there) sees no key, and its sum stays 0 (its output, never stored, is NaN).
      const float base = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
      alpha[m][half] = exp2_flush_subnormal(row_max[m][half] * scale_log2 - base);
      row_max[m][half] = new_max;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[m][n][e] = exp2_flush_subnormal(s[m][n][e] * scale_log2 - base);
          sum += s[m][n][e];
        }
      }
      row_sum[m][half] = row_sum[m][half] * alpha[m][half] + sum;
    }
  }
}

// The output rows' share of an online-softmax step: each row times its alpha.
template <int kFrags, int kD>
__device__ __forceinline__ void rescale_rows(float (&o)[kFrags][kD / 8][4], const float (&alpha)[kFrags][2]) {
#pragma unroll
  for (int m = 0; m < kFrags; ++m)
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][n][e] *= alpha[m][e / 2];
}

// One whole tile of the online softmax: the statistics, and the output rows rescaled at once.
template <int kFrags, int kBlockN, int kD>
__device__ __forceinline__ void online_softmax(float (&s)[kFrags][kBlockN / 8][4], float (&o)[kFrags][kD / 8][4],
                                               float (&row_max)[kFrags][2], float (&row_sum)[kFrags][2],
                                               float scale_log2) {
  float alpha[kFrags][2];
  online_softmax_statistics<kFrags, kBlockN>(s, row_max, row_sum, scale_log2, alpha);
  rescale_rows<kFrags, kD>(o, alpha);
}

// The softmax's end: each output row divided by its sum (reduced over the quad once, here), and the row's
// log-sum-exp in natural log written to lse[query] for the backward, for queries inside the sequence.
template <int kFrags, int kD>
__device__ __forceinline__ void finish_softmax(float (&o)[kFrags][kD / 8][4], const float (&row_max)[kFrags][2],
                                               const float (&row_sum)[kFrags][2], float scale_log2, int warp_q0,
                                               int seq, float* lse) {
#pragma unroll
  for (int m = 0; m < kFrags; ++m) {
    float inverse[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float sum = quad_sum(row_sum[m][half]);
      inverse[half] = 1.0f / sum;
      const int query = warp_q0 + 16 * m + c_row(2 * half);
      if (lane() % 4 == 0 && query >= 0 && query < seq)
        lse[query] = (row_max[m][half] * scale_log2 + log2f(sum)) * kLn2;
    }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][n][e] *= inverse[e / 2];
  }
}


// -------------------------------------------------------------------------------------------------
// Shared by the kernels
// -------------------------------------------------------------------------------------------------

// Where a block of kBlockM queries works: the query rows from q0, its query head and batch, and the key/value
// head its grouped-query group reads. Causal blocks do more work the later their queries, so blockIdx.x counts
// from the last block: the longest start first and the short ones fill the tail.
struct QueryBlock {
  int q0;
  int64_t head, batch, kv_head;
};
template <int kBlockM>
__device__ __forceinline__ QueryBlock query_block(int64_t q_heads, int64_t kv_heads) {
  const int64_t head = blockIdx.y;
  return {(static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kBlockM, head,
          static_cast<int64_t>(blockIdx.z), head / (q_heads / kv_heads)};
}

// -------------------------------------------------------------------------------------------------
// The backward's recomputed softmax, one score at a time
// -------------------------------------------------------------------------------------------------

// P = exp2(s * scale_log2 - lse_log2), the forward's probability from the saved log-sum-exp (lse_log2 = lse *
// log2(e)), or 0 where the query does not attend to the key.
__device__ __forceinline__ float recomputed_probability(float s, float scale_log2, float lse_log2, bool attended) {
  // Computed either way and then selected: a conditional exp2 became a branch around each element.
  const float p = exp2_flush_subnormal(s * scale_log2 - lse_log2);
  return attended ? p : 0.0f;
}

// delta = rowsum(dO * O) of the warp's 16 queries starting at warp_q0, two lanes per query (each sums half the
// head dim, then the pair adds): returns the query's delta to both lanes of its pair and writes it to
// p.delta[stats + query].
template <typename T, int kD>
__device__ __forceinline__ float warp_rows_delta(const FlashBackwardParams& p, int64_t batch, int64_t head,
                                                 int warp_q0, int64_t stats) {
  const int seq = static_cast<int>(p.seq);
  const int query = warp_q0 + lane() / 2;
  const int col0 = lane() % 2 * (kD / 2);
  float sum = 0.0f;
  if (query < seq) {
    const T* out = head_ptr<T>(p.out, p.out_strides, batch, head) + static_cast<int64_t>(query) * p.out_strides.seq;
    const T* grad = head_ptr<T>(p.grad_out, p.grad_out_strides, batch, head) +
                    static_cast<int64_t>(query) * p.grad_out_strides.seq;
#pragma unroll
    for (int col = col0; col < col0 + kD / 2; col += 8) {
      const Pack<T, 8> o = load_pack<8>(out + col);
      const Pack<T, 8> g = load_pack<8>(grad + col);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += to_float(o.values[i]) * to_float(g.values[i]);
    }
  }
  const float delta = sum + shfl_xor(sum, 1);
  if (lane() % 2 == 0 && query < seq) p.delta[stats + query] = delta;
  return delta;
}

// The backward's per-row statistics of a warp's 16 query rows, for the two rows each lane holds (c_row(0) and
// c_row(2)): the forward's log-sum-exp in log2 units and delta = rowsum(dO * O), which is computed here and
// written to p.delta for the dK/dV kernel, or with kDeltaWritten read from p.delta, where an earlier kernel wrote
// it (rows past seq read as 0: their tiles are zeros and they are never stored).
struct RowStatistics {
  float lse_log2[2];
  float delta[2];
};
template <typename T, int kD, bool kDeltaWritten = false>
__device__ __forceinline__ RowStatistics row_statistics(const FlashBackwardParams& p, int64_t batch, int64_t head,
                                                        int warp_q0) {
  const int64_t stats = (batch * p.q_heads + head) * p.seq;
  float delta = 0.0f;  // lane l's: row l / 2's
  if constexpr (!kDeltaWritten) delta = warp_rows_delta<T, kD>(p, batch, head, warp_q0, stats);
  RowStatistics rows;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = warp_q0 + c_row(2 * half);
    const bool inside = query < static_cast<int>(p.seq);
    rows.lse_log2[half] = inside ? p.lse[stats + query] * kLog2e : 0.0f;
    if constexpr (kDeltaWritten)
      rows.delta[half] = inside ? p.delta[stats + query] : 0.0f;
    else
      rows.delta[half] = shfl_from(delta, 2 * c_row(2 * half));
  }
  return rows;
}

// The softmax's backward on a warp's fragments of one tile, queries as rows (dQ's orientation), in two halves that
// a kernel may run apart (the Hopper backward computes P while dP is still in the tensor cores):
// P = the forward's probability recomputed from its log-sum-exp, in place of S; then dS = P * (dP - delta) in place
// of dP. kMasked: the tile crosses the warp's diagonal or the sequence's end, so P is 0 where the query does not
// attend.
template <bool kMasked, int kBlockN>
__device__ __forceinline__ void probabilities_tile(float (&s)[kBlockN / 8][4], const RowStatistics& rows, int k0,
                                                   int warp_q0, int seq, float scale_log2) {
  // As in mask_scores: per row, the first key it does not attend to (causal), counted from this lane's first
  // column. A row past the sequence's end attends to none: its tiles are zeros and must add nothing to dK and dV.
  int limit[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int query = warp_q0 + c_row(2 * half);
    limit[half] = query < seq ? query + 1 - (k0 + c_col(0, 0)) : 0;
  }
#pragma unroll
  for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool attended = !kMasked || 8 * n + (e & 1) < limit[e / 2];
      s[n][e] = recomputed_probability(s[n][e], scale_log2, rows.lse_log2[e / 2], attended);
    }
}
template <int kBlockN>
__device__ __forceinline__ void gradients_from_probabilities(const float (&s)[kBlockN / 8][4],
                                                             float (&dp)[kBlockN / 8][4], const RowStatistics& rows) {
#pragma unroll
  for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[n][e] = s[n][e] * (dp[n][e] - rows.delta[e / 2]);
}
// P for a tile known only at run time to need the mask or not. Each case is its own code: with the test inside the
// element loop, the compiler branched and packed flags around every element of every tile (ncu: about 40% of the
// dK/dV kernel's samples on integer, PRMT and branch instructions), where most tiles need no mask. Two instances
// made the Hopper forward + backward 8-15% faster at every shape measured (H200; docs/attention.md).
template <int kBlockN>
__device__ __forceinline__ void probabilities(float (&s)[kBlockN / 8][4], const RowStatistics& rows, int k0,
                                              int warp_q0, int seq, float scale_log2, bool masked) {
  if (masked)
    probabilities_tile<true, kBlockN>(s, rows, k0, warp_q0, seq, scale_log2);
  else
    probabilities_tile<false, kBlockN>(s, rows, k0, warp_q0, seq, scale_log2);
}
// Both halves: s keeps P, dp becomes dS.
template <int kBlockN>
__device__ __forceinline__ void score_gradients(float (&s)[kBlockN / 8][4], float (&dp)[kBlockN / 8][4],
                                                const RowStatistics& rows, int k0, int warp_q0, int seq,
                                                float scale_log2, bool masked) {
  probabilities<kBlockN>(s, rows, k0, warp_q0, seq, scale_log2, masked);
  gradients_from_probabilities<kBlockN>(s, dp, rows);
}

// The same with keys as rows (dK and dV's orientation: S^T and dP^T), the statistics per column read from
// shared memory (lse and delta of the tile's kBlockM queries from q0, fp32; lse in natural log). Queries run along
// the columns here: a row (key) is attended by the queries from itself to the sequence's end (queries past it must
// add nothing), bounds counted once per row from this lane's first column, so each score is two compares of a
// constant.
struct TransposedMask {
  int first[2];  // per half of the lane's rows: the first attended query, counted from the lane's first column
  int end;       // the sequence's end, counted the same way
  __device__ __forceinline__ TransposedMask(int q0, int warp_k0, int seq) {
    const int lane_q0 = q0 + c_col(0, 0);
    end = seq - lane_q0;
#pragma unroll
    for (int half = 0; half < 2; ++half) first[half] = warp_k0 + c_row(2 * half) - lane_q0;
  }
  __device__ __forceinline__ bool attended(int n, int e) const {
    const int query = 8 * n + (e & 1);  // c_col(n, e) - c_col(0, 0)
    return (query >= first[e / 2]) & (query < end);
  }
};
template <bool kMasked, int kBlockM>
__device__ __forceinline__ void probabilities_transposed_tile(float (&s)[kBlockM / 8][4], const float* lse, int q0,
                                                              int warp_k0, int seq, float scale_log2) {
  const TransposedMask mask(q0, warp_k0, seq);
#pragma unroll
  for (int n = 0; n < kBlockM / 8; ++n) {
    const float2 lse_pair = *reinterpret_cast<const float2*>(lse + c_col(n, 0));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float col_lse = (e & 1) ? lse_pair.y : lse_pair.x;
      s[n][e] = recomputed_probability(s[n][e], scale_log2, col_lse * kLog2e, !kMasked || mask.attended(n, e));
    }
  }
}
template <int kBlockM>
__device__ __forceinline__ void gradients_from_probabilities_transposed(const float (&s)[kBlockM / 8][4],
                                                                        float (&dp)[kBlockM / 8][4],
                                                                        const float* delta) {
#pragma unroll
  for (int n = 0; n < kBlockM / 8; ++n) {
    const float2 delta_pair = *reinterpret_cast<const float2*>(delta + c_col(n, 0));
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[n][e] = s[n][e] * (dp[n][e] - ((e & 1) ? delta_pair.y : delta_pair.x));
  }
}
// As probabilities: one instance for the masked tiles, one for the rest.
template <int kBlockM>
__device__ __forceinline__ void probabilities_transposed(float (&s)[kBlockM / 8][4], const float* lse, int q0,
                                                         int warp_k0, int seq, float scale_log2, bool masked) {
  if (masked)
    probabilities_transposed_tile<true, kBlockM>(s, lse, q0, warp_k0, seq, scale_log2);
  else
    probabilities_transposed_tile<false, kBlockM>(s, lse, q0, warp_k0, seq, scale_log2);
}
template <int kBlockM>
__device__ __forceinline__ void score_gradients_transposed(float (&s)[kBlockM / 8][4], float (&dp)[kBlockM / 8][4],
                                                           const float* lse, const float* delta, int q0, int warp_k0,
                                                           int seq, float scale_log2, bool masked) {
  probabilities_transposed<kBlockM>(s, lse, q0, warp_k0, seq, scale_log2, masked);
  gradients_from_probabilities_transposed<kBlockM>(s, dp, delta);
}

}  // namespace tt::kernels::flash

#endif  // TT_MMA_SYNC
