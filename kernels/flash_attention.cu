// Flash attention, register-resident generation (causal, grouped-query, optional RoPE in the load), after
// FlashAttention-2 (Dao, 2023). bf16/fp16 on NVIDIA sm_80+; the vocabulary (mma.sync fragments, ldmatrix,
// cp.async) is the "Register fragments" section of vendor.cuh, which states which lane owns which value, and
// the steps the kernels below are written in (tile loads, products, mask, online softmax) are
// flash_fragments.cuh.
//
// Forward: a block of 4 warps owns 64 queries (16 per warp) or, at long sequences, 128 (32 per warp: two row
// fragments that share every K and V fragment loaded), and walks the key/value tiles up to the diagonal. Per
// tile, each warp:
//   S = Q K^T     in registers: Q's A and K's B fragments come from shared memory through ldmatrix (16-byte
//                 rows, 16 bytes of padding per row: conflict-free);
//   online softmax in registers: each lane holds 2 rows x 2 columns per 8-key fragment, so a row's max and
//                 sum are the lane's own values reduced over its quad (two shuffles); exp2 with log2(e)
//                 folded into the scale; the row sum is kept per lane and reduced once at the end;
//   O += P V      P rounded to T is already the A operand (C and A fragments share their lanes), and V's B
//                 fragments come through ldmatrix.trans: the probabilities never touch shared memory.
// K and V tiles stream through two shared-memory stages filled by cp.async: tile j + 1 is in flight while
// tile j is computed, one block barrier per tile. Only the tiles that cross the diagonal (or the end of the
// sequence) pay for the mask.
//
// Backward, FlashAttention-2's two-kernel scheme, so that nothing is summed by atomics and every gradient is
// bitwise reproducible (delta = rowsum(dO * O) is computed by the first kernel, not by a pre-pass of its own):
//  * dK, dV: a block owns 16 kWarps keys of one key/value head, 16 per warp, and loops over the group's
//    query heads and their query tiles in a fixed order (double-buffered by cp.async). Each warp computes
//    S^T = K Q^T and dP^T = V dO^T with keys as rows, so P^T and dS^T = P^T * (dP^T - delta) are in
//    registers as the A operands of dV += P^T dO and dK += dS^T Q;
//  * dQ (launched first; it writes delta): a block owns 16 kWarps queries and loops over the key tiles up to
//    the diagonal: S = Q K^T, dP = dO V^T, dS = P * (dP - delta) in registers, dQ += dS K.
//
// RoPE in the load: the forward rotates its q tile and each key tile in shared memory right after they arrive
// (pairs (x0, x1) of position s by (cos, sin)[s], rounded to T: the values tt::ops::rope writes; the key tile's
// table rows come through the same cp.async stages), and writes the rotated q and k once (each block its own
// positions). The backward reads those and rotates dQ and dK back by the opposite angle before writing them, so
// callers pass the unrotated q and k (views of the fused QKV projection) and get their gradients.
#include "flash_attention.cuh"
#include "flash_fragments.cuh"

namespace tt::kernels {

namespace {

using namespace flash;

#if defined(TT_MMA_SYNC)

// =================================================================================================
// Forward
// =================================================================================================

// A block of kWarps warps owns kBlockM queries, each warp kFrags fragments of 16 rows. With two fragments per
// warp every K and V fragment loaded from shared memory feeds twice the products (FlashAttention-2's layout:
// 4 warps x 32 rows); the key tile then shrinks at head dim 128 so that O, S and P fit the registers.
template <int kD, int kWarps, int kFrags, bool kRope>
struct ForwardShape {
  static constexpr int kThreads = kWarps * kMmaLanes;
  static constexpr int kWarpRows = 16 * kFrags;
  static constexpr int kBlockM = kWarpRows * kWarps;                  // queries per block
  static constexpr int kBlockN = kD == 128 && kFrags == 2 ? 32 : 64;  // keys per tile
  static constexpr int kTableBytes = kRope ? kBlockN * kD / 2 * 4 : 0;  // a key tile's cos (or sin) rows
  static constexpr int kQ = 0;                                         // byte offsets in shared memory
  static constexpr int kStage = kQ + tile_bytes<kD>(kBlockM);          // two stages of {K, V, cos, sin}
  static constexpr int kStageK = 0;
  static constexpr int kStageV = kStageK + tile_bytes<kD>(kBlockN);
  static constexpr int kStageCos = kStageV + tile_bytes<kD>(kBlockN);
  static constexpr int kStageSin = kStageCos + kTableBytes;
  static constexpr int kStageBytes = kStageSin + kTableBytes;
  static constexpr int kBytes = kStage + 2 * kStageBytes;
};

// Key tiles stream through two stages: tile j + 1 (K, V and, with RoPE, its table rows) is copied while tile j
// is computed, so a whole tile of products covers each copy, and one block barrier per tile suffices.
// With RoPE, the rotated q and k are written out as well (the backward reads them instead of rotating again):
// each block writes its own query rows, and the key rows at the same positions, which it is the only block of
// its head to load at or past its first query (one query head per group writes them).
template <typename T, int kD, int kWarps, int kFrags, bool kRope>
__global__ void __launch_bounds__(kWarps * kMmaLanes) flash_forward_kernel(FlashForwardParams p) {
  start_after_previous_kernel();
  using Shape = ForwardShape<kD, kWarps, kFrags, kRope>;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kBlockM = Shape::kBlockM;
  constexpr int kBlockN = Shape::kBlockN;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kQ);
  auto stage = [&](int j) { return smem + Shape::kStage + (j % 2) * Shape::kStageBytes; };

