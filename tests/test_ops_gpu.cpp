// GPU tests of the custom kernels through their autograd Functions (kernels/ops/), each against the plain
// reference op (models/reference.h): the output and every gradient, over dtypes and awkward shapes.
//
// Tolerances: tests/kernel_checks.h.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops/cross_entropy.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/naive_swiglu.h"
#include "kernels/ops/rms_norm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "models/reference.h"
#include "tests/helpers.h"
#include "tests/kernel_checks.h"

namespace {

using torch::indexing::Slice;
using tt::reference::kIgnoreIndex;
using tt::testing::expect_error;

using tt::testing::expect_matches_reference;
using tt::testing::grads_of;
using tt::testing::gpu;
using tt::testing::leaf;
using tt::testing::misaligned_copy;
using tt::testing::shape_name;
using tt::testing::unit_roundoff;
using tt::testing::dtype_name;

const std::vector<torch::ScalarType>& kDtypes = tt::testing::kKernelDtypes;

// ---- RMSNorm ------------------------------------------------------------------------------------

constexpr double kEps = 1e-6;

// x and grad_y in `dtype`; weight in fp32 for our op (as under autocast) and in `dtype` for the
// reference's low-precision run, holding the same dtype-representable values.
void check_rms_norm(const torch::Tensor& x_in, torch::ScalarType dtype, const std::string& label) {
  const int64_t hidden = x_in.size(-1);
  auto weight_same = (1 + 0.2 * torch::randn({hidden}, gpu())).to(dtype);
  auto grad_y = torch::randn(x_in.sizes(), gpu()).to(dtype);
  const std::string what = "rms_norm " + label + " x " + shape_name(x_in.sizes());

  auto x = leaf(x_in);
  auto weight = leaf(weight_same.to(torch::kFloat32));
  auto y = tt::ops::rms_norm(x, weight, kEps);
  EXPECT_EQ(y.scalar_type(), dtype) << what << ": output must keep the activation dtype";
  auto grads = grads_of({y}, {x, weight}, {grad_y});

  auto x_same = leaf(x_in);
  auto w_same = leaf(weight_same);
  auto y_same = tt::reference::rms_norm(x_same, w_same, kEps);
  auto grads_same = grads_of({y_same}, {x_same, w_same}, {grad_y});

  auto x64 = leaf(x_in.to(torch::kFloat64));
  auto w64 = leaf(weight_same.to(torch::kFloat64));
  auto y64 = tt::reference::rms_norm(x64, w64, kEps);
  auto grads64 = grads_of({y64}, {x64, w64}, {grad_y.to(torch::kFloat64)});

  // grad x = r * (g * w - x * r^2 * mean(g * w * x)) cancels when hidden is small (at hidden 1 it is
  // O(eps)): measure its error against the size of r * g * w.
  auto inv_rms64 = torch::rsqrt(x64.detach().pow(2).mean(-1, /*keepdim=*/true) + kEps);
  const double grad_x_scale = (grad_y.to(torch::kFloat64) * w64.detach() * inv_rms64).abs().max().item<double>();
  expect_matches_reference(y, y_same, y64, dtype, 1e-5, what + " output");
  expect_matches_reference(grads[0], grads_same[0], grads64[0], dtype, 1e-4, what + " grad x", grad_x_scale);
  expect_matches_reference(grads[1], grads_same[1], grads64[1], dtype, 1e-4, what + " grad weight");
}

TEST(OpsGpu, RmsNormMatchesReferenceOverShapesAndDtypes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(0);
  // Rows: one; a few; up to 2,048 (in bf16 and fp16 the backward's weight gradient is summed in its own launch) and
  // beyond (two kernels, as in fp32: partial sums, then their sum), with more rows than the 1024 partial-sum blocks.
  // Hidden: 1, odd sizes (element-wise path), 512/1000/2048 (16-byte path), 4099 (several strides).
  const std::vector<std::vector<int64_t>> shapes = {{1, 1},       {1, 7},        {3, 129},    {2, 17, 512},
                                                    {1000, 1000}, {5, 4099},     {300, 2048}, {600, 7},
                                                    {1025, 129},  {4, 600, 512}, {2048, 512}, {2100, 7}};
  for (const auto dtype : kDtypes) {
    for (const auto& shape : shapes) check_rms_norm(torch::randn(shape, gpu()).to(dtype), dtype, "contiguous");
  }
}

TEST(OpsGpu, RmsNormHandlesNonContiguousAndMisalignedInputs) {
  TT_REQUIRE_GPU();
  torch::manual_seed(1);
  for (const auto dtype : kDtypes) {
    auto transposed = torch::randn({512, 33}, gpu()).to(dtype).t();  // [33, 512], column-major
    check_rms_norm(transposed, dtype, "transposed");
    auto sliced = torch::randn({40, 1030}, gpu()).to(dtype).narrow(1, 3, 1024);  // row stride 1030
    check_rms_norm(sliced, dtype, "column slice");
    check_rms_norm(misaligned_copy(torch::randn({9, 1024}, gpu()).to(dtype)), dtype, "misaligned");
  }
}

TEST(OpsGpu, RmsNormWeightGradientIsBitwiseDeterministic) {
  TT_REQUIRE_GPU();
  torch::manual_seed(2);
  // 2,000 rows: in bf16 and fp16 summed in the backward's own launch; 3,000 (and fp32): partial sums, a second kernel.
  for (const int64_t rows : {2000, 3000})
    for (const auto dtype : kDtypes) {
      auto x_data = torch::randn({rows, 1000}, gpu()).to(dtype);
      auto grad_y = torch::randn({rows, 1000}, gpu()).to(dtype);
      auto weight_data = torch::randn({1000}, gpu());
      std::vector<torch::Tensor> weight_grads;
      std::vector<torch::Tensor> x_grads;
      for (int run = 0; run < 2; ++run) {
        auto x = leaf(x_data);
        auto weight = leaf(weight_data);
        auto grads = grads_of({tt::ops::rms_norm(x, weight, kEps)}, {x, weight}, {grad_y});
        x_grads.push_back(grads[0]);
        weight_grads.push_back(grads[1]);
      }
      EXPECT_TRUE(torch::equal(weight_grads[0], weight_grads[1]))
          << "rms_norm grad weight [" << dtype_name(dtype) << "] differs between two identical runs";
      EXPECT_TRUE(torch::equal(x_grads[0], x_grads[1]))
          << "rms_norm grad x [" << dtype_name(dtype) << "] differs between two identical runs";
    }
}

TEST(OpsGpu, RmsNormEmptyBatch) {
  TT_REQUIRE_GPU();
  auto x = leaf(torch::randn({0, 64}, gpu()));
  auto weight = leaf(torch::randn({64}, gpu()));
  auto y = tt::ops::rms_norm(x, weight, kEps);
  EXPECT_EQ(y.sizes(), x.sizes());
  auto grads = grads_of({y}, {x, weight}, {torch::randn({0, 64}, gpu())});
  EXPECT_TRUE(grads[1].eq(0).all().item<bool>()) << "an empty batch must give a zero weight gradient";
}

// ---- Residual add fused with RMSNorm -------------------------------------------------------------

// residual in `residual_dtype`, delta and the output in `out_dtype`; both outputs receive a gradient. The
// references run the unfused composition (add in the residual's dtype, norm, cast) in the same dtypes and in
// fp64.
void check_add_rms_norm(const std::vector<int64_t>& shape, torch::ScalarType residual_dtype,
                        torch::ScalarType out_dtype, bool with_delta) {
  const int64_t hidden = shape.back();
  const std::string what = "add_rms_norm " + shape_name(torch::IntArrayRef(shape)) + " residual " +
                           dtype_name(residual_dtype) + " out " + dtype_name(out_dtype) +
                           (with_delta ? "" : " without delta");
  auto residual_in = torch::randn(shape, gpu()).to(residual_dtype);
  auto delta_in = torch::randn(shape, gpu()).to(out_dtype);
  auto weight_in = (1 + 0.2 * torch::randn({hidden}, gpu())).to(out_dtype).to(torch::kFloat32);
  auto grad_residual = torch::randn(shape, gpu()).to(residual_dtype);
  auto grad_y = torch::randn(shape, gpu()).to(out_dtype);

  auto run = [&](auto&& fn, torch::ScalarType rt, torch::ScalarType ot) {
    auto r = leaf(residual_in.to(rt)), d = leaf(delta_in.to(ot)), w = leaf(weight_in.to(ot == torch::kFloat64 ? ot : torch::kFloat32));
    auto [res, y] = fn(r, with_delta ? d : torch::Tensor(), w);
    std::vector<torch::Tensor> inputs = {r, w};
    if (with_delta) inputs.push_back(d);
    auto grads = grads_of({res, y}, inputs, {grad_residual.to(rt), grad_y.to(ot)});
    grads.insert(grads.begin(), {res, y});
    return grads;  // residual out, y, grad residual, grad weight[, grad delta]
  };
  auto ours = run(
      [&](const torch::Tensor& r, const torch::Tensor& d, const torch::Tensor& w) {
        auto out = tt::ops::add_rms_norm(r, d, w, kEps, out_dtype);
        return std::pair{out.residual, out.normalized};
      },
      residual_dtype, out_dtype);
  auto unfused = [&](torch::ScalarType ot) {
    return [=](const torch::Tensor& r, const torch::Tensor& d, const torch::Tensor& w) {
      auto h = d.defined() ? r + d : r;
      return std::pair{h, tt::reference::rms_norm(h, w, kEps).to(ot)};
    };
  };
  auto same = run(unfused(out_dtype), residual_dtype, out_dtype);
  auto ref64 = run(unfused(torch::kFloat64), torch::kFloat64, torch::kFloat64);
  EXPECT_EQ(ours[0].scalar_type(), residual_dtype) << what;
  EXPECT_EQ(ours[1].scalar_type(), out_dtype) << what;
  const std::vector<std::string> names = {"residual out", "output", "grad residual", "grad weight", "grad delta"};
  // The weight gradient is fp32, but it sums grad_y x normalised h over rows, where h = residual + delta is
  // rounded to the residual's dtype first (as the unfused add rounds it): it is held to that dtype's rule.
  const std::vector<torch::ScalarType> dtypes = {residual_dtype, out_dtype, residual_dtype, residual_dtype, out_dtype};
  for (size_t i = 0; i < ours.size(); ++i)
    expect_matches_reference(ours[i], same[i], ref64[i], dtypes[i], 1e-4, what + " " + names[i]);

  // That rule is loose for the weight gradient's own sum, which the kernels accumulate in fp32 from values exact in
  // fp64: the norm's input as stored (residual out) and grad_y. Against their fp64 sum it is held to 1e-5 of the sum
  // of the terms' magnitudes: fp32 summation and the kernel's own fp32 inv_rms stay within about 1e-6 of it (an fp32
  // emulation of both paths' orders: under 4e-8), while one row dropped or counted twice moves a column by about
  // 1/rows of it (2e-4 at 2,048 rows), which the bf16 rule above would let through.
  const auto h = ours[0].to(torch::kFloat64).reshape({-1, hidden});
  const auto terms =
      grad_y.to(torch::kFloat64).reshape({-1, hidden}) * h * torch::rsqrt(h.pow(2).mean(-1, true) + kEps);
  const auto excess = (ours[3].to(torch::kFloat64) - terms.sum(0)).abs() - 1e-5 * terms.abs().sum(0);
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << " grad weight: beyond fp32 summation error of the fp64 sum of its terms (by at most this much)";
}

TEST(OpsGpu, AddRmsNormMatchesAddThenNormOverShapesAndDtypePairs) {
  TT_REQUIRE_GPU();
  torch::manual_seed(21);
  const std::vector<std::pair<torch::ScalarType, torch::ScalarType>> pairs = {
      {torch::kFloat32, torch::kFloat32}, {torch::kBFloat16, torch::kBFloat16}, {torch::kFloat16, torch::kFloat16},
      {torch::kFloat32, torch::kBFloat16}, {torch::kFloat32, torch::kFloat16}};
  // Rows up to 2,048 (one launch with a 16-bit compute dtype: 2,048 is the largest) and beyond (two kernels). Hidden
  // 12 and 516 are not multiples of 8: with an fp32 residual's 4-wide packs the last column block reaches half past
  // the row's end ({300, 12}, {2048, 516}); {2100, 516} runs the same packs on the two-kernel path.
  const std::vector<std::vector<int64_t>> shapes = {{1, 1},    {3, 129},       {2, 17, 512},   {1025, 7},
                                                    {5, 4099}, {300, 2048},    {300, 12},      {2048, 516},
                                                    {2100, 7}, {2, 1024, 512}, {2, 1100, 512}, {2100, 516}};
  for (const auto& [residual_dtype, out_dtype] : pairs)
    for (const auto& shape : shapes)
      for (const bool with_delta : {true, false}) check_add_rms_norm(shape, residual_dtype, out_dtype, with_delta);
}

TEST(OpsGpu, AddRmsNormBackwardIsBitwiseDeterministic) {
  TT_REQUIRE_GPU();
  torch::manual_seed(22);
  auto residual = torch::randn({2000, 1000}, gpu());
  auto delta = torch::randn({2000, 1000}, gpu()).to(torch::kBFloat16);
  auto weight = torch::randn({1000}, gpu());
  auto grad_residual = torch::randn({2000, 1000}, gpu());
  auto grad_y = torch::randn({2000, 1000}, gpu()).to(torch::kBFloat16);
  std::vector<std::vector<torch::Tensor>> runs;
  for (int run = 0; run < 2; ++run) {
    auto r = leaf(residual), d = leaf(delta), w = leaf(weight);
    auto out = tt::ops::add_rms_norm(r, d, w, kEps, torch::kBFloat16);
    runs.push_back(grads_of({out.residual, out.normalized}, {r, d, w}, {grad_residual, grad_y}));
  }
  for (size_t i = 0; i < runs[0].size(); ++i)
    EXPECT_TRUE(torch::equal(runs[0][i], runs[1][i])) << "add_rms_norm gradient " << i << " differs between two runs";
}

// An absent gradient (the norms' functions do not materialise it: OpsCpu.RmsNormLeavesAnAbsentGradientAbsent)
// gives the gradients of a zero one: residual_out's (the model's final norm; the kernel skips the residual
// gradient) and y's (the backward then makes zeros itself). torch::equal: the same values. Shapes: one row, few
// rows of an odd width, many rows per backward block, the workshop's and medium's norms.
TEST(OpsGpu, RmsNormAbsentGradientsEqualZeroOnes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(23);
  const std::vector<std::vector<int64_t>> shapes = {{1, 512}, {3, 4099}, {4100, 7}, {1024, 512}, {2048, 2048}};
  for (const auto& shape : shapes) {
    const std::string what = shape_name(torch::IntArrayRef(shape));
    auto x = leaf(torch::randn(shape, gpu()));
    auto delta = leaf(torch::randn(shape, gpu()).to(torch::kBFloat16));
    auto weight = leaf(1 + 0.2 * torch::randn({shape.back()}, gpu()));
    auto grad_y = torch::randn(shape, gpu()).to(torch::kBFloat16);
    auto grad_residual = torch::randn(shape, gpu());
    auto out = tt::ops::add_rms_norm(x, delta, weight, kEps, torch::kBFloat16);
    const std::vector<torch::Tensor> inputs = {x, delta, weight};
    auto y_only = torch::autograd::grad({out.normalized}, inputs, {grad_y}, /*retain_graph=*/true);
    auto zero_residual = torch::autograd::grad({out.normalized, out.residual}, inputs,
                                               {grad_y, torch::zeros_like(out.residual)}, /*retain_graph=*/true);
    auto residual_only = torch::autograd::grad({out.residual}, inputs, {grad_residual}, /*retain_graph=*/true);
    auto zero_y = torch::autograd::grad({out.normalized, out.residual}, inputs,
                                        {torch::zeros_like(grad_y), grad_residual});
    for (size_t i = 0; i < inputs.size(); ++i) {
      EXPECT_TRUE(torch::equal(y_only[i], zero_residual[i]))
          << what << ": gradient " << i << " differs between an absent and a zero residual_out gradient";
      EXPECT_TRUE(torch::equal(residual_only[i], zero_y[i]))
          << what << ": gradient " << i << " differs between an absent and a zero y gradient";
    }
  }
}

TEST(OpsGpu, RmsNormRejectsBadInputs) {
  TT_REQUIRE_GPU();
  auto x = torch::randn({4, 8}, gpu());
  expect_error([&] { tt::ops::rms_norm(x.to(torch::kFloat64), torch::ones({8}, gpu()), kEps); },
               "the GPU kernel supports x of dtype Float, BFloat16 or Half, got Double");
  expect_error([&] { tt::ops::rms_norm(x, torch::ones({8}), kEps); }, "weight is on cpu but x is on cuda");
}

// ---- RoPE ---------------------------------------------------------------------------------------

struct RopeInputs {
  torch::Tensor q;
  torch::Tensor k;
};

void check_rope(const RopeInputs& in, torch::ScalarType dtype, const std::string& label) {
  const int64_t seq = in.q.size(1);
  const int64_t head_dim = in.q.size(3);
  // A non-zero start position, as in KV-cache decoding, so angles are not all small.
  auto [cos, sin] = tt::reference::rope_tables(seq, head_dim, 10000.0, 7, torch::kCUDA);
  auto grad_q = torch::randn(in.q.sizes(), gpu()).to(dtype);
  auto grad_k = torch::randn(in.k.sizes(), gpu()).to(dtype);
  const std::string what = "rope " + label + " q " + shape_name(in.q.sizes()) + " k " + shape_name(in.k.sizes());

  auto q = leaf(in.q);
  auto k = leaf(in.k);
  auto [q_out, k_out] = tt::ops::rope(q, k, cos, sin);
  EXPECT_EQ(q_out.scalar_type(), dtype);
  EXPECT_EQ(k_out.scalar_type(), dtype);
  auto grads = grads_of({q_out, k_out}, {q, k}, {grad_q, grad_k});

  auto q_same = leaf(in.q);
  auto k_same = leaf(in.k);
  auto q_out_same = tt::reference::apply_rope(q_same, cos, sin);
  auto k_out_same = tt::reference::apply_rope(k_same, cos, sin);
  auto grads_same = grads_of({q_out_same, k_out_same}, {q_same, k_same}, {grad_q, grad_k});

  // apply_rope computes in fp32 whatever the input; that is precise enough for an exact rotation
  // checked at 1e-5 (the fp64 run still removes the inputs' rounding from the comparison).
  auto q64 = leaf(in.q.to(torch::kFloat64));
  auto k64 = leaf(in.k.to(torch::kFloat64));
  auto q_out64 = tt::reference::apply_rope(q64, cos, sin);
  auto k_out64 = tt::reference::apply_rope(k64, cos, sin);
  auto grads64 = grads_of({q_out64, k_out64}, {q64, k64}, {grad_q.to(torch::kFloat64), grad_k.to(torch::kFloat64)});

  expect_matches_reference(q_out, q_out_same, q_out64, dtype, 1e-5, what + " q output");
  expect_matches_reference(k_out, k_out_same, k_out64, dtype, 1e-5, what + " k output");
  expect_matches_reference(grads[0], grads_same[0], grads64[0], dtype, 1e-5, what + " grad q");
  expect_matches_reference(grads[1], grads_same[1], grads64[1], dtype, 1e-5, what + " grad k");
}

TEST(OpsGpu, RopeMatchesReferenceOverShapesHeadsAndDtypes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(3);
  const std::vector<std::pair<int64_t, int64_t>> head_configs = {{8, 8}, {8, 4}, {8, 1}};
  for (const auto dtype : kDtypes) {
    for (const int64_t seq : {1, 17, 129, 1000}) {
      for (const auto& [q_heads, kv_heads] : head_configs) {
        const int64_t batch = 2, head_dim = 64;
        check_rope({torch::randn({batch, seq, q_heads, head_dim}, gpu()).to(dtype),
                    torch::randn({batch, seq, kv_heads, head_dim}, gpu()).to(dtype)},
                   dtype, "contiguous");
      }
    }
    // Tiny and odd pair counts: head_dim 2 (one pair) and 6 (three pairs).
    for (const int64_t head_dim : {2, 6}) {
      check_rope(
          {torch::randn({1, 5, 3, head_dim}, gpu()).to(dtype), torch::randn({1, 5, 1, head_dim}, gpu()).to(dtype)},
          dtype, "small head_dim");
    }
  }
}

TEST(OpsGpu, RopeHandlesStridedViews) {
  TT_REQUIRE_GPU();
  torch::manual_seed(4);
  for (const auto dtype : kDtypes) {
    const int64_t batch = 2, seq = 33, q_heads = 8, kv_heads = 2, head_dim = 32;
    // q and k as views into a fused QKV projection [B, S, (Hq + 2 Hkv) * D], as the model produces them.
    auto qkv = torch::randn({batch, seq, (q_heads + 2 * kv_heads) * head_dim}, gpu()).to(dtype);
    auto parts = qkv.split({q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim}, -1);
    check_rope({parts[0].unflatten(-1, {q_heads, head_dim}), parts[1].unflatten(-1, {kv_heads, head_dim})}, dtype,
               "fused-QKV views");
    // Heads-major layout [B, H, S, D] transposed to [B, S, H, D].
    check_rope({torch::randn({batch, q_heads, seq, head_dim}, gpu()).to(dtype).transpose(1, 2),
                torch::randn({batch, kv_heads, seq, head_dim}, gpu()).to(dtype).transpose(1, 2)},
               dtype, "transposed");
    // A non-unit stride in the head dim itself: copied by the op layer.
    check_rope({torch::randn({batch, seq, head_dim, q_heads}, gpu()).to(dtype).transpose(2, 3),
                torch::randn({batch, seq, kv_heads, head_dim}, gpu()).to(dtype)},
               dtype, "strided head dim");
  }
}

// rope_qkv against the split views rotated by the reference, every output and the gradient of qkv (the
// kernel writes all of it: rotated dq and dk, copied dv). `qkv` [B, S, Hq + 2 Hkv, D] may be any view.
void check_rope_qkv(const torch::Tensor& qkv_in, int64_t q_heads, int64_t kv_heads, torch::ScalarType dtype,
                    const std::string& label) {
  const int64_t seq = qkv_in.size(1), head_dim = qkv_in.size(3);
  auto [cos, sin] = tt::reference::rope_tables(seq, head_dim, 10000.0, 7, torch::kCUDA);
  auto sizes = qkv_in.sizes().vec();
  const auto grad_for = [&](int64_t heads) {
    sizes[2] = heads;
    return torch::randn(sizes, gpu()).to(dtype);
  };
  const std::vector<torch::Tensor> grad_outputs = {grad_for(q_heads), grad_for(kv_heads), grad_for(kv_heads)};
  const std::string what = "rope_qkv " + label + " qkv " + shape_name(qkv_in.sizes());
  const auto reference_outputs = [&](const torch::Tensor& qkv) {
    auto parts = qkv.split_with_sizes({q_heads, kv_heads, kv_heads}, 2);
    return std::vector<torch::Tensor>{tt::reference::apply_rope(parts[0], cos, sin),
                                      tt::reference::apply_rope(parts[1], cos, sin), parts[2]};
  };

  // A leaf with the caller's strides: leaf() clones, which may make it contiguous.
  auto qkv = qkv_in.detach().requires_grad_(true);
  const auto out = tt::ops::rope_qkv(qkv, q_heads, kv_heads, cos, sin);
  const std::vector<torch::Tensor> outputs = {out.q, out.k, out.v};
  auto grad = grads_of(outputs, {qkv}, grad_outputs)[0];

  auto qkv_same = leaf(qkv_in);
  const auto outputs_same = reference_outputs(qkv_same);
  auto grad_same = grads_of(outputs_same, {qkv_same}, grad_outputs)[0];
  auto qkv64 = leaf(qkv_in.to(torch::kFloat64));
  std::vector<torch::Tensor> grad_outputs64;
  for (const auto& g : grad_outputs) grad_outputs64.push_back(g.to(torch::kFloat64));
  const auto outputs64 = reference_outputs(qkv64);
  auto grad64 = grads_of(outputs64, {qkv64}, grad_outputs64)[0];

  const char* names[] = {" q output", " k output", " v output"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(outputs[i].scalar_type(), dtype) << what << names[i];
    EXPECT_EQ(outputs[i].sizes(), outputs_same[i].sizes()) << what << names[i];
    expect_matches_reference(outputs[i], outputs_same[i], outputs64[i], dtype, 1e-5, what + names[i]);
  }
  EXPECT_EQ(grad.sizes(), qkv_in.sizes()) << what;
  expect_matches_reference(grad, grad_same, grad64, dtype, 1e-5, what + " grad qkv");
}

TEST(OpsGpu, RopeQkvMatchesSplitThenRopeOverShapesAndDtypes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(5);
  for (const auto dtype : kDtypes) {
    for (const int64_t seq : {1, 17, 129}) {
      for (const auto& [q_heads, kv_heads] : std::vector<std::pair<int64_t, int64_t>>{{8, 4}, {8, 8}, {3, 1}}) {
        check_rope_qkv(torch::randn({2, seq, q_heads + 2 * kv_heads, 64}, gpu()).to(dtype), q_heads, kv_heads, dtype,
                       "contiguous");
      }
    }
    // Head dims whose heads do not split into 16-byte packs take the one-pair path: 2, 6 and (bf16) 12.
    for (const int64_t head_dim : {2, 6, 12}) {
      check_rope_qkv(torch::randn({1, 5, 5, head_dim}, gpu()).to(dtype), 3, 1, dtype, "small head_dim");
    }
    // Views: the first heads of a wider tensor (seq stride wider than the heads), heads wider than their
    // head dim (head stride 40), and a non-unit stride in the head dim (copied by the op layer).
    check_rope_qkv(torch::randn({2, 9, 10, 32}, gpu()).to(dtype).narrow(2, 0, 8), 4, 2, dtype, "seq-strided");
    check_rope_qkv(torch::randn({2, 9, 8, 40}, gpu()).to(dtype).narrow(3, 0, 32), 4, 2, dtype, "head-strided");
    check_rope_qkv(torch::randn({2, 9, 32, 8}, gpu()).to(dtype).transpose(2, 3), 4, 2, dtype, "strided head dim");
  }
}

TEST(OpsGpu, RopeRejectsBadInputs) {
  TT_REQUIRE_GPU();
  auto [cos, sin] = tt::reference::rope_tables(5, 8, 10000.0, 0, torch::kCUDA);
  auto q = torch::randn({1, 5, 4, 8}, gpu());
  auto k = torch::randn({1, 5, 2, 8}, gpu());
  expect_error([&] { tt::ops::rope(q, k, cos.cpu(), sin); }, "cos is on cpu but q is on cuda");
  expect_error([&] { tt::ops::rope(q, k.cpu(), cos, sin); }, "k is on cpu but q is on cuda");
  expect_error([&] { tt::ops::rope(q.to(torch::kFloat64), k.to(torch::kFloat64), cos, sin); },
               "the GPU kernel supports q and k of dtype Float, BFloat16 or Half, got Double");
  expect_error([&] { tt::ops::rope_qkv(torch::randn({1, 5, 8, 8}, gpu()), 4, 1, cos, sin); },
               "qkv must have shape [batch, seq, n_heads + 2 * n_kv_heads = 6, head_dim], got [1, 5, 8, 8]");
}

// ---- SwiGLU -------------------------------------------------------------------------------------

using SwigluOp = torch::Tensor (*)(const torch::Tensor&);

// `op`: tt::ops::swiglu, or its general strided path tt::ops::swiglu_strided.
void check_swiglu(const torch::Tensor& gate_up_in, torch::ScalarType dtype, const std::string& label,
                  SwigluOp op = tt::ops::swiglu) {
  const int64_t ffn = gate_up_in.size(-1) / 2;
  auto out_sizes = gate_up_in.sizes().vec();
  out_sizes.back() = ffn;
  auto grad_out = torch::randn(out_sizes, gpu()).to(dtype);
  const std::string what = "swiglu " + label + " gate_up " + shape_name(gate_up_in.sizes());

  auto gate_up = leaf(gate_up_in);
  auto out = op(gate_up);
  EXPECT_EQ(out.scalar_type(), dtype);
  auto grad = grads_of({out}, {gate_up}, {grad_out})[0];

  auto reference = [&](const torch::Tensor& input, const torch::Tensor& g) {
    auto halves = input.chunk(2, -1);
    auto result = tt::reference::swiglu(halves[0], halves[1]);
    return std::make_pair(result, grads_of({result}, {input}, {g})[0]);
  };
  auto gate_up_same = leaf(gate_up_in);
  auto [out_same, grad_same] = reference(gate_up_same, grad_out);
  auto gate_up64 = leaf(gate_up_in.to(torch::kFloat64));
  auto [out64, grad64] = reference(gate_up64, grad_out.to(torch::kFloat64));

  expect_matches_reference(out, out_same, out64, dtype, 1e-5, what + " output");
  expect_matches_reference(grad, grad_same, grad64, dtype, 1e-5, what + " grad gate_up");
}

TEST(OpsGpu, SwigluMatchesReferenceOverShapesAndDtypes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {{1, 2},    {1, 14},      {3, 258},       {8, 16, 4096},
                                                    {5, 8198}, {1000, 2000}, {2, 7, 2 * 129}};
  for (const auto dtype : kDtypes) {
    // Scaled so gates reach the saturated ends of the sigmoid.
    for (const auto& shape : shapes) check_swiglu((3 * torch::randn(shape, gpu())).to(dtype), dtype, "contiguous");
  }
}

TEST(OpsGpu, SwigluHandlesNonContiguousAndMisalignedInputs) {
  TT_REQUIRE_GPU();
  torch::manual_seed(6);
  for (const auto dtype : kDtypes) {
    check_swiglu(torch::randn({2048, 64}, gpu()).to(dtype).t(), dtype, "transposed");
    check_swiglu(torch::randn({64, 2060}, gpu()).to(dtype).narrow(1, 4, 2048), dtype, "column slice");
    check_swiglu(misaligned_copy(torch::randn({16, 2048}, gpu()).to(dtype)), dtype, "misaligned");
  }
}

// The debugging exercise's strided path: the same function on any layout, read in place.
TEST(OpsGpu, SwigluStridedMatchesReferenceOnEveryLayout) {
  TT_REQUIRE_GPU();
  torch::manual_seed(16);
  for (const auto dtype : kDtypes) {
    const auto op = tt::ops::swiglu_strided;
    check_swiglu((3 * torch::randn({2, 7, 2 * 129}, gpu())).to(dtype), dtype, "strided path, contiguous", op);
    check_swiglu(torch::randn({2048, 64}, gpu()).to(dtype).t(), dtype, "strided path, transposed", op);
    check_swiglu(torch::randn({2 * 1000, 3}, gpu()).to(dtype).t(), dtype, "strided path, transposed, 3 rows", op);
    check_swiglu(torch::randn({64, 2060}, gpu()).to(dtype).narrow(1, 4, 2048), dtype, "strided path, column slice", op);
    // [B, S, 2F] viewed from a transposed [B * S, 2F], as the non-contiguous pitfall's MLP makes it.
    check_swiglu(torch::randn({2 * 10, 4 * 3}, gpu()).to(dtype).t().view({4, 3, 20}), dtype,
                 "strided path, 3-D from transposed", op);
  }
}

// ---- Naive SwiGLU MLP kernel (the debugging exercise) ----------------------------------------------

void check_naive_swiglu(int64_t rows, int64_t hidden, int64_t ffn, torch::ScalarType dtype) {
  const std::string what = "naive_swiglu rows " + std::to_string(rows) + " hidden " + std::to_string(hidden) +
                           " ffn " + std::to_string(ffn);
  auto x_in = torch::randn({rows, hidden}, gpu()).to(dtype);
  auto w_in = (torch::randn({2 * ffn, hidden}, gpu()) / std::sqrt(static_cast<double>(hidden))).to(dtype);
  auto grad_out = torch::randn({rows, ffn}, gpu()).to(dtype);
  auto x = leaf(x_in), w = leaf(w_in);
  auto out = tt::ops::naive_swiglu(x, w);
  EXPECT_EQ(out.scalar_type(), dtype);
  auto grads = grads_of({out}, {x, w}, {grad_out});
  auto reference = [&](const torch::Tensor& xr, const torch::Tensor& wr, const torch::Tensor& g) {
    auto gate_up = torch::matmul(xr, wr.t());
    auto result = tt::reference::swiglu(gate_up.narrow(-1, 0, ffn), gate_up.narrow(-1, ffn, ffn));
    auto gr = grads_of({result}, {xr, wr}, {g});
    return std::make_tuple(result, gr[0], gr[1]);
  };
  auto x_same = leaf(x_in), w_same = leaf(w_in);
  auto [out_same, gx_same, gw_same] = reference(x_same, w_same, grad_out);
  auto x64 = leaf(x_in.to(torch::kFloat64)), w64 = leaf(w_in.to(torch::kFloat64));
  auto [out64, gx64, gw64] = reference(x64, w64, grad_out.to(torch::kFloat64));
  // fp32: sums over hidden (forward), 2F (grad x) or rows (grad W) terms, accumulated in another order than
  // the vendor GEMM's.
  expect_matches_reference(out, out_same, out64, dtype, 1e-5, what + " output");
  expect_matches_reference(grads[0], gx_same, gx64, dtype, 1e-5, what + " grad x");
  expect_matches_reference(grads[1], gw_same, gw64, dtype, 1e-5, what + " grad weight");
}

TEST(OpsGpu, NaiveSwigluMatchesReferenceOverShapesAndDtypes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(17);
  for (const auto dtype : kDtypes)
    for (const auto& [rows, hidden, ffn] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {1, 1, 1}, {1, 13, 5}, {7, 64, 129}, {33, 100, 70}, {256, 512, 256}})
      check_naive_swiglu(rows, hidden, ffn, dtype);
}

