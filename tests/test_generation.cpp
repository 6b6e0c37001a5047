#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "apps/cli/generate_cli.h"
#include "apps/train/generation.h"
#include "apps/train/training_run.h"
#include "apps/train/trainer.h"
#include "models/checkpoint.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::rel_error;
using testing::smoke_config;

// Chunks after the first attend with q_offset > 0 and several queries: the explicit bottom-right causal
// mask of the SDPA path and the offset mask of the matmul path, which one-token decoding alone never checks.
TEST(KVCache, ChunkedForwardEqualsOneForwardInEveryStage) {
  auto tokens = testing::random_tokens(2, 20, 256, 4);
  for (const auto& spec : stages::all()) {
    Transformer model = testing::spread_out_model(spec, 5);
    torch::NoGradGuard no_grad;
    const auto full = model->forward(tokens);
    auto caches = model->make_caches(2, 20, torch::kFloat32, torch::kCPU);
    std::vector<torch::Tensor> parts;
    for (auto [start, length] : {std::pair<int64_t, int64_t>{0, 1}, {1, 7}, {8, 1}, {9, 11}})
      parts.push_back(model->forward(tokens.narrow(1, start, length), &caches));
    EXPECT_LT(rel_error(torch::cat(parts, 1), full), 1e-5) << spec.name;
    try {
      model->forward(tokens.narrow(1, 0, 1), &caches);
      FAIL() << "expected an error for a full cache";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("KVCache holds 20 positions; 20 are filled and 1 more do not fit"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Generation, KvCacheEqualsFullRecomputationInEveryStage) {
  std::string long_prompt;
  for (int i = 0; i < 37; ++i) long_prompt.push_back(static_cast<char>('a' + (i * 7) % 26));
  for (const auto& spec : stages::all()) {
    Transformer model = testing::spread_out_model(spec, 5);
    for (const std::string& text : {std::string("a"), std::string("the quick "), long_prompt}) {
      GenerationOptions o;
      o.max_new_tokens = 12;
      o.keep_logits = true;
      const auto cached = generate(model, byte_tokens(text), o, torch::kCPU);
      o.use_cache = false;
      const auto full = generate(model, byte_tokens(text), o, torch::kCPU);
      EXPECT_EQ(cached.tokens, full.tokens) << spec.name << ", prompt '" << text << "'";
      ASSERT_EQ(cached.logits.size(0), 12);
      EXPECT_LT(rel_error(cached.logits, full.logits), 1e-5) << spec.name << ", prompt '" << text << "'";
      EXPECT_FALSE(cached.reached_max_seq_len);

      // Sampling from nearly equal logits with the same seed draws the same tokens.
      o.temperature = 0.8;
      o.top_k = 20;
      o.seed = 3;
      const auto sampled_full = generate(model, byte_tokens(text), o, torch::kCPU);
      o.use_cache = true;
      EXPECT_EQ(generate(model, byte_tokens(text), o, torch::kCPU).tokens, sampled_full.tokens) << spec.name;
    }
  }
}

TEST(Generation, StopsAtMaxSeqLen) {
  Transformer model = testing::spread_out_model(stages::v2_fused(), 5);
  const int64_t max_len = model->config().max_seq_len;
  const std::vector<int64_t> prompt(static_cast<size_t>(max_len - 3), 'x');
  GenerationOptions o;
  o.max_new_tokens = 10;
  const auto cached = generate(model, prompt, o, torch::kCPU);
  EXPECT_EQ(cached.tokens.size(), 3u);
  EXPECT_TRUE(cached.reached_max_seq_len);
  o.use_cache = false;
  EXPECT_EQ(generate(model, prompt, o, torch::kCPU).tokens, cached.tokens);
}

TEST(Generation, SamplingIsSeededAndTokenLimitHolds) {
  ModelConfig m = smoke_config().model;
  m.vocab_size = 300;  // larger than the byte range: tokens >= 256 must never come out
  Transformer model(m, stages::v1_baseline());
  model->init_weights(1);
  GenerationOptions o;
  o.max_new_tokens = 64;
  o.temperature = 5.0;  // nearly uniform, so tokens >= 256 would show up without the limit
  o.token_limit = 256;
  const auto a = generate(model, byte_tokens("seed"), o, torch::kCPU);
  EXPECT_EQ(generate(model, byte_tokens("seed"), o, torch::kCPU).tokens, a.tokens);
  for (int64_t t : a.tokens) EXPECT_LT(t, 256);
  o.seed = 43;
  EXPECT_NE(generate(model, byte_tokens("seed"), o, torch::kCPU).tokens, a.tokens);
}

TEST(Generation, RejectsBadPromptsAndOptions) {
  Transformer model = testing::spread_out_model(stages::v1_baseline(), 5);
  GenerationOptions o;
  EXPECT_THROW(generate(model, {}, o, torch::kCPU), std::invalid_argument);
  EXPECT_THROW(generate(model, std::vector<int64_t>(256, 'a'), o, torch::kCPU), std::invalid_argument);
  EXPECT_THROW(generate(model, {256}, o, torch::kCPU), std::invalid_argument);
  o.temperature = -1;
  EXPECT_THROW(generate(model, {1}, o, torch::kCPU), std::invalid_argument);
}

std::string write_repetitive_text() {
  const std::string path = ::testing::TempDir() + "/generation_repetitive.txt";
  std::ofstream out(path);
  for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  return path;
}

struct CliRun {
  int code;
  std::string out, err;
};

CliRun run_generate(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = generate_main(args, out, err);
  return {code, out.str(), err.str()};
}

// One briefly trained checkpoint shared by the tests below (training is the slow part).
const std::string& trained_checkpoint() {
  static const std::string path = [] {
    RunConfig c = smoke_config();
    c.training.data = write_repetitive_text();
    c.training.num_steps = 80;  // 60 already continue the pattern with several seeds
    c.training.warmup_steps = 0;
    Trainer trainer(stages::v2_fused(), c, torch::kCPU);
    std::ostringstream log;
    run_training(trainer, {}, log);
    const std::string p = ::testing::TempDir() + "/generation_trained.pt";
    trainer.save_checkpoint(p, /*overwrite=*/true);
    return p;
  }();
  return path;
}

TEST(Generation, TrainedModelContinuesThePattern) {
  const Checkpoint ck = read_checkpoint(trained_checkpoint());
  Transformer model(ck.config.model, stages::v2_fused());
  restore_weights(ck, model);
  GenerationOptions o;
  o.max_new_tokens = 20;
  const std::string text = bytes_to_text(generate(model, byte_tokens("the quick brown "), o, torch::kCPU).tokens);
  EXPECT_EQ(text.rfind("fox jumps over the", 0), 0u) << "continuation: '" << text << "'";

  // The app: greedy output is the same text, on every run and from every stage's model.
  const auto a = run_generate({"--checkpoint", trained_checkpoint(), "--prompt", "the quick brown ", "--max-new-tokens",
                               "20", "--device", "cpu"});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, text + "\n");
  for (const auto& spec : stages::all()) {
    const auto b = run_generate({"--checkpoint", trained_checkpoint(), "--prompt", "the quick brown ",
                                 "--max-new-tokens", "20", "--device", "cpu", "--stage", spec.name});
    EXPECT_EQ(b.out, a.out) << spec.name << ": " << b.err;
  }
  const auto recomputed = run_generate({"--checkpoint", trained_checkpoint(), "--prompt", "the quick brown ",
                                        "--max-new-tokens", "20", "--device", "cpu", "--no-kv-cache"});
  EXPECT_EQ(recomputed.out, a.out) << recomputed.err;
}

TEST(GenerateCli, HelpDocumentsEveryFlagWithItsDefault) {
  const auto r = run_generate({"--help"});
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--checkpoint", "--prompt", "--max-new-tokens", "--temperature", "--top-k", "--seed",
                           "--device", "--dtype", "--stage", "--no-kv-cache"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
  for (const char* value : {"(default: 200)", "(default: 0)", "(default: 42)", "(default: auto)", "(default: fp32)"})
    EXPECT_NE(r.out.find(value), std::string::npos) << value;
}

TEST(GenerateCli, ErrorsNameTheValueAndWhatIsAllowed) {
  RunConfig c = smoke_config();
  const std::string checkpoint = ::testing::TempDir() + "/generate_untrained.pt";
  Trainer(stages::v1_baseline(), c, torch::kCPU).save_checkpoint(checkpoint, /*overwrite=*/true);

  auto expect_error = [](const std::vector<std::string>& args, int code, const std::string& text) {
    const auto r = run_generate(args);
    EXPECT_EQ(r.code, code) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  };
  expect_error({"--prompt", "hi"}, 2, "--checkpoint FILE is required");
  expect_error({"--checkpoint", "/nonexistent/model.pt", "--prompt", "hi"}, 2,
               "--checkpoint: file '/nonexistent/model.pt' does not exist");
  expect_error({"--checkpoint", checkpoint}, 2, "--prompt TEXT is required");
  expect_error({"--checkpoint", checkpoint, "--prompt", ""}, 2, "--prompt was given an empty value");
  expect_error(
      {"--checkpoint", checkpoint, "--prompt", std::string(300, 'a')}, 2,
      "--prompt has 300 bytes; this checkpoint's model.max_seq_len is 256, so the prompt may have at most 255 bytes");
  expect_error({"--checkpoint", checkpoint, "--prompt", "hi", "--stage", "v9"}, 2,
               "--stage \"v9\" is not allowed: must be one of v1_baseline, v2_fused, v3_custom");
  expect_error({"--checkpoint", checkpoint, "--prompt", "hi", "--temperature", "-1"}, 2, "--temperature");
  expect_error({"--checkpoint", checkpoint, "--prompt", "hi", "--dtype", "fp16"}, 2, "--dtype \"fp16\" is not allowed");
  expect_error({"--checkpoint", checkpoint, "--prompt", "hi", "--temperature", "1", "--top-k", "257"}, 2,
               "--top-k 257 is not allowed: must be in [0, 256]");
  // Greedy decoding samples nothing: sampling flags with it are refused, not dropped.
  expect_error({"--checkpoint", checkpoint, "--prompt", "hi", "--top-k", "5"}, 2,
               "--top-k applies to sampling, and --temperature is 0 (greedy)");
  expect_error({"--checkpoint", checkpoint, "--prompt", "hi", "--seed", "3"}, 2,
               "--seed applies to sampling, and --temperature is 0 (greedy)");
  expect_error({"--checkpoint", ::testing::TempDir(), "--prompt", "hi"}, 2, "(or is not a file)");

  const std::string foreign = ::testing::TempDir() + "/generate_foreign.pt";
  std::ofstream(foreign) << "hello";
  expect_error({"--checkpoint", foreign, "--prompt", "hi"}, 1, "is not a readable checkpoint");

  RunConfig small = smoke_config();
  small.model.vocab_size = 100;
  const std::string small_checkpoint = ::testing::TempDir() + "/generate_small_vocab.pt";
  Trainer(stages::v1_baseline(), small, torch::kCPU).save_checkpoint(small_checkpoint, /*overwrite=*/true);
  expect_error({"--checkpoint", small_checkpoint, "--prompt", "hi"}, 1,
               "model.vocab_size = 100 is too small for byte tokens: generate needs vocab_size >= 256");

  // Weights that do not fit the checkpoint's own config: a 2-layer model saved under a 3-layer config.
  RunConfig three_layers = smoke_config();
  three_layers.model.n_layers = 3;
  Transformer two_layers(smoke_config().model, stages::v1_baseline());
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("format", std::string(kCheckpointFormatV1));  // pickle_save: a v1 file, no checksums
  dict.insert("stage", std::string("v1_baseline"));
  dict.insert("step", int64_t{0});
  dict.insert("config", to_json(three_layers).dump());
  for (const auto& [name, value] : two_layers->canonical_state()) dict.insert(name, value);
  const std::string mismatched = ::testing::TempDir() + "/generate_mismatched.pt";
  const auto bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream(mismatched, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  expect_error({"--checkpoint", mismatched, "--prompt", "hi"}, 1, "model.layers.2.");
}

}  // namespace
}  // namespace tt
