// Flash attention op layer: input checks, dispatch to the custom kernels on GPU tensors, real backward.
#pragma once

#include <torch/torch.h>

namespace tt::ops {

// Causal attention softmax(q k^T / sqrt(D)) v for q [B, Hq, S, D] and k, v [B, Hkv, S, D], with Hq a multiple
// of Hkv (grouped-query: query head h attends with key/value head h / (Hq / Hkv), nothing is repeated).
// Returns [B, Hq, S, D] in q's dtype; differentiable in q, k and v.
//
// GPU (fp32, bf16 or fp16; head_dim 16, 32, 64 or 128): the flash attention kernels, O(S) memory, bitwise
// reproducible gradients: register tiles (mma.sync) for bf16/fp16 on NVIDIA, shared-memory tiles for fp32 and
// on AMD. q, k and v may be strided views (of a fused QKV projection, say) as long as the head
// dim is contiguous. The result is a transposed view of a contiguous [B, S, Hq, D] tensor, so merging the
// heads afterwards (transpose(1, 2).reshape(B, S, Hq * D)) costs no copy.
// CPU (any floating dtype): the ATen formulation of the same forward and backward, computed in fp32 (fp64
// for fp64 inputs), with the S x S scores materialised.
torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// The same attention of RoPE-rotated q and k: q and k are rotated (consecutive pairs of the head dim, by the
// fp32 [S, D/2] cos/sin tables, as tt::ops::rope does) and then attended; gradients are those of the
// unrotated q and k. Where the register-tile kernels run (bf16/fp16 on NVIDIA) the rotation happens inside
// them, as q and k tiles are loaded: no rotated copy is written, and q, k can be views of a fused QKV
// projection's output. Elsewhere it is tt::ops::rope followed by flash_attention.
torch::Tensor flash_attention_rope(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& cos, const torch::Tensor& sin);

// flash_attention_rope of the three parts of a fused QKV projection's output qkv [B, S, q_heads + 2 kv_heads, D]
// (q, k, v in that order along dim 2). Differentiable in qkv: where the rotation runs inside the kernels, the
// backward writes dq, dk and dv straight into the parts of one qkv gradient (split views would each return a
// full-size gradient for autograd to add up); elsewhere it is flash_attention_rope on the split views.
torch::Tensor flash_attention_rope_qkv(const torch::Tensor& qkv, int64_t q_heads, int64_t kv_heads,
                                       const torch::Tensor& cos, const torch::Tensor& sin);

// Which kernel generation runs (kernels/flash_attention.cuh). The default: the Hopper generation (TMA and wgmma,
// forward and backward) where it applies (bf16/fp16, head_dim 64 or 128, no RoPE in the
// load, an sm_90 GPU with an sm_90a build, no broadcast input with a zero stride) and the sequence is longer than
// 128 positions (kHopperDefaultMinSeq in the .cpp: slower at 128, faster from 512, between not measured), else the
// register tiles where they exist (bf16/fp16 on NVIDIA), else the shared-memory tiles. Each generation stays
// selectable for kernel_bench, which measures the steps between them; a call a chosen generation does not apply to
// is refused (flash_attention_kernel_applies says beforehand).
enum class FlashAttentionKernel { kDefault, kSharedMemoryTiles, kHopper, kRegisterTiles };
torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              FlashAttentionKernel kernel);

// Whether `kernel` can run GPU attention of this dtype and head_dim on the current GPU (without RoPE in the load).
bool flash_attention_kernel_applies(FlashAttentionKernel kernel, torch::ScalarType dtype, int64_t head_dim);

// Whether the default runs the Hopper generation for GPU inputs of this dtype, head_dim and length without RoPE in the
// load (inputs with a broadcast, zero-stride dimension excepted: the default leaves those to the register tiles).
bool flash_attention_default_is_hopper(torch::ScalarType dtype, int64_t head_dim, int64_t seq);

}  // namespace tt::ops