TEST(OpsGpu, NaiveSwigluTakesAnFp32MasterWeightUnderBf16Input) {
  TT_REQUIRE_GPU();
  torch::manual_seed(18);
  auto x = torch::randn({2, 3, 16}, gpu(torch::kBFloat16)).requires_grad_(true);
  auto w = torch::randn({2 * 8, 16}, gpu()).requires_grad_(true);
  auto out = tt::ops::naive_swiglu(x, w);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(out.sizes(), torch::IntArrayRef({2, 3, 8}));
  out.sum().backward();
  EXPECT_EQ(w.grad().scalar_type(), torch::kFloat32);
  EXPECT_EQ(x.grad().scalar_type(), torch::kBFloat16);
  expect_error([] { tt::ops::naive_swiglu(torch::randn({3, 4}, gpu()), torch::randn({8, 4})); },
               "x is on cuda:0 but gate_up_weight on cpu");
}

TEST(OpsGpu, SwigluRejectsBadInputs) {
  TT_REQUIRE_GPU();
  expect_error(
      [] {
        tt::ops::swiglu(torch::randn({4, 8}, gpu(torch::kFloat64)));
      },
      "the GPU kernel supports gate_up of dtype Float, BFloat16 or Half, got Double");
}

// ---- Embedding --------------------------------------------------------------------------------------

