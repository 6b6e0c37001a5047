// GPU tests of the flash attention kernels through tt::ops::flash_attention: output, dQ, dK and dV against
// reference::masked_attention over dtypes, head dims, grouped-query head counts, ragged sequence lengths and
// strided inputs; bitwise reproducibility; bad inputs. Every test skips when there is no GPU.
//
// Tolerances: tests/kernel_checks.h.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/flash_attention.cuh"
#include "kernels/ops/flash_attention.h"
#include "kernels/ops/flash_attention_params.h"
#include "models/reference.h"
#include "tests/helpers.h"
#include "tests/kernel_checks.h"

namespace {

using tt::testing::expect_error;

using tt::testing::dtype_name;
using tt::testing::expect_matches_reference;
using tt::testing::gpu;
using tt::testing::grads_of;
using tt::testing::leaf;
using tt::testing::misaligned_copy;
using tt::testing::shape_name;
using tt::testing::unit_roundoff;

const std::vector<torch::ScalarType>& kDtypes = tt::testing::kKernelDtypes;


struct Config {
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t seq;
  int64_t head_dim;
};

struct Inputs {
  torch::Tensor q;
  torch::Tensor k;
  torch::Tensor v;
};

Inputs random_inputs(const Config& c, torch::ScalarType dtype) {
  return {torch::randn({c.batch, c.q_heads, c.seq, c.head_dim}, gpu()).to(dtype),
          torch::randn({c.batch, c.kv_heads, c.seq, c.head_dim}, gpu()).to(dtype),
          torch::randn({c.batch, c.kv_heads, c.seq, c.head_dim}, gpu()).to(dtype)};
}

// dQ and dK come from dS = P * (dP - delta), where dP = dO V^T and delta = rowsum(dO * O) cancel exactly when a
// query sees a single key (seq 1): the fp64 result is 0, ours the rounding of dP and delta (~1e-7 relative).
// Their tolerances are therefore relative to the size of the terms before the cancellation, in fp64:
// max |(P * |dP|) |K|| * scale for dQ and max |(P * |dP|)^T |Q|| * scale (summed over the group) for dK.
std::pair<double, double> cancellation_scales(const torch::Tensor& q64, const torch::Tensor& k64,
                                              const torch::Tensor& v64, const torch::Tensor& grad_out64) {
  torch::NoGradGuard no_grad;
  const int64_t n_rep = q64.size(1) / k64.size(1);
  const int64_t seq = q64.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q64.size(3)));
  auto keys = k64.repeat_interleave(n_rep, 1);
  auto values = v64.repeat_interleave(n_rep, 1);
  auto future = torch::ones({seq, seq}, q64.options().dtype(torch::kBool)).triu(1);
  auto probs = torch::softmax((torch::matmul(q64, keys.transpose(-2, -1)) * scale).masked_fill(future, -INFINITY), -1);
  auto terms = probs * torch::matmul(grad_out64, values.transpose(-2, -1)).abs();
  const double grad_q = (torch::matmul(terms, keys.abs()) * scale).max().item<double>();
  auto grad_k_terms = torch::matmul(terms.transpose(-2, -1), q64.abs()) * scale;
  const double grad_k = grad_k_terms.unflatten(1, {k64.size(1), n_rep}).sum(2).max().item<double>();
  return {grad_q, grad_k};
}

using Attention = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

torch::Tensor ours_default(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return tt::ops::flash_attention(q, k, v);
}
torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return tt::reference::masked_attention(q, k, v);
}
// tt::ops::flash_attention with its kernel generation chosen by name.
Attention generation(tt::ops::FlashAttentionKernel kernel) {
  return [kernel](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return tt::ops::flash_attention(q, k, v, kernel);
  };
}

// Output and the gradients of q, k and v against the reference at the same precision and in fp64, both computed
// on `reference_device` (the GPU unless a test says otherwise) and compared on the GPU.
void check_attention(const Inputs& in, torch::ScalarType dtype, const std::string& label,
                     const Attention& ours = ours_default, const Attention& reference = reference_attention,
                     torch::Device reference_device = torch::kCUDA) {
  const std::string what = "flash_attention " + label + " q " + shape_name(in.q.sizes()) + " k/v " +
                           shape_name(in.k.sizes());
  auto grad_out = torch::randn(in.q.sizes(), gpu()).to(dtype);

  auto q = tt::testing::leaf_view(in.q);
  auto k = tt::testing::leaf_view(in.k);
  auto v = tt::testing::leaf_view(in.v);
  auto out = ours(q, k, v);
  EXPECT_EQ(out.scalar_type(), dtype) << what << ": output must keep the input dtype";
  auto grads = grads_of({out}, {q, k, v}, {grad_out});

  // The reference's results, moved back to the GPU to be compared with ours.
  auto reference_on = [&](torch::ScalarType type) {
    auto q_ref = leaf(in.q.to(reference_device, type));
    auto k_ref = leaf(in.k.to(reference_device, type));
    auto v_ref = leaf(in.v.to(reference_device, type));
    auto out_ref = reference(q_ref, k_ref, v_ref);
    auto grads_ref = grads_of({out_ref}, {q_ref, k_ref, v_ref}, {grad_out.to(reference_device, type)});
    std::vector<torch::Tensor> results = {out_ref.detach().to(in.q.device())};
    for (const auto& g : grads_ref) results.push_back(g.to(in.q.device()));
    return std::make_pair(results, std::vector<torch::Tensor>{q_ref, k_ref, v_ref});
  };
  const auto [same, inputs_same] = reference_on(dtype);
  const auto [fp64, inputs64] = reference_on(torch::kFloat64);

  expect_matches_reference(out, same[0], fp64[0], dtype, 1e-5, what + " output");
  const auto [grad_q_scale, grad_k_scale] =
      cancellation_scales(inputs64[0].detach(), inputs64[1].detach(), inputs64[2].detach(),
                          grad_out.to(reference_device, torch::kFloat64));
  expect_matches_reference(grads[0], same[1], fp64[1], dtype, 1e-4, what + " grad q", grad_q_scale);
  expect_matches_reference(grads[1], same[2], fp64[2], dtype, 1e-4, what + " grad k", grad_k_scale);
  expect_matches_reference(grads[2], same[3], fp64[3], dtype, 1e-4, what + " grad v");
}

