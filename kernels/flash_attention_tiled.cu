// Flash attention, first generation: shared-memory tiles (causal, grouped-query), after FlashAttention-2's
// algorithm but not its data flow. The vendor-neutral kernel: fp32 on every GPU, and every dtype on AMD. The
// register-resident generation (flash_attention.cu) replaces it for bf16/fp16 on NVIDIA; README's attention
// page measures the step from this one to that one.
//
// Forward: one block per (query tile of kRows rows, query head, batch). It walks the key/value tiles of
// kCols keys up to the diagonal; for each, the scores S = Q K^T go to shared memory (fp32), the block updates
// every row's running max m and sum l (online softmax), writes P = exp(S - m) and rescales the output
// accumulator before adding P V. The S x S matrix never exists: memory is O(seq). The row's log-sum-exp
// m + log(l) is saved for the backward.
//
// Backward, with P recomputed from the saved log-sum-exp and delta = rowsum(dO * O) (a pre-pass kernel):
//   dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dQ = dS K * scale,   dK = dS^T Q * scale.
// Two kernels, so that no output is summed by atomics and every gradient is bitwise reproducible:
//  * dK, dV: one block per (key tile, key/value head, batch); it loops over the query heads of its group
//    and their query tiles from the diagonal on, in a fixed order (grouped-query attention sums there);
//  * dQ: one block per (query tile, query head, batch), looping over the key tiles up to the diagonal.
//
// Matrix products run on 16x16 tiles (MmaTile in vendor.cuh): tensor cores (WMMA) or MFMA for bf16/fp16,
// FMA units for fp32. A product's 16x16 fragments are dealt to the block's warps round-robin and kept in
// registers; everything row-wise (masking, softmax, dS) is done by threads on the fp32 copy in shared
// memory, so no kernel depends on how a vendor lays a fragment out across lanes. The only exception, the
// forward's per-row rescaling of its output fragments, reads the layout off a probe tile (TileRows).
//
// Blocks have kThreads = 2 * kMaxWarpSize threads: 4 warps on NVIDIA, 2 waves on AMD. Nothing in the tiling
// depends on the warp width; it only changes how many fragments each warp owns.
//
// Speed, measured on an H100 (bf16, causal, B=2, H=16/4, S=4096, D=128): forward 71 TFLOP/s, forward +
// backward 57 TFLOP/s, against 512 and 442 for cuDNN through at::scaled_dot_product_attention; fp32 forward
// 15 TFLOP/s (SDPA 10). The price of the vendor-neutral design is the shared-memory round trip of every score
// tile and four block barriers per tile; capping registers for more resident blocks changed nothing (+-3%).
#include "flash_attention.cuh"

