// CPU tests of the custom ops' autograd Functions (kernels/ops/). On CPU tensors each Function runs the
// ATen formulation of the same forward and the same analytic backward as its GPU kernels, so:
//  * fp32 forward and every gradient must match the plain reference ops (models/reference.h);
//  * a float64 central-difference check verifies each hand-written backward formula;
//  * bad inputs fail with messages that name the problem.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/ops/common.h"
#include "kernels/ops/cross_entropy.h"
#include "kernels/ops/embedding.h"
#include "kernels/ops/naive_swiglu.h"
#include "kernels/ops/rms_norm.h"
#ifdef TT_HAVE_GPU_KERNELS
#include "kernels/rms_norm.cuh"
#endif
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "models/reference.h"
#include "tests/helpers.h"
#include "tests/kernel_checks.h"

namespace {

using tt::reference::kIgnoreIndex;
using tt::testing::expect_error;

// ---- helpers ------------------------------------------------------------------------------------

using tt::testing::expect_close;
using tt::testing::shape_name;

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& inputs,
                                    const std::vector<torch::Tensor>& grad_outputs) {
  return torch::autograd::grad(outputs, inputs, grad_outputs, /*retain_graph=*/false, /*create_graph=*/false,
                               /*allow_unused=*/true);
}

// Central-difference gradient check in float64. `fn` maps the inputs to outputs; the scalar that is
// differentiated is sum_i <outputs[i], projections[i]> with fixed random projections, so every output
// element, and the backward's handling of a non-uniform incoming gradient, is exercised. Only inputs
// flagged in `differentiable` are perturbed and compared.
using OpFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

void expect_gradients_match_finite_differences(const OpFn& fn, std::vector<torch::Tensor> inputs,
                                               const std::vector<bool>& differentiable, const std::string& what) {
  constexpr double kStep = 1e-6;
  constexpr double kAtol = 1e-6;
  constexpr double kRtol = 1e-5;
  std::vector<torch::Tensor> grad_inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = inputs[i].detach().clone();
    if (differentiable[i]) grad_inputs.push_back(inputs[i].requires_grad_(true));
  }
  auto outputs = fn(inputs);
  std::vector<torch::Tensor> projections;
  for (const auto& out : outputs) projections.push_back(torch::randn_like(out));
  auto objective = [&](const std::vector<torch::Tensor>& outs) {
    auto total = torch::zeros({}, torch::kFloat64);
    for (size_t i = 0; i < outs.size(); ++i) total = total + (outs[i].to(torch::kFloat64) * projections[i]).sum();
    return total;
  };
  auto analytic = torch::autograd::grad({objective(outputs)}, grad_inputs);

  torch::NoGradGuard no_grad;
  size_t next = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!differentiable[i]) continue;
    auto flat = inputs[i].view({-1});
    auto numeric = torch::zeros_like(flat);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double original = flat[e].item<double>();
      flat[e] = original + kStep;
      const double plus = objective(fn(inputs)).item<double>();
      flat[e] = original - kStep;
      const double minus = objective(fn(inputs)).item<double>();
      flat[e] = original;
      numeric[e] = (plus - minus) / (2 * kStep);
    }
    expect_close(analytic[next++].view({-1}), numeric, kRtol, kAtol,
                 what + ": analytic vs finite-difference gradient of input " + std::to_string(i));
  }
}

auto f64() { return torch::TensorOptions().dtype(torch::kFloat64); }

// ---- RMSNorm ------------------------------------------------------------------------------------

TEST(OpsCpu, RmsNormMatchesReferenceFp32) {
  torch::manual_seed(0);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{1, 1}, {3, 7}, {2, 5, 129}}) {
    const int64_t hidden = shape.back();
    auto x = torch::randn(shape).requires_grad_(true);
    auto weight = (1 + 0.1 * torch::randn({hidden})).requires_grad_(true);
    auto x_ref = x.detach().clone().requires_grad_(true);
    auto weight_ref = weight.detach().clone().requires_grad_(true);
    auto y = tt::ops::rms_norm(x, weight, 1e-6);
    auto y_ref = tt::reference::rms_norm(x_ref, weight_ref, 1e-6);
    const std::string what = "rms_norm hidden " + std::to_string(hidden);
    EXPECT_EQ(y.scalar_type(), torch::kFloat32);
    expect_close(y, y_ref, 1e-6, 1e-7, what + " output");
    auto grad_y = torch::randn_like(y_ref);
    auto grads = grads_of({y}, {x, weight}, {grad_y});
    auto grads_ref = grads_of({y_ref}, {x_ref, weight_ref}, {grad_y});
    expect_close(grads[0], grads_ref[0], 1e-5, 1e-6, what + " grad x");
    expect_close(grads[1], grads_ref[1], 1e-5, 1e-6, what + " grad weight");
  }
}

TEST(OpsCpu, RmsNormGradientsMatchFiniteDifferences) {
  torch::manual_seed(1);
  auto fn = [](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{tt::ops::rms_norm(in[0], in[1], 1e-5)};
  };
  expect_gradients_match_finite_differences(fn, {torch::randn({2, 3, 5}, f64()), torch::randn({5}, f64())},
                                            {true, true}, "rms_norm");
}

