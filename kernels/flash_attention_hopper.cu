// Flash attention, Hopper generation (sm_90a): the forward with TMA loads and wgmma products, after
// FlashAttention-3 (Shah et al. 2024) without its pipelining refinements yet.
//
// A block of 128 queries is three warpgroups with one job each:
//  * the producer (warpgroup 0; one thread issues) copies the block's Q tile once and then each key tile's
//    K and V into a ring of kStages shared-memory slots by TMA, waiting for a slot to be empty before refilling
//    it. It needs few registers and gives them to the consumers (setmaxnreg).
//  * two consumers (warpgroups 1 and 2) own 64 query rows each. Per key tile: S = Q K^T by wgmma from shared
//    memory (both K-major), the causal mask and online softmax on the accumulator registers (the same named
//    steps as the register generation: flash_fragments.cuh), P rounded to 16 bits in registers, O += P V by
//    wgmma with P from registers and V MN-major (transposed by the instruction), then the slot is released.
// The two consumers share every K/V tile, and while one runs its softmax the other's products can run: the
// warp schedulers interleave them without explicit ping-pong (FA3's scheduled ping-pong and the softmax
// overlapped with the next product within a warpgroup are the next steps: docs/attention.md).
//
// The log-sum-exp it writes is the register generation's, so that generation's backward serves it.
// bf16 and fp16, head_dim 64 and 128, no RoPE in the load. NVIDIA sm_90a only: other targets compile the
// kernel empty and flash_kernel_available says no.
#include <type_traits>

#include "flash_fragments.cuh"
#include "hopper.cuh"

#if defined(__CUDACC__) && !defined(__HIP__)
#include <cudaTypedefs.h>
#endif

namespace tt::kernels {

#if defined(__CUDACC__) && !defined(__HIP__)

namespace hopper {

const char* encode_tensor_map(CUtensorMap* map, const void* base, bool bf16, int64_t batch, int64_t heads,
                              int64_t seq, int64_t head_dim, int64_t batch_stride, int64_t head_stride,
                              int64_t seq_stride, int box_rows) {
  // The driver's encoder through the runtime, so that nothing links libcuda directly.
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return "cuTensorMapEncodeTiled is not available from the CUDA driver";
  constexpr int64_t kBytes = 2;  // bf16 and fp16
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seq),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  // Dims 1..3 in bytes. A dim of size 1 may have any stride in a view: give it one the encoder accepts.
  auto stride_of = [](int64_t size, int64_t stride) { return static_cast<cuuint64_t>(size == 1 ? 16 : stride * kBytes); };
  const cuuint64_t strides[3] = {stride_of(seq, seq_stride), stride_of(heads, head_stride),
                                 stride_of(batch, batch_stride)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kPanelColumns), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                                 const_cast<void*>(base), dims, strides, box, element_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? nullptr
                                : "cuTensorMapEncodeTiled refused an attention operand (its pointer and strides must "
                                  "be multiples of 16 bytes)";
}

}  // namespace hopper

