#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "apps/cli/stage_cli.h"
#include "models/config.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using nlohmann::json;

using testing::error_of;

ParsedCommandLine parse(std::vector<std::string> args) { return parse_command_line("test", args); }

TEST(Config, ShippedConfigsLoadAndValidate) {
  for (const char* name : {"workshop", "medium", "long-context", "smoke"}) {
    RunConfig c = load_run_config(std::string(TT_SOURCE_DIR) + "/configs/" + name + ".json");
    EXPECT_NO_THROW(validate(c)) << name;
    EXPECT_EQ(c.name, name);
  }
  RunConfig w = load_run_config(std::string(TT_SOURCE_DIR) + "/configs/workshop.json");
  EXPECT_EQ(w.model.vocab_size, 1000);
  EXPECT_EQ(w.model.hidden_dim, 512);
  EXPECT_EQ(w.model.n_layers, 8);
  EXPECT_EQ(w.model.n_kv_heads, 4);
  EXPECT_EQ(w.training.batch_size, 8);
  EXPECT_EQ(w.training.seq_len, 128);
  EXPECT_EQ(w.training.num_steps, 50);
  EXPECT_EQ(w.training.warmup_steps, 5);
  EXPECT_DOUBLE_EQ(w.training.learning_rate, 3e-4);
}

TEST(Config, DefaultsEqualWorkshopConfig) {
  RunConfig defaults;
  RunConfig w = load_run_config(std::string(TT_SOURCE_DIR) + "/configs/workshop.json");
  EXPECT_EQ(to_json(defaults.model), to_json(w.model));
  EXPECT_EQ(to_json(defaults.training), to_json(w.training));
}

TEST(Config, JsonRoundTrip) {
  RunConfig c = testing::smoke_config();
  RunConfig back = run_config_from_json(to_json(c), "roundtrip");
  EXPECT_EQ(to_json(back), to_json(c));
}