namespace tt::kernels {

namespace {

using namespace flash;

// =================================================================================================
// Tile shapes and shared-memory layout
// =================================================================================================

constexpr int kThreads = 2 * kMaxWarpSize;
// LDS per workgroup on AMD CDNA; NVIDIA sm_80+ gives more after the opt-in, but every tile fits this.
constexpr int kMaxSharedBytes = 64 * 1024;

// Rows per tile. Forward: kRows queries per block, kCols keys per step. Backward: kOuter rows a block owns
// (keys for dK/dV, queries for dQ), kInner rows per step. Chosen so that each kernel's shared memory fits
// kMaxSharedBytes; fp32 tiles are twice the bytes, hence smaller.
template <typename T, int kD>
struct TileShape {
  static constexpr bool kSmallRows = sizeof(T) == 4 && kD == 128;
  static constexpr bool kSmallCols = kD == 128 || (sizeof(T) == 4 && kD == 64);
  static constexpr int kRows = kSmallRows ? 32 : 64;
  static constexpr int kCols = kSmallCols ? 32 : 64;
  static constexpr int kOuter = kSmallCols ? 32 : 64;
  static constexpr int kInner = kSmallRows ? 16 : 32;
};

constexpr int align_bytes(int bytes) { return (bytes + 127) / 128 * 128; }

// Row pitches, in elements. 16 bytes of padding keeps rows 16-byte aligned (vector stores, WMMA's ldm rule)
// and shifts each row by 4 banks, so reading a column of 8 consecutive rows touches 8 different banks.
template <typename T>
constexpr int pitch(int columns) {
  return columns + 16 / static_cast<int>(sizeof(T));
}

// fp32 products of 16-bit inputs are rounded to T for the next product (as FlashAttention does); fp32 inputs
// reuse the fp32 buffer in place.
template <typename T>
constexpr bool kRoundedCopy = sizeof(T) != sizeof(float);

// Byte offsets into the forward kernel's dynamic shared memory.
template <typename T, int kD>
struct ForwardSmem {
  static constexpr int kRows = TileShape<T, kD>::kRows;
  static constexpr int kCols = TileShape<T, kD>::kCols;
  static constexpr int kLdT = pitch<T>(kD);      // q, k, v tiles
  static constexpr int kLdS = pitch<float>(kCols);  // scores
  static constexpr int kLdP = kRoundedCopy<T> ? pitch<T>(kCols) : kLdS;
  static constexpr int kLdO = pitch<float>(kD);  // output staging, over the tiles once they are done
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + align_bytes(kRows * kLdT * sizeof(T));
  static constexpr int kV = kK + align_bytes(kCols * kLdT * sizeof(T));
  static constexpr int kS = kV + align_bytes(kCols * kLdT * sizeof(T));
  static constexpr int kP = kS + (kRoundedCopy<T> ? align_bytes(kRows * kLdS * sizeof(float)) : 0);
  static constexpr int kRowScale = kP + align_bytes(kRows * kLdP * sizeof(T));
  static constexpr int kBytes = kRowScale + align_bytes(kRows * sizeof(float));
  static_assert(kBytes <= kMaxSharedBytes, "forward tiles exceed the shared-memory budget");
  static_assert(kRows * kLdO * sizeof(float) <= kRowScale, "output staging overlaps the row scales");
  static_assert(kRows * kLdT * sizeof(T) >= 256 * sizeof(float), "the q tile doubles as the layout probe");
};

// Byte offsets into a backward kernel's dynamic shared memory: two outer tiles (K and V, or Q and dO), two
// inner tiles (the other pair), the fp32 [kOuter x kInner] products S and dP, their rounded copies P and dS
// (16-bit types; in place for fp32), and per-query log-sum-exp and delta.
template <typename T, int kD>
struct BackwardSmem {
  static constexpr int kOuter = TileShape<T, kD>::kOuter;
  static constexpr int kInner = TileShape<T, kD>::kInner;
  static constexpr int kLdT = pitch<T>(kD);
  static constexpr int kLdS = pitch<float>(kInner);
  static constexpr int kLdP = kRoundedCopy<T> ? pitch<T>(kInner) : kLdS;
  static constexpr int kLdG = pitch<float>(kD);  // gradient staging
  static constexpr int kOuterA = 0;
  static constexpr int kOuterB = kOuterA + align_bytes(kOuter * kLdT * sizeof(T));
  static constexpr int kInnerA = kOuterB + align_bytes(kOuter * kLdT * sizeof(T));
  static constexpr int kInnerB = kInnerA + align_bytes(kInner * kLdT * sizeof(T));
  static constexpr int kS = kInnerB + align_bytes(kInner * kLdT * sizeof(T));
  static constexpr int kDP = kS + align_bytes(kOuter * kLdS * sizeof(float));
  static constexpr int kRounded = kDP + align_bytes(kOuter * kLdS * sizeof(float));
  static constexpr int kP = kRoundedCopy<T> ? kRounded : kS;
  static constexpr int kDS = kRoundedCopy<T> ? kRounded + align_bytes(kOuter * kLdP * sizeof(T)) : kDP;
  static constexpr int kStats = kRounded + (kRoundedCopy<T> ? 2 * align_bytes(kOuter * kLdP * sizeof(T)) : 0);
  static constexpr int kStatRows = kOuter > kInner ? kOuter : kInner;
  static constexpr int kLse = kStats;
  static constexpr int kDelta = kLse + align_bytes(kStatRows * sizeof(float));
  static constexpr int kBytes = kDelta + align_bytes(kStatRows * sizeof(float));
  static_assert(kBytes <= kMaxSharedBytes, "backward tiles exceed the shared-memory budget");
  static_assert(kOuter * kLdG * sizeof(float) <= kStats, "gradient staging overlaps the row statistics");
};

// =================================================================================================
// Block-level building blocks
// =================================================================================================

// A kRows x kCols fp32 product held in registers: its 16x16 fragments, numbered row-major, are dealt to the
// warps round-robin (warp w owns w, w + W, w + 2W, ... for W warps). With fewer fragments than warps some
// warps own none and skip the work.
template <typename T, int kRows, int kCols>
struct BlockTile {
  static constexpr int kColFragments = kCols / 16;
  static constexpr int kFragments = (kRows / 16) * kColFragments;
  static constexpr int kWarps = kThreads / warp_size();
  static constexpr int kPerWarp = (kFragments + kWarps - 1) / kWarps;
  static_assert(kRows % 16 == 0 && kCols % 16 == 0, "tiles are whole 16x16 fragments");
  MmaTile<T> frag[kPerWarp];

