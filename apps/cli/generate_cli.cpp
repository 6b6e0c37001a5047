#include "apps/cli/generate_cli.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <stdexcept>

#include <c10/util/Exception.h>
#include <cxxopts.hpp>

#include "apps/cli/command_line.h"
#include "apps/results/text.h"
#include "apps/train/device.h"
#include "apps/train/generation.h"
#include "models/checkpoint.h"
#include "models/stage.h"

namespace tt {
namespace {

constexpr int64_t kByteVocab = 256;

cxxopts::Options make_options() {
  cxxopts::Options o("generate",
                     "Continue a text prompt with a trained checkpoint (byte-level tokens: one token per byte).\n"
                     "The continuation goes to stdout; progress, statistics and errors go to stderr.");
  o.add_options()
      ("checkpoint", "checkpoint written by a stage's --save-checkpoint (required)", cxxopts::value<std::string>())
      ("prompt", "text to continue, as bytes (required; 1 to model.max_seq_len - 1 bytes)",
       cxxopts::value<std::string>())
      ("max-new-tokens", "bytes to generate; generation stops earlier when prompt + new bytes reach model.max_seq_len",
       cxxopts::value<int64_t>()->default_value("200"))
      ("temperature", "0 = greedy (deterministic); > 0 samples from softmax(logits / temperature)",
       cxxopts::value<double>()->default_value("0"))
      ("top-k", "with temperature > 0, sample among the k most likely bytes, 0 to 256; 0 = all 256",
       cxxopts::value<int64_t>()->default_value("0"))
      ("seed", "seed of the sampling generator (CPU: the same bytes on every device)",
       cxxopts::value<int64_t>()->default_value("42"))
      ("device", "auto | cpu | cuda (auto: the GPU when LibTorch sees one)",
       cxxopts::value<std::string>()->default_value("auto"))
      ("dtype", "fp32 | bf16 (bf16: autocast and bf16 key/value caches, fp32 weights)",
       cxxopts::value<std::string>()->default_value("fp32"))
      ("stage", "build the model with this stage's components: " + stages::names() +
                " (default: the stage that wrote the checkpoint)", cxxopts::value<std::string>())
      ("no-kv-cache", "recompute the whole sequence for every new byte instead of decoding with the key/value cache "
                      "(slow; the reference the cache is checked against)")
      ("help", "show this help");
  return o;
}

int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto options = make_options();
  const auto parsed = parse_flags_with_dtype(options, args, out);
  if (!parsed) return 0;  // --help
  const cxxopts::ParseResult& r = parsed->flags;
  const Precision precision = parsed->precision;
  if (!r.count("checkpoint")) throw UsageError("--checkpoint FILE is required (see --help)");
  if (!r.count("prompt")) throw UsageError("--prompt TEXT is required (see --help)");
  const auto checkpoint_path = r["checkpoint"].as<std::string>();
  const auto prompt_text = r["prompt"].as<std::string>();
  const auto device_name = r["device"].as<std::string>();
  GenerationOptions g;
  g.max_new_tokens = r["max-new-tokens"].as<int64_t>();
  g.temperature = r["temperature"].as<double>();
  g.top_k = r["top-k"].as<int64_t>();
  g.seed = static_cast<uint64_t>(r["seed"].as<int64_t>());
  g.use_cache = r.count("no-kv-cache") == 0;
  g.token_limit = kByteVocab;  // the byte tokenizer cannot print tokens >= 256