  const QueryBlock block = query_block<kBlockM>(p.q_heads, p.kv_heads);
  const int q0 = block.q0;
  const int64_t head = block.head, batch = block.batch, kv_head = block.kv_head;
  const int seq = static_cast<int>(p.seq);
  const T* q = head_ptr<T>(p.q, p.q_strides, batch, head);
  const T* k = head_ptr<T>(p.k, p.k_strides, batch, kv_head);
  const T* v = head_ptr<T>(p.v, p.v_strides, batch, kv_head);
  const float scale_log2 = softmax_scale<kD>() * kLog2e;
  const int warp_row0 = Shape::kWarpRows * warp();  // this warp's first row in the block
  const int warp_q0 = q0 + warp_row0;                // and its first query
  const int tiles = (min(seq, q0 + kBlockM) + kBlockN - 1) / kBlockN;

  // Starts the copies of key tile j into stage j % 2.
  auto prefetch = [&](int j) {
    unsigned char* st = stage(j);
    load_rows_async<kBlockN, kD, kThreads>(reinterpret_cast<T*>(st + Shape::kStageK), k, p.k_strides.seq,
                                           j * kBlockN, seq);
    load_rows_async<kBlockN, kD, kThreads>(reinterpret_cast<T*>(st + Shape::kStageV), v, p.v_strides.seq,
                                           j * kBlockN, seq);
    if constexpr (kRope) {
      load_table_rows_async<kBlockN, kD, kThreads>(reinterpret_cast<float*>(st + Shape::kStageCos), p.rope_cos,
                                                   j * kBlockN, seq);
      load_table_rows_async<kBlockN, kD, kThreads>(reinterpret_cast<float*>(st + Shape::kStageSin), p.rope_sin,
                                                   j * kBlockN, seq);
    }
  };
  load_rows_async<kBlockM, kD, kThreads>(q_tile, q, p.q_strides.seq, q0, seq);
  prefetch(0);
  cp_async_commit();

  float o[kFrags][kD / 8][4];
  float row_max[kFrags][2];  // raw scores; rows lane/4 and lane/4 + 8 of each fragment
  float row_sum[kFrags][2];  // this lane's share of sum(exp2((s - max) * scale_log2))
#pragma unroll
  for (int m = 0; m < kFrags; ++m) {
    zero(o[m]);
    row_max[m][0] = row_max[m][1] = -INFINITY;
    row_sum[m][0] = row_sum[m][1] = 0.0f;
  }