  __device__ static int fragment(int i) { return static_cast<int>(threadIdx.x) / warp_size() + i * kWarps; }

  // f(fragment, row of its first element, column of its first element) for each fragment this warp owns.
  template <typename F>
  __device__ void for_each(F&& f) {
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int index = fragment(i);
      if (kFragments % kWarps == 0 || index < kFragments) f(frag[i], index / kColFragments * 16, index % kColFragments * 16);
    }
  }

  __device__ void zero() {
    for_each([](MmaTile<T>& t, int, int) { t.zero(); });
  }
  __device__ void scale(float factor) {
    for_each([&](MmaTile<T>& t, int, int) {
#pragma unroll
      for (int e = 0; e < MmaTile<T>::kElements; ++e) t[e] *= factor;
    });
  }
  // this += A B^T: A [kRows x kK] and B [kCols x kK], row-major in shared memory.
  template <int kK>
  __device__ void mma_abt(const T* a, int lda, const T* b, int ldb) {
    for_each([&](MmaTile<T>& t, int row, int col) {
#pragma unroll
      for (int k = 0; k < kK; k += 16) t.mma_abt(a + row * lda + k, lda, b + col * ldb + k, ldb);
    });
  }
  // this += A B: A [kRows x kK] and B [kK x kCols], row-major in shared memory.
  template <int kK>
  __device__ void mma_ab(const T* a, int lda, const T* b, int ldb) {
    for_each([&](MmaTile<T>& t, int row, int col) {
#pragma unroll
      for (int k = 0; k < kK; k += 16) t.mma_ab(a + row * lda + k, lda, b + k * ldb + col, ldb);
    });
  }
  __device__ void store(float* c, int ldc) {
    for_each([&](MmaTile<T>& t, int row, int col) { t.store(c + row * ldc + col, ldc); });
  }
};

// The row, within its fragment, of each accumulator value this lane holds. Every MmaTile<T> has the same
// layout, so it is read once from a probe: a tile whose elements hold their own row index. Block-collective;
// `scratch` is 256 floats of 32-byte aligned shared memory, free again when the constructor returns.
template <typename T>
struct TileRows {
  int row[MmaTile<T>::kElements];

  __device__ explicit TileRows(float* scratch) {
    for (int i = threadIdx.x; i < 256; i += kThreads) scratch[i] = static_cast<float>(i / 16);
    __syncthreads();
    MmaTile<T> probe;
    probe.load(scratch, 16);
#pragma unroll
    for (int e = 0; e < MmaTile<T>::kElements; ++e) row[e] = static_cast<int>(probe[e]);
    __syncthreads();
  }
};

// Multiplies row r of a block tile by factors[r] (shared memory).
template <typename T, int kRows, int kCols>
__device__ void scale_rows(BlockTile<T, kRows, kCols>& tile, const TileRows<T>& rows, const float* factors) {
  tile.for_each([&](MmaTile<T>& t, int row, int) {
#pragma unroll
    for (int e = 0; e < MmaTile<T>::kElements; ++e) t[e] *= factors[row + rows.row[e]];
  });
}

// Copies rows [row0, row0 + kRows) of one head's [seq, kD] matrix (consecutive rows `stride` elements apart)
// into a shared tile of row pitch kLd. Rows at or past `seq` are zero-filled: they add nothing to products.
template <typename T, int kRows, int kD, int kLd>
__device__ void load_tile(T* tile, const T* src, int64_t stride, int row0, int seq) {
  constexpr int kVec = kWideVec<T>;
  constexpr int kChunks = kD / kVec;
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = c % kChunks * kVec;
    Pack<T, kVec> pack;
    if (row0 + r < seq) {
      pack = load_pack<kVec>(src + static_cast<int64_t>(row0 + r) * stride + col);
    } else {
#pragma unroll
      for (int v = 0; v < kVec; ++v) pack.values[v] = from_float<T>(0.0f);
    }
    store_pack<kVec>(tile + r * kLd + col, pack);
  }
}

