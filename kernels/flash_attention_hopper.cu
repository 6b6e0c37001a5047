// Flash attention, Hopper generation (sm_90a): TMA loads and wgmma products, after FlashAttention-3 (Shah et al.
// 2024): the forward with warp specialisation and its pipeline within a warpgroup; the backward (at the end of this
// file), deterministic, on the same machinery: FlashAttention-3's one kernel of five products per tile pair at
// head_dim 64, FlashAttention-2's two kernels at 128.
//
// The forward (the backward's shape is described where it begins): a block is one producer warpgroup and two
// consumer warpgroups of 64 query rows (head_dim 128; for head_dim 64 two up to 512 positions, three beyond: 192
// queries). The grid is persistent: one block per SM, each looping over work items (a query block of one head and
// batch entry), the longest first.
//  * the producer (warpgroup 0; one thread issues) copies an item's Q tile once and then each key tile's K and V
//    into a ring of kStages shared-memory slots by TMA, waiting for a slot to be empty before refilling it, and
//    runs ahead into the next item while the consumers finish this one. It needs few registers and gives them to
//    the consumers (setmaxnreg).
//  * each consumer, per key tile: S = Q K^T by wgmma from shared memory (both K-major), the causal mask and online
//    softmax on the accumulator registers (the register generation's named steps: flash_fragments.cuh), P rounded
//    to 16 bits in registers, O += P V by wgmma with P from registers and V MN-major (transposed by the
//    instruction), then the slot is released. The next tile's S is issued before this tile's P V, so the softmax
//    runs while P V is in the tensor cores (FA3's intra-warpgroup pipeline).
// The consumers share every K/V tile. FA3's ping-pong (consumers taking turns to issue their products) was
// measured slower here and is not used (docs/attention.md).
//
// The log-sum-exp it writes is the register generation's, so either generation's backward serves it.
// bf16 and fp16, head_dim 64 and 128, no RoPE in the load. NVIDIA sm_90a only: other device targets compile the
// kernels to a trap, and hopper_flash_present says no unless this build has sm_90a code.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include "flash_fragments.cuh"
#include "hopper.cuh"

namespace tt::kernels {

#if defined(__CUDACC__) && !defined(__HIP__)


namespace {

using namespace flash;

// The block's shape and its shared memory: Q, then the ring's K and V slots (each 1024-byte aligned, as the
// swizzle needs), the output staging rows, the barriers. Head dim 64 takes three consumer warpgroups (192 query
// rows: each K/V tile serves more queries, and the accumulators are small) or two at short sequences
// (hopper_forward_consumers_d64), 128 takes two (FA3's tile sizes).
template <int kD, int kConsumerWarpgroups>
struct HopperForwardShape {
  static constexpr int kConsumers = kConsumerWarpgroups;  // warpgroups of kWarpgroupRows query rows
  static constexpr int kBlockM = hopper::kWarpgroupRows * kConsumers;
  static constexpr int kBlockN = 128;                  // keys per tile
  // K/V tiles in the ring. Head dim 64 takes three: its tiles are small (16 KB each), and the producer then runs a
  // tile further ahead, across the end of one item into the next. Measured on an H200 (kernel_bench, bf16,
  // alternated three times against two slots): long-context 92.5-92.9 -> 90.8-90.9 us, d64-s1024 64.1-64.3 ->
  // 62.0-62.2, d64-s2048 96.6-97.1 -> 95.2-95.7, medium 26.0-26.1 -> 25.8-26.1 (within its repeats). Head dim 128
  // keeps two: a third K and V would take the shared memory past the SM's 227 KB.
  static constexpr int kStages = kD == 64 ? 3 : 2;
  static constexpr int kThreads = (1 + kConsumers) * hopper::kWarpgroupThreads;
  // The producer's registers go to the consumers; together they fill the SM's 64 K registers.
  static constexpr int kProducerRegisters = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  // setmaxnreg moves registers within the block's own allocation: the launch's per-thread count (64 K over the
  // block's threads, rounded down to a multiple of 8) times its threads. The budgets must fit that, not just 64 K.
  static_assert((kProducerRegisters + kConsumers * kConsumerRegisters) * hopper::kWarpgroupThreads <=
                    kThreads * ((64 * 1024 / kThreads) & ~7),
                "the register budgets must fit the block's allocation");
  static constexpr int kQBytes = hopper::panel_tile_bytes(kBlockM, kD);
  static constexpr int kTileBytes = hopper::panel_tile_bytes(kBlockN, kD);  // one K or one V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kStaging = kV + kStages * kTileBytes;
  static constexpr int kBarriers = kStaging + tile_bytes<kD>(kBlockM);
  static constexpr int kBarrierCount = 2 + 3 * kStages;  // Q full and empty; K full, V full and empty per slot
  static constexpr int kBytes = kBarriers + 8 * kBarrierCount + 1024;  // + the alignment of the start
  static_assert(kQBytes % 1024 == 0 && kTileBytes % 1024 == 0, "swizzled tiles start 1024-byte aligned");
  static_assert(kBarriers % 8 == 0, "barriers are 8-byte words");
  static_assert(kBytes <= 227 * 1024, "the block's shared memory must fit an SM's (227 KB on sm_90)");
};

#if defined(TT_HOPPER_DEVICE)
// Query-block work item `work` (the forward's persistent grid, the dQ kernel's launched one), in the order a
// launched grid takes its blocks (query_block): the latest, longest query blocks of every head and batch entry
// first, so that the short ones fill the tail.
struct WorkItem {
  int q0;
  int head, batch, kv_head;
};
__device__ __forceinline__ WorkItem work_item(int work, int query_blocks, int block_m, int q_heads, int kv_heads,
                                              int batch) {
  const int per_block_row = q_heads * batch;  // items sharing one query block index
  const int m = query_blocks - 1 - work / per_block_row;
  const int rest = work % per_block_row;
  const int head = rest % q_heads;
  return {m * block_m, head, rest / q_heads, head / (q_heads / kv_heads)};
}

// The work item a block of the forward's persistent grid takes in its round `round` (its items numbered from 0):
// a snake through the list, block b taking item b of even rounds' stretch of gridDim.x items and item
// gridDim.x - 1 - b of odd rounds'. The list runs longest first, so the block that took the longest of one
// round takes the shortest of the next, and the blocks' totals come out nearly equal. The plain stride
// (b, b + gridDim.x, ...) gave block 0 the longest of every round. Counting an item as its key tiles plus one, on
// 132 SMs: long-context's busiest block had 65 against a mean of 49 (the snake: 54), d128-s4096's 152 against 136
// (the snake: 136); ncu found the SMs idle 13% of that d128-s4096 forward. Once `round` passes the list's end for
// a block it has passed it for every later round (the next round's items all come after).
__device__ __forceinline__ int scheduled_work(int round) {
  const int blocks = static_cast<int>(gridDim.x), block = static_cast<int>(blockIdx.x);
  return round * blocks + (round % 2 == 0 ? block : blocks - 1 - block);
}

// The products of the forward and the backward, issued, neither committed nor waited for. kTileDescriptor: each
// tile's descriptor computed once and each k step's offset added (descriptor_plus); otherwise each step's descriptor
// from its address (the fused backward kernel's form). Step k's descriptor of a tile of `rows` rows, either way:
template <bool kTileDescriptor>
__device__ __forceinline__ uint64_t k_major_step(const unsigned char* tile, int rows, int k) {
  using namespace hopper;
  if constexpr (kTileDescriptor)
    return descriptor_plus(k_major_descriptor(tile, rows, 0), k_major_offset(rows, k));
  else
    return k_major_descriptor(tile, rows, k);
}
template <bool kTileDescriptor>
__device__ __forceinline__ uint64_t mn_major_step(const unsigned char* tile, int rows, int k) {
  using namespace hopper;
  if constexpr (kTileDescriptor)
    return descriptor_plus(mn_major_descriptor(tile, rows, 0), mn_major_offset(k));
  else
    return mn_major_descriptor(tile, rows, k);
}

// acc [kRows x kN] = A B^T over kD, A a shared tile of kRows rows and B one of kN rows, both K-major.
template <typename T, int kD, int kRows, int kN, bool kTileDescriptor = true>
__device__ __forceinline__ void issue_product_nt(float (&acc)[kN / 8][4], const unsigned char* a,
                                                 const unsigned char* b) {
#pragma unroll
  for (int k = 0; k < kD / 16; ++k)
    hopper::wgmma<T, 0, 0>(acc, k_major_step<kTileDescriptor>(a, kRows, k), k_major_step<kTileDescriptor>(b, kN, k),
                           k > 0);
}

// The same with A's 64 rows in registers (the warpgroup's A fragments over kD columns, load_a_fragments_swizzled).
template <typename T, int kD, int kRows, int kN, bool kTileDescriptor = true>
__device__ __forceinline__ void issue_product_nt(float (&acc)[kN / 8][4], const uint32_t (&a)[kD / 16][4],
                                                 const unsigned char* b) {
#pragma unroll
  for (int k = 0; k < kD / 16; ++k) hopper::wgmma<T, 0>(acc, a[k], k_major_step<kTileDescriptor>(b, kN, k), k > 0);
}

// acc [64 x kD] += A [64 x kK] B with A's fragments in registers and B a streamed or resident tile of kK rows
// read MN-major (its rows are the reduced dimension).
template <typename T, int kD, int kK, bool kTileDescriptor = true>
__device__ __forceinline__ void accumulate_product(float (&acc)[kD / 8][4], const uint32_t (&a)[kK / 16][4],
                                                   const unsigned char* b) {
#pragma unroll
  for (int k = 0; k < kK / 16; ++k) hopper::wgmma<T, 1>(acc, a[k], mn_major_step<kTileDescriptor>(b, kK, k), true);
}
#endif

template <typename T, int kD, int kConsumers>
__global__ void __launch_bounds__(HopperForwardShape<kD, kConsumers>::kThreads, 1)
    flash_forward_hopper_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, const FlashForwardParams p) {
#if defined(TT_HOPPER_DEVICE)
  using namespace hopper;
  using Shape = HopperForwardShape<kD, kConsumers>;
  constexpr int kBlockM = Shape::kBlockM;
  constexpr int kBlockN = Shape::kBlockN;
  constexpr int kStages = Shape::kStages;
  extern __shared__ unsigned char smem_unaligned[];
  unsigned char* smem = smem_unaligned + ((1024 - shared_address(smem_unaligned) % 1024) % 1024);
  unsigned char* q_tile = smem + Shape::kQ;
  auto k_tile = [&](int slot) { return smem + Shape::kK + slot * Shape::kTileBytes; };
  auto v_tile = [&](int slot) { return smem + Shape::kV + slot * Shape::kTileBytes; };
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Shape::kBarriers);
  uint64_t* q_empty = q_full + 1;
  uint64_t* k_full = q_empty + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* empty = v_full + kStages;