// Our lookup's gradient for ids drawn from the first `used` rows of a [vocab, dim] table, against two references:
// the same fp32 sums added on the CPU in ascending position order, which it must equal bitwise (the kernel's
// contract), and the fp64 gradient within the rounding of a row's n positions (about sqrt(n) roundings). Both on the
// CPU: ATen's GPU kernel computes wrong sums when compute-sanitizer instruments it (racecheck reports races in it).
void check_embedding(int64_t vocab, int64_t dim, std::vector<int64_t> ids_shape, int64_t used,
                     const std::string& label) {
  auto ids = torch::randint(used, ids_shape, gpu(torch::kInt64));
  auto weight_in = torch::randn({vocab, dim}, gpu());
  auto out_sizes = ids_shape;
  out_sizes.push_back(dim);
  auto grad_out = torch::randn(out_sizes, gpu());
  const std::string what = "embedding " + label + " vocab " + std::to_string(vocab) + " dim " + std::to_string(dim) +
                           " ids " + shape_name(ids.sizes());

  auto weight = leaf(weight_in);
  auto out = tt::ops::embedding(weight, ids);
  EXPECT_TRUE(torch::equal(out, torch::embedding(weight_in, ids))) << what << ": the lookup is ATen's own";
  {
    // A freed block of the gradient's size, full of NaN, for the caching allocator to hand back: rows the kernel
    // failed to write would then show.
    auto poison = torch::full({vocab, dim}, std::nan(""), gpu());
  }
  auto grad = grads_of({out}, {weight}, {grad_out})[0];

  const auto ids_cpu = ids.flatten().cpu();
  const auto rows_cpu = grad_out.reshape({-1, dim}).cpu().contiguous();
  auto sequential = torch::zeros({vocab, dim});
  auto seq = sequential.accessor<float, 2>();
  const auto id = ids_cpu.accessor<int64_t, 1>();
  const auto row = rows_cpu.accessor<float, 2>();
  for (int64_t i = 0; i < ids_cpu.numel(); ++i)
    for (int64_t c = 0; c < dim; ++c) seq[id[i]][c] += row[i][c];
  EXPECT_TRUE(torch::equal(grad.cpu(), sequential)) << what << ": not the fp32 sums in ascending position order";

  auto weight64 = leaf(weight_in.to(torch::kFloat64).cpu());
  auto out64 = torch::embedding(weight64, ids.cpu());
  auto grad64 = grads_of({out64}, {weight64}, {grad_out.to(torch::kFloat64).cpu()})[0].to(grad.device());
  const double most_positions = ids.numel() == 0 ? 1.0 : torch::bincount(ids_cpu).max().item<double>();
  expect_matches_reference(grad, grad64, grad64, torch::kFloat32, 1e-6 * std::sqrt(std::max(1.0, most_positions)),
                           what + " grad weight");
  // Rows no id looks up are written as zeros, not left as they were.
  if (used < vocab) {
    EXPECT_EQ(grad.narrow(0, used, vocab - used).abs().max().item<float>(), 0.0f) << what << ": unused rows";
  }
}

