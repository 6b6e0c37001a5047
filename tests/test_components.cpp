#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "models/components.h"
#include "models/reference.h"
#include "models/stage.h"
#include "models/transformer.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::rel_error;

TEST(RMSNorm, MatchesHandComputedValues) {
  auto x = torch::tensor({{3.0f, 4.0f}, {1.0f, -1.0f}});
  auto w = torch::tensor({1.0f, 2.0f});
  // Row 0: mean(x^2) = 12.5, rms = sqrt(12.5); row 1: rms = 1.
  const double eps = 1e-6;
  auto expected = torch::tensor({{3.0 / std::sqrt(12.5 + eps), 8.0 / std::sqrt(12.5 + eps)},
                                 {1.0 / std::sqrt(1.0 + eps), -2.0 / std::sqrt(1.0 + eps)}}, torch::kFloat32);
  for (const auto& entry : norm_implementations()) {
    RMSNorm norm(2, eps, entry.kind);
    norm->weight.data().copy_(w);
    EXPECT_LT(rel_error(norm->forward(x), expected), 1e-6) << entry.name;
  }
}

// Every kind adds the pending sub-layer output before it normalises, and returns the sum as the new residual.
TEST(RMSNorm, EveryKindAddsTheResidualFirst) {
  torch::manual_seed(3);
  auto residual = torch::randn({3, 5, 16});
  auto delta = torch::randn({3, 5, 16});
  auto weight = 1 + 0.1 * torch::randn({16});
  auto expected = reference::rms_norm(residual + delta, weight, 1e-6);
  for (const auto& entry : norm_implementations()) {
    RMSNorm norm(16, 1e-6, entry.kind);
    norm->weight.data().copy_(weight);
    auto out = norm->forward(residual, delta);
    EXPECT_TRUE(torch::equal(out.residual, residual + delta)) << entry.name;
    EXPECT_LT(rel_error(out.normalized, expected), 1e-6) << entry.name;
  }
}

// Every loss kind is the head's GEMM and the mean cross-entropy over the labels that are not ignored.
TEST(Loss, EveryKindMatchesTheReference) {
  torch::manual_seed(4);
  auto hidden = torch::randn({12, 8});
  auto weight = torch::randn({11, 8});
  auto labels = torch::randint(11, {12}, torch::kInt64);
  labels[3] = reference::kIgnoreIndex;
  auto expected = reference::cross_entropy(torch::mm(hidden, weight.t()), labels, reference::kIgnoreIndex);
  for (const auto& entry : loss_implementations())
    EXPECT_LT(rel_error(entry.fn(hidden, weight, labels, reference::kIgnoreIndex), expected), 1e-6) << entry.name;
}

TEST(RoPE, TablesHaveKnownValuesAndPositionZeroIsIdentity) {
  auto [cos, sin] = reference::rope_tables(3, 4, 10000.0, 0, torch::kCPU);
  ASSERT_EQ(cos.sizes(), (std::vector<int64_t>{3, 2}));
  // angle(p, i) = p * 10000^(-2i/4): i = 0 -> p, i = 1 -> p / 100.
  EXPECT_NEAR(cos[1][0].item<double>(), std::cos(1.0), 1e-7);
  EXPECT_NEAR(sin[2][1].item<double>(), std::sin(0.02), 1e-7);
  auto x = torch::randn({2, 3, 5, 4});
  auto y = reference::apply_rope(x, cos, sin);
  EXPECT_TRUE(torch::equal(y.select(1, 0), x.select(1, 0)));
}

TEST(RoPE, RotatesConsecutivePairsAndPreservesNorms) {
  auto [cos, sin] = reference::rope_tables(2, 4, 10000.0, 0, torch::kCPU);
  auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4}).expand({1, 2, 1, 4}).contiguous();
  auto y = reference::apply_rope(x, cos, sin);
  // Position 1, pair (0,1) rotated by 1 rad; pair (2,3) by 0.01 rad.
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
  auto expected = torch::tensor({1 * c0 - 2 * s0, 1 * s0 + 2 * c0, 3 * c1 - 4 * s1, 3 * s1 + 4 * c1}, torch::kFloat32);
  EXPECT_LT(rel_error(y[0][1][0], expected), 1e-6);
  auto big = torch::randn({2, 17, 3, 8});
  auto [c, s] = reference::rope_tables(17, 8, 10000.0, 0, torch::kCPU);
  auto rotated = reference::apply_rope(big, c, s);
  auto pair_norms = [](const torch::Tensor& t) { return t.unflatten(-1, {-1, 2}).norm(2, -1); };
  EXPECT_LT(rel_error(pair_norms(rotated), pair_norms(big)), 1e-6);
}