  const int seq = static_cast<int>(p.seq);
  const int q_heads = static_cast<int>(p.q_heads), kv_heads = static_cast<int>(p.kv_heads);
  const int batches = static_cast<int>(p.batch);
  const int query_blocks = (seq + kBlockM - 1) / kBlockM;
  const int items = query_blocks * q_heads * batches;
  // The query blocks end at the sequence's end, so that where seq is not a multiple of kBlockM the part of a block
  // that holds no query is in the first block, which reads one key tile, and not in the last, which reads them all
  // (600 positions in blocks of 192, head dim 64: rows -168..23 on 1 tile instead of 576..767 on 5; every row's
  // arithmetic is unchanged). The first block starts before position 0: TMA fills those rows of Q with zeros, every
  // key is masked for them, and their output and log-sum-exp are not stored.
  const int first_row = seq - query_blocks * kBlockM;
  auto item_of = [&](int work) {
    WorkItem item = work_item(work, query_blocks, kBlockM, q_heads, kv_heads, batches);
    item.q0 += first_row;
    return item;
  };
  auto tiles_of = [&](int q0) { return (q0 + kBlockM + kBlockN - 1) / kBlockN; };  // q0 + kBlockM <= seq

  if (threadIdx.x == 0) {
    barrier_init(q_full, 1);
    barrier_init(q_empty, Shape::kConsumers * kWarpgroupThreads);
    for (int slot = 0; slot < kStages; ++slot) {
      barrier_init(&k_full[slot], 1);
      barrier_init(&v_full[slot], 1);
      barrier_init(&empty[slot], Shape::kConsumers * kWarpgroupThreads);
    }
    barrier_init_fence();
  }
  __syncthreads();

  // The grid is persistent: each block takes its work items round by round (scheduled_work). The producer runs
  // ahead into the next item (its Q once the consumers are done with the last one's, its K/V tiles as slots free
  // up) while the consumers finish and store the current one. `ring` counts the K/V tiles through the slots across
  // items: tile number r goes to slot r % kStages in round r / kStages.
  if (warpgroup() == 0) {
    registers_decrease<Shape::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    tma_prefetch_descriptor(&q_map);
    tma_prefetch_descriptor(&k_map);
    tma_prefetch_descriptor(&v_map);
    int ring = 0;
    for (int round = 0, work = scheduled_work(0); work < items; work = scheduled_work(++round)) {
      const WorkItem item = item_of(work);
      barrier_wait(q_empty, (round & 1) ^ 1);
      barrier_arrive_expect_bytes(q_full, Shape::kQBytes);
      for (int panel = 0; panel < kD / kPanelColumns; ++panel)
        tma_load_4d(q_tile + panel * kBlockM * kSwizzleRowBytes, &q_map, q_full, panel * kPanelColumns, item.q0,
                    item.head, item.batch);
      const int tiles = tiles_of(item.q0);
      for (int tile = 0; tile < tiles; ++tile, ++ring) {
        const int slot = ring % kStages;
        barrier_wait(&empty[slot], ((ring / kStages) & 1) ^ 1);
        barrier_arrive_expect_bytes(&k_full[slot], Shape::kTileBytes);
        for (int panel = 0; panel < kD / kPanelColumns; ++panel)
          tma_load_4d(k_tile(slot) + panel * kBlockN * kSwizzleRowBytes, &k_map, &k_full[slot], panel * kPanelColumns,
                      tile * kBlockN, item.kv_head, item.batch);
        barrier_arrive_expect_bytes(&v_full[slot], Shape::kTileBytes);
        for (int panel = 0; panel < kD / kPanelColumns; ++panel)
          tma_load_4d(v_tile(slot) + panel * kBlockN * kSwizzleRowBytes, &v_map, &v_full[slot], panel * kPanelColumns,
                      tile * kBlockN, item.kv_head, item.batch);
      }
    }
    return;
  }

  // A consumer: kWarpgroupRows query rows of each item, warp w of the warpgroup rows kWarpRows w.. (wgmma's layout).
  registers_increase<Shape::kConsumerRegisters>();
  const int consumer = warpgroup() - 1;
  const int row0 = kWarpgroupRows * consumer + kWarpRows * warp_in_warpgroup();  // this warp's first row in the block
  const unsigned char* my_q = q_tile + kWarpgroupRows * consumer * kSwizzleRowBytes;  // its warpgroup's rows, each panel
  const float scale_log2 = softmax_scale<kD>() * kLog2e;
  T* staging = reinterpret_cast<T*>(smem + Shape::kStaging);

  int ring = 0;
  for (int round = 0, work = scheduled_work(0); work < items; work = scheduled_work(++round)) {
    const WorkItem item = item_of(work);
    const int q0 = item.q0;
    const int warp_q0 = q0 + row0;
    const int tiles = tiles_of(q0);

    float o[1][kD / 8][4];
    float row_max[1][2] = {{-INFINITY, -INFINITY}};  // raw scores; rows lane/4 and lane/4 + 8 of the warp
    float row_sum[1][2] = {{0.0f, 0.0f}};            // this lane's share
    float alpha[1][2];
    float s[1][kBlockN / 8][4];
    uint32_t probs[kBlockN / 16][4];  // the previous tile's P, the A operand of its O += P V
    zero(o[0]);

    // S = Q K^T of tile `tile`, issued and committed.
    auto issue_scores = [&](int tile) {
      const int slot = (ring + tile) % kStages;
      barrier_wait(&k_full[slot], ((ring + tile) / kStages) & 1);
      wgmma_fence();
      issue_product_nt<T, kD, kBlockM, kBlockN>(s[0], my_q, k_tile(slot));
      wgmma_commit();
    };
    // O += P V of tile `tile` with the probabilities in `probs`, issued and committed.
    auto issue_values = [&](int tile) {
      const int slot = (ring + tile) % kStages;
      barrier_wait(&v_full[slot], ((ring + tile) / kStages) & 1);
      fence_operands(o[0]);
      wgmma_fence();
      accumulate_product<T, kD, kBlockN>(o[0], probs, v_tile(slot));
      wgmma_commit();
    };
    // Once the last tile's scores are in, this warpgroup is done with Q: the producer may load the next item's.
    auto scores_in = [&](int tile) {
      fence_operands(s[0]);
      if (tile == tiles - 1) barrier_arrive(q_empty);
    };
    // The causal mask where a tile holds keys after the block's first query or past the sequence's end.
    auto softmax_of = [&](int tile) {
      if ((tile + 1) * kBlockN - 1 > q0 || (tile + 1) * kBlockN > seq)
        mask_scores<1, kBlockN>(s, tile * kBlockN, warp_q0, seq);
      online_softmax_statistics<1, kBlockN>(s, row_max, row_sum, scale_log2, alpha);
    };

    barrier_wait(q_full, round & 1);
    issue_scores(0);
    wgmma_wait<0>();
    scores_in(0);
    softmax_of(0);  // o is still zero: no rescaling
    to_a_fragments<T, kBlockN>(probs, s[0]);
    // FA3's pipeline within a warpgroup: the next tile's scores are issued before this tile's P V, and the softmax
    // of the next tile runs while P V is still in the tensor cores; O's rescaling waits for P V to finish.
    for (int tile = 1; tile < tiles; ++tile) {
      issue_scores(tile);
      issue_values(tile - 1);
      wgmma_wait<1>();  // the scores
      scores_in(tile);
      softmax_of(tile);
      wgmma_wait<0>();  // P V of the previous tile: its slot is free again
      fence_operands(o[0]);
      barrier_arrive(&empty[(ring + tile - 1) % kStages]);
      rescale_rows<1, kD>(o, alpha);
      to_a_fragments<T, kBlockN>(probs, s[0]);
    }
    issue_values(tiles - 1);
    wgmma_wait<0>();
    fence_operands(o[0]);
    barrier_arrive(&empty[(ring + tiles - 1) % kStages]);
    ring += tiles;

    finish_softmax<1, kD>(o, row_max, row_sum, scale_log2, warp_q0, seq,
                          p.lse + (static_cast<int64_t>(item.batch) * p.q_heads + item.head) * p.seq);
    // Each warp stages and writes its own 16 rows, 16 bytes at a time.
    __syncwarp();  // the previous item's reads of these rows are done
    stage_rows<T, kD>(staging, row0, o[0], 1.0f, q0, seq, nullptr, nullptr);
    __syncwarp();
    store_rows<kWarpRows, kD, kMmaLanes>(head_ptr<T>(p.out, p.out_strides, item.batch, item.head), p.out_strides.seq,
                                         q0 + row0, seq, staging + row0 * kPitch<kD>, lane());
  }
#else
  // Built for a device without sm_90a's instructions: this kernel must never run there (the launcher checks),
  // and if it did, a trap is better than an output nobody wrote.
  (void)q_map, (void)k_map, (void)v_map, (void)p;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif  // TT_HOPPER_DEVICE
}

constexpr const char* kTooManyItems =
    "the Hopper flash attention kernels count their work items in 32 bits: batch x heads x row blocks is too many";