// Sequence lengths around the tiles (16-row fragments, 32-, 64- and 128-row blocks): one row, a partial
// fragment, exact tiles, one past, one short. Grouped-query ratios 1, 2, 4 and 8.
TEST(FlashAttentionGpu, MatchesReferenceOverShapesHeadsAndDtypes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(0);
  const std::vector<std::pair<int64_t, int64_t>> head_configs = {{8, 8}, {8, 4}, {8, 2}, {8, 1}, {32, 16}};
  int64_t case_index = 0;
  for (const auto dtype : kDtypes) {
    for (const int64_t head_dim : {16, 32, 64, 128}) {
      for (const auto& [q_heads, kv_heads] : head_configs) {
        for (const int64_t seq : {1, 7, 17, 64, 65, 127, 128, 129}) {
          const int64_t batch = case_index++ % 2 == 0 ? 1 : 3;
          check_attention(random_inputs({batch, q_heads, kv_heads, seq, head_dim}, dtype), dtype, "contiguous");
        }
      }
    }
  }
}

// Many tiles per block: the online softmax's rescaling and the backward's loops over tiles and heads.
TEST(FlashAttentionGpu, MatchesReferenceOnLongSequences) {
  TT_REQUIRE_GPU();
  torch::manual_seed(1);
  const std::vector<std::pair<torch::ScalarType, Config>> cases = {
      {torch::kBFloat16, {1, 8, 4, 4096, 64}}, {torch::kFloat16, {1, 8, 1, 4096, 128}},
      {torch::kBFloat16, {1, 16, 2, 4096, 128}}, {torch::kFloat16, {3, 8, 2, 1000, 64}},
      {torch::kFloat32, {1, 8, 2, 4096, 32}},  {torch::kFloat32, {1, 8, 8, 1000, 64}},
      {torch::kFloat32, {1, 8, 2, 1000, 128}}, {torch::kBFloat16, {3, 32, 16, 1000, 128}},
      {torch::kFloat16, {3, 8, 8, 1000, 32}},  {torch::kBFloat16, {1, 8, 1, 1000, 32}}};
  for (const auto& [dtype, config] : cases) check_attention(random_inputs(config, dtype), dtype, "long");
}

TEST(FlashAttentionGpu, AcceptsViewsOfFusedQkvAndOtherLayouts) {
  TT_REQUIRE_GPU();
  torch::manual_seed(2);
  for (const auto dtype : kDtypes) {
    const int64_t batch = 2, seq = 77, q_heads = 8, kv_heads = 2, head_dim = 64;
    // As the model makes them: [B, S, H, D] views into the fused QKV projection, transposed to [B, H, S, D].
    auto qkv = torch::randn({batch, seq, (q_heads + 2 * kv_heads) * head_dim}, gpu()).to(dtype);
    auto parts = qkv.split({q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim}, -1);
    Inputs fused{parts[0].unflatten(-1, {q_heads, head_dim}).transpose(1, 2),
                 parts[1].unflatten(-1, {kv_heads, head_dim}).transpose(1, 2),
                 parts[2].unflatten(-1, {kv_heads, head_dim}).transpose(1, 2)};
    check_attention(fused, dtype, "fused-QKV views");

    auto out = tt::ops::flash_attention(fused.q, fused.k, fused.v);
    EXPECT_TRUE(out.transpose(1, 2).is_contiguous())
        << "flash_attention [" << dtype_name(dtype) << "]: the output must be a [B, S, H, D] tensor seen as "
        << "[B, H, S, D], so merging heads is free; got strides " << shape_name(out.strides());

    // A non-unit stride in the head dim, and a misaligned start: both copied by the op layer.
    auto strided = torch::randn({batch, q_heads, head_dim, seq}, gpu()).to(dtype).transpose(2, 3);
    auto kv = random_inputs({batch, q_heads, kv_heads, seq, head_dim}, dtype);
    check_attention({strided, kv.k, kv.v}, dtype, "strided head dim");
    check_attention({misaligned_copy(kv.q), misaligned_copy(kv.k), kv.v}, dtype, "misaligned");
  }
}