  for (int tile = 0; tile < tiles; ++tile) {
    const int k0 = tile * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // tile `tile` has arrived, and every warp is done with the previous one: refill its stage
    if (tile + 1 < tiles) prefetch(tile + 1);
    cp_async_commit();
    T* k_tile = reinterpret_cast<T*>(stage(tile) + Shape::kStageK);
    T* v_tile = reinterpret_cast<T*>(stage(tile) + Shape::kStageV);
    if constexpr (kRope) {
      const int64_t offset = static_cast<int64_t>(q0) * (kD / 2);
      if (tile == 0) rotate_rows<kBlockM, kD, kThreads>(q_tile, q0, seq, p.rope_cos + offset, p.rope_sin + offset);
      rotate_rows<kBlockN, kD, kThreads>(k_tile, k0, seq, reinterpret_cast<const float*>(stage(tile) + Shape::kStageCos),
                                         reinterpret_cast<const float*>(stage(tile) + Shape::kStageSin));
      __syncthreads();
      if (tile == 0) {
        store_rows<kBlockM, kD, kThreads>(head_ptr<T>(p.q_rotated, p.q_rotated_strides, batch, head),
                                          p.q_rotated_strides.seq, q0, seq, q_tile);
      }
      if (k0 >= q0 && head % (p.q_heads / p.kv_heads) == 0) {
        store_rows<kBlockN, kD, kThreads>(head_ptr<T>(p.k_rotated, p.k_rotated_strides, batch, kv_head),
                                          p.k_rotated_strides.seq, k0, seq, k_tile);
      }
    }

    float s[kFrags][kBlockN / 8][4];
#pragma unroll
    for (int m = 0; m < kFrags; ++m) zero(s[m]);
    mma_abt_rows<T, kD, kD, kBlockN, kFrags>(s, q_tile, warp_row0, k_tile, 0);

    if (k0 + kBlockN > warp_q0 + 1 || k0 + kBlockN > seq)  // the tile crosses this warp's diagonal or the end
      mask_scores<kFrags, kBlockN>(s, k0, warp_q0, seq);
    online_softmax<kFrags, kBlockN, kD>(s, o, row_max, row_sum, scale_log2);

    uint32_t probs[kFrags][kBlockN / 16][4];
#pragma unroll
    for (int m = 0; m < kFrags; ++m) to_a_fragments<T, kBlockN>(probs[m], s[m]);
    mma_ab_rows<T, kD, kBlockN, kFrags>(o, probs, v_tile, 0);
  }

  finish_softmax<kFrags, kD>(o, row_max, row_sum, scale_log2, warp_q0, seq, p.lse + (batch * p.q_heads + head) * p.seq);

  // Stage the output over the Q tile, once no warp reads it any more (each reads its own rows for S; with RoPE
  // every thread also copies some of every row out in tile 0).
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kFrags; ++m) stage_rows<T, kD>(q_tile, warp_row0 + 16 * m, o[m], 1.0f, 0, seq, nullptr, nullptr);
  __syncthreads();
  store_rows<kBlockM, kD, kThreads>(head_ptr<T>(p.out, p.out_strides, batch, head), p.out_strides.seq, q0, seq,
                                     q_tile);
}

// =================================================================================================
// Backward: dK and dV
// =================================================================================================

template <int kD>
struct BackwardKvShape {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kMmaLanes;
  static constexpr int kBlockN = 16 * kWarps;        // keys per block
  static constexpr int kBlockM = kD == 128 ? 32 : 64;  // queries per step: dK and dV take 2 kD / 8 x 4
                                                       // registers per lane, so the step shrinks at kD 128
  static constexpr int kK = 0;
  static constexpr int kV = kK + tile_bytes<kD>(kBlockN);
  static constexpr int kStage = kV + tile_bytes<kD>(kBlockN);  // two stages of {Q, dO, lse, delta}
  static constexpr int kStageQ = 0;
  static constexpr int kStageGradOut = kStageQ + tile_bytes<kD>(kBlockM);
  static constexpr int kStageLse = kStageGradOut + tile_bytes<kD>(kBlockM);
  static constexpr int kStageDelta = kStageLse + kBlockM * 4;
  static constexpr int kStageBytes = kStageDelta + kBlockM * 4;
  static constexpr int kBytes = kStage + 2 * kStageBytes;
};