// The forward's consumer warpgroups at head dim 64: two (128 queries per block) up to kTwoConsumersMaxSeq
// positions, three (192 queries share each K/V tile) beyond. At 512 positions two compute fewer warpgroup tiles
// (20 instead of 24 per head: less of the causal diagonal is wasted). Measured, H100, bf16 and fp16
// (docs/attention.md): medium's 512 positions 26.7-26.9 us with two against 28.1-28.2 with three, long-context's
// 4096 92.3-93.0 with three against 98.8-98.9 with two, and three also at 1024 (65.8 against 68.4 us, bf16) and 2048
// (97.6 against 109.5); why three win there was not profiled. TT_HOPPER_FORWARD_CONSUMERS=2 or 3 overrides the rule
// (a measurement knob, read once).
constexpr int64_t kTwoConsumersMaxSeq = 512;
struct ConsumersKnob {
  int forced = 0;     // 0: unset
  std::string error;  // another value, refused by the launcher
};
inline const ConsumersKnob& consumers_knob() {
  static const ConsumersKnob knob = [] {
    ConsumersKnob k;
    const char* set = std::getenv("TT_HOPPER_FORWARD_CONSUMERS");
    const std::string value = set ? set : "";
    if (value == "2" || value == "3")
      k.forced = value[0] - '0';
    else if (!value.empty())
      k.error = "TT_HOPPER_FORWARD_CONSUMERS='" + value +
                "' is not allowed: 2 or 3 (the Hopper forward's consumer "
                "warpgroups at head dim 64), or unset for the rule by sequence length";
    return k;
  }();
  return knob;
}
inline int hopper_forward_consumers_d64(int64_t seq) {
  if (consumers_knob().forced != 0) return consumers_knob().forced;
  return seq <= kTwoConsumersMaxSeq ? 2 : 3;
}

template <typename T, int kD, int kConsumers>
LaunchStatus hopper_forward_with(const FlashForwardParams& p, gpuStream_t stream) {
  using Shape = HopperForwardShape<kD, kConsumers>;
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  if (const char* e = hopper::bind_device_context()) return {e};
  CUtensorMap q_map, k_map, v_map;
  if (const char* e = hopper::encode_tensor_map(&q_map, p.q, kBf16, p.batch, p.q_heads, p.seq, kD, p.q_strides.batch,
                                                p.q_strides.head, p.q_strides.seq, Shape::kBlockM))
    return {e};
  if (const char* e = hopper::encode_tensor_map(&k_map, p.k, kBf16, p.batch, p.kv_heads, p.seq, kD, p.k_strides.batch,
                                                p.k_strides.head, p.k_strides.seq, Shape::kBlockN))
    return {e};
  if (const char* e = hopper::encode_tensor_map(&v_map, p.v, kBf16, p.batch, p.kv_heads, p.seq, kD, p.v_strides.batch,
                                                p.v_strides.head, p.v_strides.seq, Shape::kBlockN))
    return {e};
  auto* kernel = flash_forward_hopper_kernel<T, kD, kConsumers>;
  const LaunchStatus status = allow_dynamic_shared_memory(kernel, Shape::kBytes);
  if (!status.ok()) return status;
  // Persistent: one block per SM (each holds an SM's shared memory), or fewer when there are fewer items.
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return last_launch_status();
  const int64_t items = static_cast<int64_t>(blocks_for(p.seq, Shape::kBlockM)) * p.q_heads * p.batch;
  // scheduled_work may look up to two grids past the last item.
  if (items > std::numeric_limits<int>::max() - 2 * static_cast<int64_t>(sms)) return {kTooManyItems};
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(items, sms));
  kernel<<<grid, Shape::kThreads, Shape::kBytes, stream>>>(q_map, k_map, v_map, p);
  return last_launch_status();
}

template <typename T, int kD>
LaunchStatus hopper_forward_for(const FlashForwardParams& p, gpuStream_t stream) {
  if (!consumers_knob().error.empty()) return {consumers_knob().error.c_str()};  // at any head dim: never ignored
  if constexpr (kD == 64) {
    if (hopper_forward_consumers_d64(p.seq) == 2) return hopper_forward_with<T, kD, 2>(p, stream);
    return hopper_forward_with<T, kD, 3>(p, stream);
  }
  return hopper_forward_with<T, kD, 2>(p, stream);
}

// =================================================================================================
// Backward, deterministic (nothing summed in an order that varies from run to run, so every gradient is bitwise
// reproducible), each product a wgmma. Every kernel has one shape: a producer warpgroup that copies by TMA the
// block's resident rows once and streams the other operand pair through a ring, and two consumer warpgroups of 64
// rows each.
//  * dK, dV: resident K and V of 128 keys, streamed Q and dO tiles of 64 queries (every query head of the
//    grouped-query group, from the last tile down to the diagonal) with their lse and delta. S^T = K Q^T and
//    dP^T = V dO^T, keys as rows, so that P^T and dS^T are already the A operands of dV += P^T dO and
//    dK += dS^T Q (dO and Q MN-major: the tiles loaded K-major for the first two products serve transposed for the
//    last two).
//  * head_dim 64 from 1,024 positions, the same kernel also makes dQ (FlashAttention-3's five products): dS^T goes
//    to shared memory, each consumer multiplies its 64 keys' dS by their K, and a writer warp (one per share slot)
//    adds the two shares to the query tile's fp32 dQ sum in the block's turn (the kernel's comment). A prologue
//    writes delta = rowsum(dO * O) and zeroes the sums first; an epilogue writes dQ from them.
//  * elsewhere (head_dim 128, and 64 below 1,024 positions), dQ has blocks of its own: resident Q and dO of 128
//    queries (in the dQ kernel of the two-kernel scheme, also in registers as A operands), streamed K and V tiles of
//    64 keys up to the diagonal. S = Q K^T and dP = dO V^T again (seven products per tile pair in all),
//    dS = P * (dP - delta) in registers, dQ += dS K with dS from registers and K MN-major.
//    FlashAttention-2's scheme, which measured faster there than the fused kernel (hopper_backward_for). Below 4,096
//    positions the dQ and dK/dV blocks are one grid after a prologue that writes delta, so that the dQ blocks fill
//    the SMs the short dK/dV blocks leave; from 4,096 the dQ kernel runs first, writing delta, then dK/dV.
// Every tile, resident or streamed, is copied in boxes of 64 rows (one set of tensor maps serves every kernel).
// Within a tile, S and dP are two groups: a warpgroup computes P while dP is still in the tensor cores (and in the
// non-fused dK/dV step dS^T while dV is). Across tiles each warpgroup runs in order: the forward's pipeline within a
// warpgroup (the next tile's first products issued before this tile's last) was tried in the two kernels and measured
// no faster, and the
// two consumers taking turns to issue their products (FA3's warp-scheduler barriers) measured slower
// (docs/attention.md); why neither pays was not profiled.
// =================================================================================================

constexpr int kBackwardBoxRows = 64;

#if defined(TT_HOPPER_DEVICE)
// Copies rows [row0, row0 + kRows) of one head of `map` into a tile of 64-column swizzled panels, in boxes of
// kBackwardBoxRows rows; the bytes complete on `barrier` (rows past the sequence's end arrive as zeros).
template <int kRows, int kD>
__device__ __forceinline__ void tma_load_rows(unsigned char* tile, const CUtensorMap* map, uint64_t* barrier,
                                              int row0, int head, int batch) {
#pragma unroll
  for (int panel = 0; panel < kD / hopper::kPanelColumns; ++panel)
#pragma unroll
    for (int box = 0; box < kRows / kBackwardBoxRows; ++box)
      hopper::tma_load_4d(tile + (panel * kRows + box * kBackwardBoxRows) * hopper::kSwizzleRowBytes, map, barrier,
                          panel * hopper::kPanelColumns, row0 + box * kBackwardBoxRows, head, batch);
}
#endif