TEST(OpsCpu, RmsNormKeepsActivationDtypeAndAcceptsNonContiguousInput) {
  torch::manual_seed(2);
  auto weight = torch::randn({6});
  auto x = torch::randn({6, 4}).t();  // [4, 6], not contiguous
  ASSERT_FALSE(x.is_contiguous());
  expect_close(tt::ops::rms_norm(x, weight, 1e-6), tt::reference::rms_norm(x, weight, 1e-6), 1e-6, 1e-7,
               "rms_norm on a transposed input");
  auto y_bf16 = tt::ops::rms_norm(x.to(torch::kBFloat16), weight, 1e-6);
  EXPECT_EQ(y_bf16.scalar_type(), torch::kBFloat16) << "output keeps the activation dtype, weight is fp32";
}

TEST(OpsCpu, RmsNormRejectsBadInputs) {
  auto x = torch::randn({2, 7});
  auto weight = torch::ones({7});
  expect_error([&] { tt::ops::rms_norm(x.to(torch::kInt32), weight, 1e-6); }, "x must be a floating-point tensor");
  expect_error([&] { tt::ops::rms_norm(x, torch::ones({6}), 1e-6); }, "weight must have shape [7]");
  expect_error([&] { tt::ops::rms_norm(x, torch::ones({7, 1}), 1e-6); }, "weight must have shape [7]");
  expect_error([&] { tt::ops::rms_norm(x, weight.to(torch::kInt64), 1e-6); }, "weight must be a floating-point");
  expect_error([&] { tt::ops::rms_norm(torch::randn({2, 0}), torch::ones({0}), 1e-6); }, "hidden > 0");
  expect_error([&] { tt::ops::rms_norm(x, weight, -1.0); }, "eps must be finite and >= 0");
}

// The backward's two paths (kernels/rms_norm.cu): the weight gradient summed in the backward's own launch up to 2,048
// rows with a 16-bit compute dtype, partial sums and a second kernel otherwise; and the launcher refusing a
// num_partials or scratch that does not match (before any GPU work, so this runs without a GPU).
TEST(OpsCpu, RmsNormBackwardPathsAndTheirContract) {
#ifndef TT_HAVE_GPU_KERNELS
  GTEST_SKIP() << "no GPU kernels in this build";
#else
  using tt::kernels::DType;
  using tt::kernels::rms_norm_backward_num_partials;
  for (const DType compute : {DType::kBFloat16, DType::kFloat16}) {
    EXPECT_EQ(rms_norm_backward_num_partials(1, compute), 0);
    EXPECT_EQ(rms_norm_backward_num_partials(1024, compute), 0);
    EXPECT_EQ(rms_norm_backward_num_partials(2048, compute), 0);
    EXPECT_GT(rms_norm_backward_num_partials(2049, compute), 0);
    EXPECT_GT(rms_norm_backward_num_partials(8192, compute), 0);
  }
  for (const int64_t rows : {1, 1024, 2048, 8192}) EXPECT_GT(rms_norm_backward_num_partials(rows, DType::kFloat32), 0);

  float scratch = 0.0f;
  tt::kernels::RmsNormBackwardParams params{};
  params.rows = 3000;
  params.hidden = 512;
  const int64_t needed = rms_norm_backward_num_partials(3000, DType::kBFloat16);
  const auto refused = [&](int64_t num_partials, float* partial) {
    params.num_partials = num_partials;
    params.weight_grad_partial = partial;
    const auto status = tt::kernels::rms_norm_backward(params, DType::kFloat32, DType::kBFloat16, nullptr);
    return !status.ok() && std::string(status.error).find("num_partials must be") != std::string::npos;
  };
  EXPECT_TRUE(refused(needed - 1, &scratch)) << "fewer partial rows than the row blocks";
  EXPECT_TRUE(refused(needed, nullptr)) << "partial sums without a scratch buffer";
  EXPECT_TRUE(refused(0, nullptr)) << "one launch where the rows call for two kernels";
  params.rows = 1000;
  EXPECT_TRUE(refused(0, &scratch)) << "a scratch buffer on the one-launch path";
  EXPECT_TRUE(refused(rms_norm_backward_num_partials(1000, DType::kFloat32), &scratch))
      << "two kernels where the rows and dtype call for one launch";
  // What the op layer passes is accepted. Only without a GPU: the launch itself then fails, with another message,
  // where on a GPU it would run on these null tensors (the GPU tests pass the rule's arguments on every backward).
  if (!torch::cuda::is_available()) {
    params.rows = 1000;
    EXPECT_FALSE(refused(0, nullptr)) << "the one-launch path's own arguments";
    params.rows = 3000;
    EXPECT_FALSE(refused(needed, &scratch)) << "the two-kernel path's own arguments";
  }
#endif
}

// ---- Residual add fused with RMSNorm -------------------------------------------------------------