template <typename T, int kD, bool kRope>
__global__ void __launch_bounds__(BackwardKvShape<kD>::kThreads) flash_backward_kv_kernel(FlashBackwardParams p) {
  start_after_previous_kernel();
  using Shape = BackwardKvShape<kD>;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kBlockN = Shape::kBlockN;
  constexpr int kBlockM = Shape::kBlockM;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_tile = reinterpret_cast<T*>(smem + Shape::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Shape::kV);
  auto stage = [&](int i) { return smem + Shape::kStage + (i % 2) * Shape::kStageBytes; };

  const int k0 = static_cast<int>(blockIdx.x) * kBlockN;
  const int64_t kv_head = blockIdx.y;
  const int64_t batch = blockIdx.z;
  const int64_t group = p.q_heads / p.kv_heads;
  const int seq = static_cast<int>(p.seq);
  const float scale = softmax_scale<kD>();
  const float scale_log2 = scale * kLog2e;
  const int warp_k0 = k0 + 16 * warp();  // this warp's first key
  // Query tiles that end before this block's first key see none of its keys.
  const int first_q0 = k0 / kBlockM * kBlockM;
  const int q_tiles = (seq - first_q0 + kBlockM - 1) / kBlockM;
  const int steps = static_cast<int>(group) * q_tiles;  // (head, query tile) pairs, head-major: a fixed order

  // Starts the copies of step i's Q, dO, lse and delta into stage i % 2.
  auto prefetch = [&](int i) {
    const int64_t head = kv_head * group + i / q_tiles;
    const int q0 = first_q0 + i % q_tiles * kBlockM;
    unsigned char* st = stage(i);
    load_rows_async<kBlockM, kD, kThreads>(reinterpret_cast<T*>(st + Shape::kStageQ),
                                           head_ptr<T>(p.q, p.q_strides, batch, head), p.q_strides.seq, q0, seq);
    load_rows_async<kBlockM, kD, kThreads>(reinterpret_cast<T*>(st + Shape::kStageGradOut),
                                           head_ptr<T>(p.grad_out, p.grad_out_strides, batch, head),
                                           p.grad_out_strides.seq, q0, seq);
    const int64_t stats = (batch * p.q_heads + head) * p.seq;
    load_stats_async<kBlockM, kThreads>(reinterpret_cast<float*>(st + Shape::kStageLse), p.lse + stats, q0, seq);
    load_stats_async<kBlockM, kThreads>(reinterpret_cast<float*>(st + Shape::kStageDelta), p.delta + stats, q0, seq);
  };

  load_rows_async<kBlockN, kD, kThreads>(k_tile, head_ptr<T>(p.k, p.k_strides, batch, kv_head), p.k_strides.seq, k0,
                                         seq);
  load_rows_async<kBlockN, kD, kThreads>(v_tile, head_ptr<T>(p.v, p.v_strides, batch, kv_head), p.v_strides.seq, k0,
                                         seq);
  prefetch(0);
  cp_async_commit();

  float grad_k[kD / 8][4];
  float grad_v[kD / 8][4];
  zero(grad_k);
  zero(grad_v);

  for (int i = 0; i < steps; ++i) {
    const int q0 = first_q0 + i % q_tiles * kBlockM;
    cp_async_wait<0>();
    __syncthreads();  // step i's tiles have arrived, and every warp is done with step i - 1's stage
    if (i + 1 < steps) prefetch(i + 1);
    cp_async_commit();
    T* q_tile = reinterpret_cast<T*>(stage(i) + Shape::kStageQ);
    T* grad_out_tile = reinterpret_cast<T*>(stage(i) + Shape::kStageGradOut);
    const float* lse = reinterpret_cast<const float*>(stage(i) + Shape::kStageLse);
    const float* delta = reinterpret_cast<const float*>(stage(i) + Shape::kStageDelta);

    // S^T = K Q^T and dP^T = V dO^T, keys as rows.
    float s[kBlockM / 8][4];
    float dp[kBlockM / 8][4];
    zero(s);
    zero(dp);
    {
      uint32_t a[kD / 16][4];
      load_a_row<kD, kD>(a, k_tile, 16 * warp());
      mma_abt<T, kD, kD, kBlockM>(s, a, q_tile, 0);
      load_a_row<kD, kD>(a, v_tile, 16 * warp());
      mma_abt<T, kD, kD, kBlockM>(dp, a, grad_out_tile, 0);
    }

    // P^T = exp(S^T * scale - lse) (0 where the key is in the query's future), dS^T = P^T * (dP^T - delta).
    score_gradients_transposed<kBlockM>(s, dp, lse, delta, q0, warp_k0, seq, scale_log2, true);

    uint32_t a[kBlockM / 16][4];
    to_a_fragments<T, kBlockM>(a, s);
    mma_ab<T, kD, kBlockM>(grad_v, a, grad_out_tile, 0);  // dV += P^T dO
    to_a_fragments<T, kBlockM>(a, dp);
    mma_ab<T, kD, kBlockM>(grad_k, a, q_tile, 0);  // dK += dS^T Q
  }

  __syncthreads();  // every warp is done with the K and V tiles: stage the gradients over them
  stage_rows<T, kD>(k_tile, 16 * warp(), grad_k, scale, k0, seq, kRope ? p.rope_cos : nullptr, p.rope_sin);
  stage_rows<T, kD>(v_tile, 16 * warp(), grad_v, 1.0f, 0, seq, nullptr, nullptr);
  __syncthreads();
  store_rows<kBlockN, kD, kThreads>(head_ptr<T>(p.grad_k, p.grad_k_strides, batch, kv_head), p.grad_k_strides.seq,
                                     k0, seq, k_tile);
  store_rows<kBlockN, kD, kThreads>(head_ptr<T>(p.grad_v, p.grad_v_strides, batch, kv_head), p.grad_v_strides.seq,
                                     k0, seq, v_tile);
}

