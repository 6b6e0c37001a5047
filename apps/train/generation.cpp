#include "apps/train/generation.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "apps/train/device.h"
#include "apps/train/evaluate.h"

namespace tt {
namespace {

void check(const Transformer& model, const std::vector<int64_t>& prompt, const GenerationOptions& o) {
  const ModelConfig& c = model->config();
  const auto n = static_cast<int64_t>(prompt.size());
  if (n == 0) throw std::invalid_argument("the prompt is empty: generation needs at least one token to continue");
  if (n >= c.max_seq_len)
    throw std::invalid_argument("the prompt has " + std::to_string(n) + " tokens; the model's max_seq_len is " +
                                std::to_string(c.max_seq_len) + ", so a prompt may have at most " +
                                std::to_string(c.max_seq_len - 1) + " tokens (one position is left for new tokens)");
  for (int64_t token : prompt)
    if (token < 0 || token >= c.vocab_size)
      throw std::invalid_argument("prompt token " + std::to_string(token) + " is outside the vocab [0, " +
                                  std::to_string(c.vocab_size) + ")");
  if (o.max_new_tokens < 0)
    throw std::invalid_argument("max_new_tokens = " + std::to_string(o.max_new_tokens) +
                                " is not allowed: must be >= 0");
  if (!(o.temperature >= 0) || std::isinf(o.temperature))
    throw std::invalid_argument("temperature = " + std::to_string(o.temperature) +
                                " is not allowed: must be >= 0 and finite (0 = greedy)");
  if (o.top_k < 0)
    throw std::invalid_argument("top_k = " + std::to_string(o.top_k) + " is not allowed: must be >= 0 (0 = off)");
  if (o.token_limit < 0 || o.token_limit > c.vocab_size)
    throw std::invalid_argument("token_limit = " + std::to_string(o.token_limit) +
                                " is not allowed: must be in [0, vocab_size = " + std::to_string(c.vocab_size) +
                                "] (0 = the whole vocab)");
}

// Chooses the next token from one position's logits [vocab] (fp32, CPU).
int64_t choose(const torch::Tensor& logits, const GenerationOptions& o, at::Generator& generator) {
  auto scores = o.token_limit > 0 ? logits.narrow(0, 0, o.token_limit) : logits;
  if (o.temperature == 0) return scores.argmax().item<int64_t>();
  scores = scores.to(torch::kFloat64) / o.temperature;
  if (o.top_k > 0 && o.top_k < scores.numel()) {
    const auto kth = std::get<0>(scores.topk(o.top_k)).min();
    scores = scores.masked_fill(scores < kth, -std::numeric_limits<double>::infinity());
  }
  return torch::multinomial(torch::softmax(scores, 0), 1, /*replacement=*/false, generator).item<int64_t>();
}

}  // namespace

Generation generate(Transformer& model, const std::vector<int64_t>& prompt, const GenerationOptions& options,
                    const torch::Device& device, const std::function<void(int64_t)>& on_token) {
  check(model, prompt, options);
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  const int64_t room = model->config().max_seq_len - prompt_len;
  const int64_t new_tokens = std::min(options.max_new_tokens, room);

  Generation out;
  out.reached_max_seq_len = new_tokens < options.max_new_tokens;
  std::vector<torch::Tensor> kept;
  auto generator = at::detail::createCPUGenerator(options.seed);
  EvalModeScope mode(model);
  torch::NoGradGuard no_grad;
  // Every forward opens the model's autocast region itself; this outer one keeps autocast's cache of bf16
  // weight casts alive from token to token (it is dropped when the outermost region closes), as one region
  // around the whole loop does in Python.
  AutocastScope autocast(device, model->precision());

  // Each step reads one row of logits back: the next input depends on it (and the caller streams it).
  auto emit = [&](const torch::Tensor& last_logits) {
    auto row = last_logits.to(torch::kCPU, torch::kFloat32);
    if (options.keep_logits) kept.push_back(row);
    const int64_t token = choose(row, options, generator);
    out.tokens.push_back(token);
    if (on_token) on_token(token);
    return token;
  };
  auto ids = [&](const std::vector<int64_t>& tokens) {
    return torch::tensor(tokens, torch::kLong).view({1, -1}).to(device);
  };

  if (new_tokens > 0 && options.use_cache) {
    // The last new token is never fed back, so prompt + new - 1 positions are cached.
    auto caches =
        model->make_caches(1, prompt_len + new_tokens - 1, compute_dtype(model->precision()), device);
    auto logits = model->forward(ids(prompt), &caches);
    for (int64_t i = 0;; ++i) {
      const int64_t token = emit(logits[0][-1]);
      if (i + 1 == new_tokens) break;
      logits = model->forward(ids({token}), &caches);
    }
  } else if (new_tokens > 0) {
    std::vector<int64_t> sequence = prompt;
    for (int64_t i = 0; i < new_tokens; ++i) sequence.push_back(emit(model->forward(ids(sequence))[0][-1]));
  }
  if (options.keep_logits)
    out.logits = kept.empty() ? torch::empty({0, model->config().vocab_size}) : torch::stack(kept);
  return out;
}

std::vector<int64_t> byte_tokens(const std::string& text) {
  std::vector<int64_t> tokens;
  tokens.reserve(text.size());
  for (unsigned char byte : text) tokens.push_back(byte);
  return tokens;
}

std::string bytes_to_text(const std::vector<int64_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int64_t token : tokens) {
    if (token < 0 || token > 255)
      throw std::invalid_argument("token " + std::to_string(token) + " is not a byte (0..255)");
    text.push_back(static_cast<char>(static_cast<unsigned char>(token)));
  }
  return text;
}

}  // namespace tt