// The unfused composition the fused op replaces: the add in the residual's dtype, the norm, the cast.
std::vector<torch::Tensor> add_then_norm_reference(const torch::Tensor& residual, const torch::Tensor& delta,
                                                   const torch::Tensor& weight, torch::ScalarType out_dtype) {
  auto h = delta.defined() ? residual + delta : residual;
  return {h, tt::reference::rms_norm(h, weight, 1e-6).to(out_dtype)};
}

TEST(OpsCpu, AddRmsNormMatchesAddThenNormWithEveryGradient) {
  torch::manual_seed(11);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{1, 1}, {3, 7}, {2, 5, 129}}) {
    for (const bool with_delta : {true, false}) {
      const int64_t hidden = shape.back();
      auto residual = torch::randn(shape).requires_grad_(true);
      auto delta = torch::randn(shape).requires_grad_(true);
      auto weight = (1 + 0.1 * torch::randn({hidden})).requires_grad_(true);
      auto r_ref = residual.detach().clone().requires_grad_(true);
      auto d_ref = delta.detach().clone().requires_grad_(true);
      auto w_ref = weight.detach().clone().requires_grad_(true);
      auto out = tt::ops::add_rms_norm(residual, with_delta ? delta : torch::Tensor(), weight, 1e-6, torch::kFloat32);
      auto ref = add_then_norm_reference(r_ref, with_delta ? d_ref : torch::Tensor(), w_ref, torch::kFloat32);
      const std::string what =
          "add_rms_norm " + shape_name(torch::IntArrayRef(shape)) + (with_delta ? "" : " without delta");
      expect_close(out.residual, ref[0], 0, 0, what + " residual out");
      expect_close(out.normalized, ref[1], 1e-6, 1e-7, what + " output");
      // Both outputs get a gradient: the residual's from the next block, the normalised one's from the GEMM.
      auto grad_residual = torch::randn(shape), grad_y = torch::randn(shape);
      std::vector<torch::Tensor> inputs = {residual, weight}, inputs_ref = {r_ref, w_ref};
      if (with_delta) {
        inputs.push_back(delta);
        inputs_ref.push_back(d_ref);
      }
      auto grads = grads_of({out.residual, out.normalized}, inputs, {grad_residual, grad_y});
      auto grads_ref = grads_of(ref, inputs_ref, {grad_residual, grad_y});
      expect_close(grads[0], grads_ref[0], 1e-5, 1e-6, what + " grad residual");
      expect_close(grads[1], grads_ref[1], 1e-5, 1e-6, what + " grad weight");
      if (with_delta) expect_close(grads[2], grads_ref[2], 1e-5, 1e-6, what + " grad delta");
    }
  }
}

TEST(OpsCpu, AddRmsNormMixedPrecisionWritesTheComputeDtype) {
  torch::manual_seed(12);
  auto residual = torch::randn({4, 33}).requires_grad_(true);
  auto delta = torch::randn({4, 33}).to(torch::kBFloat16).requires_grad_(true);
  auto weight = torch::randn({33}).requires_grad_(true);
  auto out = tt::ops::add_rms_norm(residual, delta, weight, 1e-6, torch::kBFloat16);
  EXPECT_EQ(out.residual.scalar_type(), torch::kFloat32) << "the residual stream keeps its dtype";
  EXPECT_EQ(out.normalized.scalar_type(), torch::kBFloat16) << "the output is in the next GEMM's dtype";
  auto ref = add_then_norm_reference(residual.detach(), delta.detach(), weight.detach(), torch::kBFloat16);
  expect_close(out.residual, ref[0], 0, 0, "mixed add_rms_norm residual out");
  // Rounded once, like autocast's cast of an fp32 output: at most one bf16 step apart from the reference's.
  expect_close(out.normalized.to(torch::kFloat32), ref[1].to(torch::kFloat32), 1.0 / 128, 1e-6,
               "mixed add_rms_norm output");
  auto grads = grads_of({out.residual, out.normalized}, {residual, delta, weight},
                        {torch::randn({4, 33}), torch::randn({4, 33}).to(torch::kBFloat16)});
  EXPECT_EQ(grads[1].scalar_type(), torch::kBFloat16) << "delta's gradient comes back in delta's dtype";
  expect_close(grads[1].to(torch::kFloat32), grads[0].to(torch::kBFloat16).to(torch::kFloat32), 0, 0,
               "delta's gradient is the residual's, rounded");
}

TEST(OpsCpu, AddRmsNormGradientsMatchFiniteDifferences) {
  torch::manual_seed(13);
  auto fn = [](const std::vector<torch::Tensor>& in) {
    auto out = tt::ops::add_rms_norm(in[0], in[1], in[2], 1e-5, torch::kFloat64);
    return std::vector<torch::Tensor>{out.residual, out.normalized};
  };
  expect_gradients_match_finite_differences(
      fn, {torch::randn({2, 3, 5}, f64()), torch::randn({2, 3, 5}, f64()), torch::randn({5}, f64())},
      {true, true, true}, "add_rms_norm");
}