// =================================================================================================
// Backward: dQ
// =================================================================================================

template <int kD>
struct BackwardQShape {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kMmaLanes;
  static constexpr int kBlockM = 16 * kWarps;  // queries per block
  static constexpr int kBlockN = 64;           // keys per step
  static constexpr int kQ = 0;
  static constexpr int kGradOut = kQ + tile_bytes<kD>(kBlockM);
  static constexpr int kStage = kGradOut + tile_bytes<kD>(kBlockM);  // two stages of {K, V}
  static constexpr int kStageV = tile_bytes<kD>(kBlockN);
  static constexpr int kStageBytes = 2 * tile_bytes<kD>(kBlockN);
  static constexpr int kBytes = kStage + 2 * kStageBytes;
};

// The dK/dV kernel comes next. Let it launch only after this block's main loop (let_next_kernel_launch below),
// not at the start: launched during this kernel's main loop, it ran slower (in a trace, the pair took 25.7 us a
// layer where it took 17.9 without programmatic launch; why was not profiled). H200, v4 workshop bf16, alternated
// three times in one call: a step of 1.2996-1.3018 ms with the late trigger, 1.3044-1.3055 with the dK/dV kernel
// launched the usual way, 1.3576-1.3631 with both triggers at the start.
template <typename T, int kD, bool kRope>
__global__ void __launch_bounds__(BackwardQShape<kD>::kThreads) flash_backward_q_kernel(FlashBackwardParams p) {
  wait_for_previous_kernel();
  using Shape = BackwardQShape<kD>;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kBlockM = Shape::kBlockM;
  constexpr int kBlockN = Shape::kBlockN;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem + Shape::kQ);
  T* grad_out_tile = reinterpret_cast<T*>(smem + Shape::kGradOut);
  auto k_tile = [&](int j) { return reinterpret_cast<T*>(smem + Shape::kStage + (j % 2) * Shape::kStageBytes); };
  auto v_tile = [&](int j) {
    return reinterpret_cast<T*>(smem + Shape::kStage + (j % 2) * Shape::kStageBytes + Shape::kStageV);
  };

  const QueryBlock block = query_block<kBlockM>(p.q_heads, p.kv_heads);
  const int q0 = block.q0;
  const int64_t head = block.head, batch = block.batch, kv_head = block.kv_head;
  const int seq = static_cast<int>(p.seq);
  const T* k = head_ptr<T>(p.k, p.k_strides, batch, kv_head);
  const T* v = head_ptr<T>(p.v, p.v_strides, batch, kv_head);
  const float scale = softmax_scale<kD>();
  const float scale_log2 = scale * kLog2e;
  const int warp_q0 = q0 + 16 * warp();
  const int tiles = (min(seq, q0 + kBlockM) + kBlockN - 1) / kBlockN;

  auto prefetch = [&](int j) {
    load_rows_async<kBlockN, kD, kThreads>(k_tile(j), k, p.k_strides.seq, j * kBlockN, seq);
    load_rows_async<kBlockN, kD, kThreads>(v_tile(j), v, p.v_strides.seq, j * kBlockN, seq);
  };
  load_rows_async<kBlockM, kD, kThreads>(q_tile, head_ptr<T>(p.q, p.q_strides, batch, head), p.q_strides.seq, q0, seq);
  load_rows_async<kBlockM, kD, kThreads>(grad_out_tile, head_ptr<T>(p.grad_out, p.grad_out_strides, batch, head),
                                         p.grad_out_strides.seq, q0, seq);
  prefetch(0);
  cp_async_commit();

  // delta while the tiles are in flight; written out for the dK/dV kernel, which runs after this one (no
  // pre-pass kernel of its own).
  const RowStatistics rows = row_statistics<T, kD>(p, batch, head, warp_q0);

  float grad_q[kD / 8][4];
  zero(grad_q);

  for (int j = 0; j < tiles; ++j) {
    const int k0 = j * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // tile j has arrived, and every warp is done with tile j - 1's stage
    if (j + 1 < tiles) prefetch(j + 1);
    cp_async_commit();

    float s[kBlockN / 8][4];
    float dp[kBlockN / 8][4];
    zero(s);
    zero(dp);
    {
      uint32_t a[kD / 16][4];
      load_a_row<kD, kD>(a, q_tile, 16 * warp());
      mma_abt<T, kD, kD, kBlockN>(s, a, k_tile(j), 0);  // S = Q K^T
      load_a_row<kD, kD>(a, grad_out_tile, 16 * warp());
      mma_abt<T, kD, kD, kBlockN>(dp, a, v_tile(j), 0);  // dP = dO V^T
    }

    score_gradients<kBlockN>(s, dp, rows, k0, warp_q0, seq, scale_log2, true);  // dS = P * (dP - delta)

    uint32_t a[kBlockN / 16][4];
    to_a_fragments<T, kBlockN>(a, dp);
    mma_ab<T, kD, kBlockN>(grad_q, a, k_tile(j), 0);  // dQ += dS K
  }

  let_next_kernel_launch();
  // Each warp stages its own 16 rows over the Q tile, which only that warp reads.
  __syncwarp();
  stage_rows<T, kD>(q_tile, 16 * warp(), grad_q, scale, q0, seq, kRope ? p.rope_cos : nullptr, p.rope_sin);
  __syncthreads();
  store_rows<kBlockM, kD, kThreads>(head_ptr<T>(p.grad_q, p.grad_q_strides, batch, head), p.grad_q_strides.seq, q0,
                                     seq, q_tile);
}