// Every backward kernel's shape: kResidentRows rows of two operands held for the whole block (Q and dO, or K and V),
// and tiles of kStreamedRows rows of two others streamed through kStages ring slots. kStats: the streamed rows' lse and
// delta come with them (dK/dV). kGradQ: the block also computes dQ (the fused kernel): dS^T goes through shared
// memory, and each consumer's dQ share through fp32 rows in two slots, each for its writer warp. Then the staging
// rows of the output and the barriers.
template <int kHeadDim, int kResident, int kStreamed, bool kStats, bool kGradQ = false>
struct HopperBackwardShape {
  static constexpr int kD = kHeadDim;
  static constexpr int kResidentRows = kResident;
  static constexpr int kStreamedRows = kStreamed;
  static constexpr int kConsumers = 2;
  static_assert(kResidentRows == hopper::kWarpgroupRows * kConsumers, "a consumer warpgroup per 64 resident rows");
  static constexpr int kStages = 2;
  static constexpr int kThreads = (1 + kConsumers) * hopper::kWarpgroupThreads;
  // The producer warpgroup's loops (the TMA thread's and the statistics warp's) run over (query tile, head) without
  // a division and are not unrolled, so they fit in 24 registers (with the division, or unrolled, ptxas spilled there
  // and the dK/dV kernel's producer had 40); the consumers take the rest of the block's allocation (24 + 2 x 240 =
  // 56 + 2 x 224 = 504 = 3 x 168 per thread). The dK/dV kernel needs its 240: its head-dim-128 step in
  // FlashAttention-3's order (dV issued before dS^T is known: below) spills at 232 (ptxas C7512). The two together
  // measured 0.9-1.7% faster forward + backward at d128-s1024/s2048 (H200, docs/attention.md); at 56 / 224 the
  // dK/dV kernel had measured 0.6-2.3% slower than at 40 / 232 (head dim 128).
  // For the fused and dQ kernels the split is a measurement, not a need (nothing spills at either). The fused kernel
  // ran faster with 56 and 224 (H200, forward + backward at 1,024 to 4,096 positions 0.3-2% faster; ncu at
  // long-context 2.3% fewer cycles, with as many instructions in the SASS, scheduled differently). The dQ kernel at
  // 40 / 232 measured the same, and at 56 / 224 0.6-0.9% faster at d128-s4096 only (two pairs, bf16: not resolved;
  // three more pairs at d128-s1024 to s4096, bf16 and fp16, level); it keeps 24 / 240.
  static constexpr int kProducerRegisters = kGradQ ? 56 : 24;
  static constexpr int kConsumerRegisters = kGradQ ? 224 : 240;
  static_assert((kProducerRegisters + kConsumers * kConsumerRegisters) * hopper::kWarpgroupThreads <=
                    kThreads * ((64 * 1024 / kThreads) & ~7),
                "the register budgets must fit the block's allocation");
  static constexpr int kResidentBytes = hopper::panel_tile_bytes(kResidentRows, kD);  // one of the two
  static constexpr int kTileBytes = hopper::panel_tile_bytes(kStreamedRows, kD);      // one of the two
  static constexpr int kStatsBytes = kStats ? 2 * kStreamedRows * 4 : 0;              // lse, delta
  // dS^T [resident rows x streamed rows], one swizzled panel; each consumer's dQ share (dS K over its own 64 keys,
  // all kD columns) [streamed rows x kD] fp32 in two slots, stored in the accumulator's fragment order (fragment n of
  // thread t at float4 n * 128 + t: consecutive threads write consecutive 16 bytes, and the tile is one contiguous
  // block that a bulk copy adds to global memory whole).
  static constexpr int kDsBytes = kGradQ ? hopper::panel_tile_bytes(kResidentRows, kStreamedRows) : 0;
  static constexpr int kShareSlots = 2;
  static constexpr int kGradQShareBytes = kStreamedRows * kD * 4;
  static constexpr int kGradQBytes = kGradQ ? kShareSlots * kConsumers * kGradQShareBytes : 0;
  static constexpr int kResidentA = 0;
  static constexpr int kResidentB = kResidentA + kResidentBytes;
  static constexpr int kStreamA = kResidentB + kResidentBytes;
  static constexpr int kStreamB = kStreamA + kStages * kTileBytes;
  static constexpr int kStreamStats = kStreamB + kStages * kTileBytes;
  static constexpr int kDs = kStreamStats + kStages * kStatsBytes;
  static constexpr int kGradQShares = kDs + kDsBytes;
  static constexpr int kStaging = kGradQShares + kGradQBytes;  // not shared with the shares: the writer may still
                                                               // be copying the last one when dK and dV are staged
  static constexpr int kBarriers = kStaging + tile_bytes<kD>(kResidentRows);
  // resident full; full and empty per ring slot; with dQ, full and empty per share slot
  static constexpr int kBarrierCount = 1 + 2 * kStages + (kGradQ ? 2 * kShareSlots : 0);
  static constexpr int kBytes = kBarriers + 8 * kBarrierCount + 1024;  // + the alignment of the start
  static_assert(kResidentBytes % 1024 == 0 && kTileBytes % 1024 == 0 && kDs % 1024 == 0,
                "swizzled tiles start 1024-byte aligned");
  static_assert(!kGradQ || kStreamedRows == hopper::kPanelColumns, "dS^T is one panel wide");
  static_assert(kGradQShares % 128 == 0 && kStaging % 16 == 0 && kBarriers % 8 == 0,
                "shares and staging rows 16-byte aligned (bulk copies need 16; 128 keeps whole L2 lines), "
                "barriers 8-byte words");
  static_assert(kResidentRows % kBackwardBoxRows == 0 && kStreamedRows % kBackwardBoxRows == 0,
                "tiles are copied in whole boxes");
};
template <int kD>
using HopperBackwardQShape = HopperBackwardShape<kD, 128, kBackwardBoxRows, false>;  // 128 queries; 64-key tiles
template <int kD>
using HopperBackwardKvShape = HopperBackwardShape<kD, 128, kBackwardBoxRows, true>;  // 128 keys; 64-query tiles
template <int kD>
using HopperBackwardFusedShape = HopperBackwardShape<kD, 128, kBackwardBoxRows, true, true>;  // as dK/dV, + dQ

#if defined(TT_HOPPER_DEVICE)
// The barriers and tiles of a HopperBackwardShape block in its (1024-byte aligned) shared memory.
template <typename Shape>
struct BackwardBlock {
  unsigned char* smem;
  __device__ unsigned char* resident_a() const { return smem + Shape::kResidentA; }
  __device__ unsigned char* resident_b() const { return smem + Shape::kResidentB; }
  __device__ unsigned char* stream_a(int slot) const { return smem + Shape::kStreamA + slot * Shape::kTileBytes; }
  __device__ unsigned char* stream_b(int slot) const { return smem + Shape::kStreamB + slot * Shape::kTileBytes; }
  // A streamed tile's statistics (dK/dV): lse of its kStreamedRows rows, then delta.
  __device__ float* lse(int slot) const {
    return reinterpret_cast<float*>(smem + Shape::kStreamStats + slot * Shape::kStatsBytes);
  }
  __device__ float* delta(int slot) const { return lse(slot) + Shape::kStreamedRows; }
  // The fused kernel's dS^T (consumer c's 64 rows from consumer * 64), consumer c's fp32 dQ share in a share slot,
  // and the slot's barriers (full: both consumers stored theirs; empty: the slot's writer is done with it).
  __device__ unsigned char* ds(int consumer) const {
    return smem + Shape::kDs + consumer * hopper::kWarpgroupRows * hopper::kSwizzleRowBytes;
  }
  __device__ float* grad_q_share(int slot, int consumer) const {
    return reinterpret_cast<float*>(smem + Shape::kGradQShares +
                                    (slot * Shape::kConsumers + consumer) * Shape::kGradQShareBytes);
  }
  __device__ uint64_t* share_full(int slot) const { return resident_full() + 1 + 2 * Shape::kStages + slot; }
  __device__ uint64_t* share_empty(int slot) const {
    return resident_full() + 1 + 2 * Shape::kStages + Shape::kShareSlots + slot;
  }
  __device__ uint64_t* resident_full() const { return reinterpret_cast<uint64_t*>(smem + Shape::kBarriers); }
  __device__ uint64_t* full(int slot) const { return resident_full() + 1 + slot; }
  __device__ uint64_t* empty(int slot) const { return resident_full() + 1 + Shape::kStages + slot; }

  // Aligns the dynamic shared memory and initialises the barriers (block-collective).
  __device__ static BackwardBlock start(unsigned char* smem_unaligned) {
    BackwardBlock block{smem_unaligned + ((1024 - shared_address(smem_unaligned) % 1024) % 1024)};
    if (threadIdx.x == 0) {
      hopper::barrier_init(block.resident_full(), 1);
      for (int slot = 0; slot < Shape::kStages; ++slot) {
        // A streamed slot fills with the TMA thread's arrival, and the statistics warp's 32 where there is one.
        hopper::barrier_init(block.full(slot), 1 + (Shape::kStatsBytes > 0 ? kMmaLanes : 0));
        hopper::barrier_init(block.empty(slot), Shape::kConsumers * hopper::kWarpgroupThreads);
      }
      for (int slot = 0; slot < (Shape::kGradQBytes > 0 ? Shape::kShareSlots : 0); ++slot) {
        hopper::barrier_init(block.share_full(slot), Shape::kConsumers * hopper::kWarpgroupThreads);
        hopper::barrier_init(block.share_empty(slot), kMmaLanes);  // every lane of the slot's writer warp
      }
      hopper::barrier_init_fence();
    }
    __syncthreads();
    return block;
  }
  // Streamed tile i sits in slot i % kStages, in round i / kStages of the ring.
  __device__ static int slot_of(int i) { return i % Shape::kStages; }
  __device__ static int round_parity(int i) { return (i / Shape::kStages) & 1; }
  // Tile i's dQ shares sit in share slot i % kShareSlots.
  __device__ static int share_slot_of(int i) { return i % Shape::kShareSlots; }
  __device__ static int share_parity(int i) { return (i / Shape::kShareSlots) & 1; }
};

// S (or S^T) and dP (or dP^T) of one tile: a [64 x kN] = rows of `a` (this warpgroup's 64 rows of a resident
// K-major tile of kRows rows, or their A fragments in registers) times the streamed tile `b` (kN rows, K-major)
// transposed, for both operand pairs, issued as two groups, S first, neither waited for. The caller waits for S
// alone (wgmma_wait<1>) and computes P while dP is still in the tensor cores (FlashAttention-3's order), then for dP.
template <typename T, int kD, int kRows, int kN, bool kTileDescriptor = true, typename RowsA>
__device__ __forceinline__ void issue_scores_and_gradients(float (&s)[kN / 8][4], float (&dp)[kN / 8][4],
                                                           const RowsA& a_s, const unsigned char* b_s,
                                                           const RowsA& a_dp, const unsigned char* b_dp) {
  using namespace hopper;
  wgmma_fence();
  issue_product_nt<T, kD, kRows, kN, kTileDescriptor>(s, a_s, b_s);
  wgmma_commit();
  issue_product_nt<T, kD, kRows, kN, kTileDescriptor>(dp, a_dp, b_dp);
  wgmma_commit();
}

// The fused kernel's dQ for one streamed tile. Each consumer stores its share (dS K over its own 64 keys) in the
// accumulator's fragment order (the order the global fp32 sum keeps too; the epilogue kernel reads it back) and
// arrives on the share slot's full barrier. The slot's writer warp (write_grad_q_sums) does the rest while the
// consumers go on.
template <int kD>
__device__ __forceinline__ void store_grad_q_share(const float (&grad_q)[kD / 8][4], float* share) {
  const int thread = static_cast<int>(threadIdx.x) % hopper::kWarpgroupThreads;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
    reinterpret_cast<float4*>(share)[n * hopper::kWarpgroupThreads + thread] =
        make_float4(grad_q[n][0], grad_q[n][1], grad_q[n][2], grad_q[n][3]);
}