// Writes rows [row0, min(row0 + kRows, seq)) of an fp32 staging tile (pitch kLd) to global memory as T.
template <typename T, int kRows, int kD, int kLd>
__device__ void store_tile(T* dst, int64_t stride, int row0, int seq, const float* staging) {
  constexpr int kVec = kWideVec<T>;
  constexpr int kChunks = kD / kVec;
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = c % kChunks * kVec;
    if (row0 + r >= seq) continue;
    Pack<T, kVec> pack;
#pragma unroll
    for (int v = 0; v < kVec; ++v) pack.values[v] = from_float<T>(staging[r * kLd + col + v]);
    store_pack<kVec>(dst + static_cast<int64_t>(row0 + r) * stride + col, pack);
  }
}

// Reductions over the kLanes consecutive lanes that share a row (kLanes divides every warp width): a
// butterfly, so all of them end with the same value, combined in the same order on every run.
template <int kLanes>
__device__ float lanes_max(float value) {
#pragma unroll
  for (int offset = 1; offset < kLanes; offset *= 2) value = fmaxf(value, shfl_xor(value, offset));
  return value;
}

// =================================================================================================
// Forward
// =================================================================================================

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(FlashForwardParams p) {
  using Smem = ForwardSmem<T, kD>;
  constexpr int kRows = Smem::kRows;
  constexpr int kCols = Smem::kCols;
  constexpr int kLanes = kThreads / kRows;  // threads per row in the softmax
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem + Smem::kQ);
  T* k_tile = reinterpret_cast<T*>(smem + Smem::kK);
  T* v_tile = reinterpret_cast<T*>(smem + Smem::kV);
  float* scores = reinterpret_cast<float*>(smem + Smem::kS);
  T* probs = reinterpret_cast<T*>(smem + Smem::kP);
  float* row_scale = reinterpret_cast<float*>(smem + Smem::kRowScale);
  float* staging = reinterpret_cast<float*>(smem);

  // Causal blocks do more work the later their queries: start those first, so the short ones fill the tail.
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kRows;
  const int64_t head = blockIdx.y;
  const int64_t batch = blockIdx.z;
  const int64_t kv_head = head / (p.q_heads / p.kv_heads);
  const int seq = static_cast<int>(p.seq);
  const T* q = head_ptr<T>(p.q, p.q_strides, batch, head);
  const T* k = head_ptr<T>(p.k, p.k_strides, batch, kv_head);
  const T* v = head_ptr<T>(p.v, p.v_strides, batch, kv_head);
  const float scale_log2 = softmax_scale<kD>() * kLog2e;

  const TileRows<T> rows(reinterpret_cast<float*>(q_tile));
  load_tile<T, kRows, kD, Smem::kLdT>(q_tile, q, p.q_strides.seq, q0, seq);
  BlockTile<T, kRows, kD> out;
  out.zero();

  // This thread's share of the softmax: row `row`, columns part, part + kLanes, ...
  const int row = threadIdx.x / kLanes;
  const int part = threadIdx.x % kLanes;
  const int query = q0 + row;
  float row_max = -INFINITY;  // running max of the row's scores, in log2 units
  float row_sum = 0.0f;       // running sum of exp2(score - row_max)

  const int last_key = min(seq, q0 + kRows) - 1;  // later keys are masked for every query of the block
  for (int k0 = 0; k0 <= last_key; k0 += kCols) {
    load_tile<T, kCols, kD, Smem::kLdT>(k_tile, k, p.k_strides.seq, k0, seq);
    load_tile<T, kCols, kD, Smem::kLdT>(v_tile, v, p.v_strides.seq, k0, seq);
    __syncthreads();

    {
      BlockTile<T, kRows, kCols> s;
      s.zero();
      s.template mma_abt<kD>(q_tile, Smem::kLdT, k_tile, Smem::kLdT);
      s.store(scores, Smem::kLdS);
    }
    __syncthreads();

    float x[kCols / kLanes];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kCols / kLanes; ++j) {
      const int col = part + j * kLanes;
      const int key = k0 + col;
      x[j] = key <= query && key < seq ? scores[row * Smem::kLdS + col] * scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, x[j]);
    }
    const float new_max = fmaxf(row_max, lanes_max<kLanes>(tile_max));
    // Every row sees key 0 in the first tile, so new_max is finite; the guard keeps -inf - -inf out anyway.
    const float base = new_max == -INFINITY ? 0.0f : new_max;
    const float alpha = exp2f(row_max - base);
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kCols / kLanes; ++j) {
      const float prob = exp2f(x[j] - base);
      tile_sum += prob;
      probs[row * Smem::kLdP + part + j * kLanes] = from_float<T>(prob);
    }
    row_sum = row_sum * alpha + lanes_sum<kLanes>(tile_sum);
    row_max = new_max;
    if (part == 0) row_scale[row] = alpha;
    __syncthreads();

    scale_rows(out, rows, row_scale);
    out.template mma_ab<kCols>(probs, Smem::kLdP, v_tile, Smem::kLdT);
    __syncthreads();
  }

  if (part == 0) {
    row_scale[row] = 1.0f / row_sum;
    if (query < seq) {
      p.lse[(batch * p.q_heads + head) * p.seq + query] = (row_max + log2f(row_sum)) * kLn2;
    }
  }
  __syncthreads();
  scale_rows(out, rows, row_scale);
  out.store(staging, Smem::kLdO);
  __syncthreads();
  store_tile<T, kRows, kD, Smem::kLdO>(head_ptr<T>(p.out, p.out_strides, batch, head), p.out_strides.seq, q0, seq,
                                       staging);
}