// Tensors of zeros made on this thread while `fn` runs (aten::zeros and aten::zeros_like, counted by a
// RecordFunction callback): how LibTorch materialises an absent gradient for a custom function's backward.
int zero_tensors_made_during(const std::function<void()>& fn) {
  static thread_local int count = 0;
  count = 0;
  auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(
      [](const at::RecordFunction& f) -> std::unique_ptr<at::ObserverContext> {
        const std::string name = f.name();
        if (name == "aten::zeros" || name == "aten::zeros_like") ++count;
        return nullptr;
      }));
  fn();
  at::removeCallback(handle);
  return count;
}

// A custom function with LibTorch's default (absent gradients materialised as zeros) and an output nobody reads.
struct TwoOutputsMaterialised : torch::autograd::Function<TwoOutputsMaterialised> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return {x * 2, x * 3};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * 2 + grads[1] * 3};
  }
};

// The norms' functions leave an absent gradient absent (set_materialize_grads(false)): the model's final norm,
// whose residual_out nothing reads, and every plain rms_norm would otherwise get a tensor of zeros (a fill kernel
// on the GPU) before each backward. The control shows that the count sees LibTorch's default.
TEST(OpsCpu, RmsNormLeavesAnAbsentGradientAbsent) {
  torch::manual_seed(5);
  auto x = torch::randn({6, 16}, torch::requires_grad());
  auto delta = torch::randn({6, 16}, torch::requires_grad());
  auto weight = torch::randn({16}, torch::requires_grad());
  const int control = zero_tensors_made_during([&] { TwoOutputsMaterialised::apply(x)[0].sum().backward(); });
  EXPECT_GE(control, 1) << "the count must see LibTorch materialising the unread output's gradient";
  auto fused = tt::ops::add_rms_norm(x, delta, weight, 1e-6, torch::kFloat32);
  EXPECT_EQ(zero_tensors_made_during([&] { fused.normalized.sum().backward(); }), 0)
      << "add_rms_norm: residual_out's absent gradient was materialised";
  auto plain = tt::ops::rms_norm(x, weight, 1e-6);
  EXPECT_EQ(zero_tensors_made_during([&] { plain.sum().backward(); }), 0)
      << "rms_norm: the absent gradient of its second output was materialised";
}

TEST(OpsCpu, AddRmsNormRejectsBadInputs) {
  auto residual = torch::randn({2, 7});
  auto weight = torch::ones({7});
  expect_error([&] { tt::ops::add_rms_norm(residual, torch::randn({2, 6}), weight, 1e-6, torch::kFloat32); },
               "delta must have the residual's shape [2, 7], got [2, 6]");
  expect_error([&] { tt::ops::add_rms_norm(residual.to(torch::kBFloat16), torch::Tensor(), weight, 1e-6,
                                           torch::kFloat32); },
               "out_dtype must be the residual's dtype (BFloat16) or, for a Float residual, BFloat16 or Half; got Float");
}

// ---- RoPE ---------------------------------------------------------------------------------------

TEST(OpsCpu, RopeMatchesReferenceFp32) {
  torch::manual_seed(3);
  for (const auto& heads : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {4, 2}, {4, 1}}) {
    const int64_t batch = 2, seq = 5, head_dim = 8;
    auto [cos, sin] = tt::reference::rope_tables(seq, head_dim, 10000.0, 3, torch::kCPU);
    auto q = torch::randn({batch, seq, heads.first, head_dim}).requires_grad_(true);
    auto k = torch::randn({batch, seq, heads.second, head_dim}).requires_grad_(true);
    auto q_ref = q.detach().clone().requires_grad_(true);
    auto k_ref = k.detach().clone().requires_grad_(true);
    auto [q_out, k_out] = tt::ops::rope(q, k, cos, sin);
    auto q_out_ref = tt::reference::apply_rope(q_ref, cos, sin);
    auto k_out_ref = tt::reference::apply_rope(k_ref, cos, sin);
    const std::string what = "rope heads " + std::to_string(heads.first) + "/" + std::to_string(heads.second);
    expect_close(q_out, q_out_ref, 1e-6, 1e-7, what + " q");
    expect_close(k_out, k_out_ref, 1e-6, 1e-7, what + " k");
    auto grad_q = torch::randn_like(q_out_ref);
    auto grad_k = torch::randn_like(k_out_ref);
    auto grads = grads_of({q_out, k_out}, {q, k}, {grad_q, grad_k});
    auto grads_ref = grads_of({q_out_ref, k_out_ref}, {q_ref, k_ref}, {grad_q, grad_k});
    expect_close(grads[0], grads_ref[0], 1e-6, 1e-7, what + " grad q");
    expect_close(grads[1], grads_ref[1], 1e-6, 1e-7, what + " grad k");
  }
}