TEST(OpsGpu, EmbeddingBackwardMatchesReferencesOverShapes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(31);
  check_embedding(1000, 512, {8, 128}, 1000, "workshop-sized");
  check_embedding(7, 3, {5}, 7, "odd dim (no vector path)");
  check_embedding(33, 130, {2, 1030}, 33, "many repeats, dim 130");
  check_embedding(40, 1032, {300}, 40, "dim 1032 (three column steps)");
  // Every id the same row, more positions than the block's list holds: summed in three passes.
  check_embedding(5, 64, {3000}, 1, "one row at 3000 positions");
  check_embedding(9, 64, {3000}, 3, "three rows at 1000 positions each");
  // More than 8,192 rows: eight rows per block (the last block short), three of one block over the list's capacity.
  check_embedding(9005, 64, {3000}, 3, "three rows of one eight-row block at 1000 positions each");
  check_embedding(50003, 8, {3}, 50003, "few ids, large table");
  check_embedding(10, 16, {0}, 10, "no ids");
  check_embedding(300, 12, {4, 97}, 40, "a quarter of the rows used");
}

TEST(OpsGpu, EmbeddingBackwardIsBitwiseDeterministic) {
  TT_REQUIRE_GPU();
  torch::manual_seed(32);
  auto ids = torch::randint(20, {4096}, gpu(torch::kInt64));  // ~200 positions per row
  auto grad_out = torch::randn({4096, 256}, gpu());
  auto run = [&] {
    auto weight = leaf(torch::randn({20, 256}, gpu()));
    return grads_of({tt::ops::embedding(weight, ids)}, {weight}, {grad_out})[0];
  };
  const auto first = run();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(run(), first)) << "repeat " << i;
}