// Output and the three gradients of `attention` equal over three identical runs, bit for bit.
void expect_bitwise_repeatable(const Attention& attention, const Inputs& in, const std::string& label) {
  const char* names[] = {"output", "grad q", "grad k", "grad v"};
  auto grad_out = torch::randn(in.q.sizes(), gpu()).to(in.q.scalar_type());
  std::vector<std::vector<torch::Tensor>> runs;
  for (int run = 0; run < 3; ++run) {
    auto q = leaf(in.q);
    auto k = leaf(in.k);
    auto v = leaf(in.v);
    auto out = attention(q, k, v);
    auto grads = grads_of({out}, {q, k, v}, {grad_out});
    runs.push_back({out.detach(), grads[0], grads[1], grads[2]});
  }
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_TRUE(torch::equal(runs[0][i], runs[1][i]) && torch::equal(runs[0][i], runs[2][i]))
        << "flash_attention " << label << " " << names[i] << " [" << dtype_name(in.q.scalar_type()) << ", head_dim "
        << in.q.size(3) << "] differs between three identical runs: max |difference| = "
        << std::max((runs[0][i].to(torch::kFloat64) - runs[1][i].to(torch::kFloat64)).abs().max().item<double>(),
                    (runs[0][i].to(torch::kFloat64) - runs[2][i].to(torch::kFloat64)).abs().max().item<double>());
  }
}

TEST(FlashAttentionGpu, IsBitwiseDeterministic) {
  TT_REQUIRE_GPU();
  torch::manual_seed(3);
  for (const auto dtype : kDtypes)
    for (const int64_t head_dim : {64, 128})
      expect_bitwise_repeatable(ours_default, random_inputs({2, 8, 2, 1000, head_dim}, dtype), "default");
}

// q, k and v as the model passes them: [B, S, H, D] parts of a fused QKV projection, seen as [B, H, S, D].
Inputs fused_qkv_views(const Config& c, torch::ScalarType dtype) {
  auto qkv = torch::randn({c.batch, c.seq, c.q_heads + 2 * c.kv_heads, c.head_dim}, gpu()).to(dtype);
  auto parts = qkv.split({c.q_heads, c.kv_heads, c.kv_heads}, 2);
  return {parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2)};
}

// flash_attention_rope, and its reference: rope (the reference's) then the reference attention.
Attention rope_in_the_load(const torch::Tensor& cos, const torch::Tensor& sin) {
  return [cos, sin](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return tt::ops::flash_attention_rope(q, k, v, cos, sin);
  };
}
Attention rope_then_attention(const torch::Tensor& cos, const torch::Tensor& sin) {
  return [cos, sin](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    auto c_rows = cos.narrow(0, 0, q.size(2));
    auto s_rows = sin.narrow(0, 0, q.size(2));
    auto q_rotated = tt::reference::apply_rope(q.transpose(1, 2), c_rows, s_rows).transpose(1, 2);
    auto k_rotated = tt::reference::apply_rope(k.transpose(1, 2), c_rows, s_rows).transpose(1, 2);
    return tt::reference::masked_attention(q_rotated, k_rotated, v);
  };
}

// RoPE in the load: flash_attention_rope(q, k, v) against rope then attention, computed by the reference. The
// register kernels rotate tiles as they load them and rotate dQ and dK back; fp32 takes tt::ops::rope then the
// shared-memory kernels. q and k are views of a fused QKV projection, as v4 passes them.
TEST(FlashAttentionGpu, RopeInTheLoadMatchesRopeThenAttention) {
  TT_REQUIRE_GPU();
  torch::manual_seed(4);
  const std::vector<Config> configs = {{1, 8, 2, 1, 64},   {3, 8, 8, 17, 64},  {2, 8, 4, 129, 128},
                                       {1, 8, 1, 1000, 64}, {2, 16, 2, 300, 128}, {1, 4, 2, 33, 16}};
  for (const auto dtype : kDtypes) {
    for (const auto& c : configs) {
      auto [cos, sin] = tt::reference::rope_tables(c.seq + 5, c.head_dim, 10000.0, 0, gpu().device());
      check_attention(fused_qkv_views(c, dtype), dtype, "rope in the load", rope_in_the_load(cos, sin),
                      rope_then_attention(cos, sin));
    }
  }
}