TEST(OpsCpu, RopeGradientsMatchFiniteDifferences) {
  torch::manual_seed(4);
  auto [cos, sin] = tt::reference::rope_tables(3, 4, 10000.0, 0, torch::kCPU);
  auto fn = [&](const std::vector<torch::Tensor>& in) {
    auto [q_out, k_out] = tt::ops::rope(in[0], in[1], cos, sin);
    return std::vector<torch::Tensor>{q_out, k_out};
  };
  expect_gradients_match_finite_differences(fn, {torch::randn({2, 3, 2, 4}, f64()), torch::randn({2, 3, 1, 4}, f64())},
                                            {true, true}, "rope");
}

TEST(OpsCpu, RopeQkvMatchesSplitThenRopeAndFiniteDifferences) {
  torch::manual_seed(6);
  const int64_t batch = 2, seq = 5, q_heads = 4, kv_heads = 2, head_dim = 8;
  auto [cos, sin] = tt::reference::rope_tables(seq, head_dim, 10000.0, 3, torch::kCPU);
  auto qkv = torch::randn({batch, seq, q_heads + 2 * kv_heads, head_dim}).requires_grad_(true);
  auto qkv_ref = qkv.detach().clone().requires_grad_(true);
  const auto out = tt::ops::rope_qkv(qkv, q_heads, kv_heads, cos, sin);
  auto parts = qkv_ref.split_with_sizes({q_heads, kv_heads, kv_heads}, 2);
  const std::vector<torch::Tensor> outputs = {out.q, out.k, out.v};
  const std::vector<torch::Tensor> outputs_ref = {tt::reference::apply_rope(parts[0], cos, sin),
                                                  tt::reference::apply_rope(parts[1], cos, sin), parts[2]};
  std::vector<torch::Tensor> grad_outputs;
  for (int i = 0; i < 3; ++i) {
    expect_close(outputs[i], outputs_ref[i], 1e-6, 1e-7, "rope_qkv output " + std::to_string(i));
    grad_outputs.push_back(torch::randn_like(outputs_ref[i]));
  }
  expect_close(grads_of(outputs, {qkv}, grad_outputs)[0], grads_of(outputs_ref, {qkv_ref}, grad_outputs)[0], 1e-6, 1e-7,
               "rope_qkv grad qkv");

  auto [cos3, sin3] = tt::reference::rope_tables(3, 4, 10000.0, 0, torch::kCPU);
  auto fn = [&](const std::vector<torch::Tensor>& in) {
    const auto r = tt::ops::rope_qkv(in[0], 2, 1, cos3, sin3);
    return std::vector<torch::Tensor>{r.q, r.k, r.v};
  };
  expect_gradients_match_finite_differences(fn, {torch::randn({2, 3, 4, 4}, f64())}, {true}, "rope_qkv");
}

TEST(OpsCpu, RopeRejectsBadInputs) {
  auto [cos, sin] = tt::reference::rope_tables(5, 8, 10000.0, 0, torch::kCPU);
  auto q = torch::randn({2, 5, 4, 8});
  auto k = torch::randn({2, 5, 2, 8});
  expect_error([&] { tt::ops::rope(q.flatten(2), k, cos, sin); }, "q must have shape [batch, seq, heads, head_dim]");
  expect_error([&] { tt::ops::rope(q, k.to(torch::kFloat64), cos, sin); }, "q and k must have the same dtype");
  expect_error(
      [&] {
        tt::ops::rope(q, torch::randn({2, 4, 2, 8}), cos, sin);
      },
      "must agree in batch, seq and head_dim");
  expect_error(
      [&] {
        tt::ops::rope(torch::randn({2, 5, 4, 7}), torch::randn({2, 5, 2, 7}), cos, sin);
      },
      "head_dim must be even");
  expect_error([&] { tt::ops::rope(q, k, cos.narrow(0, 0, 4), sin); },
               "cos must have shape [seq, head_dim / 2] = [5, 4]");
  expect_error([&] { tt::ops::rope(q, k, cos, sin.to(torch::kFloat64)); }, "sin must be Float (fp32)");
  expect_error([&] { tt::ops::rope(q.to(torch::kInt64), k.to(torch::kInt64), cos, sin); },
               "q must be a floating-point");
}

// ---- Embedding ----------------------------------------------------------------------------------

// On CPU tensors the op is ATen's lookup and ATen's backward: what the GPU tests compare our kernel with.
TEST(OpsCpu, EmbeddingIsAtensOwnOnTheCpu) {
  torch::manual_seed(30);
  auto ids = torch::randint(10, {3, 7}, torch::kInt64);
  auto weight = torch::randn({12, 5}).requires_grad_(true);
  auto weight_ref = weight.detach().clone().requires_grad_(true);
  auto out = tt::ops::embedding(weight, ids);
  auto out_ref = torch::embedding(weight_ref, ids);
  EXPECT_TRUE(torch::equal(out, out_ref));
  auto grad_out = torch::randn_like(out_ref);
  auto grad = grads_of({out}, {weight}, {grad_out})[0];
  EXPECT_TRUE(torch::equal(grad, grads_of({out_ref}, {weight_ref}, {grad_out})[0]));
  EXPECT_EQ(grad.narrow(0, 10, 2).abs().max().item<float>(), 0.0f) << "rows no id looks up";
}