#endif  // TT_MMA_SYNC

// =================================================================================================
// Launchers
// =================================================================================================


#if defined(TT_MMA_SYNC)
// Long sequences take blocks of 128 queries, 4 warps of 32 rows (each K/V tile is read from L2 once for 128
// queries, and each K/V fragment feeds two row fragments); shorter ones blocks of 64 queries, 4 warps of 16
// rows, so that a workshop-sized batch still spreads over the GPU.
template <typename T, int kD, bool kRope>
LaunchStatus register_forward_for(const FlashForwardParams& p, gpuStream_t stream) {
  auto run = [&](auto frags) {
    constexpr int kFrags = decltype(frags)::value;
    using Shape = ForwardShape<kD, 4, kFrags, kRope>;
    const dim3 grid(blocks_for(p.seq, Shape::kBlockM), static_cast<unsigned>(p.q_heads),
                    static_cast<unsigned>(p.batch));
    auto* kernel = flash_forward_kernel<T, kD, 4, kFrags, kRope>;
    const LaunchStatus status = allow_dynamic_shared_memory(kernel, Shape::kBytes);
    if (!status.ok()) return status;
    launch_after_previous(kernel, grid, Shape::kThreads, Shape::kBytes, stream, p);
    return last_launch_status();
  };
  return p.seq >= 1024 ? run(std::integral_constant<int, 2>{}) : run(std::integral_constant<int, 1>{});
}

// dQ first: its kernel also writes delta, which the dK/dV kernel reads.
template <typename T, int kD, bool kRope>
LaunchStatus register_backward_for(const FlashBackwardParams& p, gpuStream_t stream) {
  using Q = BackwardQShape<kD>;
  LaunchStatus status = allow_dynamic_shared_memory(flash_backward_q_kernel<T, kD, kRope>, Q::kBytes);
  if (!status.ok()) return status;
  const dim3 q_grid(blocks_for(p.seq, Q::kBlockM), static_cast<unsigned>(p.q_heads), static_cast<unsigned>(p.batch));
  launch_after_previous(flash_backward_q_kernel<T, kD, kRope>, q_grid, Q::kThreads, Q::kBytes, stream, p);
  status = last_launch_status();
  if (!status.ok()) return status;

  using Kv = BackwardKvShape<kD>;
  status = allow_dynamic_shared_memory(flash_backward_kv_kernel<T, kD, kRope>, Kv::kBytes);
  if (!status.ok()) return status;
  const dim3 kv_grid(blocks_for(p.seq, Kv::kBlockN), static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.batch));
  launch_after_previous(flash_backward_kv_kernel<T, kD, kRope>, kv_grid, Kv::kThreads, Kv::kBytes, stream, p);
  return last_launch_status();
}