// The fused-QKV form v4 calls: flash_attention_rope_qkv(qkv) writes dq, dk, dv straight into one qkv
// gradient; it must equal flash_attention_rope on split views (whose gradients autograd adds up), output and
// gradient, bit for bit: the same kernels, and each element of the summed gradient has one nonzero term.
void expect_fused_qkv_form_equals_split_views(const Config& c, torch::ScalarType dtype) {
  auto [cos, sin] = tt::reference::rope_tables(c.seq + 5, c.head_dim, 10000.0, 0, gpu().device());
  const auto data = torch::randn({c.batch, c.seq, c.q_heads + 2 * c.kv_heads, c.head_dim}, gpu()).to(dtype);
  const auto grad_out = torch::randn({c.batch, c.q_heads, c.seq, c.head_dim}, gpu()).to(dtype);
  auto fused = leaf(data.clone()), split = leaf(data.clone());
  const auto a = tt::ops::flash_attention_rope_qkv(fused, c.q_heads, c.kv_heads, cos, sin);
  const auto parts = split.split({c.q_heads, c.kv_heads, c.kv_heads}, 2);
  const auto b = tt::ops::flash_attention_rope(parts[0].transpose(1, 2), parts[1].transpose(1, 2),
                                               parts[2].transpose(1, 2), cos, sin);
  const auto ga = grads_of({a}, {fused}, {grad_out})[0], gb = grads_of({b}, {split}, {grad_out})[0];
  EXPECT_TRUE(torch::equal(a, b)) << dtype_name(dtype) << " seq " << c.seq << ": output";
  EXPECT_TRUE(torch::equal(ga, gb)) << dtype_name(dtype) << " seq " << c.seq << ": gradient of qkv";
}

TEST(FlashAttentionGpu, FusedQkvFormEqualsSplitViewsBitwise) {
  TT_REQUIRE_GPU();
  torch::manual_seed(6);
  for (const auto dtype : kDtypes)
    for (const Config& c : {Config{1, 8, 2, 1, 64}, Config{3, 8, 8, 17, 64}, Config{2, 8, 4, 129, 128},
                            Config{2, 16, 2, 300, 128}, Config{1, 4, 2, 33, 16}})
      expect_fused_qkv_form_equals_split_views(c, dtype);
  expect_error([] { tt::ops::flash_attention_rope_qkv(torch::zeros({1, 4, 5, 64}), 2, 2, {}, {}); },
               "qkv must be [B, S, q_heads + 2 kv_heads, D] = [B, S, 6, D]");
}

// The register generation, selected by name: where the Hopper forward applies, the default no longer runs its
// forward, so it is checked here at the head dims the Hopper one takes (and stays right for kernel_bench's table).
TEST(FlashAttentionGpu, RegisterTilesStillMatchTheReference) {
  TT_REQUIRE_GPU();
  if (!tt::ops::flash_attention_kernel_applies(tt::ops::FlashAttentionKernel::kRegisterTiles, torch::kBFloat16, 64))
    GTEST_SKIP() << "the register-tile kernels are NVIDIA-only";
  torch::manual_seed(6);
  const Attention registers = generation(tt::ops::FlashAttentionKernel::kRegisterTiles);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat16})
    for (const Config& c : {Config{3, 8, 2, 129, 64}, Config{1, 8, 4, 300, 128}, Config{1, 8, 1, 1100, 64},
                            Config{1, 4, 2, 2100, 128}})
      check_attention(random_inputs(c, dtype), dtype, "register tiles", registers);
}

// The first-generation kernel stays selectable (kernel_bench measures the steps between them): it must
// still be right.
TEST(FlashAttentionGpu, SharedMemoryTilesStillMatchTheReference) {
  TT_REQUIRE_GPU();
  torch::manual_seed(5);
  const Attention tiled = generation(tt::ops::FlashAttentionKernel::kSharedMemoryTiles);
  for (const auto dtype : kDtypes)
    for (const Config& c : {Config{3, 8, 2, 129, 64}, Config{1, 8, 4, 300, 128}})
      check_attention(random_inputs(c, dtype), dtype, "shared-memory tiles", tiled);
}

