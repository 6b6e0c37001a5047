// The Hopper (sm_90a) layer under our wgmma/TMA kernels: warpgroup roles and register budgets, mbarriers,
// TMA tensor maps and copies, shared-memory matrix descriptors and the wgmma products. Beside vendor.cuh's
// fragment layer (mma.sync, ldmatrix, cp.async), which every NVIDIA kernel from sm_80 uses; this one compiles to
// instructions only for sm_90a (TT_HOPPER_DEVICE), and is empty on AMD.
//
// The layouts, stated once (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//  * A warpgroup is 4 consecutive warps (128 threads, the first a multiple of 128). wgmma is issued by all
//    of them together and multiplies a 64 x N tile: warp w of the warpgroup owns rows 16w..16w+15.
//  * The fp32 accumulator of a 64 x N product, per thread: d[n][e] for 8-column group n, exactly the
//    mma.sync C fragment of the warp's 16 rows (vendor.cuh's table): row g or g + 8 (e >= 2), column
//    8n + 2t + (e & 1). So the register kernels' softmax steps (flash_fragments.cuh) run on it unchanged.
//  * An A operand in registers (16 x 16 of a warp's rows per k step, 4 registers of two 16-bit values) is the
//    mma.sync A fragment: to_a_fragments turns probabilities into it.
//  * Operands in shared memory are described by a 64-bit descriptor (smem_descriptor): tiles stored in rows
//    of 128 bytes (64 16-bit elements) with the 128-byte swizzle (the 16-byte chunk c of row r sits at chunk
//    c ^ (r % 8)), 8 rows making a 1024-byte atom; the tile must start 1024-byte aligned. TMA writes exactly
//    this layout when its tensor map says CU_TENSOR_MAP_SWIZZLE_128B with a 128-byte inner box. A matrix wider
//    than 64 elements is stored as panels of 64 columns, one after the other.
//      K-major (the reduced dimension contiguous; q and k rows for S = Q K^T): stride byte offset = 1024
//      between 8-row atoms; the 16-element k step j of a panel starts 32 j bytes into it (the swizzle acts on
//      the address bits, which is why atoms must be aligned).
//      MN-major (the output dimension contiguous; v rows for O = P V, wgmma's transpose flag on B): stride
//      byte offset = 1024 between groups of 8 reduced rows, leading byte offset = the panel's size between
//      the 64-column panels of the output dimension; k step j starts 16 rows = 2048 j bytes in.
#pragma once

#include <cstdint>
#include <string>

#include "vendor.cuh"

#if defined(__CUDACC__) && !defined(__HIP__)
#include <cuda.h>  // CUtensorMap and its enums only: the encoder is reached through the runtime, no -lcuda
#include <cudaTypedefs.h>
#endif

// Device code of sm_90a (wgmma, setmaxnreg and TMA need the architecture-specific target).
#if defined(__CUDA_ARCH__) && !defined(__HIP__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TT_HOPPER_DEVICE 1
#endif

#if defined(__CUDACC__) && !defined(__HIP__)