// A writer warp, one per share slot (`slot`: it takes the steps whose shares sit there): for each of its streamed
// tiles, waits for both consumers' shares, sums them in a fixed order (the first consumer's + the second's, into the
// first's), waits for this key block's turn on the query tile, adds the sum to the tile's fp32 dQ in global memory
// with one bulk reduction (cp.reduce.async.bulk .add.f32), waits for it to complete, passes the turn on and frees
// the slot. One warp for both slots was the kernel's bottleneck: its chain per tile (the sum, the turn's poll, the
// reduction's completion, the release) took longer than the consumers' step, and they waited for the slot (ncu,
// H100, long-context: 18% of the kernel's stall samples on that wait; without the turns, forward + backward 413
// against 545 us). Two warps run two tiles' chains at once; each tile's turns keep their order, so dQ does not
// change. head_of(i) and q0_of(i): step i's query head and first query.
template <typename Shape, typename HeadOf, typename Q0Of>
__device__ __forceinline__ void write_grad_q_sums(const BackwardBlock<Shape>& block, const FlashBackwardParams& p,
                                                  int batch, int k0, int steps, int slot, HeadOf head_of, Q0Of q0_of) {
  using namespace hopper;
  using Block = BackwardBlock<Shape>;
  constexpr int kRows = Shape::kStreamedRows;  // a tile's queries
  constexpr int kVectors = Shape::kGradQShareBytes / 16;
  const int key_block = k0 / Shape::kResidentRows;
  const int tiles = static_cast<int>((p.seq + kRows - 1) / kRows);
  for (int i = slot; i < steps; i += Shape::kShareSlots) {
    barrier_wait(block.share_full(slot), Block::share_parity(i));
    float4* sum = reinterpret_cast<float4*>(block.grad_q_share(slot, 0));
#pragma unroll 4
    for (int v = lane(); v < kVectors; v += kMmaLanes) {
#pragma unroll
      for (int consumer = 1; consumer < Shape::kConsumers; ++consumer) {
        const float4 w = reinterpret_cast<const float4*>(block.grad_q_share(slot, consumer))[v];
        const float4 a = sum[v];
        sum[v] = make_float4(a.x + w.x, a.y + w.y, a.z + w.z, a.w + w.w);
      }
    }
    fence_shared_for_async();  // the sums, before the bulk copy reads them
    __syncwarp();
    if (lane() == 0) {
      const int64_t tile = (static_cast<int64_t>(batch) * p.q_heads + head_of(i)) * tiles + q0_of(i) / kRows;
      int* turn = p.grad_q_turns + tile;
      float* tile_sum = p.grad_q_accum + tile * kRows * Shape::kD;
      turn_wait(turn, key_block);
      fence_global_between_proxies();  // the turn taken before the additions are issued
      bulk_reduce_add(tile_sum, sum, Shape::kGradQShareBytes);
      bulk_wait_all();                 // the additions are done in global memory (and the slot read)
      fence_global_between_proxies();  // ... before the turn is passed
      turn_pass(turn, key_block + 1);
    }
    __syncwarp();
    // Every lane arrives (the barrier counts 32): each releases its own reads and writes of the slot, and lane 0's
    // arrival comes after the bulk copy has read it.
    barrier_arrive(block.share_empty(slot));
  }
}
#endif

#if defined(TT_HOPPER_DEVICE)
// dQ of work item `work`: a query block of 128 rows of one head and batch entry, the longest first. kDeltaWritten:
// delta is read from p.delta (the prologue wrote it); otherwise this block computes its rows' delta and writes it.
// kRowsInRegisters: Q and dO are the A operands of S and dP from registers, loaded once (otherwise both operands are
// read from shared memory, as in the dK/dV blocks).
template <typename T, int kD, bool kDeltaWritten, bool kRowsInRegisters>
__device__ __forceinline__ void backward_q_block(int work, const CUtensorMap* q_map, const CUtensorMap* k_map,
                                                 const CUtensorMap* v_map, const CUtensorMap* grad_out_map,
                                                 const FlashBackwardParams& p) {
  using namespace hopper;
  using Shape = HopperBackwardQShape<kD>;
  using Block = BackwardBlock<Shape>;
  constexpr int kBlockM = Shape::kResidentRows;  // queries
  constexpr int kBlockN = Shape::kStreamedRows;  // keys per streamed tile
  extern __shared__ unsigned char smem_unaligned[];
  const Block block = Block::start(smem_unaligned);
  const int seq = static_cast<int>(p.seq);
  const WorkItem item = work_item(work, (seq + kBlockM - 1) / kBlockM, kBlockM, static_cast<int>(p.q_heads),
                                  static_cast<int>(p.kv_heads), static_cast<int>(p.batch));
  const int q0 = item.q0;
  const int tiles = (min(seq, q0 + kBlockM) + kBlockN - 1) / kBlockN;  // key tiles up to the diagonal

  if (warpgroup() == 0) {  // the producer: Q and dO once, then each key tile's K and V
    registers_decrease<Shape::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    barrier_arrive_expect_bytes(block.resident_full(), 2 * Shape::kResidentBytes);
    tma_load_rows<kBlockM, kD>(block.resident_a(), q_map, block.resident_full(), q0, item.head, item.batch);
    tma_load_rows<kBlockM, kD>(block.resident_b(), grad_out_map, block.resident_full(), q0, item.head, item.batch);
    for (int tile = 0; tile < tiles; ++tile) {
      const int slot = Block::slot_of(tile);
      barrier_wait(block.empty(slot), Block::round_parity(tile) ^ 1);
      barrier_arrive_expect_bytes(block.full(slot), 2 * Shape::kTileBytes);
      tma_load_rows<kBlockN, kD>(block.stream_a(slot), k_map, block.full(slot), tile * kBlockN, item.kv_head,
                                 item.batch);
      tma_load_rows<kBlockN, kD>(block.stream_b(slot), v_map, block.full(slot), tile * kBlockN, item.kv_head,
                                 item.batch);
    }
    return;
  }

  registers_increase<Shape::kConsumerRegisters>();
  const int consumer = warpgroup() - 1;
  const int row0 = kWarpgroupRows * consumer + kWarpRows * warp_in_warpgroup();  // this warp's first row in the block
  const int warp_q0 = q0 + row0;
  const unsigned char* my_q = block.resident_a() + kWarpgroupRows * consumer * kSwizzleRowBytes;
  const unsigned char* my_grad_out = block.resident_b() + kWarpgroupRows * consumer * kSwizzleRowBytes;
  const float scale = softmax_scale<kD>();
  const float scale_log2 = scale * kLog2e;
  // lse and delta while the copies are in flight (delta from global O and dO, written out for the dK/dV kernel,
  // unless the prologue wrote it).
  const RowStatistics rows = row_statistics<T, kD, kDeltaWritten>(p, item.batch, item.head, warp_q0);

  float grad_q[kD / 8][4];
  zero(grad_q);
  barrier_wait(block.resident_full(), 0);
  // With both operands in shared memory each 64 x 64 x 16 step of S and dP reads 4 KB there; with A from registers,
  // 2 KB.
  uint32_t q_rows[kRowsInRegisters ? kD / 16 : 1][4], grad_out_rows[kRowsInRegisters ? kD / 16 : 1][4];
  if constexpr (kRowsInRegisters) {
    load_a_fragments_swizzled<kD, kBlockM>(my_q, q_rows);
    load_a_fragments_swizzled<kD, kBlockM>(my_grad_out, grad_out_rows);
  }
  for (int tile = 0; tile < tiles; ++tile) {
    const int slot = Block::slot_of(tile);
    const int k0 = tile * kBlockN;
    barrier_wait(block.full(slot), Block::round_parity(tile));
    float s[kBlockN / 8][4];
    float dp[kBlockN / 8][4];
    // Masked where a key may lie after a query or past the end. Query rows past the end need no mask: their Q and dO
    // rows are zeros and their lse and delta 0, so dS is 0 there, and they are never stored.
    const bool masked = k0 + kBlockN - 1 > warp_q0 || k0 + kBlockN > seq;
    if constexpr (kRowsInRegisters)  // S = Q K^T, dP = dO V^T
      issue_scores_and_gradients<T, kD, kBlockM, kBlockN>(s, dp, q_rows, block.stream_a(slot), grad_out_rows,
                                                          block.stream_b(slot));
    else
      issue_scores_and_gradients<T, kD, kBlockM, kBlockN>(s, dp, my_q, block.stream_a(slot), my_grad_out,
                                                          block.stream_b(slot));
    wgmma_wait<1>();
    fence_operands(s);
    probabilities<kBlockN>(s, rows, k0, warp_q0, seq, scale_log2, masked);
    wgmma_wait<0>();
    fence_operands(dp);
    gradients_from_probabilities<kBlockN>(s, dp, rows);  // dS = P * (dP - delta)
    uint32_t ds[kBlockN / 16][4];
    to_a_fragments<T, kBlockN>(ds, dp);
    fence_operands(grad_q);
    wgmma_fence();
    accumulate_product<T, kD, kBlockN>(grad_q, ds, block.stream_a(slot));  // dQ += dS K
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(grad_q);
    barrier_arrive(block.empty(slot));
  }

  // Each warp stages and writes its own 16 rows.
  T* staging = reinterpret_cast<T*>(block.smem + Shape::kStaging);
  stage_rows<T, kD>(staging, row0, grad_q, scale, q0, seq, nullptr, nullptr);
  __syncwarp();
  store_rows<kWarpRows, kD, kMmaLanes>(head_ptr<T>(p.grad_q, p.grad_q_strides, item.batch, item.head),
                                       p.grad_q_strides.seq, warp_q0, seq, staging + row0 * kPitch<kD>, lane());
}
#endif  // TT_HOPPER_DEVICE

// The dQ kernel of the two-kernel scheme: a block per work item; it writes delta for the dK/dV kernel after it. Its
// Q and dO rows are in registers. H200, d128-s4096, forward + backward, two builds with it alternated three times with
// main: level in bf16 (1.4% faster to 0.7% slower per pair), 0.1-3.9% faster in fp16, not resolved beyond the spread
// of identical code between builds (docs/attention.md). The one grid's dQ blocks (below 4,096 positions) read both
// operands from shared memory: with registers they measured 0.3-2.1% slower at medium, d64-s256 and d128-s1024 and
// 0.4-1.7% faster at d128-s2048 (per pair), and no choice by length was built.
template <typename T, int kD>
__global__ void __launch_bounds__(HopperBackwardQShape<kD>::kThreads, 1)
    flash_backward_q_hopper_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                   const __grid_constant__ CUtensorMap v_map,
                                   const __grid_constant__ CUtensorMap grad_out_map, const FlashBackwardParams p) {
#if defined(TT_HOPPER_DEVICE)
  backward_q_block<T, kD, false, true>(static_cast<int>(blockIdx.x), &q_map, &k_map, &v_map, &grad_out_map, p);
#else
  (void)q_map, (void)k_map, (void)v_map, (void)grad_out_map, (void)p;
#if defined(__CUDA_ARCH__)
  __trap();  // as the forward: never launched where sm_90a code is missing
#endif
#endif  // TT_HOPPER_DEVICE
}

