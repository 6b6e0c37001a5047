// RoPE forward and backward (the backward is the forward with the angle negated).
//
// One block per token (b, s): the token's q heads and k heads form one list of (head, pair) items that
// the block's threads stride over, so q and k take one launch and the token's row of the cos/sin tables
// is read from cache by every head. Purely element-wise and memory-bound: each element is read once
// and written once, and consecutive threads touch consecutive pairs, so accesses coalesce.
#include "rope.cuh"

namespace tt::kernels {

namespace {

// =================================================================================================
// Kernel
// =================================================================================================

template <typename T, bool kInverse>
__global__ void rope_kernel(RopeParams params) {
  const int64_t token = blockIdx.x;
  const int64_t b = token / params.seq;
  const int64_t s = token % params.seq;
  const int half_dim = static_cast<int>(params.head_dim / 2);
  const int q_items = static_cast<int>(params.q.heads) * half_dim;
  const int items = q_items + static_cast<int>(params.k.heads) * half_dim;
  const float* cos_row = params.cos + s * half_dim;
  const float* sin_row = params.sin + s * half_dim;

  for (int item = threadIdx.x; item < items; item += blockDim.x) {
    // Select fields rather than a reference to params.q / params.k: taking the address of a kernel
    // parameter makes the compiler copy the whole struct to local memory.
    const bool is_q = item < q_items;
    const int local = is_q ? item : item - q_items;
    const int head = local / half_dim;
    const int pair = local % half_dim;
    const int64_t in_offset = is_q ? b * params.q.stride_batch + s * params.q.stride_seq + head * params.q.stride_head
                                   : b * params.k.stride_batch + s * params.k.stride_seq + head * params.k.stride_head;
    const int64_t out_offset = ((is_q ? token * params.q.heads : token * params.k.heads) + head) * params.head_dim;
    const T* in = static_cast<const T*>(is_q ? params.q.in : params.k.in) + in_offset + 2 * pair;
    T* out = static_cast<T*>(is_q ? params.q.out : params.k.out) + out_offset + 2 * pair;

    const float x0 = to_float(in[0]);
    const float x1 = to_float(in[1]);
    const float c = cos_row[pair];
    const float sn = kInverse ? -sin_row[pair] : sin_row[pair];
    out[0] = from_float<T>(x0 * c - x1 * sn);
    out[1] = from_float<T>(x0 * sn + x1 * c);
  }
}

// =================================================================================================
// Launchers
// =================================================================================================

template <bool kInverse>
LaunchStatus launch(const RopeParams& params, DType dtype, void* stream) {
  const int64_t tokens = params.batch * params.seq;
  if (tokens == 0) return {};
  const int64_t items = (params.q.heads + params.k.heads) * (params.head_dim / 2);
  // Few threads per block: a token has only (Hq + Hkv) * D/2 pairs (384 at the workshop shape), and
  // many small blocks spread the tokens over all SMs.
  const int threads = block_threads_for(items, 256);
  const unsigned grid = static_cast<unsigned>(tokens);
  const gpuStream_t s = to_stream(stream);
  dispatch_dtype(dtype,
                 [&](auto element) { rope_kernel<decltype(element), kInverse><<<grid, threads, 0, s>>>(params); });
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