TEST(OpsGpu, EmbeddingRejectsBadInputs) {
  TT_REQUIRE_GPU();
  auto ids = torch::zeros({3}, gpu(torch::kInt64));
  expect_error(
      [&] {
        tt::ops::embedding(torch::randn({4, 8}, gpu()).to(torch::kBFloat16), ids);
      },
      "the GPU backward writes an fp32 gradient, so weight must be Float, got BFloat16");
  expect_error(
      [&] {
        tt::ops::embedding(torch::randn({4, 8}, gpu()), ids.to(torch::kInt32));
      },
      "ids must be Long, got Int");
  expect_error([&] { tt::ops::embedding(torch::randn({4, 8}, gpu()), ids.cpu()); }, "ids are on cpu but weight is on");
}

// ---- Cross-entropy --------------------------------------------------------------------------------

// Labels: uniform over the vocabulary, every third row set to ignore_index when `ignore_some`.
torch::Tensor make_labels(int64_t rows, int64_t vocab, bool ignore_some) {
  auto labels = torch::randint(vocab, {rows}, gpu(torch::kInt64));
  if (ignore_some) labels.index_put_({Slice(0, torch::indexing::None, 3)}, kIgnoreIndex);
  return labels;
}

// A non-unit incoming gradient, so the backward's scaling is checked too.
constexpr double kGradLoss = 1.7;