TEST(OpsCpu, EmbeddingRejectsBadInputs) {
  auto ids = torch::zeros({3}, torch::kInt64);
  expect_error([&] { tt::ops::embedding(torch::randn({4, 8, 2}), ids); }, "weight must have shape [vocab, dim]");
  expect_error([&] { tt::ops::embedding(torch::randn({4, 8}), ids.to(torch::kInt32)); }, "ids must be Long, got Int");
}

// ---- SwiGLU -------------------------------------------------------------------------------------

TEST(OpsCpu, SwigluMatchesReferenceFp32) {
  torch::manual_seed(5);
  for (const auto& shape : std::vector<std::vector<int64_t>>{{1, 2}, {3, 14}, {2, 4, 258}}) {
    const int64_t ffn = shape.back() / 2;
    auto gate_up = (2 * torch::randn(shape)).requires_grad_(true);
    auto gate_up_ref = gate_up.detach().clone().requires_grad_(true);
    auto out = tt::ops::swiglu(gate_up);
    auto halves = gate_up_ref.chunk(2, -1);
    auto out_ref = tt::reference::swiglu(halves[0], halves[1]);
    const std::string what = "swiglu ffn " + std::to_string(ffn);
    expect_close(out, out_ref, 1e-6, 1e-7, what + " output");
    auto grad_out = torch::randn_like(out_ref);
    expect_close(grads_of({out}, {gate_up}, {grad_out})[0], grads_of({out_ref}, {gate_up_ref}, {grad_out})[0], 1e-6,
                 1e-7, what + " grad gate_up");
  }
}

TEST(OpsCpu, SwigluGradientsMatchFiniteDifferences) {
  torch::manual_seed(6);
  auto fn = [](const std::vector<torch::Tensor>& in) { return std::vector<torch::Tensor>{tt::ops::swiglu(in[0])}; };
  expect_gradients_match_finite_differences(fn, {2 * torch::randn({2, 3, 8}, f64())}, {true}, "swiglu");
}

TEST(OpsCpu, SwigluRejectsBadInputs) {
  expect_error([] { tt::ops::swiglu(torch::randn({3, 7})); }, "gate_up must have shape [..., 2 * ffn]");
  expect_error([] { tt::ops::swiglu(torch::randn({3, 0})); }, "gate_up must have shape [..., 2 * ffn]");
  expect_error([] { tt::ops::swiglu(torch::ones({3, 8}, torch::kInt32)); }, "gate_up must be a floating-point");
}

// The strided path's CPU formulation is swiglu's; what it adds is taking any layout without a copy.
TEST(OpsCpu, SwigluStridedMatchesSwigluOnTransposedInputAndPassesGradientCheck) {
  torch::manual_seed(7);
  auto gate_up = (2 * torch::randn({258, 3})).t().requires_grad_(false);  // [3, 258], column stride 3
  auto a = gate_up.clone().requires_grad_(true);
  auto b = gate_up.contiguous().requires_grad_(true);
  auto out = tt::ops::swiglu_strided(a);
  auto out_ref = tt::ops::swiglu(b);
  expect_close(out, out_ref, 0, 0, "swiglu_strided output");
  auto grad_out = torch::randn_like(out);
  expect_close(grads_of({out}, {a}, {grad_out})[0], grads_of({out_ref}, {b}, {grad_out})[0], 0, 0,
               "swiglu_strided grad gate_up");
  // The finite-difference helper flattens inputs and gradients with view(), so it takes a contiguous input.
  auto fn = [](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{tt::ops::swiglu_strided(in[0])};
  };
  expect_gradients_match_finite_differences(fn, {2 * torch::randn({3, 8}, f64())}, {true}, "swiglu_strided");
  expect_error([] { tt::ops::swiglu_strided(torch::randn({3, 7})); },
               "tt::ops::swiglu_strided: gate_up must have shape [..., 2 * ffn]");
}

// On the CPU naive_swiglu is the formulation its kernel replaces: GEMM, then swiglu.
TEST(OpsCpu, NaiveSwigluMatchesReferenceAndPassesGradientCheck) {
  torch::manual_seed(8);
  auto x = torch::randn({2, 3, 5}).requires_grad_(true);
  auto w = torch::randn({2 * 7, 5}).requires_grad_(true);
  auto x_ref = x.detach().clone().requires_grad_(true);
  auto w_ref = w.detach().clone().requires_grad_(true);
  auto out = tt::ops::naive_swiglu(x, w);
  auto gate_up = torch::matmul(x_ref, w_ref.t());
  auto out_ref = tt::reference::swiglu(gate_up.narrow(-1, 0, 7), gate_up.narrow(-1, 7, 7));
  expect_close(out, out_ref, 1e-6, 1e-6, "naive_swiglu output");
  auto grad_out = torch::randn_like(out);
  auto grads = grads_of({out}, {x, w}, {grad_out});
  auto grads_ref = grads_of({out_ref}, {x_ref, w_ref}, {grad_out});
  expect_close(grads[0], grads_ref[0], 1e-6, 1e-6, "naive_swiglu grad x");
  expect_close(grads[1], grads_ref[1], 1e-6, 1e-6, "naive_swiglu grad weight");
  auto fn = [](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{tt::ops::naive_swiglu(in[0], in[1])};
  };
  expect_gradients_match_finite_differences(fn, {torch::randn({3, 4}, f64()), torch::randn({6, 4}, f64())},
                                            {true, true}, "naive_swiglu");
}

