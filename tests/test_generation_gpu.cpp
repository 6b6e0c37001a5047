// Evaluation and KV-cache decoding on the GPU: the SDPA explicit-mask path with a cache offset, the custom
// kernels at positions > 0, bf16 caches under autocast. Every test skips without a GPU.
#include <gtest/gtest.h>

#include "apps/train/device.h"
#include "apps/train/evaluate.h"
#include "apps/train/generation.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::rel_error;
using testing::smoke_config;

Transformer spread_out_model(const StageSpec& spec, const torch::Device& device) {
  ModelConfig m = smoke_config().model;
  m.init_std = 0.3;  // logits well apart: greedy choices do not hinge on rounding
  Transformer model(m, spec);
  model->init_weights(5);
  model->to(device);
  return model;
}

TEST(GenerationGpu, KvCacheEqualsFullRecomputationInEveryStage) {
  TT_REQUIRE_GPU();
  const torch::Device cuda(torch::kCUDA, 0);
  for (const auto& spec : stages::all()) {
    Transformer model = spread_out_model(spec, cuda);
    for (const std::string& text : {std::string("a"), std::string("the quick brown ")}) {
      GenerationOptions o;
      o.max_new_tokens = 16;
      o.keep_logits = true;
      const auto cached = generate(model, byte_tokens(text), o, cuda);
      o.use_cache = false;
      const auto full = generate(model, byte_tokens(text), o, cuda);
      EXPECT_EQ(cached.tokens, full.tokens) << spec.name << ", prompt '" << text << "'";
      EXPECT_LT(rel_error(cached.logits, full.logits), 1e-4) << spec.name << ", prompt '" << text << "'";
    }
  }
}

TEST(GenerationGpu, ChunkedForwardEqualsOneForwardInFp32AndBf16) {
  TT_REQUIRE_GPU();
  const torch::Device cuda(torch::kCUDA, 0);
  auto tokens = testing::random_tokens(2, 40, 256, 4).to(cuda);
  auto run = [&](Transformer& model, bool bf16, bool chunked) {
    torch::NoGradGuard no_grad;
    model->set_precision(bf16 ? Precision::kBf16 : Precision::kFp32);
    if (!chunked) return model->forward(tokens).to(torch::kFloat32);
    auto caches = model->make_caches(2, 40, compute_dtype(model->precision()), cuda);
    std::vector<torch::Tensor> parts;
    for (auto [start, length] : {std::pair<int64_t, int64_t>{0, 9}, {9, 1}, {10, 17}, {27, 13}})
      parts.push_back(model->forward(tokens.narrow(1, start, length), &caches));
    return torch::cat(parts, 1).to(torch::kFloat32);
  };
  for (const auto& spec : stages::all()) {
    Transformer model = spread_out_model(spec, cuda);
    const auto reference = run(model, false, false);
    EXPECT_LT(rel_error(run(model, false, true), reference), 1e-4) << spec.name;
    // bf16: the cached path may differ from one bf16 pass by rounding, but not by more than that pass's own
    // error against fp32 (twice it, as the stage equivalence tests allow).
    const double own_error = rel_error(run(model, true, false), reference);
    EXPECT_LT(rel_error(run(model, true, true), reference), 2 * own_error) << spec.name << " bf16";
  }
}

TEST(GenerationGpu, EvaluationMatchesTheCpu) {
  TT_REQUIRE_GPU();
  const torch::Device cuda(torch::kCUDA, 0);
  auto gen = at::detail::createCPUGenerator(11);
  auto tokens = torch::randint(0, 256, {7 * 33 + 5}, gen, torch::kLong);
  for (const auto& spec : stages::all()) {
    Transformer cpu_model = spread_out_model(spec, torch::kCPU);
    Transformer gpu_model = spread_out_model(spec, cuda);
    const double cpu = evaluate(cpu_model, tokens, 32, 3, torch::kCPU).loss;
    EXPECT_NEAR(evaluate(gpu_model, tokens, 32, 3, cuda).loss, cpu, 1e-4 * cpu) << spec.name;
    gpu_model->set_precision(Precision::kBf16);
    EXPECT_NEAR(evaluate(gpu_model, tokens, 32, 3, cuda).loss, cpu, 2e-2 * cpu) << spec.name << " bf16";
  }
}

}  // namespace
}  // namespace tt