void check_cross_entropy(const torch::Tensor& logits_in, const torch::Tensor& labels, torch::ScalarType dtype,
                         const std::string& label) {
  auto grad_loss = torch::full({}, kGradLoss, gpu());
  const std::string what = "cross_entropy " + label + " logits " + shape_name(logits_in.sizes());

  auto logits = leaf(logits_in);
  auto loss = tt::ops::cross_entropy(logits, labels, kIgnoreIndex);
  EXPECT_EQ(loss.dim(), 0) << what;
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32) << what << ": the loss is accumulated and returned in fp32";
  auto grad = grads_of({loss}, {logits}, {grad_loss})[0];

  auto logits_same = leaf(logits_in);
  auto loss_same = tt::reference::cross_entropy(logits_same, labels, kIgnoreIndex);
  auto grad_same = grads_of({loss_same}, {logits_same}, {grad_loss.to(dtype)})[0];

  auto logits64 = leaf(logits_in.to(torch::kFloat64));
  auto loss64 = tt::reference::cross_entropy(logits64, labels, kIgnoreIndex);
  auto grad64 = grads_of({loss64}, {logits64}, {grad_loss.to(torch::kFloat64)})[0];

  // Each gradient element is (p - [j == label]) * grad_loss / n_valid with |p - [j == label]| <= 1.
  const double n_valid = labels.ne(kIgnoreIndex).sum().item<double>();
  const double grad_scale = n_valid > 0 ? kGradLoss / n_valid : 0.0;
  expect_matches_reference(loss, loss_same, loss64, dtype, 1e-5, what + " loss");
  expect_matches_reference(grad, grad_same, grad64, dtype, 1e-5, what + " grad logits", grad_scale);
}

