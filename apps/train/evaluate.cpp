#include "apps/train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ostream>
#include <stdexcept>

#include "apps/train/data.h"
#include "apps/train/device.h"

namespace tt {
namespace {

constexpr int64_t kByteVocab = 256;

}  // namespace

EvalData load_eval_data(const std::string& path, int64_t seq_len) {
  return {path, read_byte_windows("eval data", path, seq_len)};
}

EvalResult evaluate(Transformer& model, const torch::Tensor& tokens, int64_t seq_len, int64_t batch_size,
                    const torch::Device& device, std::ostream* progress,
                    double progress_seconds, const std::function<bool()>& stop) {
  const ModelConfig& c = model->config();
  if (c.vocab_size < kByteVocab)
    throw std::runtime_error("evaluation reads bytes as tokens: model.vocab_size = " + std::to_string(c.vocab_size) +
                             " is not allowed, it must be >= 256");
  // seq_len <= model.max_seq_len is the config's rule (validate), checked once there for every caller's config.
  if (batch_size <= 0)
    throw std::runtime_error("evaluation: batch_size = " + std::to_string(batch_size) +
                             " is not allowed: must be positive");
  TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == torch::kLong,
              "evaluation: tokens must be a 1-D int64 tensor, got ", tokens.scalar_type(), " ", tokens.sizes());
  const int64_t window = seq_len + 1;
  EvalResult result;
  result.windows = tokens.numel() / window;
  if (result.windows == 0)
    throw std::runtime_error("evaluation: " + std::to_string(tokens.numel()) +
                             " tokens do not fill one window of seq_len + 1 = " + std::to_string(window));
  result.tokens = result.windows * seq_len;
  result.dropped_bytes = tokens.numel() - result.windows * window;

  auto rows = tokens.narrow(0, 0, result.windows * window).view({result.windows, window});
  EvalModeScope mode(model);
  torch::NoGradGuard no_grad;
  // Accumulated on the device so that the only host sync is the final read.
  auto total = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  const auto began = std::chrono::steady_clock::now();
  auto last_report = began;
  for (int64_t start = 0; start < result.windows; start += batch_size) {
    if (stop && stop()) {
      result.stopped = true;
      return result;
    }
    const auto now = std::chrono::steady_clock::now();
    if (progress && std::chrono::duration<double>(now - last_report).count() >= progress_seconds) {
      last_report = now;
      *progress << "  eval: " << start << " of " << result.windows << " windows ("
                << 100 * start / result.windows << "%) after "
                << std::lround(std::chrono::duration<double>(now - began).count()) << " s" << std::endl;
    }
    const int64_t n = std::min(batch_size, result.windows - start);
    auto batch = rows.narrow(0, start, n).to(device);
    auto inputs = batch.narrow(1, 0, seq_len).contiguous();
    auto labels = batch.narrow(1, 1, seq_len);
    const torch::Tensor logits = model->forward(inputs);  // at the model's precision
    auto log_probs = torch::log_softmax(logits.to(torch::kFloat32), -1);
    total -= log_probs.gather(-1, labels.unsqueeze(-1)).sum(torch::kFloat64);
  }
  result.loss = total.item<double>() / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.loss);
  return result;
}

}  // namespace tt
