// CPU tests of tt::ops::flash_attention. On CPU tensors the autograd Function runs the ATen formulation of the
// same forward and the same backward formulas as the GPU kernels (probabilities recomputed from the saved
// log-sum-exp), so:
//  * fp32 output and every gradient must match reference::masked_attention (explicit mask, repeated heads);
//  * a float64 central-difference check verifies the hand-written backward, grouped-query sums included;
//  * bad inputs fail with messages that name the problem.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kernels/ops/flash_attention.h"
#include "models/reference.h"
#include "tests/helpers.h"
#include "tests/kernel_checks.h"

namespace {

using tt::testing::expect_error;

using tt::testing::expect_close;
using tt::testing::grads_of;
using tt::testing::leaf;


struct Shape {
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t seq;
  int64_t head_dim;

  std::string name() const {
    return "B" + std::to_string(batch) + " H" + std::to_string(q_heads) + "/" + std::to_string(kv_heads) + " S" +
           std::to_string(seq) + " D" + std::to_string(head_dim);
  }
};

// Output and the gradients of q, k and v against the reference, on the given (possibly strided) inputs.
void check_against_reference(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                             const std::string& what) {
  auto q = tt::testing::leaf_view(q_in);
  auto k = tt::testing::leaf_view(k_in);
  auto v = tt::testing::leaf_view(v_in);
  auto out = tt::ops::flash_attention(q, k, v);
  auto q_ref = leaf(q_in);
  auto k_ref = leaf(k_in);
  auto v_ref = leaf(v_in);
  auto out_ref = tt::reference::masked_attention(q_ref, k_ref, v_ref);
  EXPECT_EQ(out.scalar_type(), q_in.scalar_type()) << what;
  expect_close(out, out_ref, 1e-5, 1e-6, what + " output");

  auto grad_out = torch::randn_like(out_ref);
  auto grads = grads_of({out}, {q, k, v}, {grad_out});
  auto grads_ref = grads_of({out_ref}, {q_ref, k_ref, v_ref}, {grad_out});
  expect_close(grads[0], grads_ref[0], 1e-4, 1e-5, what + " grad q");
  expect_close(grads[1], grads_ref[1], 1e-4, 1e-5, what + " grad k");
  expect_close(grads[2], grads_ref[2], 1e-4, 1e-5, what + " grad v");
}

TEST(FlashAttentionCpu, MatchesReferenceFp32) {
  torch::manual_seed(0);
  const std::vector<Shape> shapes = {{1, 1, 1, 1, 8},   {2, 4, 4, 7, 16},  {2, 8, 4, 13, 32},
                                     {1, 8, 1, 9, 64},  {3, 6, 2, 17, 32}, {1, 32, 16, 5, 8},
                                     {2, 2, 2, 65, 128}};
  for (const auto& s : shapes) {
    check_against_reference(torch::randn({s.batch, s.q_heads, s.seq, s.head_dim}),
                            torch::randn({s.batch, s.kv_heads, s.seq, s.head_dim}),
                            torch::randn({s.batch, s.kv_heads, s.seq, s.head_dim}), "flash_attention " + s.name());
  }
}

// The model's layout: q, k and v are [B, S, H, D] views into one fused projection, transposed to [B, H, S, D].
TEST(FlashAttentionCpu, AcceptsViewsOfFusedQkv) {
  torch::manual_seed(1);
  const int64_t batch = 2, seq = 11, q_heads = 6, kv_heads = 2, head_dim = 16;
  auto qkv = torch::randn({batch, seq, (q_heads + 2 * kv_heads) * head_dim});
  auto parts = qkv.split({q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim}, -1);
  auto q = parts[0].unflatten(-1, {q_heads, head_dim}).transpose(1, 2);
  auto k = parts[1].unflatten(-1, {kv_heads, head_dim}).transpose(1, 2);
  auto v = parts[2].unflatten(-1, {kv_heads, head_dim}).transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  check_against_reference(q, k, v, "flash_attention fused-QKV views");
}

TEST(FlashAttentionCpu, KeepsTheInputDtype) {
  torch::manual_seed(2);
  for (const auto dtype : {torch::kBFloat16, torch::kFloat16, torch::kFloat64}) {
    auto q = torch::randn({1, 4, 6, 8}).to(dtype);
    auto kv = torch::randn({1, 2, 6, 8}).to(dtype);
    auto out = tt::ops::flash_attention(q, kv, kv);
    EXPECT_EQ(out.scalar_type(), dtype);
    expect_close(out, tt::reference::masked_attention(q.to(torch::kFloat64), kv.to(torch::kFloat64),
                                                      kv.to(torch::kFloat64)),
                 dtype == torch::kFloat64 ? 1e-12 : 1e-2, 0.0, std::string("flash_attention ") + c10::toString(dtype));
  }
}

// Central differences in float64 on sum(out * projection), so every output element and a non-uniform
// incoming gradient are exercised; the analytic gradient is the Function's own backward.
void expect_gradients_match_finite_differences(const Shape& s, uint64_t seed) {
  constexpr double kStep = 1e-6;
  torch::manual_seed(seed);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  std::vector<torch::Tensor> inputs = {torch::randn({s.batch, s.q_heads, s.seq, s.head_dim}, f64),
                                       torch::randn({s.batch, s.kv_heads, s.seq, s.head_dim}, f64),
                                       torch::randn({s.batch, s.kv_heads, s.seq, s.head_dim}, f64)};
  for (auto& t : inputs) t.requires_grad_(true);
  auto projection = torch::randn({s.batch, s.q_heads, s.seq, s.head_dim}, f64);
  auto objective = [&] { return (tt::ops::flash_attention(inputs[0], inputs[1], inputs[2]) * projection).sum(); };
  auto analytic = torch::autograd::grad({objective()}, inputs);

  torch::NoGradGuard no_grad;
  const char* names[] = {"q", "k", "v"};
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto flat = inputs[i].view({-1});
    auto numeric = torch::zeros_like(flat);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double original = flat[e].item<double>();
      flat[e] = original + kStep;
      const double plus = objective().item<double>();
      flat[e] = original - kStep;
      const double minus = objective().item<double>();
      flat[e] = original;
      numeric[e] = (plus - minus) / (2 * kStep);
    }
    expect_close(analytic[i].view({-1}), numeric, 1e-5, 1e-6,
                 "flash_attention " + s.name() + ": analytic vs finite-difference gradient of " + names[i]);
  }
}