TEST(OpsGpu, CrossEntropyMatchesReferenceOverVocabsAndDtypes) {
  TT_REQUIRE_GPU();
  torch::manual_seed(7);
  for (const auto dtype : kDtypes) {
    for (const int64_t vocab : {1, 17, 1000, 32000, 50257}) {
      for (const int64_t rows : {1, 37, 256}) {
        for (const bool ignore_some : {false, true}) {
          auto logits = (4 * torch::randn({rows, vocab}, gpu())).to(dtype);
          check_cross_entropy(logits, make_labels(rows, vocab, ignore_some), dtype,
                              ignore_some ? "every third row ignored" : "no row ignored");
        }
      }
    }
  }
}

TEST(OpsGpu, CrossEntropyHandlesNonContiguousAndMisalignedInputs) {
  TT_REQUIRE_GPU();
  torch::manual_seed(8);
  for (const auto dtype : kDtypes) {
    auto labels = make_labels(48, 1000, true);
    check_cross_entropy(torch::randn({1000, 48}, gpu()).to(dtype).t(), labels, dtype, "transposed");
    check_cross_entropy(torch::randn({48, 1024}, gpu()).to(dtype).narrow(1, 8, 1000), labels, dtype, "column slice");
    check_cross_entropy(misaligned_copy(torch::randn({48, 1000}, gpu()).to(dtype)), labels, dtype, "misaligned");
    auto strided_labels = make_labels(96, 1000, true).slice(0, 0, 96, 2);  // every other element
    ASSERT_FALSE(strided_labels.is_contiguous());
    check_cross_entropy(torch::randn({48, 1000}, gpu()).to(dtype), strided_labels, dtype, "strided labels");
  }
}

// ---- Output head and loss in chunks ---------------------------------------------------------------

