#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "apps/cli/stage_cli.h"
#include "apps/train/evaluation_report.h"
#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/evaluate.h"
#include "apps/train/trainer.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::smoke_config;
using testing::train_result;

torch::Tensor random_bytes(int64_t n, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randint(0, 256, {n}, gen, torch::kLong);
}

// The definition, written out: per window, -log softmax of the model's logits at the next byte, summed
// over every predicted token of every full window, divided by their number.
double hand_computed_loss(Transformer& model, const torch::Tensor& tokens, int64_t seq_len) {
  torch::NoGradGuard no_grad;
  const int64_t windows = tokens.numel() / (seq_len + 1);
  double sum = 0;
  for (int64_t w = 0; w < windows; ++w) {
    auto window = tokens.narrow(0, w * (seq_len + 1), seq_len + 1);
    auto logits = model->forward(window.narrow(0, 0, seq_len).unsqueeze(0))[0].to(torch::kFloat64);
    auto log_probs = logits - logits.logsumexp(-1, /*keepdim=*/true);
    auto labels = window.narrow(0, 1, seq_len);
    for (int64_t t = 0; t < seq_len; ++t) sum -= log_probs[t][labels[t].item<int64_t>()].item<double>();
  }
  return sum / static_cast<double>(windows * seq_len);
}

