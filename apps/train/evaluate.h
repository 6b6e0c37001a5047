// Held-out evaluation of a byte-level model: mean next-token loss per token and perplexity over a text
// file cut into consecutive windows (README, "The evaluation loss, exactly"):
//   windows  = floor(bytes / (seq_len + 1)) consecutive, non-overlapping windows from the file's start
//              (the trailing bytes that do not fill a window are dropped);
//   loss     = sum over windows w and positions t < seq_len of -log softmax(logits(w[:seq_len]))_t[w[t + 1]]
//              divided by windows * seq_len, the log-softmax taken in fp32 and the sum kept in fp64;
//   perplexity = exp(loss).
// Batches only group windows for speed; they do not weight the mean. The result files' "evaluation"
// objects are written by the reporting layer (apps/train/evaluation_report.h).
#pragma once

#include <functional>
#include <iosfwd>
#include <string>

#include <torch/torch.h>

#include "models/config.h"
#include "models/transformer.h"

namespace tt {

// Switches the model to eval mode for its lifetime and restores the previous mode, also on exceptions.
class EvalModeScope {
 public:
  explicit EvalModeScope(Transformer& model) : model_(model), was_training_(model->is_training()) { model_->eval(); }
  ~EvalModeScope() { model_->train(was_training_); }
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;

 private:
  Transformer& model_;
  bool was_training_;
};

// Byte tokens of an evaluation file, checked against the window size before any GPU work.
struct EvalData {
  std::string path;
  torch::Tensor tokens;  // 1-D int64 on the CPU, values 0..255
};

// Reads the file as bytes; throws std::runtime_error naming the file, its size and the window size when
// it does not hold one full window of seq_len + 1 bytes.
EvalData load_eval_data(const std::string& path, int64_t seq_len);

struct EvalResult {
  double loss = 0;        // mean loss per token (nats)
  double perplexity = 0;  // exp(loss)
  int64_t windows = 0;
  int64_t tokens = 0;         // windows * seq_len predicted tokens
  int64_t dropped_bytes = 0;  // the trailing partial window
  bool stopped = false;       // `stop` ended it early: the figures above are not those of the whole file
};

// Evaluates in eval mode without gradients, batch_size windows at a time, at the model's precision;
// restores the model's training mode afterwards. One host sync, at the end. Throws for a vocab
// smaller than 256 or fewer tokens than one window; seq_len must be a validated config's (<= max_seq_len). With `progress`, a
// long evaluation writes a line there every `progress_seconds` (windows handed to the device so far). `stop`,
// when given, is asked before every batch (a stop signal; data parallel: a collective vote, so every rank
// asks as often); true ends the evaluation there, marked `stopped`.
constexpr double kEvalProgressSeconds = 10.0;
EvalResult evaluate(Transformer& model, const torch::Tensor& tokens, int64_t seq_len, int64_t batch_size,
                    const torch::Device& device, std::ostream* progress = nullptr,
                    double progress_seconds = kEvalProgressSeconds, const std::function<bool()>& stop = {});

}  // namespace tt