// Every kind in the catalog (all run on the CPU: our kernels fall back to ATen there), through both entry
// points: separate q and k (fn) and the fused QKV projection's output (on_qkv), forward and backward,
// against the reference kind.
TEST(RoPE, AllKindsAgree) {
  ModelConfig c;
  c.hidden_dim = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.max_seq_len = 64;
  auto q = torch::randn({2, 9, 4, 8});
  auto k = torch::randn({2, 9, 2, 8});
  auto qkv = torch::randn({2, 9, 4 + 2 * 2, 8});
  auto dq = torch::randn({2, 9, 4, 8}), dk = torch::randn({2, 9, 2, 8});  // weights for a scalar to differentiate
  struct Result {
    torch::Tensor q, k, grad_q, grad_k, qkv_q, qkv_k, qkv_v, grad_qkv;
  };
  auto run = [&](RopeKind kind) {
    Rotary rotary(c, kind);
    Result r;
    auto q_in = q.clone().requires_grad_(true), k_in = k.clone().requires_grad_(true);
    std::tie(r.q, r.k) = rotary->forward(q_in, k_in, 3);
    ((r.q * dq).sum() + (r.k * dk).sum()).backward();
    r.grad_q = q_in.grad();
    r.grad_k = k_in.grad();
    auto qkv_in = qkv.clone().requires_grad_(true);
    const auto rotated = rotary->forward_qkv(qkv_in, 4, 2, 3);
    r.qkv_q = rotated.q;
    r.qkv_k = rotated.k;
    r.qkv_v = rotated.v;
    ((rotated.q * dq).sum() + (rotated.k * dk).sum() + rotated.v.sum()).backward();
    r.grad_qkv = qkv_in.grad();
    return r;
  };
  const auto& kinds = rope_implementations();
  ASSERT_EQ(kinds.size(), 5u) << "a new RoPE kind: check that it runs on the CPU, then update this count";
  const Result ref = run(RopeKind::kReference);
  for (const auto& impl : kinds) {
    const Result r = run(impl.kind);
    EXPECT_LT(rel_error(r.q, ref.q), 1e-6) << impl.name;
    EXPECT_LT(rel_error(r.k, ref.k), 1e-6) << impl.name;
    EXPECT_LT(rel_error(r.grad_q, ref.grad_q), 1e-6) << impl.name;
    EXPECT_LT(rel_error(r.grad_k, ref.grad_k), 1e-6) << impl.name;
    EXPECT_LT(rel_error(r.qkv_q, ref.qkv_q), 1e-6) << impl.name << " (on_qkv)";
    EXPECT_LT(rel_error(r.qkv_k, ref.qkv_k), 1e-6) << impl.name << " (on_qkv)";
    EXPECT_TRUE(torch::equal(r.qkv_v, ref.qkv_v)) << impl.name << " (on_qkv): v passes through unrotated";
    EXPECT_LT(rel_error(r.grad_qkv, ref.grad_qkv), 1e-6) << impl.name << " (on_qkv)";
  }
  // The reference's fused entry point is itself pinned to apply_rope on q's heads at positions 3..11, so the
  // on_qkv comparisons above are not only the reference agreeing with itself.
  const auto [cos, sin] = reference::rope_tables(9, 8, 10000.0, 3, torch::kCPU);
  EXPECT_LT(rel_error(ref.qkv_q, reference::apply_rope(qkv.narrow(2, 0, 4), cos, sin)), 1e-6);
  EXPECT_LT(rel_error(ref.qkv_k, reference::apply_rope(qkv.narrow(2, 4, 2), cos, sin)), 1e-6);
}

class AttentionTest : public ::testing::TestWithParam<AttentionKind> {};