std::string write_bytes(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(Evaluate, EqualsTheHandComputedMeanOverFullWindows) {
  const int64_t seq_len = 8;
  // Five full windows of 9 bytes and 7 trailing bytes, which must be dropped.
  auto tokens = random_bytes(5 * (seq_len + 1) + 7, 11);
  for (const auto& spec : stages::all()) {
    Transformer model = testing::spread_out_model(spec, 7);
    const double expected = hand_computed_loss(model, tokens, seq_len);
    // Batches of 2 leave a last batch of one window: the mean must still weight every token once.
    const EvalResult r = evaluate(model, tokens, seq_len, 2, torch::kCPU);
    EXPECT_EQ(r.windows, 5);
    EXPECT_EQ(r.tokens, 40);
    EXPECT_EQ(r.dropped_bytes, 7);
    EXPECT_NEAR(r.loss, expected, 1e-5 * expected) << spec.name;
    EXPECT_NEAR(r.perplexity, std::exp(expected), 1e-5 * std::exp(expected)) << spec.name;
    for (int64_t batch : {1, 3, 5, 64})
      EXPECT_NEAR(evaluate(model, tokens, seq_len, batch, torch::kCPU).loss, expected, 1e-5 * expected)
          << spec.name << ", batch " << batch;
    // Without the trailing bytes: the same windows, the same loss.
    EXPECT_EQ(evaluate(model, tokens.narrow(0, 0, 45), seq_len, 2, torch::kCPU).loss, r.loss) << spec.name;
    EXPECT_TRUE(model->is_training()) << "evaluate must restore the training mode";
  }
}

TEST(Evaluate, Bf16AutocastStaysCloseToFp32) {
  Transformer model = testing::spread_out_model(stages::v2_fused(), 7);
  auto tokens = random_bytes(4 * 17, 12);
  const double fp32 = evaluate(model, tokens, 16, 4, torch::kCPU).loss;
  model->set_precision(Precision::kBf16);
  const double bf16 = evaluate(model, tokens, 16, 4, torch::kCPU).loss;
  EXPECT_NE(fp32, bf16) << "bf16 must actually run under autocast";
  EXPECT_NEAR(bf16, fp32, 0.02 * fp32);
}

TEST(Evaluate, RejectsShortDataAndNonByteVocabs) {
  const std::string short_file = write_bytes("eval_short.txt", std::string(8, 'a'));
  try {
    load_eval_data(short_file, 8);
    FAIL() << "expected an error for a file shorter than one window";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "has 8 bytes; seq_len 8 needs at least one window of seq_len + 1 = 9"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(load_eval_data(write_bytes("eval_one_window.txt", std::string(9, 'a')), 8).tokens.numel(), 9);

  ModelConfig m = smoke_config().model;
  m.vocab_size = 100;
  Transformer small(m, stages::v1_baseline());
  try {
    evaluate(small, random_bytes(20, 1) % 100, 8, 2, torch::kCPU);
    FAIL() << "expected an error for vocab_size < 256";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("model.vocab_size = 100 is not allowed, it must be >= 256"), std::string::npos)
        << e.what();
  }
}

// A long evaluation says how far it is; with a zero interval, before every batch.
TEST(Evaluate, LongEvaluationsReportProgress) {
  ModelConfig m = smoke_config().model;
  m.vocab_size = 256;
  Transformer model(m, stages::v1_baseline());
  std::ostringstream log;
  evaluate(model, random_bytes(9 * 6, 3), 8, 2, torch::kCPU, &log, /*progress_seconds=*/0);
  EXPECT_NE(log.str().find("eval: 2 of 6 windows (33%) after"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("eval: 4 of 6 windows (66%) after"), std::string::npos) << log.str();
  std::ostringstream quiet;
  evaluate(model, random_bytes(9 * 6, 3), 8, 2, torch::kCPU, &quiet);
  EXPECT_EQ(quiet.str(), "") << "a short evaluation prints nothing";
}

std::string repetitive_text_file() {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  return write_bytes("eval_repetitive.txt", text);
}

TEST(Evaluate, EvalEveryAddsAHeldOutCurveWithoutChangingTraining) {
  RunConfig c = smoke_config();
  c.training.data = repetitive_text_file();
  c.training.num_steps = 6;
  c.training.warmup_steps = 2;
  std::ostringstream log;
  const auto plain = train_result(stages::v2_fused(), c, torch::kCPU, log);
  EXPECT_FALSE(plain.contains("evaluation"));

  Trainer trainer(stages::v2_fused(), c, torch::kCPU);
  RunExtras extras;
  extras.eval_data = load_eval_data(c.training.data, c.training.seq_len);
  extras.eval_every = 3;
  const auto result = run_training(trainer, extras, log);
  EXPECT_NO_THROW(validate_result_json(result));
  EXPECT_EQ(result["losses"], plain["losses"]) << "evaluation must not change training";
  const auto& e = result["evaluation"];
  ASSERT_EQ(e["curve"].size(), 3u);  // after steps 3 and 6, and after the last step (8)
  EXPECT_EQ(e["curve"][0]["step"], 3);
  EXPECT_EQ(e["curve"][1]["step"], 6);
  EXPECT_EQ(e["curve"][2]["step"], 8);
  EXPECT_EQ(e["step"], 8);
  EXPECT_EQ(e["loss"], e["curve"][2]["loss"]);
  EXPECT_LT(e["curve"][2]["loss"].get<double>(), e["curve"][0]["loss"].get<double>()) << log.str();
  EXPECT_EQ(e["loss"].get<double>(),
            evaluate(trainer.model(), load_eval_data(c.training.data, c.training.seq_len).tokens, c.training.seq_len,
                     c.training.batch_size, torch::kCPU)
                .loss);
  EXPECT_NE(log.str().find("eval after step 3/8 | held-out loss"), std::string::npos) << log.str();

  auto broken = result;
  broken["evaluation"].erase("tokens");
  EXPECT_THROW(validate_result_json(broken), std::runtime_error);
}

TEST(Evaluate, CommandLineChecksTheEvalFlags) {
  const std::string data = repetitive_text_file();
  const std::string config = std::string(TT_SOURCE_DIR) + "/configs/smoke.json";
  auto parse = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--config", config});
    return parse_command_line("v1_baseline", args);
  };
  auto message = [&](std::vector<std::string> args) {
    try {
      parse(args);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(parse({"--eval-data", data, "--eval-every", "5"}).options.eval_every, 5);
  EXPECT_NE(message({"--eval-every", "5"}).find("--eval-every needs --eval-data FILE"), std::string::npos);
  EXPECT_NE(message({"--eval-data", data, "--eval-every", "-1"}).find("must be >= 0"), std::string::npos);
  EXPECT_NE(message({"--eval-data", data, "--eval-only"}).find("--eval-only needs --load-checkpoint"),
            std::string::npos);
  EXPECT_NE(message({"--eval-data", "/nonexistent/eval.txt"})
                .find("--eval-data: file '/nonexistent/eval.txt' does not exist"),
            std::string::npos);
  EXPECT_NE(message({"--eval-data", data, "--vocab-size", "100"}).find("model.vocab_size = 100 is not allowed"),
            std::string::npos);
}

TEST(Evaluate, EvalOnlyRunWritesAValidEvalResult) {
  RunConfig c = smoke_config();
  Trainer trainer(stages::v1_baseline(), c, torch::kCPU);
  auto tokens = testing::random_tokens(2, 17, 256, 3);
  trainer.step(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16));
  const std::string checkpoint = ::testing::TempDir() + "/eval_only.pt";
  trainer.save_checkpoint(checkpoint, /*overwrite=*/true);
  const std::string data = repetitive_text_file();
  const std::string output = ::testing::TempDir() + "/eval_only.json";

  std::vector<std::string> args = {"v2_fused",   "--config",    std::string(TT_SOURCE_DIR) + "/configs/smoke.json",
                                   "--device",   "cpu",         "--load-checkpoint",
                                   checkpoint,   "--eval-only", "--eval-data",
                                   data,         "--output",    output,
                                   "--overwrite"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_EQ(stage_main(static_cast<int>(argv.size()), argv.data(), stages::v2_fused()), 0);

  const auto result = read_json_file(output);
  EXPECT_NO_THROW(validate_eval_result_json(result));
  EXPECT_EQ(result["checkpoint"]["step"], 1);
  EXPECT_EQ(result["checkpoint"]["stage"], "v1_baseline");
  EXPECT_EQ(result["stage"]["name"], "v2_fused");
  const auto expected = evaluate(trainer.model(), load_eval_data(data, c.training.seq_len).tokens, c.training.seq_len,
                                 c.training.batch_size, torch::kCPU);
  EXPECT_NEAR(result["evaluation"]["loss"].get<double>(), expected.loss, 1e-5 * expected.loss);
  EXPECT_EQ(result["evaluation"]["windows"], expected.windows);

  // Without --config the run has the workshop model, which the checkpoint does not fit: the error says why.
  std::vector<std::string> no_config = {"v2_fused", "--device",    "cpu",         "--load-checkpoint",
                                        checkpoint, "--eval-only", "--eval-data", data,
                                        "--output", output,        "--overwrite"};
  argv.clear();
  for (auto& a : no_config) argv.push_back(a.data());
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(stage_main(static_cast<int>(argv.size()), argv.data(), stages::v2_fused()), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("model.n_layers: checkpoint has 2, this run has 8"), std::string::npos) << err;
  EXPECT_NE(err.find("pass the config the checkpoint was trained with (its name: \"smoke\")"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace tt