TEST(Config, UnknownKeysWrongTypesAndMalformedJsonAreErrors) {
  EXPECT_NE(error_of([] { run_config_from_json(json{{"model", {{"hiden_dim", 8}}}}, "f.json"); })
                .find("\"model.hiden_dim\" is not a known key"),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"trainig", json::object()}}, "f.json"); }).find("\"trainig\""),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"model", {{"hidden_dim", "512"}}}}, "f.json"); })
                .find("must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"model", {{"hidden_dim", 512.5}}}}, "f.json"); })
                .find("must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"model", {{"tie_embeddings", 1}}}}, "f.json"); })
                .find("must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"training", {{"learning_rate", "fast"}}}}, "f.json"); })
                .find("must be a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"model", 3}}, "f.json"); }).find("must be a JSON object"),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"training", {{"dtype", "fp16"}}}}, "f.json"); })
                .find("field \"training.dtype\" = \"fp16\" is not allowed: must be \"fp32\" or \"bf16\""),
            std::string::npos);
  EXPECT_NE(error_of([] { run_config_from_json(json{{"training", {{"dtype", 16}}}}, "f.json"); })
                .find("\"training.dtype\" must be \"fp32\" or \"bf16\""),
            std::string::npos);
  const std::string path = ::testing::TempDir() + "/malformed.json";
  std::ofstream(path) << "{\"model\": {";
  EXPECT_NE(error_of([&] { load_run_config(path); }).find("is not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { load_run_config("/nonexistent/x.json"); }).find("cannot open"), std::string::npos);
}

struct Rule {
  std::function<void(RunConfig&)> change;
  std::string field;
  std::string phrase;
};

TEST(Config, EveryValidationRuleNamesFieldValueAndRule) {
  const std::vector<Rule> rules = {
      {[](RunConfig& c) { c.model.vocab_size = 0; }, "model.vocab_size", "= 0 is not allowed: must be positive"},
      {[](RunConfig& c) { c.model.hidden_dim = -4; }, "model.hidden_dim", "must be positive"},
      {[](RunConfig& c) { c.model.n_layers = 0; }, "model.n_layers", "must be positive"},
      {[](RunConfig& c) { c.model.n_heads = 0; }, "model.n_heads", "must be positive"},
      {[](RunConfig& c) { c.model.n_kv_heads = 0; }, "model.n_kv_heads", "must be positive"},
      {[](RunConfig& c) { c.model.intermediate_dim = 0; }, "model.intermediate_dim", "must be positive"},
      {[](RunConfig& c) { c.model.max_seq_len = 0; }, "model.max_seq_len", "must be positive"},
      {[](RunConfig& c) { c.model.hidden_dim = 66; }, "model.hidden_dim", "must be divisible by model.n_heads (4)"},
      {[](RunConfig& c) { c.model.n_kv_heads = 3; }, "model.n_heads", "must be a multiple of model.n_kv_heads (3)"},
      {[](RunConfig& c) { c.model.hidden_dim = 36; }, "model.hidden_dim", "must be even for RoPE"},
      {[](RunConfig& c) { c.model.rope_theta = 0; }, "model.rope_theta", "must be > 0"},
      {[](RunConfig& c) { c.model.norm_eps = -1; }, "model.norm_eps", "must be > 0"},
      {[](RunConfig& c) { c.model.init_std = 0; }, "model.init_std", "must be > 0"},
      {[](RunConfig& c) { c.training.batch_size = 0; }, "training.batch_size", "must be positive"},
      {[](RunConfig& c) { c.training.seq_len = 0; }, "training.seq_len", "must be positive"},
      {[](RunConfig& c) { c.training.num_steps = 0; }, "training.num_steps", "must be positive"},
      {[](RunConfig& c) { c.training.seq_len = 300; }, "training.seq_len", "must be <= model.max_seq_len (256)"},
      {[](RunConfig& c) { c.training.warmup_steps = -1; }, "training.warmup_steps", "must be >= 0"},
      {[](RunConfig& c) { c.training.log_every = -1; }, "training.log_every", "must be >= 0"},
      {[](RunConfig& c) { c.training.learning_rate = 0; }, "training.learning_rate", "must be finite and > 0"},
      {[](RunConfig& c) { c.training.beta1 = 1; }, "training.beta1", "must be in [0, 1)"},
      {[](RunConfig& c) { c.training.beta2 = -0.5; }, "training.beta2", "must be in [0, 1)"},
      {[](RunConfig& c) { c.training.adam_eps = 0; }, "training.adam_eps", "must be finite and > 0"},
      {[](RunConfig& c) { c.training.weight_decay = -0.1; }, "training.weight_decay", "must be finite and >= 0"},
      {[](RunConfig& c) { c.training.grad_clip = -1; }, "training.grad_clip", "must be finite and >= 0"},
      {[](RunConfig& c) { c.training.learning_rate = INFINITY; }, "training.learning_rate", "must be finite and > 0"},
      {[](RunConfig& c) { c.training.grad_clip = INFINITY; }, "training.grad_clip", "must be finite and >= 0"},
      {[](RunConfig& c) { c.training.device = "tpu"; }, "training.device", "must be \"auto\", \"cpu\" or \"cuda\""},
      {[](RunConfig& c) { c.model.vocab_size = 100; c.training.data = "x.txt"; }, "model.vocab_size", "byte-level text needs vocab_size >= 256"},
      {[](RunConfig& c) { c.model.vocab_size = 1; }, "model.vocab_size", "synthetic tokens are drawn from [1, vocab_size)"},
      {[](RunConfig& c) { c.training.min_lr = 1e-5; }, "training.min_lr", "with lr_schedule \"constant\", which never decays"},
      {[](RunConfig& c) { c.training.lr_warmup_steps = 13; }, "training.lr_warmup_steps", "the ramp must end within the run's 12"},
      {[](RunConfig& c) { c.training.allow_tf32 = true; }, "training.allow_tf32", "not allowed with training.device = \"cpu\""},
      {[](RunConfig& c) { c.name = "../elsewhere"; }, "name", "letters, digits, '-', '_' and '.' only"},
      {[](RunConfig& c) { c.name = ""; }, "name", "letters, digits"},
      {[](RunConfig& c) { c.model.vocab_size = int64_t{1} << 62; }, "model", "parameters; at most 1e+12 are allowed"},
      {[](RunConfig& c) { c.model.n_layers = 100000000000; }, "model", "n_layers 100000000000"},
      {[](RunConfig& c) { c.training.batch_size = int64_t{1} << 40; }, "training.batch_size", "batch_size x seq_len must be at most"},
  };
  for (const auto& rule : rules) {
    RunConfig c = testing::smoke_config();
    rule.change(c);
    const std::string message = error_of([&] { validate(c); });
    EXPECT_NE(message.find("\"" + rule.field + "\""), std::string::npos) << message;
    EXPECT_NE(message.find(rule.phrase), std::string::npos) << "expected '" << rule.phrase << "' in: " << message;
  }
}

TEST(CommandLine, FlagsOverrideConfigFields) {
  auto p = parse({"--config", std::string(TT_SOURCE_DIR) + "/configs/workshop.json", "--batch-size", "4", "--seq-len", "64",
                  "--num-steps", "7", "--hidden-dim", "256", "--num-layers", "2", "--num-heads", "4", "--num-kv-heads",
                  "2", "--learning-rate", "0.001", "--use-amp", "--seed", "7", "--warmup-steps", "1", "--device", "cpu"});
  const auto& c = p.config;
  EXPECT_EQ(c.training.batch_size, 4);
  EXPECT_EQ(c.training.seq_len, 64);
  EXPECT_EQ(c.training.num_steps, 7);
  EXPECT_EQ(c.model.hidden_dim, 256);
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.n_heads, 4);
  EXPECT_EQ(c.model.n_kv_heads, 2);
  EXPECT_DOUBLE_EQ(c.training.learning_rate, 1e-3);
  EXPECT_EQ(c.training.dtype, Precision::kBf16);
  EXPECT_EQ(c.training.seed, 7);
  EXPECT_EQ(c.training.warmup_steps, 1);
  EXPECT_EQ(c.training.device, "cpu");
  EXPECT_EQ(c.model.vocab_size, 1000);  // untouched fields keep the file's values
}

// JSON lets a key repeat and nlohmann keeps the last: a second "model" section would drop the first unsaid.
TEST(Config, DuplicateKeysAndOutOfRangeIntegersAreRefused) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  EXPECT_NE(error_of([&] { load_run_config(write("dup_section.json", R"({"model": {"hidden_dim": 64}, "model": {}})")); })
                .find("key \"model\" appears twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_run_config(write("dup_field.json", R"({"training": {"batch_size": 2, "batch_size": 3}})"));
            }).find("key \"training.batch_size\" appears twice"),
            std::string::npos);
  // The same key in two different objects is no repeat.
  EXPECT_NO_THROW(load_run_config(write("same_key_two_objects.json", R"({"model": {}, "training": {}, "name": "x"})")));
  EXPECT_NE(error_of([&] { load_run_config(write("huge.json", R"({"model": {"hidden_dim": 9223372036854775808}})")); })
                .find("\"model.hidden_dim\" = 9223372036854775808 is not allowed: must be at most 9223372036854775807"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_run_config(dir); }).find("does not exist or is not a file"), std::string::npos);
}