// The Hopper generation (TMA + wgmma forward and backward, sm_90 only): output and all three gradients against the
// reference over both dtypes and head dims, grouped-query ratios 1 to 8, lengths that end inside a 64-row
// warpgroup, a 64-row streamed tile, a 128- or 192-row block and a 128-key tile, long ones (many tiles, every ring
// slot reused), several batch entries, and the fused-QKV views v4 passes ([B, S, H, D] strides, read by the
// tensor maps as they are). Then bitwise reproducibility of all four results, incoming gradients with zero
// strides against the same gradients materialised, and the refusals. Skips where the kernels do not run.
TEST(FlashAttentionGpu, HopperMatchesTheReference) {
  TT_REQUIRE_GPU();
  if (!tt::ops::flash_attention_kernel_applies(tt::ops::FlashAttentionKernel::kHopper, torch::kBFloat16, 64))
    GTEST_SKIP() << "the Hopper flash attention kernel needs an sm_90 GPU and an sm_90a build";
  torch::manual_seed(9);
  const Attention hopper = generation(tt::ops::FlashAttentionKernel::kHopper);
  int64_t case_index = 0;
  for (const auto dtype : {torch::kBFloat16, torch::kFloat16}) {
    for (const int64_t head_dim : {64, 128}) {
      for (const auto& [q_heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {8, 2}, {8, 1}}) {
        for (const int64_t seq : {1, 63, 64, 100, 128, 129, 255, 300, 1060}) {
          const Config c{case_index % 3 == 0 ? 3 : 1, q_heads, kv_heads, seq, head_dim};
          const bool fused = case_index++ % 2 == 1;
          check_attention(fused ? fused_qkv_views(c, dtype) : random_inputs(c, dtype), dtype,
                          fused ? "Hopper, fused-QKV views" : "Hopper", hopper);
        }
      }
    }
    check_attention(random_inputs({1, 16, 2, 4096, 128}, dtype), dtype, "Hopper, long", hopper);
    check_attention(random_inputs({2, 8, 4, 2048, 64}, dtype), dtype, "Hopper, long", hopper);
  }

  // Each backward scheme repeats bitwise: at 1,000 positions the dQ and dK/dV blocks in one grid (both head dims),
  // at 1,100 head dim 64's fused kernel, at 4,100 head dim 128's two kernels.
  for (const auto& [head_dim, seq] :
       std::vector<std::pair<int64_t, int64_t>>{{64, 1000}, {128, 1000}, {64, 1100}, {128, 4100}}) {
    ASSERT_EQ(seq == 1000, tt::kernels::hopper_backward_one_grid(head_dim, seq))
        << "head_dim " << head_dim << ", seq " << seq;
    ASSERT_EQ(seq == 1100, tt::kernels::hopper_backward_fused(head_dim, seq))
        << "head_dim " << head_dim << ", seq " << seq;
    expect_bitwise_repeatable(hopper, random_inputs({2, 8, 2, seq, head_dim}, torch::kBFloat16), "Hopper");
  }

  // Incoming gradients with zero strides against the same values materialised: every stride 0 (from .sum(); the op
  // copies it for every generation) and broadcast over the batch (an expand(); copied for the tensor map only).
  const auto in = random_inputs({2, 8, 2, 300, 64}, torch::kBFloat16);
  const auto broadcast = torch::randn({1, 8, 300, 64}, gpu()).to(torch::kBFloat16).expand({2, 8, 300, 64});
  for (const bool from_sum : {true, false}) {
    std::vector<std::vector<torch::Tensor>> grads;
    for (const bool materialised : {false, true}) {
      auto q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
      const auto out = hopper(q, k, v);
      if (from_sum)
        grads.push_back(materialised ? grads_of({out}, {q, k, v}, {torch::ones_like(out)})
                                     : grads_of({out.sum()}, {q, k, v}, {torch::ones({}, gpu()).to(torch::kBFloat16)}));
      else
        grads.push_back(grads_of({out}, {q, k, v}, {materialised ? broadcast.contiguous() : broadcast}));
    }
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i]))
          << "Hopper backward, " << (from_sum ? "gradient of a sum" : "gradient broadcast over the batch")
          << ": input " << i;
  }

  auto fp32 = random_inputs({1, 2, 2, 64, 64}, torch::kFloat32);
  expect_error([&] { hopper(fp32.q, fp32.k, fp32.v); }, "the Hopper kernel runs bf16/fp16 with head_dim 64 or 128");
  auto d32 = random_inputs({1, 2, 2, 64, 32}, torch::kBFloat16);
  expect_error([&] { hopper(d32.q, d32.k, d32.v); }, "head_dim 32");
}