// dK and dV, and with kGradQ dQ too (FlashAttention-3's five products per tile pair). Work item `work`: a key
// block of 128 rows of one key/value head and batch entry, the earliest (the longest: it sees every later query)
// first, so that short ones fill the tail. Its stream: the query tiles from the last down to the key block's
// first key, each for every query head of the group, in that fixed order.
// With dQ: a query tile's dQ sums over every key block up to its diagonal, and the blocks take turns on it (a
// counter per tile) in key-block order, so that the sum's order, and dQ, are the same on every run: each block's
// writer warps (one per share slot, so two tiles' turns are awaited at once) add the block's share to the tile's
// fp32 sum (zeroed by the prologue) in L2 by one bulk reduction, while the consumers go on with the next tiles; the
// epilogue kernel scales and converts the sums afterwards. Blocks that start together reach a tile at the same step
// (the stream runs from the last tile down), so a turn costs the waits of the blocks before it, not their work; and a
// block only ever waits for earlier key blocks, which come first in the grid, so the turns cannot deadlock on a block
// not yet launched. That assumes what CUDA does but does not promise: blocks are dispatched in blockIdx order
// (FlashAttention-3's deterministic mode and CUTLASS's semaphores assume it too); and the prologue runs before the
// kernel on the same stream, with no programmatic dependent launch.
#if defined(TT_HOPPER_DEVICE)
template <typename T, int kD, bool kGradQ>
__device__ __forceinline__ void backward_kv_block(int work, const CUtensorMap* q_map, const CUtensorMap* k_map,
                                                  const CUtensorMap* v_map, const CUtensorMap* grad_out_map,
                                                  const FlashBackwardParams& p) {
  using namespace hopper;
  using Shape = HopperBackwardShape<kD, 128, kBackwardBoxRows, true, kGradQ>;
  using Block = BackwardBlock<Shape>;
  constexpr int kBlockN = Shape::kResidentRows;  // keys
  constexpr int kBlockM = Shape::kStreamedRows;  // queries per streamed tile
  extern __shared__ unsigned char smem_unaligned[];
  const Block block = Block::start(smem_unaligned);
  const int seq = static_cast<int>(p.seq);
  const int kv_heads = static_cast<int>(p.kv_heads), batches = static_cast<int>(p.batch);
  const int k0 = work / (kv_heads * batches) * kBlockN;
  const int kv_head = work % (kv_heads * batches) % kv_heads;
  const int batch = work % (kv_heads * batches) / kv_heads;
  const int group = static_cast<int>(p.q_heads) / kv_heads;
  const int q_tiles = (seq - k0 + kBlockM - 1) / kBlockM;  // query tiles that end before k0 see none of its keys
  // (query tile, head) pairs: the last query tile first, the heads of the group inner. In that order every key
  // block reaches a given tile after the same number of steps from its start (the order of the dQ turns needs it).
  // The producer's TMA and statistics loops below walk the same order as nested loops (no division): change all three
  // together.
  const int steps = group * q_tiles;
  auto head_of = [&](int i) { return kv_head * group + i % group; };
  auto q0_of = [&](int i) { return k0 + (q_tiles - 1 - i / group) * kBlockM; };

  if (warpgroup() == 0) {
    registers_decrease<Shape::kProducerRegisters>();
    if (threadIdx.x == 0) {  // K and V once, then each step's Q and dO
      barrier_arrive_expect_bytes(block.resident_full(), 2 * Shape::kResidentBytes);
      tma_load_rows<kBlockN, kD>(block.resident_a(), k_map, block.resident_full(), k0, kv_head, batch);
      tma_load_rows<kBlockN, kD>(block.resident_b(), v_map, block.resident_full(), k0, kv_head, batch);
      int i = 0;
#pragma unroll 1
      for (int q0 = k0 + (q_tiles - 1) * kBlockM; q0 >= k0; q0 -= kBlockM)
#pragma unroll 1
        for (int head = kv_head * group; head < (kv_head + 1) * group; ++head, ++i) {
          const int slot = Block::slot_of(i);
          barrier_wait(block.empty(slot), Block::round_parity(i) ^ 1);
          barrier_arrive_expect_bytes(block.full(slot), 2 * Shape::kTileBytes);
          tma_load_rows<kBlockM, kD>(block.stream_a(slot), q_map, block.full(slot), q0, head, batch);
          tma_load_rows<kBlockM, kD>(block.stream_b(slot), grad_out_map, block.full(slot), q0, head, batch);
        }
    } else if (warp_in_warpgroup() == 1) {  // the statistics warp: each step's lse and delta, 0 past the end
      // The steps as (query tile, head) loops and the rows' pointers advanced per step, with no division: the dK/dV
      // kernel's producer warpgroup holds this loop in 24 registers (the consumers then get 240).
      static_assert(kBlockM == 2 * kMmaLanes, "each lane holds two rows of a tile's statistics");
      const int r0 = lane();
      const float* lse_head0 = p.lse + (static_cast<int64_t>(batch) * p.q_heads + kv_head * group) * p.seq;
      const float* delta_head0 = p.delta + (lse_head0 - p.lse);
      int i = 0;
#pragma unroll 1
      for (int q0 = k0 + (q_tiles - 1) * kBlockM; q0 >= k0; q0 -= kBlockM) {
        const bool low_in = q0 + r0 < seq, high_in = q0 + r0 + kMmaLanes < seq;
        const float* lse_rows = lse_head0 + q0 + r0;
        const float* delta_rows = delta_head0 + q0 + r0;
#pragma unroll 1
        for (int h = 0; h < group; ++h, ++i, lse_rows += p.seq, delta_rows += p.seq) {
          const int slot = Block::slot_of(i);
          barrier_wait(block.empty(slot), Block::round_parity(i) ^ 1);
          float* lse = block.lse(slot) + r0;
          float* delta = block.delta(slot) + r0;
          lse[0] = low_in ? lse_rows[0] : 0.0f;
          delta[0] = low_in ? delta_rows[0] : 0.0f;
          lse[kMmaLanes] = high_in ? lse_rows[kMmaLanes] : 0.0f;
          delta[kMmaLanes] = high_in ? delta_rows[kMmaLanes] : 0.0f;
          barrier_arrive(block.full(slot));  // releases the writes to the consumers that wait on the phase
        }
      }
    } else if (warp_in_warpgroup() >= 2) {  // warps 2 and 3, the writer warps: each tile's dQ sum, in its turn, one
                                            // warp per share slot
      static_assert(!kGradQ || Shape::kShareSlots == 2, "one writer warp per share slot: warps 2 and 3");
      if constexpr (kGradQ) write_grad_q_sums(block, p, batch, k0, steps, warp_in_warpgroup() - 2, head_of, q0_of);
    }
    return;
  }

  registers_increase<Shape::kConsumerRegisters>();
  const int consumer = warpgroup() - 1;
  const int row0 = kWarpgroupRows * consumer + kWarpRows * warp_in_warpgroup();
  const int warp_k0 = k0 + row0;  // this warp's first key
  const unsigned char* my_k = block.resident_a() + kWarpgroupRows * consumer * kSwizzleRowBytes;
  const unsigned char* my_v = block.resident_b() + kWarpgroupRows * consumer * kSwizzleRowBytes;
  const float scale = softmax_scale<kD>();
  const float scale_log2 = scale * kLog2e;

  float grad_k[kD / 8][4];
  float grad_v[kD / 8][4];
  zero(grad_k);
  zero(grad_v);
  barrier_wait(block.resident_full(), 0);
  for (int i = 0; i < steps; ++i) {
    const int slot = Block::slot_of(i);
    const int q0 = q0_of(i);
    barrier_wait(block.full(slot), Block::round_parity(i));
    float s[kBlockM / 8][4];
    float dp[kBlockM / 8][4];
    const bool masked = q0 < warp_k0 + kWarpRows - 1 || q0 + kBlockM > seq;
    uint32_t probs[kBlockM / 16][4];
    uint32_t ds[kBlockM / 16][4];
    if constexpr (!kGradQ) {
      // S^T = K Q^T, dP^T = V dO^T; P^T while dP^T is still in the tensor cores. dV += P^T dO is then issued before
      // dS^T is known, so dS^T is computed while dV runs (FlashAttention-3's order; at head dim 128 it needs the
      // consumers' 240 registers: see HopperBackwardShape).
      issue_scores_and_gradients<T, kD, kBlockN, kBlockM>(s, dp, my_k, block.stream_a(slot), my_v,
                                                          block.stream_b(slot));
      wgmma_wait<1>();
      fence_operands(s);
      probabilities_transposed<kBlockM>(s, block.lse(slot), q0, warp_k0, seq, scale_log2, masked);
      to_a_fragments<T, kBlockM>(probs, s);
      fence_operands(grad_v);
      wgmma_fence();
      accumulate_product<T, kD, kBlockM>(grad_v, probs, block.stream_b(slot));  // dV += P^T dO
      wgmma_commit();
      wgmma_wait<1>();  // dP^T is in; dV may still be running
      fence_operands(dp);
      gradients_from_probabilities_transposed<kBlockM>(s, dp, block.delta(slot));  // dS^T = P^T * (dP^T - delta)
      to_a_fragments<T, kBlockM>(ds, dp);
      fence_operands(grad_k);  // grad_v is in flight: not touched until the wait below
      wgmma_fence();
      accumulate_product<T, kD, kBlockM>(grad_k, ds, block.stream_a(slot));  // dK += dS^T Q
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(grad_v);
      fence_operands(grad_k);
      barrier_arrive(block.empty(slot));
    } else {
      // The fused kernel issues S^T and dP^T as one group and waits for both (FlashAttention-3's order measured
      // slower here with one writer warp, and was not measured again since the two), with the address-form descriptors
      // (each tile's descriptor computed once measured slower at long-context; docs/attention.md). Then dS^T goes to
      // shared memory, where its rows are the A operand of dQ. A warpgroup's dQ reads only its own rows.
      wgmma_fence();
      issue_product_nt<T, kD, kBlockN, kBlockM, false>(s, my_k, block.stream_a(slot));   // S^T = K Q^T
      issue_product_nt<T, kD, kBlockN, kBlockM, false>(dp, my_v, block.stream_b(slot));  // dP^T = V dO^T
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(s);
      fence_operands(dp);
      score_gradients_transposed<kBlockM>(s, dp, block.lse(slot), block.delta(slot), q0, warp_k0, seq, scale_log2,
                                          masked);
      to_a_fragments<T, kBlockM>(probs, s);
      to_a_fragments<T, kBlockM>(ds, dp);
      if (i > 0) named_barrier_sync(1 + consumer, kWarpgroupThreads);  // every warp is past the last tile's dQ
      store_a_fragments_swizzled<kBlockM>(block.ds(consumer), ds);
      fence_shared_for_async();
      named_barrier_sync(1 + consumer, kWarpgroupThreads);  // every row stored
      fence_operands(grad_v);
      fence_operands(grad_k);
      wgmma_fence();
      accumulate_product<T, kD, kBlockM, false>(grad_v, probs, block.stream_b(slot));  // dV += P^T dO
      accumulate_product<T, kD, kBlockM, false>(grad_k, ds, block.stream_a(slot));     // dK += dS^T Q
      // In the same group, this warpgroup's share of dQ = dS K over its own 64 keys. dS^T is MN-major for dS (one
      // panel: M = 64 needs no leading offset), K MN-major (its rows are the reduced dimension).
      float grad_q[kD / 8][4];
#pragma unroll
      for (int k = 0; k < kWarpgroupRows / 16; ++k)
        wgmma<T, 1, 1>(grad_q, mn_major_descriptor(block.ds(consumer), kWarpgroupRows, k),
                       mn_major_descriptor(my_k, kBlockN, k), k > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(grad_q);
      fence_operands(grad_v);
      fence_operands(grad_k);
      barrier_arrive(block.empty(slot));
      const int share_slot = Block::share_slot_of(i);
      barrier_wait(block.share_empty(share_slot), Block::share_parity(i) ^ 1);
      store_grad_q_share<kD>(grad_q, block.grad_q_share(share_slot, consumer));
      barrier_arrive(block.share_full(share_slot));
    }
  }

  // Each warp stages and writes its own 16 rows of dK, then of dV.
  T* staging = reinterpret_cast<T*>(block.smem + Shape::kStaging);
  T* my_staging = staging + row0 * kPitch<kD>;
  stage_rows<T, kD>(staging, row0, grad_k, scale, k0, seq, nullptr, nullptr);
  __syncwarp();
  store_rows<kWarpRows, kD, kMmaLanes>(head_ptr<T>(p.grad_k, p.grad_k_strides, batch, kv_head), p.grad_k_strides.seq,
                                       warp_k0, seq, my_staging, lane());
  __syncwarp();
  stage_rows<T, kD>(staging, row0, grad_v, 1.0f, k0, seq, nullptr, nullptr);
  __syncwarp();
  store_rows<kWarpRows, kD, kMmaLanes>(head_ptr<T>(p.grad_v, p.grad_v_strides, batch, kv_head), p.grad_v_strides.seq,
                                       warp_k0, seq, my_staging, lane());
}
#endif  // TT_HOPPER_DEVICE

// dK and dV (with kGradQ: and dQ's sums), a block per work item.
template <typename T, int kD, bool kGradQ>
__global__ void __launch_bounds__(HopperBackwardShape<kD, 128, kBackwardBoxRows, true, kGradQ>::kThreads, 1)
    flash_backward_kv_hopper_kernel(const __grid_constant__ CUtensorMap q_map,
                                    const __grid_constant__ CUtensorMap k_map,
                                    const __grid_constant__ CUtensorMap v_map,
                                    const __grid_constant__ CUtensorMap grad_out_map, const FlashBackwardParams p) {
#if defined(TT_HOPPER_DEVICE)
  backward_kv_block<T, kD, kGradQ>(static_cast<int>(blockIdx.x), &q_map, &k_map, &v_map, &grad_out_map, p);
#else
  (void)q_map, (void)k_map, (void)v_map, (void)grad_out_map, (void)p;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif  // TT_HOPPER_DEVICE
}

// dQ and dK/dV in one grid (`kv_items` blocks of dK/dV items, then the dQ items, each list longest first), after the
// prologue has written delta. Where the key blocks are about as many as the SMs, the dK/dV kernel of the two-kernel
// scheme runs as one wave whose longest block (key block 0, which sees every query) sets its time while the SMs of
// the short ones idle, after a dQ kernel that could have filled them. In one grid the dQ items fill those SMs (ncu,
// H200, d128-s1024: the dK/dV kernel alone kept its SMs active 57% of its longest SM's cycles).
template <typename T, int kD>
__global__ void __launch_bounds__(HopperBackwardKvShape<kD>::kThreads, 1)
    flash_backward_one_grid_hopper_kernel(const __grid_constant__ CUtensorMap q_map,
                                          const __grid_constant__ CUtensorMap k_map,
                                          const __grid_constant__ CUtensorMap v_map,
                                          const __grid_constant__ CUtensorMap grad_out_map, const FlashBackwardParams p,
                                          int kv_items) {
  static_assert(HopperBackwardKvShape<kD>::kThreads == HopperBackwardQShape<kD>::kThreads, "one block size");
#if defined(TT_HOPPER_DEVICE)
  const int work = static_cast<int>(blockIdx.x);
  if (work < kv_items)
    backward_kv_block<T, kD, false>(work, &q_map, &k_map, &v_map, &grad_out_map, p);
  else
    backward_q_block<T, kD, true, false>(work - kv_items, &q_map, &k_map, &v_map, &grad_out_map, p);
#else
  (void)q_map, (void)k_map, (void)v_map, (void)grad_out_map, (void)p, (void)kv_items;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif  // TT_HOPPER_DEVICE
}

// The first kernel of the fused backward and of the one-grid launch, a block per 64-query tile of one head and batch
// entry (the turn counters' and the dQ sums' order): delta = rowsum(dO * O) of every query (a warp per 16 rows,
// written to p.delta); with kGradQSums (the fused kernel's) the tile's fp32 dQ sum and its turn counter zeroed.
template <typename T, int kD, bool kGradQSums>
__global__ void __launch_bounds__(hopper::kWarpgroupThreads)
    flash_backward_prologue_hopper_kernel(const FlashBackwardParams p) {
  constexpr int kRows = HopperBackwardKvShape<kD>::kStreamedRows;  // as the fused kernel's query tiles
  static_assert(kRows == hopper::kWarpgroupWarps * hopper::kWarpRows, "a warp per 16 rows of the tile");
  static_assert(kRows == kHopperGradQTileRows, "ops sizes the turns by kHopperGradQTileRows");
  const int tiles = static_cast<int>((p.seq + kRows - 1) / kRows);
  const int tile = static_cast<int>(blockIdx.x) % tiles;
  const int head = static_cast<int>(blockIdx.x) / tiles % static_cast<int>(p.q_heads);
  const int batch = static_cast<int>(blockIdx.x) / tiles / static_cast<int>(p.q_heads);
  const int warp_q0 = tile * kRows + hopper::kWarpRows * (static_cast<int>(threadIdx.x) / kMmaLanes);
  warp_rows_delta<T, kD>(p, batch, head, warp_q0, (static_cast<int64_t>(batch) * p.q_heads + head) * p.seq);
  if constexpr (kGradQSums) {
    float4* sum = reinterpret_cast<float4*>(p.grad_q_accum) + static_cast<int64_t>(blockIdx.x) * kRows * kD / 4;
    for (int v = static_cast<int>(threadIdx.x); v < kRows * kD / 4; v += hopper::kWarpgroupThreads)
      sum[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (threadIdx.x == 0) p.grad_q_turns[blockIdx.x] = 0;
  }
}

// The fused backward's last kernel, a block per 64-query tile as the prologue: dQ = the tile's fp32 sum times the
// softmax scale, in the input's dtype. The sum is in the consumers' fragment order (store_grad_q_share):
// float4 n * 128 + t holds thread t's fragment n, rows and columns as flash_fragments.cuh's c_row and c_col say for
// warp t / 32, lane t % 32.
template <typename T, int kD>
__global__ void __launch_bounds__(hopper::kWarpgroupThreads)
    flash_backward_epilogue_hopper_kernel(const FlashBackwardParams p) {
  using Shape = HopperBackwardFusedShape<kD>;
  constexpr int kRows = Shape::kStreamedRows;
  const int seq = static_cast<int>(p.seq);
  const int tiles = (seq + kRows - 1) / kRows;
  const int tile = static_cast<int>(blockIdx.x) % tiles;
  const int head = static_cast<int>(blockIdx.x) / tiles % static_cast<int>(p.q_heads);
  const int batch = static_cast<int>(blockIdx.x) / tiles / static_cast<int>(p.q_heads);
  const float scale = softmax_scale<kD>();
  const float4* sum =
      reinterpret_cast<const float4*>(p.grad_q_accum) + static_cast<int64_t>(blockIdx.x) * kRows * kD / 4;
  const int thread = static_cast<int>(threadIdx.x);
  float grad_q[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    const float4 v = sum[n * hopper::kWarpgroupThreads + thread];
    grad_q[n][0] = v.x, grad_q[n][1] = v.y, grad_q[n][2] = v.z, grad_q[n][3] = v.w;
  }
  // Each warp stages and writes its own 16 rows, 16 bytes at a time, as the other kernels' epilogues do.
  __shared__ __align__(16) T staging[kRows * kPitch<kD>];
  const int row0 = hopper::kWarpRows * (thread / kMmaLanes);
  stage_rows<T, kD>(staging, row0, grad_q, scale, 0, seq, nullptr, nullptr);
  __syncwarp();
  store_rows<hopper::kWarpRows, kD, kMmaLanes>(head_ptr<T>(p.grad_q, p.grad_q_strides, batch, head),
                                               p.grad_q_strides.seq, tile * kRows + row0, seq,
                                               staging + row0 * kPitch<kD>, lane());
}

// A backward kernel over `items` blocks, taking the four tensor maps, the parameters and then `extra` (the one grid's
// count of dK/dV items).
template <typename Kernel, typename... Extra>
LaunchStatus launch_backward(Kernel* kernel, int64_t items, int threads, int bytes, const CUtensorMap (&maps)[4],
                             const FlashBackwardParams& p, gpuStream_t stream, Extra... extra) {
  if (items > std::numeric_limits<int>::max()) return {kTooManyItems};
  const LaunchStatus status = allow_dynamic_shared_memory(kernel, bytes);
  if (!status.ok()) return status;
  kernel<<<static_cast<unsigned>(items), threads, bytes, stream>>>(maps[0], maps[1], maps[2], maps[3], p, extra...);
  return last_launch_status();
}

// The prologue over every 64-query tile: delta, and with kGradQSums the fused kernel's zeroed sums and turns.
template <typename T, int kD, bool kGradQSums>
LaunchStatus launch_backward_prologue(const FlashBackwardParams& p, gpuStream_t stream) {
  const int64_t query_tiles =
      static_cast<int64_t>(blocks_for(p.seq, HopperBackwardKvShape<kD>::kStreamedRows)) * p.q_heads * p.batch;
  if (query_tiles > std::numeric_limits<int>::max()) return {kTooManyItems};
  flash_backward_prologue_hopper_kernel<T, kD, kGradQSums>
      <<<static_cast<unsigned>(query_tiles), hopper::kWarpgroupThreads, 0, stream>>>(p);
  return last_launch_status();
}

// The fused kernel between its prologue (delta, the zeroed sums and turns) and epilogue (dQ) at head dim 64 from
// kHopperFusedBackwardFromSeq positions; elsewhere FlashAttention-2's two kernels: in one grid after the prologue
// (delta only) below kHopperTwoBackwardKernelsFromSeq positions, and from there as two launches, dQ first (its kernel
// also writes delta, which the dK/dV kernel reads). The one grid against the two launches: H200, bf16 and fp16,
// alternated three times (d128-s1024 206 against 254 us, d128-s2048 365 against 440, d128-s4096 0.7-3.2% slower).
// The fused kernel against the two kernels measured on an H100 (bf16 and fp16, kernel_bench forward + backward, the
// two alternated in one call, docs/attention.md): at head dim 64 the two kernels
// at 256 and 512 positions (80 against 85, 101 against 107 us: the fused kernel's prologue and epilogue weigh most
// where there are few tiles), the fused one from 1,024 (281 against 285 us; 2,048: 430-437 against 450-455) and level
// at 4,096. At head dim 128 the fused block's shared memory (two fp32 share slots of 64 x 128 per consumer) exceeds the
// 227 KB a block may have. Forms that split dQ's columns between the consumers fit, and measured slower than the two
// kernels: with the consumers adding them themselves 6-10% (d128-s1024 395.2 vs 358.6 us, d128-s4096 1,721.8 vs
// 1,618.4), with the writer warps adding them 8-26% (2026-11-28: register spills, and a barrier per tile).
template <typename T, int kD>
LaunchStatus hopper_backward_for(const FlashBackwardParams& p, gpuStream_t stream) {
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  if (const char* e = hopper::bind_device_context()) return {e};
  CUtensorMap maps[4];  // q, k, v, grad_out
  const void* bases[4] = {p.q, p.k, p.v, p.grad_out};
  const FlashStrides strides[4] = {p.q_strides, p.k_strides, p.v_strides, p.grad_out_strides};
  for (int i = 0; i < 4; ++i) {
    const int64_t heads = i == 1 || i == 2 ? p.kv_heads : p.q_heads;
    if (const char* e = hopper::encode_tensor_map(&maps[i], bases[i], kBf16, p.batch, heads, p.seq, kD,
                                                  strides[i].batch, strides[i].head, strides[i].seq, kBackwardBoxRows))
      return {e};
  }
  if constexpr (hopper_backward_fusable(kD)) {
    if (hopper_backward_fused(kD, p.seq)) {
      using Fused = HopperBackwardFusedShape<kD>;
      const int64_t key_blocks = static_cast<int64_t>(blocks_for(p.seq, Fused::kResidentRows)) * p.kv_heads * p.batch;
      if (p.grad_q_accum == nullptr || p.grad_q_turns == nullptr)
        return {"the fused Hopper flash attention backward needs its dQ scratch (grad_q_accum, grad_q_turns)"};
      const int64_t query_tiles = static_cast<int64_t>(blocks_for(p.seq, Fused::kStreamedRows)) * p.q_heads * p.batch;
      if (query_tiles > std::numeric_limits<int>::max()) return {kTooManyItems};
      LaunchStatus status = launch_backward_prologue<T, kD, true>(p, stream);
      if (!status.ok()) return status;
      status = launch_backward(flash_backward_kv_hopper_kernel<T, kD, true>, key_blocks, Fused::kThreads, Fused::kBytes,
                               maps, p, stream);
      if (!status.ok()) return status;
      flash_backward_epilogue_hopper_kernel<T, kD>
          <<<static_cast<unsigned>(query_tiles), hopper::kWarpgroupThreads, 0, stream>>>(p);
      return last_launch_status();
    }
  }
  {
    using Kv = HopperBackwardKvShape<kD>;
    using Q = HopperBackwardQShape<kD>;
    const int64_t key_blocks = static_cast<int64_t>(blocks_for(p.seq, Kv::kResidentRows)) * p.kv_heads * p.batch;
    const int64_t query_blocks = static_cast<int64_t>(blocks_for(p.seq, Q::kResidentRows)) * p.q_heads * p.batch;
    if (hopper_backward_one_grid(kD, p.seq)) {
      if (key_blocks + query_blocks > std::numeric_limits<int>::max()) return {kTooManyItems};
      const LaunchStatus status = launch_backward_prologue<T, kD, false>(p, stream);
      if (!status.ok()) return status;
      return launch_backward(flash_backward_one_grid_hopper_kernel<T, kD>, key_blocks + query_blocks, Kv::kThreads,
                             std::max(Kv::kBytes, Q::kBytes), maps, p, stream, static_cast<int>(key_blocks));
    }
    // From kHopperTwoBackwardKernelsFromSeq, which only head dim 128 reaches unfused: the dQ kernel (it writes
    // delta), then dK/dV.
    static_assert(kHopperTwoBackwardKernelsFromSeq > kHopperFusedBackwardFromSeq, "head dim 64 never runs two kernels");
    if constexpr (hopper_backward_fusable(kD)) {
      return {"the Hopper flash attention backward has no scheme for this head_dim and length"};  // unreachable
    } else {
      const LaunchStatus status =
          launch_backward(flash_backward_q_hopper_kernel<T, kD>, query_blocks, Q::kThreads, Q::kBytes, maps, p, stream);
      if (!status.ok()) return status;
      return launch_backward(flash_backward_kv_hopper_kernel<T, kD, false>, key_blocks, Kv::kThreads, Kv::kBytes, maps,
                             p, stream);
    }
  }
}

}  // namespace

bool hopper_flash_present() {
#if defined(TT_SM90A_IN_BUILD)
  // This build has the kernels' sm_90a code (CMake: TORCH_CUDA_ARCH_LIST names 9.0a); the current GPU must be an
  // sm_90 one, which is where the runtime loads that code (the forward kernel stands for all). Remembered per device.
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // 0 unknown, 1 yes, 2 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    (void)cudaGetLastError();
    return false;
  }
  if (known[device] == 0) {
    int major = 0, minor = 0;
    const bool sm90 = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
                      major == 9 && minor == 0;
    cudaFuncAttributes attributes{};
    const bool loaded = sm90 &&
                        cudaFuncGetAttributes(&attributes, flash_forward_hopper_kernel<bf16, 64, 3>) == cudaSuccess &&
                        attributes.binaryVersion == 90;
    (void)cudaGetLastError();
    known[device] = loaded ? 1 : 2;
  }
  return known[device] == 1;
#else
  return false;  // no sm_90a code in this build: the kernel would be the trap
#endif
}