TEST(FlashAttentionCpu, GradientsMatchFiniteDifferences) {
  expect_gradients_match_finite_differences({2, 2, 2, 5, 3}, 3);
  expect_gradients_match_finite_differences({1, 4, 2, 6, 4}, 4);  // grouped-query: dK, dV sum two heads
  expect_gradients_match_finite_differences({2, 3, 1, 4, 2}, 5);  // one key/value head for all queries
}

// flash_attention_rope on CPU: tt::ops::rope then attention, against the reference's rotation then attention,
// output and every gradient, on q and k that are views of a fused QKV projection.
TEST(FlashAttentionCpu, RopeVariantMatchesRopeThenAttention) {
  torch::manual_seed(11);
  for (const Shape& s : {Shape{2, 4, 2, 17, 16}, Shape{1, 8, 1, 33, 64}}) {
    auto [cos, sin] = tt::reference::rope_tables(s.seq + 3, s.head_dim, 10000.0, 0, torch::kCPU);
    auto qkv = torch::randn({s.batch, s.seq, s.q_heads + 2 * s.kv_heads, s.head_dim});
    auto parts = qkv.split({s.q_heads, s.kv_heads, s.kv_heads}, 2);
    auto q = tt::testing::leaf_view(parts[0].transpose(1, 2));
    auto k = tt::testing::leaf_view(parts[1].transpose(1, 2));
    auto v = tt::testing::leaf_view(parts[2].transpose(1, 2));
    auto out = tt::ops::flash_attention_rope(q, k, v, cos, sin);

    auto q_ref = leaf(parts[0].transpose(1, 2));
    auto k_ref = leaf(parts[1].transpose(1, 2));
    auto v_ref = leaf(parts[2].transpose(1, 2));
    auto rows_cos = cos.narrow(0, 0, s.seq);
    auto rows_sin = sin.narrow(0, 0, s.seq);
    auto out_ref = tt::reference::masked_attention(
        tt::reference::apply_rope(q_ref.transpose(1, 2), rows_cos, rows_sin).transpose(1, 2),
        tt::reference::apply_rope(k_ref.transpose(1, 2), rows_cos, rows_sin).transpose(1, 2), v_ref);
    expect_close(out, out_ref, 1e-5, 1e-6, "flash_attention_rope " + s.name() + " output");
    auto grad_out = torch::randn_like(out_ref);
    auto grads = grads_of({out}, {q, k, v}, {grad_out});
    auto grads_ref = grads_of({out_ref}, {q_ref, k_ref, v_ref}, {grad_out});
    const char* names[] = {"grad q", "grad k", "grad v"};
    for (int i = 0; i < 3; ++i)
      expect_close(grads[i], grads_ref[i], 1e-4, 1e-5, "flash_attention_rope " + s.name() + " " + names[i]);
  }
}

TEST(FlashAttentionCpu, RejectsBadInputs) {
  auto q = torch::randn({2, 8, 5, 16});
  auto kv = torch::randn({2, 4, 5, 16});
  expect_error([&] { tt::ops::flash_attention(q.flatten(2), kv, kv); },
               "q must have shape [batch, q_heads, seq, head_dim]");
  expect_error([&] { tt::ops::flash_attention(q, kv.flatten(2), kv); },
               "k must have shape [batch, kv_heads, seq, head_dim]");
  expect_error([&] { tt::ops::flash_attention(q, kv, kv.to(torch::kFloat64)); },
               "q, k and v must have the same dtype, got q Float, k Float and v Double");
  expect_error([&] { tt::ops::flash_attention(q.to(torch::kInt32), kv.to(torch::kInt32), kv.to(torch::kInt32)); },
               "q must be a floating-point tensor");
  expect_error(
      [&] {
        auto kv3 = torch::randn({2, 3, 5, 16});
        tt::ops::flash_attention(q, kv3, kv3);
      },
      "number of query heads (8) must be a multiple of key/value heads (3)");
  expect_error([&] { tt::ops::flash_attention(q, kv, torch::randn({2, 4, 6, 16})); },
               "k and v must have the same shape");
  expect_error(
      [&] {
        auto kv6 = torch::randn({2, 4, 6, 16});
        tt::ops::flash_attention(q, kv6, kv6);
      },
      "q and k/v must agree in batch, seq and head_dim");
  expect_error(
      [&] {
        auto kv0 = torch::randn({2, 0, 5, 16});
        tt::ops::flash_attention(q, kv0, kv0);
      },
      "k and v must have at least one head");
}

}  // namespace