// The Hopper forward writes every row in [0, seq) of its output and log-sum-exp, and nothing else. Its first query
// block may start before row 0 (the blocks end at the sequence's end; the rows before 0 are computed, masked and
// must not be stored). So the kernel is launched directly on views into NaN-filled buffers: guard rows before and
// after every head's rows and an extra head around the output, guard entries around the log-sum-exp. The guards must
// keep their bits, no NaN may be left inside, and the output must equal the op's bitwise (an unwritten row of a fresh
// tensor could hold a stale right answer; here it holds NaN). Where the first block starts: up to 512 positions
// (128-row blocks at both head dims) at -127 (seq 1 and 129), -28 (100), -64 (192), -84 (300) and 0 (384); beyond,
// at head dim 64 (192-row blocks) -168 (600) and 0 (768), at 128 -40 (600) and 0 (768).
TEST(FlashAttentionGpu, HopperForwardWritesExactlyItsRows) {
#if !defined(TT_BACKEND_CUDA)
  GTEST_SKIP() << "launches the Hopper kernel (CUDA builds only) directly";
#else
  TT_REQUIRE_GPU();
  if (!tt::ops::flash_attention_kernel_applies(tt::ops::FlashAttentionKernel::kHopper, torch::kBFloat16, 64))
    GTEST_SKIP() << "the Hopper flash attention kernel needs an sm_90 GPU and an sm_90a build";
  torch::manual_seed(13);
  const Attention hopper = generation(tt::ops::FlashAttentionKernel::kHopper);
  constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kGuard = 70;
  auto same_bits = [](const torch::Tensor& a, const torch::Tensor& b) {
    return torch::equal(a.contiguous().view(torch::kInt16), b.contiguous().view(torch::kInt16));
  };
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t seq : {1, 100, 129, 192, 300, 384, 600, 768}) {
      const std::string label = "head_dim " + std::to_string(head_dim) + ", seq " + std::to_string(seq);
      const auto in = random_inputs({kBatch, kHeads, kKvHeads, seq, head_dim}, torch::kBFloat16);
      // [B, S, H, D] memory, as the op allocates its output, with the guards.
      auto out_buffer = torch::full({kBatch, seq + 2 * kGuard, kHeads + 1, head_dim}, NAN, gpu()).to(torch::kBFloat16);
      auto lse_buffer = torch::full({kBatch * kHeads * seq + 2 * kGuard}, NAN, gpu());
      const auto out_before = out_buffer.clone();
      const auto lse_before = lse_buffer.clone();
      auto out = out_buffer.narrow(1, kGuard, seq).narrow(2, 0, kHeads).permute({0, 2, 1, 3});  // [B, H, S, D]
      const int64_t entries = kBatch * kHeads * seq;
      const auto p =
          tt::ops::detail::flash_forward_params(in.q, in.k, in.v, out, lse_buffer.narrow(0, kGuard, entries));
      // The default (legacy) stream, which LibTorch's current stream is in these tests.
      const auto status = tt::kernels::flash_attention_forward(p, tt::kernels::DType::kBFloat16, nullptr,
                                                               tt::kernels::FlashKernel::kHopper);
      ASSERT_TRUE(status.ok()) << label << ": " << status.error;
      torch::cuda::synchronize();

      auto inside = torch::zeros(out_buffer.sizes(), gpu().dtype(torch::kBool));
      inside.narrow(1, kGuard, seq).narrow(2, 0, kHeads).fill_(true);
      const auto outside = inside.logical_not();
      EXPECT_TRUE(same_bits(out_buffer.masked_select(outside), out_before.masked_select(outside)))
          << label << ": the output's guard rows or extra head were written";
      for (const int64_t start : {int64_t{0}, kGuard + entries})
        EXPECT_TRUE(torch::equal(lse_buffer.narrow(0, start, kGuard).view(torch::kInt32),
                                 lse_before.narrow(0, start, kGuard).view(torch::kInt32)))
            << label << ": the log-sum-exp's guard entries were written";
      EXPECT_FALSE(out.isnan().any().item<bool>()) << label << ": output rows left unwritten";
      EXPECT_FALSE(lse_buffer.narrow(0, kGuard, entries).isnan().any().item<bool>())
          << label << ": log-sum-exp entries left unwritten";
      EXPECT_TRUE(same_bits(out, hopper(in.q, in.k, in.v))) << label << ": differs from the op's output";
    }
  }
#endif
}

// The fused Hopper backward (head dim 64, from 1,024 positions) sums dQ over key blocks in fp32 scratch, with a turn
// counter per query tile, both allocated by the op with torch::empty: the kernels themselves must leave no stale value
// in the result (the prologue zeroes both; a kernel that wrote the first turn's sum instead of adding it, as was tried,
// must cover every tile). Launched directly on scratch filled with NaN and garbage counters, the gradients must equal
// those of a launch on zeroed scratch (values compared, so that -0 and +0 count as equal). A prologue that no longer
// reset the counters would make this test hang on its turns rather than fail; sums left stale fail it.
TEST(FlashAttentionGpu, HopperFusedBackwardNeedsNoZeroedScratch) {
#if !defined(TT_BACKEND_CUDA)
  GTEST_SKIP() << "launches the Hopper kernels (CUDA builds only) directly";
#else
  TT_REQUIRE_GPU();
  if (!tt::ops::flash_attention_kernel_applies(tt::ops::FlashAttentionKernel::kHopper, torch::kBFloat16, 64))
    GTEST_SKIP() << "the Hopper flash attention kernel needs an sm_90 GPU and an sm_90a build";
  torch::manual_seed(17);
  constexpr int64_t kBatch = 2, kHeads = 4, kKvHeads = 2, kHeadDim = 64;
  for (const int64_t seq : {1024, 1060, 2100}) {
    ASSERT_TRUE(tt::kernels::hopper_backward_fused(kHeadDim, seq));
    const std::string label = "seq " + std::to_string(seq);
    const auto in = random_inputs({kBatch, kHeads, kKvHeads, seq, kHeadDim}, torch::kBFloat16);
    const auto grad_out = torch::randn({kBatch, kHeads, seq, kHeadDim}, gpu()).to(torch::kBFloat16);
    auto out = torch::empty_like(in.q);
    auto lse = torch::empty({kBatch, kHeads, seq}, gpu());
    const auto f = tt::ops::detail::flash_forward_params(in.q, in.k, in.v, out, lse);
    // The default (legacy) stream, which LibTorch's current stream is in these tests.
    const auto forward = tt::kernels::flash_attention_forward(f, tt::kernels::DType::kBFloat16, nullptr,
                                                              tt::kernels::FlashKernel::kHopper);
    ASSERT_TRUE(forward.ok()) << label << ": " << forward.error;

    const int64_t tiles = tt::kernels::hopper_grad_q_tiles(seq);
    auto backward = [&](bool zeroed) {
      auto grad_q = torch::empty_like(in.q), grad_k = torch::empty_like(in.k), grad_v = torch::empty_like(in.v);
      auto delta = torch::empty({kBatch, kHeads, seq}, gpu());
      auto sums =
          torch::full({kBatch, kHeads, tiles * tt::kernels::kHopperGradQTileRows, kHeadDim}, zeroed ? 0.0 : NAN, gpu());
      auto turns = torch::full({kBatch, kHeads, tiles}, zeroed ? 0 : 12345, gpu().dtype(torch::kInt32));
      const auto b = tt::ops::detail::flash_backward_params(in.q, in.k, in.v, out, lse, grad_out, grad_q, grad_k,
                                                            grad_v, delta, sums, turns);
      const auto status = tt::kernels::flash_attention_backward(b, tt::kernels::DType::kBFloat16, nullptr,
                                                                tt::kernels::FlashKernel::kHopper);
      EXPECT_TRUE(status.ok()) << label << ": " << status.error;
      torch::cuda::synchronize();
      return std::vector<torch::Tensor>{grad_q, grad_k, grad_v};
    };
    const auto on_zeros = backward(true);
    const auto on_garbage = backward(false);
    const char* names[] = {"dq", "dk", "dv"};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_FALSE(on_garbage[i].isnan().any().item<bool>()) << label << ": " << names[i] << " holds NaN";
      EXPECT_TRUE(torch::equal(on_garbage[i], on_zeros[i]))
          << label << ": " << names[i] << " differs from the launch on zeroed scratch";
    }
  }