// =================================================================================================
// Backward
// =================================================================================================

// dK and dV of one key tile: rows of the products are keys (kOuter), columns queries (kInner).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) flash_backward_kv_kernel(FlashBackwardParams p) {
  using Smem = BackwardSmem<T, kD>;
  constexpr int kOuter = Smem::kOuter;
  constexpr int kInner = Smem::kInner;
  constexpr int kLanes = kThreads / kOuter;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_tile = reinterpret_cast<T*>(smem + Smem::kOuterA);
  T* v_tile = reinterpret_cast<T*>(smem + Smem::kOuterB);
  T* q_tile = reinterpret_cast<T*>(smem + Smem::kInnerA);
  T* grad_out_tile = reinterpret_cast<T*>(smem + Smem::kInnerB);
  float* scores = reinterpret_cast<float*>(smem + Smem::kS);
  float* grad_probs = reinterpret_cast<float*>(smem + Smem::kDP);
  T* probs = reinterpret_cast<T*>(smem + Smem::kP);
  T* grad_scores = reinterpret_cast<T*>(smem + Smem::kDS);
  float* lse_tile = reinterpret_cast<float*>(smem + Smem::kLse);
  float* delta_tile = reinterpret_cast<float*>(smem + Smem::kDelta);
  float* staging = reinterpret_cast<float*>(smem);

  const int k0 = static_cast<int>(blockIdx.x) * kOuter;
  const int64_t kv_head = blockIdx.y;
  const int64_t batch = blockIdx.z;
  const int64_t group = p.q_heads / p.kv_heads;
  const int seq = static_cast<int>(p.seq);
  const float scale = softmax_scale<kD>();
  const float scale_log2 = scale * kLog2e;

  load_tile<T, kOuter, kD, Smem::kLdT>(k_tile, head_ptr<T>(p.k, p.k_strides, batch, kv_head), p.k_strides.seq, k0,
                                       seq);
  load_tile<T, kOuter, kD, Smem::kLdT>(v_tile, head_ptr<T>(p.v, p.v_strides, batch, kv_head), p.v_strides.seq, k0,
                                       seq);
  BlockTile<T, kOuter, kD> grad_k;
  BlockTile<T, kOuter, kD> grad_v;
  grad_k.zero();
  grad_v.zero();

  const int row = threadIdx.x / kLanes;
  const int part = threadIdx.x % kLanes;
  const int key = k0 + row;
  // Query tiles that end before this block's first key see none of its keys.
  const int first_q0 = k0 / kInner * kInner;

  // A fixed order over (head, query tile): the sums over the group's heads are reproducible.
  for (int64_t head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    const T* q = head_ptr<T>(p.q, p.q_strides, batch, head);
    const T* grad_out = head_ptr<T>(p.grad_out, p.grad_out_strides, batch, head);
    const float* lse = p.lse + (batch * p.q_heads + head) * p.seq;
    const float* delta = p.delta + (batch * p.q_heads + head) * p.seq;
    for (int q0 = first_q0; q0 < seq; q0 += kInner) {
      load_tile<T, kInner, kD, Smem::kLdT>(q_tile, q, p.q_strides.seq, q0, seq);
      load_tile<T, kInner, kD, Smem::kLdT>(grad_out_tile, grad_out, p.grad_out_strides.seq, q0, seq);
      for (int i = threadIdx.x; i < kInner; i += kThreads) {
        const bool valid = q0 + i < seq;
        lse_tile[i] = valid ? lse[q0 + i] * kLog2e : 0.0f;
        delta_tile[i] = valid ? delta[q0 + i] : 0.0f;
      }
      __syncthreads();

      {
        BlockTile<T, kOuter, kInner> product;
        product.zero();
        product.template mma_abt<kD>(k_tile, Smem::kLdT, q_tile, Smem::kLdT);  // S^T = K Q^T
        product.store(scores, Smem::kLdS);
        product.zero();
        product.template mma_abt<kD>(v_tile, Smem::kLdT, grad_out_tile, Smem::kLdT);  // dP^T = V dO^T
        product.store(grad_probs, Smem::kLdS);
      }
      __syncthreads();

#pragma unroll
      for (int j = 0; j < kInner / kLanes; ++j) {
        const int col = part + j * kLanes;
        const int query = q0 + col;
        const int s = row * Smem::kLdS + col;
        const float prob = query < seq && key <= query ? exp2f(scores[s] * scale_log2 - lse_tile[col]) : 0.0f;
        const float grad_score = prob * (grad_probs[s] - delta_tile[col]);
        probs[row * Smem::kLdP + col] = from_float<T>(prob);
        grad_scores[row * Smem::kLdP + col] = from_float<T>(grad_score);
      }
      __syncthreads();

      grad_v.template mma_ab<kInner>(probs, Smem::kLdP, grad_out_tile, Smem::kLdT);   // dV += P^T dO
      grad_k.template mma_ab<kInner>(grad_scores, Smem::kLdP, q_tile, Smem::kLdT);    // dK += dS^T Q
      __syncthreads();
    }
  }

  grad_k.scale(scale);
  grad_k.store(staging, Smem::kLdG);
  __syncthreads();
  store_tile<T, kOuter, kD, Smem::kLdG>(head_ptr<T>(p.grad_k, p.grad_k_strides, batch, kv_head),
                                        p.grad_k_strides.seq, k0, seq, staging);
  __syncthreads();
  grad_v.store(staging, Smem::kLdG);
  __syncthreads();
  store_tile<T, kOuter, kD, Smem::kLdG>(head_ptr<T>(p.grad_v, p.grad_v_strides, batch, kv_head),
                                        p.grad_v_strides.seq, k0, seq, staging);
}