namespace tt::kernels::hopper {

constexpr int kWarpgroupWarps = 4;
constexpr int kWarpgroupThreads = kWarpgroupWarps * kMmaLanes;
// Rows of a wgmma product (m64), and of each warp's share of them.
constexpr int kWarpgroupRows = 64;
constexpr int kWarpRows = kWarpgroupRows / kWarpgroupWarps;
// Bytes of one 128-byte-swizzled row and of an 8-row atom.
constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;
// 16-bit elements per row of a swizzled panel.
constexpr int kPanelColumns = kSwizzleRowBytes / 2;

// Bytes of a [rows x cols] 16-bit tile stored as 64-column swizzled panels.
constexpr int panel_tile_bytes(int rows, int cols) { return rows * cols * 2; }

// ---------------------------------------------------------------------------------------------
// Host: TMA tensor maps
// ---------------------------------------------------------------------------------------------

// The encoder below is a driver call and needs the device's context current on the calling thread, which the
// runtime binds only on its first call there that needs one. Autograd runs the backward on a thread of its own,
// where that may not have happened yet (the encoder then failed with CUresult 201, invalid context), and c10's
// device guard skips cudaSetDevice when the device is already the current one. cudaSetDevice binds the current
// device's primary context (CUDA 12+); it is not a stream operation, so capture does not forbid it. A launcher calls
// this once before encoding its maps. Returns what went wrong, or nullptr (a message stays valid until the next
// failure on this thread).
inline const char* bind_device_context() {
  int device = 0;
  const cudaError_t error = cudaGetDevice(&device) == cudaSuccess ? cudaSetDevice(device) : cudaGetLastError();
  if (error == cudaSuccess) return nullptr;
  (void)cudaGetLastError();  // not left for a later launch's check to report as its own
  thread_local std::string message;
  message = std::string("binding the device's context before encoding TMA tensor maps failed: ") +
            cudaGetErrorString(error);
  return message.c_str();
}

// A tensor map over one [B, H, S, D] operand given by element strides (FlashStrides' batch, head, seq; D
// contiguous), read in boxes of `box_rows` sequence rows x 64 columns of one head, 128-byte swizzled. Rows past
// the sequence's end read as zeros. Needs the device's context bound (bind_device_context). Returns what went
// wrong (the driver refuses strides that are not multiples of 16 bytes, say; a message stays valid until the next
// failure on this thread), or nullptr on success.
inline const char* encode_tensor_map(CUtensorMap* map, const void* base, bool bf16, int64_t batch, int64_t heads,
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
  if (result == CUDA_SUCCESS) return nullptr;
  // What the driver was given, for the message.
  thread_local std::string message;
  message = "cuTensorMapEncodeTiled refused a [B, H, S, D] operand (CUresult " + std::to_string(result) +
            "; dims D, S, H, B = " + std::to_string(head_dim) + ", " + std::to_string(seq) + ", " +
            std::to_string(heads) + ", " + std::to_string(batch) + "; byte strides S, H, B = " +
            std::to_string(strides[0]) + ", " + std::to_string(strides[1]) + ", " + std::to_string(strides[2]) +
            "; address % 16 = " + std::to_string(reinterpret_cast<uintptr_t>(base) % 16) +
            "; the pointer and strides must be multiples of 16 bytes)";
  return message.c_str();
}

}  // namespace tt::kernels::hopper

#endif  // NVIDIA

#if defined(TT_HOPPER_DEVICE)