#endif
}

// Every kernel the three generations instantiate, once each, at sizes compute-sanitizer gets through in minutes:
// scripts/gpu_validate.sh runs this test, and only this one of the attention suite, under memcheck, racecheck,
// synccheck and initcheck. The loops are the launchers' template axes (kernels/flash_attention.cu dispatch(),
// register_forward_for; flash_attention_tiled.cu; flash_attention_hopper.cu: dtype x head_dim 64/128, on sm_90
// only): generation, dtype, head_dim, RoPE in the load (register tiles
// only) and, for the register forward, the row layout (one 16-row fragment per warp below 1024 positions, two
// from 1024). Every length ends inside a 16-row fragment and inside every block (100 and 1060 leave 4 rows past a
// multiple of 16 and 32, 36 past one of 64 and 128), every case has grouped-query heads (4:1 and 2:1) and, but for
// head dim 128's two backward kernels at 4,100 positions (kept small: one batch entry, two heads), a second batch
// entry; the fused-QKV views ([B, S, H, D] strides, as the model passes them) alternate with
// contiguous [B, H, S, D] inputs. Last, the fused-QKV form v4 calls (flash_attention_rope_qkv, whose backward
// writes dq, dk and dv into one gradient tensor) against the split views, at both lengths.
// The references run on the CPU: under racecheck the vendor GEMMs of a GPU reference crash the tool (H100,
// compute-sanitizer 2025.3.1: "failed to handle a hardware exception"), even uninstrumented.
TEST(FlashAttentionGpu, EveryKernelOnceAtSanitizerSize) {
  TT_REQUIRE_GPU();
  torch::manual_seed(7);
  const Config one_fragment{2, 4, 1, 100, 0};  // head_dim set below
  const Config two_fragments{2, 2, 1, 1060, 0};
  int cases = 0;
  auto run = [&](Config c, int64_t head_dim, torch::ScalarType dtype, bool rope, const Attention& plain,
                 const std::string& label) {
    c.head_dim = head_dim;
    const bool views = cases++ % 2 == 0;
    const Inputs in = views ? fused_qkv_views(c, dtype) : random_inputs(c, dtype);
    const std::string what = label + (views ? ", fused-QKV views" : ", contiguous") + ", head_dim " +
                             std::to_string(head_dim) + ", seq " + std::to_string(c.seq);
    if (!rope) return check_attention(in, dtype, what, plain, reference_attention, torch::kCPU);
    auto [cos, sin] = tt::reference::rope_tables(c.seq, head_dim, 10000.0, 0, gpu().device());
    check_attention(in, dtype, what + ", rope in the load", rope_in_the_load(cos, sin),
                    rope_then_attention(cos.cpu(), sin.cpu()), torch::kCPU);
  };
  const Attention tiled = generation(tt::ops::FlashAttentionKernel::kSharedMemoryTiles);
  const Attention registers = generation(tt::ops::FlashAttentionKernel::kRegisterTiles);
  const Attention hopper = generation(tt::ops::FlashAttentionKernel::kHopper);
  const bool have_registers =
      tt::ops::flash_attention_kernel_applies(tt::ops::FlashAttentionKernel::kRegisterTiles, torch::kBFloat16, 64);
  const bool have_hopper =
      tt::ops::flash_attention_kernel_applies(tt::ops::FlashAttentionKernel::kHopper, torch::kBFloat16, 64);
  for (const int64_t head_dim : {16, 32, 64, 128}) {
    // Register tiles (bf16, fp16), without and with RoPE in the load (the default's RoPE path where they exist,
    // else these run the shared-memory tiles again).
    for (const auto dtype : {torch::kBFloat16, torch::kFloat16})
      for (const bool rope : {false, true})
        for (const Config& c : {one_fragment, two_fragments})
          run(c, head_dim, dtype, rope, have_registers ? registers : ours_default,
              have_registers ? "register tiles" : "default");
    // Hopper forward and backward (bf16, fp16; head_dim 64 and 128). The forward's block holds two consumer
    // warpgroups (128 queries) at head_dim 128, and at head_dim 64 up to 512 positions; three (192) at head_dim 64
    // beyond. Its grid is persistent (a block per SM): the last two cases have more work items (at seq 300, 3 query
    // blocks x 36 heads x 2 at either head_dim; at seq 600, 4 x 36 x 2 at head_dim 64 with three consumers, 5 x 36 x 2
    // at 128) than any GPU we run has SMs, so blocks move on to further items (Q released and reloaded, the K/V
    // ring's phases carried across items), with each block layout.
    // The backward takes the dQ and dK/dV blocks in one grid at 100 positions (both head dims) and at 1,060 (head
    // dim 128); the fused kernel at 1,060 (head dim 64); head dim 128's two kernels from 4,096 positions: the last
    // case, one batch entry and two heads so that it stays small.
    if (have_hopper && head_dim >= 64) {
      for (const auto dtype : {torch::kBFloat16, torch::kFloat16})
        for (const Config& c : {one_fragment, two_fragments}) run(c, head_dim, dtype, false, hopper, "Hopper");
      for (const int64_t seq : {300, 600})
        run(Config{2, 36, 4, seq, 0}, head_dim, torch::kBFloat16, false, hopper, "Hopper, more items than SMs");
      if (head_dim == 128) {
        const Config two_kernels{1, 2, 1, 4100, 0};
        ASSERT_FALSE(tt::kernels::hopper_backward_one_grid(head_dim, two_kernels.seq) ||
                     tt::kernels::hopper_backward_fused(head_dim, two_kernels.seq));
        run(two_kernels, head_dim, torch::kBFloat16, false, hopper, "Hopper, two backward kernels");
      }
    }
    // Shared-memory tiles: every dtype, no RoPE in the load, one row layout.
    for (const auto dtype : kDtypes) run(one_fragment, head_dim, dtype, false, tiled, "shared-memory tiles");
  }
  for (const auto dtype : {torch::kBFloat16, torch::kFloat16})
    for (Config c : {one_fragment, two_fragments}) {
      c.head_dim = 64;
      expect_fused_qkv_form_equals_split_views(c, dtype);
    }
}