namespace {

// The refusals both entry points share (nullptr: the kernels apply), checked before the empty-input shortcut.
// Positions are counted in 32 bits inside the kernels (a tile's end, the number of blocks), hence the bound on seq.
template <typename Params>
const char* hopper_refusal(const Params& params, DType dtype) {
  if (!hopper_flash_present()) return "the Hopper flash attention kernels need an sm_90 GPU and an sm_90a build";
  if (params.rope_cos != nullptr) return "the Hopper flash attention kernels take no RoPE";
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return "the Hopper flash attention kernels take bf16 or fp16";
  if (params.head_dim != 64 && params.head_dim != 128)
    return "the Hopper flash attention kernels exist for head_dim 64 and 128 only";
  if (params.seq > (int64_t{1} << 30)) return "the Hopper flash attention kernels take at most 2^30 positions";
  return nullptr;
}

// Calls launch(element, head_dim) with a T{} and a std::integral_constant for the checked dtype and head_dim.
template <typename Launch>
LaunchStatus dispatch_hopper(DType dtype, int64_t head_dim, Launch&& launch) {
  const bool bf = dtype == DType::kBFloat16;
  if (head_dim == 64)
    return bf ? launch(bf16{}, std::integral_constant<int, 64>{}) : launch(fp16{}, std::integral_constant<int, 64>{});
  return bf ? launch(bf16{}, std::integral_constant<int, 128>{}) : launch(fp16{}, std::integral_constant<int, 128>{});
}

}  // namespace