namespace {

using namespace flash;

// The block's shape and its shared memory: Q, then the ring's K and V slots (each 1024-byte aligned, as the
// swizzle needs), the output staging rows, the barriers. Head dim 64 takes three consumer warpgroups (192 query
// rows: each K/V tile serves more queries, and the accumulators are small), 128 takes two (FA3's tile sizes).
template <int kD>
struct HopperForwardShape {
  static constexpr int kConsumers = kD == 64 ? 3 : 2;  // warpgroups of 64 query rows
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = 128;                  // keys per tile
  static constexpr int kStages = 2;
  static constexpr int kThreads = (1 + kConsumers) * hopper::kWarpgroupThreads;
  // The producer's registers go to the consumers; together they fill the SM's 64 K registers.
  static constexpr int kProducerRegisters = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static_assert((kProducerRegisters + kConsumers * kConsumerRegisters) * hopper::kWarpgroupThreads <= 64 * 1024,
                "the register budgets must fit the SM's 64 K registers");
  static constexpr int kQBytes = hopper::panel_tile_bytes(kBlockM, kD);
  static constexpr int kTileBytes = hopper::panel_tile_bytes(kBlockN, kD);  // one K or one V tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kStaging = kV + kStages * kTileBytes;
  static constexpr int kBarriers = kStaging + tile_bytes<kD>(kBlockM);
  static constexpr int kBarrierCount = 1 + 3 * kStages;  // Q full; K full, V full and empty per slot
  static constexpr int kBytes = kBarriers + 8 * kBarrierCount + 1024;  // + the alignment of the start
  static_assert(kQBytes % 1024 == 0 && kTileBytes % 1024 == 0, "swizzled tiles start 1024-byte aligned");
  static_assert(kBarriers % 8 == 0, "barriers are 8-byte words");
};

template <typename T, int kD>
__global__ void __launch_bounds__(HopperForwardShape<kD>::kThreads, 1)
    flash_forward_hopper_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                const __grid_constant__ CUtensorMap v_map, const FlashForwardParams p) {
#if defined(TT_HOPPER_DEVICE)
  using namespace hopper;
  using Shape = HopperForwardShape<kD>;
  constexpr int kBlockM = Shape::kBlockM;
  constexpr int kBlockN = Shape::kBlockN;
  constexpr int kStages = Shape::kStages;
  extern __shared__ unsigned char smem_unaligned[];
  unsigned char* smem = smem_unaligned + ((1024 - shared_address(smem_unaligned) % 1024) % 1024);
  unsigned char* q_tile = smem + Shape::kQ;
  auto k_tile = [&](int slot) { return smem + Shape::kK + slot * Shape::kTileBytes; };
  auto v_tile = [&](int slot) { return smem + Shape::kV + slot * Shape::kTileBytes; };
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Shape::kBarriers);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* empty = v_full + kStages;

  const QueryBlock block = query_block<kBlockM>(p.q_heads, p.kv_heads);
  const int q0 = block.q0;
  const int seq = static_cast<int>(p.seq);
  const int tiles = (min(seq, q0 + kBlockM) + kBlockN - 1) / kBlockN;

  if (threadIdx.x == 0) {
    barrier_init(q_full, 1);
    for (int slot = 0; slot < kStages; ++slot) {
      barrier_init(&k_full[slot], 1);
      barrier_init(&v_full[slot], 1);
      barrier_init(&empty[slot], Shape::kConsumers * kWarpgroupThreads);
    }
    barrier_init_fence();
  }
  __syncthreads();

  if (warpgroup() == 0) {
    // The producer: tile `tile` goes into slot tile % kStages once its previous contents were released.
    registers_decrease<Shape::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    const int head = static_cast<int>(block.head), kv_head = static_cast<int>(block.kv_head);
    const int batch = static_cast<int>(block.batch);
    tma_prefetch_descriptor(&q_map);
    tma_prefetch_descriptor(&k_map);
    tma_prefetch_descriptor(&v_map);
    barrier_arrive_expect_bytes(q_full, Shape::kQBytes);
    for (int panel = 0; panel < kD / kPanelColumns; ++panel)
      tma_load_4d(q_tile + panel * kBlockM * kSwizzleRowBytes, &q_map, q_full, panel * kPanelColumns, q0, head, batch);
    for (int tile = 0; tile < tiles; ++tile) {
      const int slot = tile % kStages;
      barrier_wait(&empty[slot], ((tile / kStages) & 1) ^ 1);
      barrier_arrive_expect_bytes(&k_full[slot], Shape::kTileBytes);
      for (int panel = 0; panel < kD / kPanelColumns; ++panel)
        tma_load_4d(k_tile(slot) + panel * kBlockN * kSwizzleRowBytes, &k_map, &k_full[slot], panel * kPanelColumns,
                    tile * kBlockN, kv_head, batch);
      barrier_arrive_expect_bytes(&v_full[slot], Shape::kTileBytes);
      for (int panel = 0; panel < kD / kPanelColumns; ++panel)
        tma_load_4d(v_tile(slot) + panel * kBlockN * kSwizzleRowBytes, &v_map, &v_full[slot], panel * kPanelColumns,
                    tile * kBlockN, kv_head, batch);
    }
    return;
  }

  // A consumer: 64 query rows, warp w of the warpgroup rows 16w..16w+15.
  registers_increase<Shape::kConsumerRegisters>();
  const int consumer = warpgroup() - 1;
  const int row0 = 64 * consumer + 16 * warp_in_warpgroup();  // this warp's first row in the block
  const int warp_q0 = q0 + row0;
  const unsigned char* my_q = q_tile + 64 * consumer * kSwizzleRowBytes;  // the warpgroup's rows of each panel
  const float scale_log2 = softmax_scale<kD>() * kLog2e;

  float o[1][kD / 8][4];
  float row_max[1][2] = {{-INFINITY, -INFINITY}};  // raw scores; rows lane/4 and lane/4 + 8 of the warp
  float row_sum[1][2] = {{0.0f, 0.0f}};            // this lane's share
  float alpha[1][2];
  float s[1][kBlockN / 8][4];
  uint32_t probs[kBlockN / 16][4];  // the previous tile's P, the A operand of its O += P V
  zero(o[0]);

  // S = Q K^T of tile `tile`, issued (the caller commits and waits).
  auto issue_scores = [&](int tile) {
    const int slot = tile % kStages;
    barrier_wait(&k_full[slot], (tile / kStages) & 1);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / 16; ++k)
      wgmma<T, 0, 0>(s[0], k_major_descriptor(my_q, kBlockM, k), k_major_descriptor(k_tile(slot), kBlockN, k), k > 0);
    wgmma_commit();
  };
  // O += P V of tile `tile` with the probabilities in `probs`, issued and committed.
  auto issue_values = [&](int tile) {
    const int slot = tile % kStages;
    barrier_wait(&v_full[slot], (tile / kStages) & 1);
    fence_operands(o[0]);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k)
      wgmma<T, 1>(o[0], probs[k], mn_major_descriptor(v_tile(slot), kBlockN, k), true);
    wgmma_commit();
  };
  // The causal mask where a tile holds keys after the block's first query or past the sequence's end.
  auto softmax_of = [&](int tile) {
    if ((tile + 1) * kBlockN - 1 > q0 || (tile + 1) * kBlockN > seq)
      mask_scores<1, kBlockN>(s, tile * kBlockN, warp_q0, seq);
    online_softmax_statistics<1, kBlockN>(s, row_max, row_sum, scale_log2, alpha);
  };

  barrier_wait(q_full, 0);
  issue_scores(0);
  wgmma_wait<0>();
  fence_operands(s[0]);
  softmax_of(0);  // o is still zero: no rescaling
  to_a_fragments<T, kBlockN>(probs, s[0]);
  // FA3's pipeline within a warpgroup: the next tile's scores are issued before this tile's P V, and the softmax
  // of the next tile runs while P V is still in the tensor cores; O's rescaling waits for P V to finish.
  for (int tile = 1; tile < tiles; ++tile) {
    issue_scores(tile);
    issue_values(tile - 1);
    wgmma_wait<1>();  // the scores
    fence_operands(s[0]);
    softmax_of(tile);
    wgmma_wait<0>();  // P V of the previous tile: its slot is free again
    fence_operands(o[0]);
    barrier_arrive(&empty[(tile - 1) % kStages]);
    rescale_rows<1, kD>(o, alpha);
    to_a_fragments<T, kBlockN>(probs, s[0]);
  }
  issue_values(tiles - 1);
  wgmma_wait<0>();
  fence_operands(o[0]);
  barrier_arrive(&empty[(tiles - 1) % kStages]);

  finish_softmax<1, kD>(o, row_max, row_sum, scale_log2, warp_q0, seq, p.lse + (block.batch * p.q_heads + block.head) * p.seq);
  // Each warp stages and writes its own 16 rows, 16 bytes at a time.
  T* staging = reinterpret_cast<T*>(smem + Shape::kStaging);
  stage_rows<T, kD>(staging, row0, o[0], 1.0f, q0, seq, nullptr, nullptr);
  __syncwarp();
  T* out = head_ptr<T>(p.out, p.out_strides, block.batch, block.head);
  constexpr int kChunks = kD / 8;
  for (int c = lane(); c < 16 * kChunks; c += kMmaLanes) {
    const int r = row0 + c / kChunks;
    const int col = c % kChunks * 8;
    if (q0 + r < seq)
      store_pack<8>(out + static_cast<int64_t>(q0 + r) * p.out_strides.seq + col,
                    load_pack<8>(staging + r * kPitch<kD> + col));
  }