// dQ of one query tile: rows of the products are queries (kOuter), columns keys (kInner).
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) flash_backward_q_kernel(FlashBackwardParams p) {
  using Smem = BackwardSmem<T, kD>;
  constexpr int kOuter = Smem::kOuter;
  constexpr int kInner = Smem::kInner;
  constexpr int kLanes = kThreads / kOuter;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem + Smem::kOuterA);
  T* grad_out_tile = reinterpret_cast<T*>(smem + Smem::kOuterB);
  T* k_tile = reinterpret_cast<T*>(smem + Smem::kInnerA);
  T* v_tile = reinterpret_cast<T*>(smem + Smem::kInnerB);
  float* scores = reinterpret_cast<float*>(smem + Smem::kS);
  float* grad_probs = reinterpret_cast<float*>(smem + Smem::kDP);
  T* grad_scores = reinterpret_cast<T*>(smem + Smem::kDS);
  float* lse_tile = reinterpret_cast<float*>(smem + Smem::kLse);
  float* delta_tile = reinterpret_cast<float*>(smem + Smem::kDelta);
  float* staging = reinterpret_cast<float*>(smem);

  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kOuter;  // longest first
  const int64_t head = blockIdx.y;
  const int64_t batch = blockIdx.z;
  const int64_t kv_head = head / (p.q_heads / p.kv_heads);
  const int seq = static_cast<int>(p.seq);
  const T* k = head_ptr<T>(p.k, p.k_strides, batch, kv_head);
  const T* v = head_ptr<T>(p.v, p.v_strides, batch, kv_head);
  const float scale = softmax_scale<kD>();
  const float scale_log2 = scale * kLog2e;

  load_tile<T, kOuter, kD, Smem::kLdT>(q_tile, head_ptr<T>(p.q, p.q_strides, batch, head), p.q_strides.seq, q0, seq);
  load_tile<T, kOuter, kD, Smem::kLdT>(grad_out_tile, head_ptr<T>(p.grad_out, p.grad_out_strides, batch, head),
                                       p.grad_out_strides.seq, q0, seq);
  const int64_t stats = (batch * p.q_heads + head) * p.seq;
  for (int i = threadIdx.x; i < kOuter; i += kThreads) {
    const bool valid = q0 + i < seq;
    lse_tile[i] = valid ? p.lse[stats + q0 + i] * kLog2e : 0.0f;
    delta_tile[i] = valid ? p.delta[stats + q0 + i] : 0.0f;
  }
  BlockTile<T, kOuter, kD> grad_q;
  grad_q.zero();

  const int row = threadIdx.x / kLanes;
  const int part = threadIdx.x % kLanes;
  const int query = q0 + row;

  const int last_key = min(seq, q0 + kOuter) - 1;
  for (int k0 = 0; k0 <= last_key; k0 += kInner) {
    load_tile<T, kInner, kD, Smem::kLdT>(k_tile, k, p.k_strides.seq, k0, seq);
    load_tile<T, kInner, kD, Smem::kLdT>(v_tile, v, p.v_strides.seq, k0, seq);
    __syncthreads();

    {
      BlockTile<T, kOuter, kInner> product;
      product.zero();
      product.template mma_abt<kD>(q_tile, Smem::kLdT, k_tile, Smem::kLdT);  // S = Q K^T
      product.store(scores, Smem::kLdS);
      product.zero();
      product.template mma_abt<kD>(grad_out_tile, Smem::kLdT, v_tile, Smem::kLdT);  // dP = dO V^T
      product.store(grad_probs, Smem::kLdS);
    }
    __syncthreads();

#pragma unroll
    for (int j = 0; j < kInner / kLanes; ++j) {
      const int col = part + j * kLanes;
      const int key = k0 + col;
      const int s = row * Smem::kLdS + col;
      const float prob = query < seq && key <= query ? exp2f(scores[s] * scale_log2 - lse_tile[row]) : 0.0f;
      grad_scores[row * Smem::kLdP + col] = from_float<T>(prob * (grad_probs[s] - delta_tile[row]));
    }
    __syncthreads();

    grad_q.template mma_ab<kInner>(grad_scores, Smem::kLdP, k_tile, Smem::kLdT);  // dQ += dS K
    __syncthreads();
  }

  grad_q.scale(scale);
  grad_q.store(staging, Smem::kLdG);
  __syncthreads();
  store_tile<T, kOuter, kD, Smem::kLdG>(head_ptr<T>(p.grad_q, p.grad_q_strides, batch, head), p.grad_q_strides.seq,
                                        q0, seq, staging);
}