namespace tt::kernels::hopper {

__device__ __forceinline__ int warpgroup() { return static_cast<int>(threadIdx.x) / kWarpgroupThreads; }
__device__ __forceinline__ int warp_in_warpgroup() {
  return static_cast<int>(threadIdx.x) / kMmaLanes % kWarpgroupWarps;
}

// A warpgroup's register budget, moved between warpgroups at run time (setmaxnreg): the producer, which only
// issues copies, gives registers up so that the consumers' accumulators fit.
template <int kRegisters>
__device__ __forceinline__ void registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// ---------------------------------------------------------------------------------------------
// mbarriers: a phase completes when `count` arrivals and the expected transaction bytes (TMA) are in;
// waiters name the phase by its parity. A fresh barrier counts as having completed phase "parity 1", so a
// producer's first wait for an empty slot (parity 1) passes at once.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void barrier_init(uint64_t* barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(count));
}
// Makes initialised barriers visible to the async proxy (TMA) and the other threads (a block barrier follows).
__device__ __forceinline__ void barrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` of transactions for this phase.
__device__ __forceinline__ void barrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nwaiting:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra waiting;\n}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
}

// ---------------------------------------------------------------------------------------------
// Named barriers (bar.sync with an id and a thread count: a subset of the block, e.g. one warpgroup, waits for
// itself without stopping the others; id 0 is __syncthreads') and turns taken through a counter in global memory
// (one block at a time works on something, in a fixed order: the deterministic backward's dQ sums).
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Waits until *turn == mine (acquire: what the previous holder wrote before passing the turn is then visible to
// this thread, and to the others of its block after a barrier). One thread per block waits. Bulk copies (the async
// proxy) issued after it must follow a fence_global_between_proxies.
__device__ __forceinline__ void turn_wait(const int* turn, int mine) {
  int now;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(now) : "l"(turn) : "memory");
  } while (now != mine);
}
// Passes the turn on (release: after a barrier, it covers what every thread of that barrier wrote before it, since
// the barrier orders their writes before this store; threads outside the barrier are not covered). Bulk copies
// before it are covered only once waited for (bulk_wait_all) and followed by a fence_global_between_proxies.
__device__ __forceinline__ void turn_pass(int* turn, int next) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(turn), "r"(next) : "memory");
}
// global[0, bytes) += shared[0, bytes) in fp32, one thread's bulk copy (16-byte aligned, bytes a multiple of 16),
// done in L2; bulk_wait_all waits for it.
__device__ __forceinline__ void bulk_reduce_add(float* global, const void* shared, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               "cp.async.bulk.commit_group;\n" ::"l"(global),
               "r"(shared_address(shared)), "r"(bytes)
               : "memory");
}
// Waits until this thread's bulk copies are complete: their writes done in global memory, their shared memory read.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Orders this thread's global-memory accesses through the generic proxy (ordinary loads and stores, acquire and
// release) and through the async proxy (bulk copies) with each other, both ways.
__device__ __forceinline__ void fence_global_between_proxies() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// Makes this thread's ordinary shared-memory stores visible to the async proxy (wgmma's and TMA's reads); a
// barrier among the writers must follow before the product is issued.
__device__ __forceinline__ void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Where A fragment value e of k step k (two 16-bit elements; to_a_fragments' layout, warp w holding rows 16w..) sits
// in a K-major tile of 128-byte-swizzled 64-column panels of `panel_rows` rows each, counted from the warpgroup's
// first row of the first panel (a multiple of 8 rows into it, so that the swizzle's row is the row counted from
// there). Across a warp's lanes, each 4-byte pair of a row lands in a different bank (the swizzle spreads the 8 rows
// over the 8 chunks): loads and stores of a whole fragment have no conflicts.
__device__ __forceinline__ int a_fragment_offset(int panel_rows, int k, int e) {
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes;
  const int row = kWarpRows * warp_in_warpgroup() + lane / 4 + (e & 1) * 8;  // a[k][1], a[k][3]: 8 rows further down
  const int col = 16 * k + (e >= 2 ? 8 : 0) + 2 * (lane % 4);  // a[k][2], a[k][3]: the columns 8 further right
  const int panel = col / kPanelColumns, chunk = col % kPanelColumns / 8;
  return (panel * panel_rows + row) * kSwizzleRowBytes + ((chunk ^ (row % 8)) * 16) + (col % 8) * 2;
}

// Stores a warpgroup's 64 x 64 tile of A fragments as 64 rows of one swizzled panel from `rows` (1024-byte
// aligned), the layout TMA writes and the descriptors read.
template <int kCols>
__device__ __forceinline__ void store_a_fragments_swizzled(unsigned char* rows, const uint32_t (&a)[kCols / 16][4]) {
  // One panel: a wider tile's next panel would start a whole panel's rows further on, which these 64 rows (say half
  // of a 128-row panel) do not know.
  static_assert(kCols == kPanelColumns, "one panel of 64 columns");
#pragma unroll
  for (int k = 0; k < kCols / 16; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) *reinterpret_cast<uint32_t*>(rows + a_fragment_offset(0, k, e)) = a[k][e];
}

// Loads a warpgroup's 64 rows x kCols of A fragments from a K-major tile of swizzled panels of kPanelRows rows
// (`rows`: the warpgroup's first row of the first panel), for an A operand the warpgroup keeps in registers.
template <int kCols, int kPanelRows>
__device__ __forceinline__ void load_a_fragments_swizzled(const unsigned char* rows, uint32_t (&a)[kCols / 16][4]) {
#pragma unroll
  for (int k = 0; k < kCols / 16; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[k][e] = *reinterpret_cast<const uint32_t*>(rows + a_fragment_offset(kPanelRows, k, e));
}

// ---------------------------------------------------------------------------------------------
// TMA: one thread copies a box of a tensor map into shared memory; the bytes complete on `barrier`.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void tma_load_4d(void* destination, const CUtensorMap* map, uint64_t* barrier, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(shared_address(destination)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(barrier)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Shared-memory matrix descriptors (the layouts are in this file's header comment)
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ uint64_t smem_descriptor(const void* start, uint32_t leading_bytes, uint32_t stride_bytes) {
  constexpr uint64_t kSwizzle128B = 1;
  return static_cast<uint64_t>((shared_address(start) & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32) | (kSwizzle128B << 62);
}

// Where the 16-element k step `k` of a K-major tile of `rows` rows, stored as 64-column panels, starts (bytes).
__device__ __forceinline__ uint32_t k_major_offset(int rows, int k) {
  return (k / 4) * rows * kSwizzleRowBytes + (k % 4) * 32;
}
// Where the 16-row k step `k` of an MN-major tile (rows = the reduced dimension) starts (bytes).
__device__ __forceinline__ uint32_t mn_major_offset(int k) { return k * 16 * kSwizzleRowBytes; }

// The k step `k` of a K-major tile. The leading byte offset is unused by swizzled K-major layouts (a k step never
// leaves its 128-byte row); 16 is CUTLASS's value.
__device__ __forceinline__ uint64_t k_major_descriptor(const unsigned char* tile, int rows, int k) {
  return smem_descriptor(tile + k_major_offset(rows, k), 16, kSwizzleAtomBytes);
}
// The k step `k` of an MN-major tile of `rows` reduced rows per panel.
__device__ __forceinline__ uint64_t mn_major_descriptor(const unsigned char* tile, int rows, int k) {
  return smem_descriptor(tile + mn_major_offset(k), rows * kSwizzleRowBytes, kSwizzleAtomBytes);
}

// A k step's descriptor from its tile's (k = 0) one: the start address is the descriptor's low field, in 16-byte
// units, and adding the step's offset never carries out of it (every step's address, tile + offset, is a shared
// address below 2^18; offsets are multiples of 16). The forward computes each tile's descriptor once and adds the
// unrolled loop's constant offsets: one instruction per product where the address form takes five, 1-4% of the
// forward's time (H200, docs/attention.md). So do the backward kernels, but for the fused head-dim-64 one, which keeps
// the address form: with this one it measured slower at long-context.
__device__ __forceinline__ uint64_t descriptor_plus(uint64_t tile_descriptor, uint32_t offset_bytes) {
  return tile_descriptor + (offset_bytes >> 4);
}

// ---------------------------------------------------------------------------------------------
// wgmma: products issued asynchronously by a whole warpgroup. The order is fence (orders this warpgroup's
// earlier register writes, to accumulators and to A operands, before the products read them; shared memory that
// TMA filled is visible once its mbarrier's phase completed, while shared memory written by ordinary stores would
// also need fence.proxy.async), the products, commit (closes a group), wait (at most kPending
// groups still running). The accumulator registers must not be touched in between: fence_operands pins them
// so that the compiler does not move their uses across the wait.
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
template <int kN>
__device__ __forceinline__ void fence_operands(float (&d)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
}

// The instructions, one per output width N (64 or 128) and A source; T = bf16 or fp16, fp32 accumulators.
// `accumulate` false overwrites d (d = A B). kTransA/kTransB: 0 = K-major, 1 = MN-major.

// The accumulator's registers as asm operands (8-column group n: 4 values) and as the instruction's register list.
#define TT_ACC4(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define TT_ACC_N64 TT_ACC4(0), TT_ACC4(1), TT_ACC4(2), TT_ACC4(3), TT_ACC4(4), TT_ACC4(5), TT_ACC4(6), TT_ACC4(7)
#define TT_ACC_N128 \
  TT_ACC_N64, TT_ACC4(8), TT_ACC4(9), TT_ACC4(10), TT_ACC4(11), TT_ACC4(12), TT_ACC4(13), TT_ACC4(14), TT_ACC4(15)
#define TT_REGS_N64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define TT_REGS_N128                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "   \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// One instruction: N columns, A from shared memory (SS) or registers (RS). A, B, SCALE, TA and TB are the operand
// numbers of the descriptors (or A's registers), the accumulate flag and the transpose immediates, which follow
// the accumulator's N / 2 registers.
#define TT_WGMMA_SS(N, TYPE, REGS, ACC, A, B, SCALE, TA, TB)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                             \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", " A ", " B             \
               ", p, 1, 1, " TA ", " TB ";\n}\n"                                                                \
               : ACC                                                                                           \
               : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB))
#define TT_WGMMA_RS(N, TYPE, REGS, ACC, A, B, SCALE, TB)                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                             \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS ", " A ", " B             \
               ", p, 1, 1, " TB ";\n}\n"                                                                        \
               : ACC                                                                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)), "n"(kTransB))
#define TT_WGMMA_SS_N64(TYPE) TT_WGMMA_SS(64, TYPE, TT_REGS_N64, TT_ACC_N64, "%32", "%33", "%34", "%35", "%36")
#define TT_WGMMA_RS_N64(TYPE) \
  TT_WGMMA_RS(64, TYPE, TT_REGS_N64, TT_ACC_N64, "{%32, %33, %34, %35}", "%36", "%37", "%38")
#define TT_WGMMA_SS_N128(TYPE) TT_WGMMA_SS(128, TYPE, TT_REGS_N128, TT_ACC_N128, "%64", "%65", "%66", "%67", "%68")
#define TT_WGMMA_RS_N128(TYPE) \
  TT_WGMMA_RS(128, TYPE, TT_REGS_N128, TT_ACC_N128, "{%64, %65, %66, %67}", "%68", "%69", "%70")

// d [64 x N] (+)= A B with A [64 x 16] and B [16 x N] in shared memory.
template <typename T, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma(float (&d)[8][4], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) { TT_WGMMA_SS_N64("bf16"); } else { TT_WGMMA_SS_N64("f16"); }
}
template <typename T, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma(float (&d)[16][4], uint64_t a, uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) { TT_WGMMA_SS_N128("bf16"); } else { TT_WGMMA_SS_N128("f16"); }
}
// d [64 x N] (+)= A B with A [64 x 16] in registers (the A fragments of the warps' 16 rows).
template <typename T, int kTransB>
__device__ __forceinline__ void wgmma(float (&d)[8][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) { TT_WGMMA_RS_N64("bf16"); } else { TT_WGMMA_RS_N64("f16"); }
}
template <typename T, int kTransB>
__device__ __forceinline__ void wgmma(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) { TT_WGMMA_RS_N128("bf16"); } else { TT_WGMMA_RS_N128("f16"); }
}

#undef TT_WGMMA_SS_N64
#undef TT_WGMMA_RS_N64
#undef TT_WGMMA_SS_N128
#undef TT_WGMMA_RS_N128
#undef TT_WGMMA_SS
#undef TT_WGMMA_RS
#undef TT_REGS_N64
#undef TT_REGS_N128
#undef TT_ACC_N64
#undef TT_ACC_N128
#undef TT_ACC4

}  // namespace tt::kernels::hopper

#endif  // TT_HOPPER_DEVICE