#else
  (void)q_map, (void)k_map, (void)v_map, (void)p;
#endif  // TT_HOPPER_DEVICE
}

template <typename T, int kD>
LaunchStatus hopper_forward_for(const FlashForwardParams& p, gpuStream_t stream) {
  using Shape = HopperForwardShape<kD>;
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
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
  auto* kernel = flash_forward_hopper_kernel<T, kD>;
  const LaunchStatus status = allow_dynamic_shared_memory(kernel, Shape::kBytes);
  if (!status.ok()) return status;
  const dim3 grid(blocks_for(p.seq, Shape::kBlockM), static_cast<unsigned>(p.q_heads), static_cast<unsigned>(p.batch));
  kernel<<<grid, Shape::kThreads, Shape::kBytes, stream>>>(q_map, k_map, v_map, p);
  return last_launch_status();
}

}  // namespace

bool hopper_flash_forward_present() {
  // The kernel has sm_90a code in this build (the runtime then loads it on an sm_90 device, and nowhere else).
  static const bool present = [] {
    int device = 0;
    cudaDeviceProp props{};
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&props, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    cudaFuncAttributes attributes{};
    const bool built = cudaFuncGetAttributes(&attributes, flash_forward_hopper_kernel<bf16, 64>) == cudaSuccess;
    (void)cudaGetLastError();
    return props.major == 9 && props.minor == 0 && built && attributes.binaryVersion == 90;
  }();
  return present;
}