  if (g.max_new_tokens < 0)
    throw UsageError("--max-new-tokens " + std::to_string(g.max_new_tokens) + " is not allowed: must be >= 0");
  if (!(g.temperature >= 0) || std::isinf(g.temperature))
    throw UsageError("--temperature " + std::to_string(g.temperature) +
                     " is not allowed: must be >= 0 and finite (0 = greedy)");
  if (g.top_k < 0 || g.top_k > kByteVocab)
    throw UsageError("--top-k " + std::to_string(g.top_k) + " is not allowed: must be in [0, " +
                     std::to_string(kByteVocab) + "] (0 = all bytes)");
  // Greedy decoding samples nothing: a top-k or seed given with it would be dropped without a word.
  if (g.temperature == 0)
    for (const char* flag : {"top-k", "seed"})
      if (r.count(flag))
        throw UsageError(std::string("--") + flag + " applies to sampling, and --temperature is 0 (greedy): give " +
                         "--temperature > 0, or leave out --" + flag);
  if (device_name != "auto" && device_name != "cpu" && device_name != "cuda")
    throw UsageError("--device \"" + device_name + "\" is not allowed: must be \"auto\", \"cpu\" or \"cuda\"");
  const StageSpec* spec = nullptr;
  if (r.count("stage")) {
    spec = stages::find(r["stage"].as<std::string>());
    if (!spec)
      throw UsageError("--stage \"" + r["stage"].as<std::string>() + "\" is not allowed: must be one of " +
                       stages::names());
  }
  if (!std::filesystem::is_regular_file(checkpoint_path))
    throw UsageError("--checkpoint: file '" + checkpoint_path + "' does not exist (or is not a file)");

  // Everything below the file check needs the checkpoint's config; no GPU work before the last check.
  const Checkpoint ck = read_checkpoint(checkpoint_path);
  const ModelConfig& model_config = ck.config.model;
  if (model_config.vocab_size < kByteVocab)
    throw std::runtime_error("the checkpoint's model.vocab_size = " + std::to_string(model_config.vocab_size) +
                             " is too small for byte tokens: generate needs vocab_size >= 256");
  if (!spec) {
    spec = stages::find(ck.stage);
    if (!spec)
      throw std::runtime_error("the checkpoint was written by stage \"" + ck.stage +
                               "\", which this build does not know; pass --stage, one of " + stages::names());
  }
  const auto prompt = byte_tokens(prompt_text);
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len >= model_config.max_seq_len)
    throw UsageError("--prompt has " + std::to_string(prompt_len) + " bytes; this checkpoint's model.max_seq_len is " +
                     std::to_string(model_config.max_seq_len) + ", so the prompt may have at most " +
                     std::to_string(model_config.max_seq_len - 1) + " bytes");
  torch::Device device = torch::kCPU;
  try {
    device = resolve_device(device_name);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }

  Transformer model(model_config, *spec);
  restore_weights(ck, model);
  model->to(device);
  model->set_precision(precision);
  err << "[generate] '" << checkpoint_path << "' (written by " << ck.stage << " at step " << ck.step << ", config "
      << ck.config.name << ") | model " << spec->name << " | device " << device.str() << " | " << to_string(precision) << " | "
      << (g.temperature == 0 ? std::string("greedy")
                             : "temperature " + strprintf("%g", g.temperature) +
                                   (g.top_k > 0 ? ", top-k " + std::to_string(g.top_k) : "") + ", seed " +
                                   std::to_string(g.seed))
      << " | " << (g.use_cache ? "KV cache" : "full recomputation per byte") << std::endl;

  const auto start = std::chrono::steady_clock::now();
  const Generation result = generate(model, prompt, g, device, [&](int64_t token) {
    out.put(static_cast<char>(static_cast<unsigned char>(token)));
    out.flush();
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out << std::endl;

  const auto n = static_cast<int64_t>(result.tokens.size());
  err << "[generate] " << n << " new bytes in " << strprintf("%.3f", seconds) << " s ("
      << strprintf("%.1f", seconds > 0 ? static_cast<double>(n) / seconds : 0.0)
      << " new bytes/s, the prompt's forward included)" << std::endl;
  if (result.reached_max_seq_len)
    err << "[generate] stopped after " << n << " of " << g.max_new_tokens << " new bytes: prompt (" << prompt_len
        << ") + new bytes reached the model's max_seq_len (" << model_config.max_seq_len << ")" << std::endl;
  if (prompt_len + n > ck.config.training.seq_len)
    err << "[generate] note: the model was trained on windows of " << ck.config.training.seq_len
        << " bytes; positions beyond that were never trained on" << std::endl;
  return 0;
}

}  // namespace

int generate_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return run_tool("generate", [&] { return run(args, out, err); }, err);
}

}  // namespace tt