TEST(OpsCpu, NaiveSwigluRejectsBadInputs) {
  expect_error([] { tt::ops::naive_swiglu(torch::randn({3, 5}), torch::randn({7, 5})); },
               "gate_up_weight must have shape [2 * ffn, hidden] with ffn > 0, got [7, 5]");
  expect_error([] { tt::ops::naive_swiglu(torch::randn({3, 5}), torch::randn({8, 4})); },
               "gate_up_weight has 4 columns but x has hidden size 5");
  expect_error([] { tt::ops::naive_swiglu(torch::ones({3, 5}, torch::kInt32), torch::randn({8, 5})); },
               "x must be a floating-point tensor");
}

// ---- Cross-entropy --------------------------------------------------------------------------------

TEST(OpsCpu, CrossEntropyMatchesReferenceFp32) {
  torch::manual_seed(7);
  for (const int64_t vocab : {1, 17, 1000}) {
    const int64_t rows = 9;
    auto logits = (3 * torch::randn({rows, vocab})).requires_grad_(true);
    auto logits_ref = logits.detach().clone().requires_grad_(true);
    auto labels = torch::randint(vocab, {rows}, torch::kInt64);
    labels.index_put_({torch::indexing::Slice(0, torch::indexing::None, 3)}, kIgnoreIndex);  // rows 0, 3, 6
    auto loss = tt::ops::cross_entropy(logits, labels, kIgnoreIndex);
    auto loss_ref = tt::reference::cross_entropy(logits_ref, labels, kIgnoreIndex);
    const std::string what = "cross_entropy vocab " + std::to_string(vocab);
    EXPECT_EQ(loss.dim(), 0);
    EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    expect_close(loss, loss_ref, 1e-6, 1e-7, what + " loss");
    auto grad_loss = torch::full({}, 1.7);
    auto grad = grads_of({loss}, {logits}, {grad_loss})[0];
    expect_close(grad, grads_of({loss_ref}, {logits_ref}, {grad_loss})[0], 1e-6, 1e-7, what + " grad logits");
    EXPECT_TRUE(grad.index({torch::indexing::Slice(0, torch::indexing::None, 3)}).eq(0).all().item<bool>())
        << what << ": ignored rows must get a zero gradient";
  }
}

TEST(OpsCpu, CrossEntropyHonoursCustomIgnoreIndex) {
  torch::manual_seed(8);
  auto logits = torch::randn({6, 5});
  auto labels = torch::tensor({0, 1, 2, 0, 4, 3}, torch::kInt64);
  expect_close(tt::ops::cross_entropy(logits, labels, 0), tt::reference::cross_entropy(logits, labels, 0), 1e-6, 1e-7,
               "cross_entropy with ignore_index 0");
}

// LibTorch's behaviour, which we match: the mean over zero rows is NaN and the gradient is zero.
TEST(OpsCpu, CrossEntropyAllRowsIgnoredGivesNanLossAndZeroGradient) {
  auto logits = torch::randn({4, 5}).requires_grad_(true);
  auto labels = torch::full({4}, kIgnoreIndex, torch::kInt64);
  auto loss = tt::ops::cross_entropy(logits, labels, kIgnoreIndex);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  EXPECT_TRUE(std::isnan(tt::reference::cross_entropy(logits, labels, kIgnoreIndex).item<double>()))
      << "LibTorch itself no longer returns NaN here; revisit the documented behaviour";
  loss.backward();
  EXPECT_TRUE(logits.grad().eq(0).all().item<bool>()) << "all-ignored batch must give a zero gradient";
}

TEST(OpsCpu, CrossEntropyGradientsMatchFiniteDifferences) {
  torch::manual_seed(9);
  auto labels = torch::tensor(std::vector<int64_t>{2, kIgnoreIndex, 0, 4});
  auto fn = [&](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{tt::ops::cross_entropy(in[0], labels, kIgnoreIndex)};
  };
  expect_gradients_match_finite_differences(fn, {2 * torch::randn({4, 5}, f64())}, {true}, "cross_entropy");
}