// hidden and weight in `dtype`; the reference is the unchunked head GEMM and reference cross-entropy, in
// `dtype` and in fp64.
void check_linear_cross_entropy(int64_t rows, int64_t vocab, int64_t hidden_dim, int64_t chunk_rows,
                                torch::ScalarType dtype, bool ignore_some) {
  const std::string what = "linear_cross_entropy rows " + std::to_string(rows) + " vocab " + std::to_string(vocab) +
                           " hidden " + std::to_string(hidden_dim) + " chunk " + std::to_string(chunk_rows) +
                           (ignore_some ? " (some rows ignored)" : "");
  auto hidden_in = torch::randn({rows, hidden_dim}, gpu()).to(dtype);
  auto weight_in = (torch::randn({vocab, hidden_dim}, gpu()) / std::sqrt(static_cast<double>(hidden_dim))).to(dtype);
  auto labels = make_labels(rows, vocab, ignore_some);
  auto grad_loss = torch::full({}, kGradLoss, gpu());
  auto run = [&](bool ours, torch::ScalarType t) {
    auto h = leaf(hidden_in.to(t)), w = leaf(weight_in.to(t));
    auto loss = ours ? tt::ops::linear_cross_entropy(h, w, labels, kIgnoreIndex, chunk_rows)
                     : tt::reference::cross_entropy(torch::mm(h, w.t()), labels, kIgnoreIndex);
    auto grads = grads_of({loss}, {h, w}, {grad_loss.to(loss.scalar_type())});
    return std::vector<torch::Tensor>{loss, grads[0], grads[1]};
  };
  auto ours = run(true, dtype), same = run(false, dtype), ref64 = run(false, torch::kFloat64);
  EXPECT_EQ(ours[1].scalar_type(), dtype) << what;
  EXPECT_EQ(ours[2].scalar_type(), dtype) << what;
  const std::vector<std::string> names = {"loss", "grad hidden", "grad weight"};
  // The weight gradient is summed over chunks in the GEMM dtype (as Liger-Kernel does; an fp32 accumulator
  // would cost a [vocab, H] fp32 buffer): each chunk after the first rounds the running sum once more.
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  for (size_t i = 0; i < ours.size(); ++i)
    expect_matches_reference(ours[i], same[i], ref64[i], dtype, 1e-4, what + " " + names[i], -1.0,
                             i == 2 ? chunks - 1 : 0);
}

TEST(OpsGpu, LinearCrossEntropyMatchesHeadThenLossOverChunkings) {
  TT_REQUIRE_GPU();
  torch::manual_seed(9);
  for (const auto dtype : kDtypes) {
    // One chunk, a ragged last chunk, one row per chunk, chunks larger than the batch.
    for (const int64_t chunk : {int64_t{300}, int64_t{64}, int64_t{1}, int64_t{1000}}) {
      check_linear_cross_entropy(300, 1000, 64, chunk, dtype, true);
    }
    check_linear_cross_entropy(37, 32000, 128, 16, dtype, false);
    check_linear_cross_entropy(5, 17, 33, 2, dtype, true);
  }
}

TEST(OpsGpu, CrossEntropyExtremeLogits) {
  TT_REQUIRE_GPU();
  torch::manual_seed(9);
  for (const auto dtype : kDtypes) {
    // Large magnitudes (overflow exp without max subtraction) and a masked (-inf) column that is not a label.
    auto logits = (30 * torch::randn({16, 1000}, gpu())).to(dtype);
    logits.index_put_({Slice(), 5}, -std::numeric_limits<float>::infinity());
    auto labels = torch::randint(6, 1000, {16}, gpu(torch::kInt64));
    check_cross_entropy(logits, labels, dtype, "large and -inf logits");
  }
}

// Matches LibTorch: the mean over zero rows is NaN, and the gradient is zero.
TEST(OpsGpu, CrossEntropyAllRowsIgnoredGivesNanLossAndZeroGradient) {
  TT_REQUIRE_GPU();
  for (const auto dtype : kDtypes) {
    auto logits = leaf(torch::randn({8, 1000}, gpu()).to(dtype));
    auto labels = torch::full({8}, kIgnoreIndex, gpu(torch::kInt64));
    auto loss = tt::ops::cross_entropy(logits, labels, kIgnoreIndex);
    EXPECT_TRUE(std::isnan(loss.item<double>())) << "[" << dtype_name(dtype) << "] loss " << loss.item<double>();
    loss.backward();
    EXPECT_TRUE(logits.grad().eq(0).all().item<bool>()) << "[" << dtype_name(dtype) << "] gradient must be zero";
  }
}

// The GPU path cannot check labels without a host synchronisation; an out-of-range label must at least
// poison the loss rather than read out of bounds silently.
TEST(OpsGpu, CrossEntropyOutOfRangeLabelGivesNanLoss) {
  TT_REQUIRE_GPU();
  auto logits = torch::randn({4, 10}, gpu());
  for (const int64_t bad : {10, -1}) {
    auto labels = torch::tensor(std::vector<int64_t>{1, bad, 2, 3}).to(torch::kCUDA);
    EXPECT_TRUE(std::isnan(tt::ops::cross_entropy(logits, labels, kIgnoreIndex).item<double>()))
        << "label " << bad << " with vocab 10";
  }
}

TEST(OpsGpu, CrossEntropyLossIsBitwiseDeterministic) {
  TT_REQUIRE_GPU();
  torch::manual_seed(10);
  auto logits = torch::randn({4096, 1000}, gpu()).to(torch::kBFloat16);
  auto labels = make_labels(4096, 1000, true);
  auto first = tt::ops::cross_entropy(logits, labels, kIgnoreIndex);
  auto second = tt::ops::cross_entropy(logits, labels, kIgnoreIndex);
  EXPECT_TRUE(torch::equal(first, second)) << first.item<double>() << " vs " << second.item<double>();
}

TEST(OpsGpu, CrossEntropyRejectsBadInputs) {
  TT_REQUIRE_GPU();
  auto logits = torch::randn({4, 10}, gpu());
  auto labels = torch::tensor({1, 2, 3, 4}, gpu(torch::kInt64));
  expect_error([&] { tt::ops::cross_entropy(logits, labels.cpu(), kIgnoreIndex); },
               "labels are on cpu but logits are on cuda");
  expect_error([&] { tt::ops::cross_entropy(logits.to(torch::kFloat64), labels, kIgnoreIndex); },
               "the GPU kernel supports logits of dtype Float, BFloat16 or Half, got Double");
  expect_error([&] { tt::ops::cross_entropy(logits, labels.to(torch::kInt32), kIgnoreIndex); },
               "labels must be Long (int64), got Int");
}

}  // namespace
