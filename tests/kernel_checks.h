// What the kernel tests share (tests/test_ops_{cpu,gpu}.cpp, tests/test_flash_attention_{cpu,gpu}.cpp): tensor
// helpers and the comparisons with the references. Their GPU guard is TT_REQUIRE_GPU (tests/helpers.h).
//
// Tolerances. Every comparison is made against the reference evaluated in float64 on the same (already
// rounded) inputs.
//  * fp32: max |ours - ref64| <= rtol * scale.
//  * bf16/fp16: our error may be at most twice the reference implementation's own error at that precision
//    (the reference run on the same bf16/fp16 inputs, against the same fp64 result), plus half an ulp of
//    the scale: the flash-attention test convention.
// `scale` is max |ref64|, or the size of the terms a result is the difference of where the caller passes it
// (a result that cancels to almost nothing: an RMSNorm input gradient, p - 1 in cross-entropy, dQ at one
// position), whichever is larger. Failures print the error, the allowance and the worst element, so the log
// alone tells how far off it is.
#pragma once

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace tt::testing {

inline const std::vector<torch::ScalarType> kKernelDtypes = {torch::kFloat32, torch::kBFloat16, torch::kFloat16};

inline torch::TensorOptions gpu(torch::ScalarType dtype = torch::kFloat32) {
  return torch::TensorOptions().device(torch::kCUDA).dtype(dtype);
}

inline std::string dtype_name(torch::ScalarType dtype) { return c10::toString(dtype); }

inline std::string shape_name(torch::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

inline double unit_roundoff(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16: return std::ldexp(1.0, -8);
    case torch::kFloat16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -24);
  }
}

// CPU tests: max |actual - expected| <= atol + rtol * max |expected|, reported with both magnitudes.
inline void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol, double atol,
                         const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": no result (undefined tensor)";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what << ": shapes differ";
  auto a = actual.detach().to(torch::kFloat64);
  auto e = expected.detach().to(torch::kFloat64);
  const double error = a.numel() == 0 ? 0.0 : (a - e).abs().max().item<double>();
  const double scale = e.numel() == 0 ? 0.0 : e.abs().max().item<double>();
  const double allowed = atol + rtol * scale;
  EXPECT_LE(error, allowed) << what << ": max |actual - expected| = " << error << ", allowed " << allowed << " (rtol "
                            << rtol << " x max |expected| " << scale << " + atol " << atol << ")";
}

// `ours`, `ref_same` (the reference at the test's precision; unused for fp32) and `ref64` are compared in
// fp64. NaNs must appear in the same places as the reference's (an all-ignored cross-entropy batch) and are
// otherwise skipped. `extra_roundings`: how many more times than the reference ours rounds a running sum to
// `dtype` (an accumulation over chunks); each adds half an ulp of the scale to the allowance.
inline void expect_matches_reference(const torch::Tensor& ours, const torch::Tensor& ref_same,
                                     const torch::Tensor& ref64, torch::ScalarType dtype, double fp32_rtol,
                                     const std::string& what, double term_scale = -1.0,
                                     int64_t extra_roundings = 0) {
  ASSERT_TRUE(ours.defined()) << what << ": no result (undefined tensor)";
  ASSERT_EQ(ours.sizes(), ref64.sizes()) << what << ": shape differs from the reference's";
  auto o = ours.detach().to(torch::kFloat64);
  auto r64 = ref64.detach().to(torch::kFloat64);
  if (o.numel() == 0) return;
  EXPECT_TRUE(torch::equal(o.isnan(), r64.isnan()))
      << what << " [" << dtype_name(dtype) << "]: NaNs differ from the fp64 reference's: ours has "
      << o.isnan().sum().item<int64_t>() << ", the reference " << r64.isnan().sum().item<int64_t>();
  auto abs_diff = [&](const torch::Tensor& a) {
    auto diff = (a - r64).abs();
    return torch::where(diff.isnan(), torch::zeros_like(diff), diff);
  };
  const auto diff = abs_diff(o);
  const double error = diff.max().item<double>();
  const int64_t worst = diff.flatten().argmax().item<int64_t>();
  const double scale = std::max(term_scale, torch::nan_to_num(r64.abs(), 0.0).max().item<double>());
  double allowed = 0.0;
  std::ostringstream rule;
  if (dtype == torch::kFloat32) {
    allowed = fp32_rtol * scale;
    rule << "rtol " << fp32_rtol << " x scale " << scale;
  } else {
    const double ref_error = abs_diff(ref_same.detach().to(torch::kFloat64)).max().item<double>();
    const double floor = unit_roundoff(dtype) * scale;
    allowed = 2 * ref_error + (1 + extra_roundings) * floor;
    rule << "2 x reference's own " << dtype_name(dtype) << " error " << ref_error << " + " << (1 + extra_roundings)
         << " x floor " << floor << " (half an ulp of scale " << scale << ")";
  }
  EXPECT_LE(error, allowed) << what << " [" << dtype_name(dtype) << "]: max |ours - fp64 reference| = " << error
                            << " exceeds " << allowed << " = " << rule.str() << "; worst at flat index " << worst
                            << " of " << shape_name(o.sizes()) << ": ours " << o.flatten()[worst].item<double>()
                            << ", reference " << r64.flatten()[worst].item<double>();
}

inline std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& outputs,
                                           const std::vector<torch::Tensor>& inputs,
                                           const std::vector<torch::Tensor>& grad_outputs) {
  return torch::autograd::grad(outputs, inputs, grad_outputs);
}

inline torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }
// A leaf that keeps t's strides (a view of the same storage), so the op sees the layout under test.
inline torch::Tensor leaf_view(const torch::Tensor& t) { return t.detach().requires_grad_(true); }

// A contiguous tensor whose data starts one element past an aligned address: the kernels (or the op layer)
// must notice and fall back from 16-byte accesses.
inline torch::Tensor misaligned_copy(const torch::Tensor& t) {
  auto storage = torch::empty({t.numel() + 1}, t.options());
  auto view = storage.narrow(0, 1, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

}  // namespace tt::testing