TEST(CommandLine, BadFlagsAreClearErrors) {
  EXPECT_NE(error_of([] { parse({"--batch-sise", "4"}); }).find("batch-sise"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"--batch-size", "four"}); }).find("four"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"--batch-size", "0"}); }).find("\"training.batch_size\" = 0 is not allowed: must be positive (set by --batch-size)"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse({"stray"}); }).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"--dtype", "fp32", "--use-amp"}); }).find("--use-amp"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"--load-checkpoint", "/nonexistent.pt"}); }).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of([] { parse({"--data", "/nonexistent.txt", "--vocab-size", "256"}); }).find("does not exist"),
            std::string::npos);
  // A rule broken by a value from a --config file names the file.
  const std::string bad_file = ::testing::TempDir() + "/zero_batch.json";
  std::ofstream(bad_file) << R"({"training": {"batch_size": 0}})";
  EXPECT_NE(error_of([&] { parse({"--config", bad_file}); }).find("must be positive (in " + bad_file + ")"),
            std::string::npos);
  // --doctor and --validate print and exit; a run's flag beside them would be ignored.
  EXPECT_NE(error_of([] { parse({"--doctor", "--num-steps", "3"}); }).find("--doctor prints what this machine has"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse({"--validate", "--output", "x.json"}); })
                .find("--output is not allowed with --validate"),
            std::string::npos);
  EXPECT_TRUE(parse({"--validate", "--batch-size", "3", "--use-amp"}).options.validate_only);
  // cxxopts keeps the last of a repeated flag; ours refuses the repeat.
  EXPECT_NE(error_of([] { parse({"--batch-size", "4", "--batch-size=8"}); })
                .find("--batch-size is given more than once"),
            std::string::npos);
  // A folder where a file is read: named, not a stream error.
  const std::string folder = ::testing::TempDir();
  EXPECT_NE(error_of([&] { parse({"--load-checkpoint", folder}); }).find("(or is not a file)"), std::string::npos);
  EXPECT_NE(error_of([&] { parse({"--data", folder, "--vocab-size", "256"}); }).find("(or is not a file)"),
            std::string::npos);
}