TEST(OpsCpu, CrossEntropyRejectsBadInputs) {
  auto logits = torch::randn({4, 5});
  auto labels = torch::tensor({0, 1, 2, 3}, torch::kInt64);
  expect_error([&] { tt::ops::cross_entropy(logits, labels.to(torch::kInt32), kIgnoreIndex); },
               "labels must be Long (int64), got Int");
  expect_error([&] { tt::ops::cross_entropy(logits, labels.narrow(0, 0, 3), kIgnoreIndex); },
               "labels must have shape [4]");
  expect_error([&] { tt::ops::cross_entropy(logits.unsqueeze(0), labels, kIgnoreIndex); },
               "logits must have shape [rows, vocab]");
  expect_error([&] { tt::ops::cross_entropy(logits.to(torch::kInt64), labels, kIgnoreIndex); },
               "logits must be a floating-point tensor");
  expect_error(
      [&] {
        tt::ops::cross_entropy(logits, torch::tensor({0, 1, 5, 3}, torch::kInt64), kIgnoreIndex);
      },
      "labels must be in [0, 5)");
  expect_error(
      [&] {
        tt::ops::cross_entropy(logits, torch::tensor({0, -1, 2, 3}, torch::kInt64), kIgnoreIndex);
      },
      "labels must be in [0, 5)");
}

// ---- Output head and loss in chunks ---------------------------------------------------------------

TEST(OpsCpu, LinearCrossEntropyMatchesHeadThenLossForAnyChunking) {
  torch::manual_seed(31);
  auto hidden = torch::randn({10, 6}).requires_grad_(true);
  auto weight = torch::randn({9, 6}).requires_grad_(true);
  auto labels = torch::tensor({0, 8, -100, 3, 3, 1, -100, 7, 2, 5}, torch::kInt64);
  auto h_ref = hidden.detach().clone().requires_grad_(true);
  auto w_ref = weight.detach().clone().requires_grad_(true);
  auto loss_ref = tt::reference::cross_entropy(torch::mm(h_ref, w_ref.t()), labels, -100);
  auto grads_ref = grads_of({loss_ref}, {h_ref, w_ref}, {torch::full({}, 1.7)});
  for (const int64_t chunk : {1, 3, 10, 64}) {
    const std::string what = "linear_cross_entropy chunk " + std::to_string(chunk);
    auto loss = tt::ops::linear_cross_entropy(hidden, weight, labels, -100, chunk);
    expect_close(loss, loss_ref, 1e-6, 1e-7, what + " loss");
    auto grads = grads_of({loss}, {hidden, weight}, {torch::full({}, 1.7)});
    expect_close(grads[0], grads_ref[0], 1e-5, 1e-7, what + " grad hidden");
    expect_close(grads[1], grads_ref[1], 1e-5, 1e-7, what + " grad weight");
  }
}

TEST(OpsCpu, LinearCrossEntropyGradientsMatchFiniteDifferences) {
  torch::manual_seed(32);
  auto labels = torch::tensor({0, 4, -100, 2, 1}, torch::kInt64);
  auto fn = [&](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{tt::ops::linear_cross_entropy(in[0], in[1], labels, -100, 2)};
  };
  expect_gradients_match_finite_differences(fn, {torch::randn({5, 3}, f64()), torch::randn({6, 3}, f64())},
                                            {true, true}, "linear_cross_entropy");
}

TEST(OpsCpu, LinearCrossEntropyRejectsBadInputs) {
  auto hidden = torch::randn({4, 6});
  auto labels = torch::zeros({4}, torch::kInt64);
  expect_error([&] { tt::ops::linear_cross_entropy(hidden, torch::randn({9, 5}), labels, -100, 2); },
               "hidden must be [rows, H] and weight [vocab, H] with the same H, got [4, 6] and [9, 5]");
  expect_error([&] { tt::ops::linear_cross_entropy(hidden, torch::randn({9, 6}).to(torch::kBFloat16), labels, -100, 2); },
               "hidden and weight must have one dtype, got Float and BFloat16");
  expect_error([&] { tt::ops::linear_cross_entropy(hidden, torch::randn({9, 6}), labels, -100, 0); },
               "chunk_rows must be > 0, got 0");
  expect_error([&] { tt::ops::linear_cross_entropy(hidden, torch::randn({9, 6}), labels.narrow(0, 0, 3), -100, 2); },
               "labels must have shape [4]");
}

// The environment's switch of programmatic launch (kernels/vendor.cuh; the apps ask before any GPU work): unset or
// empty is on, 0 and 1 are read, anything else is refused naming the variable, the value and what is allowed.
TEST(OpsCpu, ProgrammaticLaunchSettingAcceptsOnlyZeroOrOne) {
#ifndef TT_HAVE_GPU_KERNELS
  GTEST_SKIP() << "no GPU kernels in this build: nothing to switch";
#else
  EXPECT_TRUE(tt::kernels::programmatic_launch_setting_from(nullptr));
  EXPECT_TRUE(tt::kernels::programmatic_launch_setting_from(""));
  EXPECT_TRUE(tt::kernels::programmatic_launch_setting_from("1"));
  EXPECT_FALSE(tt::kernels::programmatic_launch_setting_from("0"));
  for (const char* bad : {"2", "on", "00", " 1"}) {
    try {
      tt::kernels::programmatic_launch_setting_from(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()),
                "TT_PROGRAMMATIC_LAUNCH='" + std::string(bad) + "' is not allowed: 0 (off) or 1 (on, the default)");
    }
  }
#endif
}

}  // namespace