TEST(FlashAttentionGpu, EmptyBatch) {
  TT_REQUIRE_GPU();
  auto q = leaf(torch::randn({0, 8, 16, 64}, gpu()));
  auto k = leaf(torch::randn({0, 2, 16, 64}, gpu()));
  auto v = leaf(torch::randn({0, 2, 16, 64}, gpu()));
  auto out = tt::ops::flash_attention(q, k, v);
  EXPECT_EQ(out.sizes(), q.sizes());
  auto grads = grads_of({out}, {q, k, v}, {torch::randn({0, 8, 16, 64}, gpu())});
  EXPECT_EQ(grads[0].sizes(), q.sizes());
  EXPECT_EQ(grads[1].sizes(), k.sizes());
  EXPECT_EQ(grads[2].sizes(), v.sizes());
}

TEST(FlashAttentionGpu, RejectsBadInputs) {
  TT_REQUIRE_GPU();
  auto q = torch::randn({1, 8, 5, 64}, gpu());
  auto kv = torch::randn({1, 2, 5, 64}, gpu());
  expect_error([&] { tt::ops::flash_attention(q.to(torch::kFloat64), kv.to(torch::kFloat64), kv.to(torch::kFloat64)); },
               "the GPU kernel supports q, k and v of dtype Float, BFloat16 or Half, got Double");
  expect_error(
      [&] {
        tt::ops::flash_attention(torch::randn({1, 8, 5, 48}, gpu()), torch::randn({1, 2, 5, 48}, gpu()),
                                 torch::randn({1, 2, 5, 48}, gpu()));
      },
      "the GPU kernel supports head_dim 16, 32, 64 or 128, got 48");
  expect_error([&] { tt::ops::flash_attention(q, kv.cpu(), kv); }, "k is on cpu but q is on cuda");
  expect_error([&] { tt::ops::flash_attention(q, kv, kv.cpu()); }, "v is on cpu but q is on cuda");
  expect_error(
      [&] {
        auto kv3 = torch::randn({1, 3, 5, 64}, gpu());
        tt::ops::flash_attention(q, kv3, kv3);
      },
      "number of query heads (8) must be a multiple of key/value heads (3)");
  auto [cos, sin] = tt::reference::rope_tables(5, 64, 10000.0, 0, gpu().device());
  expect_error([&] { tt::ops::flash_attention_rope(q, kv, kv, cos.narrow(0, 0, 4), sin); },
               "cos must be a [seq, head_dim / 2] = [5, 32] table, got [4, 32]");
  expect_error([&] { tt::ops::flash_attention_rope(q, kv, kv, cos, sin.to(torch::kFloat64)); },
               "sin must be Float, got Double");
  expect_error([&] { tt::ops::flash_attention_rope(q, kv, kv, cos.cpu(), sin); }, "cos is on cpu but q is on cuda");
}

}  // namespace