// --eval-only reads the model fields and a few training fields; a flag for any other would do nothing.
TEST(CommandLine, EvalOnlyRefusesTrainingFlagsItWouldIgnore) {
  const std::string text = ::testing::TempDir() + "/eval_only_flags.txt";
  std::ofstream(text) << std::string(600, 'a');
  const std::string checkpoint = ::testing::TempDir() + "/eval_only_flags.pt";
  std::ofstream(checkpoint) << "x";
  const std::vector<std::string> eval = {"--eval-only", "--eval-data", text, "--load-checkpoint", checkpoint,
                                         "--vocab-size", "256"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = eval;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  EXPECT_NO_THROW(parse(with({"--batch-size", "4", "--seq-len", "64", "--dtype", "bf16"})));
  for (const std::vector<std::string>& flag :
       {std::vector<std::string>{"--learning-rate", "1"}, {"--num-steps", "100"}, {"--lr-schedule", "cosine"},
        {"--grad-accum-steps", "4"}, {"--seed", "7"}}) {
    const std::string message = error_of([&] { parse(with(flag)); });
    EXPECT_NE(message.find(flag[0] + " is not allowed with --eval-only"), std::string::npos) << message;
    EXPECT_NE(message.find("which evaluation does not use"), std::string::npos) << message;
  }
}

TEST(CommandLine, AllowTf32IsASwitchRecordedInTheConfig) {
  EXPECT_FALSE(parse({}).config.training.allow_tf32);
  EXPECT_TRUE(parse({"--allow-tf32"}).config.training.allow_tf32);
  EXPECT_FALSE(parse({"--allow-tf32=false"}).config.training.allow_tf32);
  EXPECT_NE(error_of([] { parse({"--allow-tf32=maybe"}); }).find("must be true or false, got 'maybe'"), std::string::npos);
  EXPECT_EQ(to_json(parse({"--allow-tf32"}).config)["training"]["allow_tf32"], true);
}

TEST(CommandLine, NoGraphIsRefusedForAStageWithoutAGraph) {
  std::vector<const char*> argv = {"v3_custom", "--no-graph", "--device", "cpu", "--validate"};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(stage_main(static_cast<int>(argv.size()), const_cast<char**>(argv.data()), stages::v3_custom()), 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--no-graph applies to stages that capture their step as a graph"), std::string::npos) << err;
  argv[0] = "v4_ultra";
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(stage_main(static_cast<int>(argv.size()), const_cast<char**>(argv.data()), stages::v4_ultra()), 0);
  ::testing::internal::GetCapturedStdout();
}

TEST(CommandLine, HelpDocumentsEveryFlagWithDefault) {
  auto p = parse({"--help"});
  ASSERT_TRUE(p.help);
  // Every config field with a flag: the flag, its field and its default, as add_config_flags writes them.
  int config_flags = 0;
  for (const auto& field : config_fields()) {
    if (!field.flag) continue;
    ++config_flags;
    EXPECT_NE(p.help_text.find("--" + std::string(field.flag)), std::string::npos) << field.flag;
    // cxxopts wraps long lines, so the bracket is checked without the spaces a wrap may move.
    std::string flat;
    for (char ch : p.help_text) if (ch != ' ' && ch != '\n') flat += ch;
    std::string expected = "[" + field.path + ",default" + field.default_value + "]";
    expected.erase(std::remove(expected.begin(), expected.end(), ' '), expected.end());
    EXPECT_NE(flat.find(expected), std::string::npos) << expected;
  }
  EXPECT_GE(config_flags, 20);
  // Every other flag of a stage executable.
  for (const char* flag : {"--use-amp", "--config", "--output", "--overwrite", "--save-checkpoint", "--load-checkpoint",
                           "--validate", "--doctor", "--no-graph", "--pitfall", "--help", "--checkpoint-dir",
                           "--checkpoint-every", "--keep-checkpoints", "--resume", "--profile", "--profile-steps",
                           "--eval-data", "--eval-every", "--eval-only", "--dist-timeout", "--scaling-baseline",
                           "--dp-sync", "--dp-embedding-grad", "--zero-gather"})
    EXPECT_NE(p.help_text.find(flag), std::string::npos) << flag;
}

}  // namespace
}  // namespace tt