// =================================================================================================
// Backward: delta = rowsum(dO * O), the pre-pass of this generation's backward (the register generation's dQ
// kernel computes delta itself)
// =================================================================================================

// One row per kLanes threads, 16-byte loads.
template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) flash_delta_kernel(FlashBackwardParams p) {
  constexpr int kVec = kWideVec<T>;
  constexpr int kLanes = kD / kVec;
  static_assert(kLanes <= 32, "a row's lanes must lie in one warp");
  const int64_t rows = p.batch * p.q_heads * p.seq;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / kLanes) + threadIdx.x / kLanes;
  const int col = static_cast<int>(threadIdx.x) % kLanes * kVec;
  float sum = 0.0f;
  if (row < rows) {
    const int64_t s = row % p.seq;
    const int64_t head = row / p.seq % p.q_heads;
    const int64_t batch = row / p.seq / p.q_heads;
    const T* out = head_ptr<T>(p.out, p.out_strides, batch, head) + s * p.out_strides.seq + col;
    const T* grad = head_ptr<T>(p.grad_out, p.grad_out_strides, batch, head) + s * p.grad_out_strides.seq + col;
    const Pack<T, kVec> o = load_pack<kVec>(out);
    const Pack<T, kVec> g = load_pack<kVec>(grad);
#pragma unroll
    for (int i = 0; i < kVec; ++i) sum += to_float(o.values[i]) * to_float(g.values[i]);
  }
  sum = lanes_sum<kLanes>(sum);
  if (row < rows && col == 0) p.delta[row] = sum;
}