#endif

// Calls f(T{}) for the 16-bit dtypes the register kernels take.
template <typename F>
void dispatch_16bit(DType dtype, F&& f) {
  if (dtype == DType::kBFloat16) f(bf16{});
  if (dtype == DType::kFloat16) f(fp16{});
}

template <typename F>
void dispatch_rope(bool rope, F&& f) {
  if (rope) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace

FlashKernel default_flash_kernel(DType dtype) {
  return flash_kernel_available(FlashKernel::kRegisterTiles, dtype) ? FlashKernel::kRegisterTiles
                                                                    : FlashKernel::kSharedMemoryTiles;
}

bool flash_kernel_available(FlashKernel kernel, DType dtype) {
  if (kernel == FlashKernel::kSharedMemoryTiles) return true;
  if (kernel == FlashKernel::kHopper) return dtype != DType::kFloat32 && hopper_flash_present();
#if defined(TT_MMA_SYNC)
  return dtype != DType::kFloat32;
#else
  (void)dtype;
  return false;
#endif
}

namespace {

// The two entry points' shared path: the generation's availability, the shared-memory kernels (`tiled`), the
// empty-input shortcut, and the switch from the runtime head_dim, dtype and RoPE flag to the register kernels'
// template parameters, which `launch(element, head_dim, rope)` receives as tags.
template <typename Params, typename Tiled, typename Launch>
LaunchStatus dispatch(const Params& params, DType dtype, void* stream, FlashKernel kernel, Tiled tiled,
                      Launch launch) {
  if (!flash_kernel_available(kernel, dtype)) return {"this flash attention kernel does not exist for this dtype"};
  if (kernel == FlashKernel::kSharedMemoryTiles) {
    if (params.rope_cos != nullptr) return {"the shared-memory flash attention kernels take no RoPE"};
    return tiled(params, dtype, stream);
  }
  if (params.batch == 0 || params.q_heads == 0 || params.seq == 0) return {};
  LaunchStatus status;
  const bool supported = dispatch_head_dim(params.head_dim, [&](auto head_dim) {
    dispatch_16bit(dtype, [&](auto element) {
      dispatch_rope(params.rope_cos != nullptr, [&](auto rope) { status = launch(element, head_dim, rope); });
    });
  });
  return supported ? status : LaunchStatus{kUnsupportedHeadDim};
}

}  // namespace

LaunchStatus flash_attention_forward(const FlashForwardParams& params, DType dtype, void* stream, FlashKernel kernel) {
  if (kernel == FlashKernel::kHopper) return flash_attention_forward_hopper(params, dtype, stream);
  return dispatch(params, dtype, stream, kernel, flash_attention_forward_tiled,
                  [&](auto element, auto head_dim, auto rope) -> LaunchStatus {
#if defined(TT_MMA_SYNC)
                    return register_forward_for<decltype(element), decltype(head_dim)::value, decltype(rope)::value>(
                        params, to_stream(stream));
#else
                    (void)element, (void)head_dim, (void)rope;
                    return {kUnsupportedHeadDim};  // unreachable: flash_kernel_available said no
#endif
                  });
}

LaunchStatus flash_attention_backward(const FlashBackwardParams& params, DType dtype, void* stream,
                                      FlashKernel kernel) {
  if (kernel == FlashKernel::kHopper) return flash_attention_backward_hopper(params, dtype, stream);
  return dispatch(params, dtype, stream, kernel, flash_attention_backward_tiled,
                  [&](auto element, auto head_dim, auto rope) -> LaunchStatus {
#if defined(TT_MMA_SYNC)
                    return register_backward_for<decltype(element), decltype(head_dim)::value, decltype(rope)::value>(
                        params, to_stream(stream));
#else
                    (void)element, (void)head_dim, (void)rope;
                    return {kUnsupportedHeadDim};  // unreachable: flash_kernel_available said no
#endif
                  });
}

}  // namespace tt::kernels