LaunchStatus flash_attention_forward_hopper(const FlashForwardParams& params, DType dtype, void* stream) {
  if (const char* refusal = hopper_refusal(params, dtype)) return {refusal};
  if (params.batch == 0 || params.q_heads == 0 || params.seq == 0) return {};
  return dispatch_hopper(dtype, params.head_dim, [&](auto element, auto head_dim) {
    return hopper_forward_for<decltype(element), decltype(head_dim)::value>(params, static_cast<gpuStream_t>(stream));
  });
}

LaunchStatus flash_attention_backward_hopper(const FlashBackwardParams& params, DType dtype, void* stream) {
  if (const char* refusal = hopper_refusal(params, dtype)) return {refusal};
  if (params.batch == 0 || params.q_heads == 0 || params.seq == 0) return {};
  return dispatch_hopper(dtype, params.head_dim, [&](auto element, auto head_dim) {
    return hopper_backward_for<decltype(element), decltype(head_dim)::value>(params, static_cast<gpuStream_t>(stream));
  });
}

#else  // AMD: the Hopper generation does not exist.

bool hopper_flash_present() { return false; }

LaunchStatus flash_attention_forward_hopper(const FlashForwardParams&, DType, void*) {
  return {"the Hopper flash attention kernels exist on NVIDIA sm_90a only"};
}

LaunchStatus flash_attention_backward_hopper(const FlashBackwardParams&, DType, void*) {
  return {"the Hopper flash attention kernels exist on NVIDIA sm_90a only"};
}

#endif

}  // namespace tt::kernels