LaunchStatus flash_attention_forward_hopper(const FlashForwardParams& params, DType dtype, void* stream) {
  if (!hopper_flash_forward_present()) return {"the Hopper flash attention kernels need an sm_90 GPU and an sm_90a build"};
  if (params.rope_cos != nullptr) return {"the Hopper flash attention kernels take no RoPE"};
  if (params.batch == 0 || params.q_heads == 0 || params.seq == 0) return {};
  const auto s = static_cast<gpuStream_t>(stream);
  const bool bf = dtype == DType::kBFloat16;
  if (dtype != DType::kBFloat16 && dtype != DType::kFloat16) return {"the Hopper flash attention kernels take bf16 or fp16"};
  switch (params.head_dim) {
    case 64: return bf ? hopper_forward_for<bf16, 64>(params, s) : hopper_forward_for<fp16, 64>(params, s);
    case 128: return bf ? hopper_forward_for<bf16, 128>(params, s) : hopper_forward_for<fp16, 128>(params, s);
    default: return {"the Hopper flash attention kernels exist for head_dim 64 and 128 only"};
  }
}

#else  // AMD: the Hopper generation does not exist.

bool hopper_flash_forward_present() { return false; }

LaunchStatus flash_attention_forward_hopper(const FlashForwardParams&, DType, void*) {
  return {"the Hopper flash attention kernels exist on NVIDIA sm_90a only"};
}

#endif

}  // namespace tt::kernels