TEST_P(AttentionTest, IsCausal) {
  ModelConfig c;
  c.hidden_dim = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.max_seq_len = 64;
  StageSpec spec = stages::v1_baseline();
  spec.attention = GetParam();
  torch::manual_seed(0);
  Attention attn(c, spec);
  Rotary rotary(c, RopeKind::kReference);
  auto x = torch::randn({2, 12, 32});
  auto y = attn->forward(x, rotary);
  auto x2 = x.clone();
  x2.narrow(1, 7, 5).normal_();  // change positions 7..11
  auto y2 = attn->forward(x2, rotary);
  EXPECT_TRUE(torch::allclose(y.narrow(1, 0, 7), y2.narrow(1, 0, 7), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(y.narrow(1, 7, 5), y2.narrow(1, 7, 5), 1e-3, 1e-3));
}

TEST_P(AttentionTest, GroupedQueryEqualsMultiHeadWithRepeatedKV) {
  ModelConfig gqa;
  gqa.hidden_dim = 32;
  gqa.n_heads = 4;
  gqa.n_kv_heads = 2;
  gqa.max_seq_len = 64;
  ModelConfig mha = gqa;
  mha.n_kv_heads = 4;
  StageSpec spec = stages::v1_baseline();
  spec.attention = GetParam();
  Attention a(gqa, spec), b(mha, spec);
  Rotary rotary(gqa, RopeKind::kReference);
  torch::NoGradGuard no_grad;
  b->q_proj->weight.copy_(a->q_proj->weight);
  b->o_proj->weight.copy_(a->o_proj->weight);
  // K/V head j of the GQA model serves query heads 2j and 2j+1: repeat each head's rows.
  auto repeat_heads = [](const torch::Tensor& w) { return w.view({2, 8, 32}).repeat_interleave(2, 0).reshape({32, 32}); };
  b->k_proj->weight.copy_(repeat_heads(a->k_proj->weight));
  b->v_proj->weight.copy_(repeat_heads(a->v_proj->weight));
  auto x = torch::randn({3, 10, 32});
  EXPECT_LT(rel_error(a->forward(x, rotary), b->forward(x, rotary)), 1e-5);
}

// Every kind in the catalog, kOurFlashSharedMemory included: no stage uses it, but kernel_bench does, and on
// the CPU it takes the same ATen fallback as kOurFlash (the GPU suite covers the kernels themselves).
std::vector<AttentionKind> all_attention_kinds() {
  std::vector<AttentionKind> kinds;
  for (const auto& impl : attention_implementations()) kinds.push_back(impl.kind);
  return kinds;
}

// The catalog name as a test name: letters and digits kept, everything else an underscore.
std::string attention_test_name(const ::testing::TestParamInfo<AttentionKind>& info) {
  std::string name = implementation(info.param).name;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Kinds, AttentionTest, ::testing::ValuesIn(all_attention_kinds()), attention_test_name);

TEST(Attention, FusedQkvEqualsSeparateProjections) {
  ModelConfig c;
  c.hidden_dim = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.max_seq_len = 64;
  StageSpec separate = stages::v1_baseline();
  StageSpec fused = separate;
  fused.fused_qkv = true;
  Attention a(c, separate), b(c, fused);
  torch::NoGradGuard no_grad;
  b->qkv_proj->weight.copy_(torch::cat({a->q_proj->weight, a->k_proj->weight, a->v_proj->weight}, 0));
  b->o_proj->weight.copy_(a->o_proj->weight);
  Rotary rotary(c, RopeKind::kReference);
  auto x = torch::randn({2, 5, 32});
  EXPECT_LT(rel_error(b->forward(x, rotary), a->forward(x, rotary)), 1e-6);
}

TEST(MLP, SwiGLUIsDownOfSiluGateTimesUp) {
  ModelConfig c;
  c.hidden_dim = 8;
  c.intermediate_dim = 12;
  MLP mlp(c, stages::v1_baseline());
  auto x = torch::randn({3, 8});
  auto expected = torch::matmul(torch::silu(torch::matmul(x, mlp->gate_proj->weight.t())) *
                                    torch::matmul(x, mlp->up_proj->weight.t()),
                                mlp->down_proj->weight.t());
  EXPECT_LT(rel_error(mlp->forward(x), expected), 1e-6);
}

}  // namespace
}  // namespace tt