// =================================================================================================
// Launchers
// =================================================================================================


template <typename T, int kD>
LaunchStatus forward_for(const FlashForwardParams& p, gpuStream_t stream) {
  using Smem = ForwardSmem<T, kD>;
  const LaunchStatus status = allow_dynamic_shared_memory(flash_forward_kernel<T, kD>, Smem::kBytes);
  if (!status.ok()) return status;
  const dim3 grid(blocks_for(p.seq, Smem::kRows), static_cast<unsigned>(p.q_heads), static_cast<unsigned>(p.batch));
  flash_forward_kernel<T, kD><<<grid, kThreads, Smem::kBytes, stream>>>(p);
  return last_launch_status();
}

template <typename T, int kD>
LaunchStatus backward_for(const FlashBackwardParams& p, gpuStream_t stream) {
  using Smem = BackwardSmem<T, kD>;
  constexpr int kDeltaRowsPerBlock = kThreads / (kD / kWideVec<T>);
  flash_delta_kernel<T, kD><<<blocks_for(p.batch * p.q_heads * p.seq, kDeltaRowsPerBlock), kThreads, 0, stream>>>(p);
  LaunchStatus status = last_launch_status();
  if (!status.ok()) return status;

  status = allow_dynamic_shared_memory(flash_backward_kv_kernel<T, kD>, Smem::kBytes);
  if (!status.ok()) return status;
  const dim3 kv_grid(blocks_for(p.seq, Smem::kOuter), static_cast<unsigned>(p.kv_heads),
                     static_cast<unsigned>(p.batch));
  flash_backward_kv_kernel<T, kD><<<kv_grid, kThreads, Smem::kBytes, stream>>>(p);
  status = last_launch_status();
  if (!status.ok()) return status;

  status = allow_dynamic_shared_memory(flash_backward_q_kernel<T, kD>, Smem::kBytes);
  if (!status.ok()) return status;
  const dim3 q_grid(blocks_for(p.seq, Smem::kOuter), static_cast<unsigned>(p.q_heads), static_cast<unsigned>(p.batch));
  flash_backward_q_kernel<T, kD><<<q_grid, kThreads, Smem::kBytes, stream>>>(p);
  return last_launch_status();
}


}  // namespace

LaunchStatus flash_attention_forward_tiled(const FlashForwardParams& params, DType dtype, void* stream) {
  if (params.batch == 0 || params.q_heads == 0 || params.seq == 0) return {};
  LaunchStatus status;
  const bool supported = dispatch_head_dim(params.head_dim, [&](auto head_dim) {
    dispatch_dtype(dtype, [&](auto element) {
      status = forward_for<decltype(element), decltype(head_dim)::value>(params, to_stream(stream));
    });
  });
  return supported ? status : LaunchStatus{kUnsupportedHeadDim};
}

LaunchStatus flash_attention_backward_tiled(const FlashBackwardParams& params, DType dtype, void* stream) {
  if (params.batch == 0 || params.q_heads == 0 || params.seq == 0) return {};
  LaunchStatus status;
  const bool supported = dispatch_head_dim(params.head_dim, [&](auto head_dim) {
    dispatch_dtype(dtype, [&](auto element) {
      status = backward_for<decltype(element), decltype(head_dim)::value>(params, to_stream(stream));
    });
  });
  return supported ? status : LaunchStatus{kUnsupportedHeadDim};
}

}  // namespace tt::kernels
