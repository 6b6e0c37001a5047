// RoPE forward and backward (the backward is the forward with the angle negated).
//
// One block per token (b, s): the token's q heads, k heads and (when given) v heads form one list of
// items that the block's threads stride over, so all of them take one launch and the token's row of the
// cos/sin tables is read from cache by every head. An item is kVec consecutive elements of one head:
// 16 bytes (8 bf16 or 4 fp32 values, 4 or 2 pairs) where every pointer and stride allows, one pair
// otherwise. Purely element-wise and memory-bound: each element is read once and written once, and
// consecutive threads touch consecutive packs, so accesses coalesce. The one-pair form moved 4 bytes per
// access and ran at a third of the bandwidth (medium config, bf16, H200: 16.8 us per launch).
#include "rope.cuh"

namespace tt::kernels {

namespace {

// =================================================================================================
// Kernel
// =================================================================================================

// kVec elements starting at `ptr`: one wide access, or element by element on the one-pair path (whose
// pointers need not be aligned to the pair).
template <int kVec, bool kWide, typename T>
__device__ __forceinline__ Pack<T, kVec> load_elements(const T* ptr) {
  if constexpr (kWide) {
    return load_pack<kVec>(ptr);
  } else {
    Pack<T, kVec> pack;
#pragma unroll
    for (int e = 0; e < kVec; ++e) pack.values[e] = ptr[e];
    return pack;
  }
}

template <int kVec, bool kWide, typename T>
__device__ __forceinline__ void store_elements(T* ptr, const Pack<T, kVec>& pack) {
  if constexpr (kWide) {
    store_pack<kVec>(ptr, pack);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) ptr[e] = pack.values[e];
  }
}

template <typename T, bool kWide, bool kInverse>
__global__ void rope_kernel(RopeParams params) {
  start_after_previous_kernel();
  constexpr int kVec = kWide ? kWideVec<T> : 2;
  constexpr int kPairs = kVec / 2;
  const int64_t token = blockIdx.x;
  const int64_t b = token / params.seq;
  const int64_t s = token % params.seq;
  const int half_dim = static_cast<int>(params.head_dim / 2);
  const int packs_per_head = static_cast<int>(params.head_dim / kVec);
  const int q_items = static_cast<int>(params.q.heads) * packs_per_head;
  const int qk_items = q_items + static_cast<int>(params.k.heads) * packs_per_head;
  const int items = qk_items + static_cast<int>(params.v.heads) * packs_per_head;
  const float* cos_row = params.cos + s * half_dim;
  const float* sin_row = params.sin + s * half_dim;

  for (int item = threadIdx.x; item < items; item += blockDim.x) {
    // Select fields rather than a reference to params.q / .k / .v: taking the address of a kernel
    // parameter makes the compiler copy the whole struct to local memory.
    const int which = item < q_items ? 0 : item < qk_items ? 1 : 2;
    const int local = item - (which == 0 ? 0 : which == 1 ? q_items : qk_items);
    const int64_t head = local / packs_per_head;
    const int first = (local % packs_per_head) * kVec;  // element within the head
#define TT_ROPE_FIELD(field) (which == 0 ? params.q.field : which == 1 ? params.k.field : params.v.field)
    const T* in = static_cast<const T*>(TT_ROPE_FIELD(in)) + b * TT_ROPE_FIELD(in_stride_batch) +
                  s * TT_ROPE_FIELD(in_stride_seq) + head * TT_ROPE_FIELD(in_stride_head) + first;
    T* out = static_cast<T*>(TT_ROPE_FIELD(out)) + b * TT_ROPE_FIELD(out_stride_batch) +
             s * TT_ROPE_FIELD(out_stride_seq) + head * TT_ROPE_FIELD(out_stride_head) + first;
#undef TT_ROPE_FIELD
    Pack<T, kVec> x = load_elements<kVec, kWide>(in);
    if (which != 2) {
      const Pack<float, kPairs> c = load_elements<kPairs, kWide>(cos_row + first / 2);
      const Pack<float, kPairs> sn = load_elements<kPairs, kWide>(sin_row + first / 2);
#pragma unroll
      for (int p = 0; p < kPairs; ++p) {
        const float x0 = to_float(x.values[2 * p]);
        const float x1 = to_float(x.values[2 * p + 1]);
        const float sine = kInverse ? -sn.values[p] : sn.values[p];
        x.values[2 * p] = from_float<T>(x0 * c.values[p] - x1 * sine);
        x.values[2 * p + 1] = from_float<T>(x0 * sine + x1 * c.values[p]);
      }
    }
    store_elements<kVec, kWide>(out, x);
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

// The 16-byte path needs whole packs per head and every pack aligned: pointers, strides, and the
// cos/sin rows read kVec / 2 floats at a time.
template <typename T>
bool wide_path_fits(const RopeParams& p) {
  constexpr int kVec = kWideVec<T>;
  if (p.head_dim % kVec != 0) return false;
  if (!is_pack_aligned<float, kVec / 2>(p.cos) || !is_pack_aligned<float, kVec / 2>(p.sin)) return false;
  for (const RopeTensor* t : {&p.q, &p.k, &p.v}) {
    if (t->heads == 0) continue;
    if (!is_pack_aligned<T, kVec>(t->in) || !is_pack_aligned<T, kVec>(t->out)) return false;
    for (const int64_t stride : {t->in_stride_batch, t->in_stride_seq, t->in_stride_head, t->out_stride_batch,
                                 t->out_stride_seq, t->out_stride_head})
      if (stride % kVec != 0) return false;
  }
  return true;
}

template <bool kInverse>
LaunchStatus launch(const RopeParams& params, DType dtype, void* stream) {
  const int64_t tokens = params.batch * params.seq;
  if (tokens == 0) return {};
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype, [&](auto element) {
    using T = decltype(element);
    const bool wide = wide_path_fits<T>(params);
    const int64_t items =
        (params.q.heads + params.k.heads + params.v.heads) * (params.head_dim / (wide ? kWideVec<T> : 2));
    // Few threads per block: a token has only (Hq + Hkv) * D / kVec items (96 in the workshop's bf16
    // forward), and many small blocks spread the tokens over all SMs.
    const int threads = block_threads_for(items, 256);
    const unsigned grid = static_cast<unsigned>(tokens);
    if (wide) {
      launch_after_previous(rope_kernel<T, true, kInverse>, grid, threads, 0, s, params);
    } else {
      launch_after_previous(rope_kernel<T, false, kInverse>, grid, threads, 0, s, params);
    }
  });
  return last_launch_status();
}

}  // namespace

LaunchStatus rope_forward(const RopeParams& params, DType dtype, void* stream) {
  return launch<false>(params, dtype, stream);
}

LaunchStatus rope_backward(const RopeParams& params, DType dtype, void* stream) {
  return launch<true>(params, dtype, stream);
}

}  // namespace tt::kernels
