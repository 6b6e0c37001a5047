// Training data: deterministic synthetic tokens (the workshop's default) or a text file read as bytes.
// Batches are drawn on the CPU from a seeded generator (the same tokens on every device), uploaded in
// chunks between steps, and each step copies its batch into fixed device buffers: no allocation and
// no host sync inside a step.
#pragma once

#include <memory>
#include <string>

#include <torch/torch.h>

namespace tt {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Fills rows [count, seq_len + 1] int64 CPU tensor; labels are the inputs shifted by one.
  virtual void fill(torch::Tensor& rows) = 0;
  virtual std::string describe() const = 0;
};

// Uniform tokens in [1, vocab_size).
std::unique_ptr<TokenSource> make_synthetic_source(int64_t vocab_size, uint64_t seed);
// Random windows of a file's bytes (byte-level tokenizer: token = byte value).
std::unique_ptr<TokenSource> make_text_source(const std::string& path, int64_t seq_len, uint64_t seed);
// The file's bytes as int64 tokens; throws with the path when unreadable or empty.
torch::Tensor read_byte_tokens(const std::string& path);
// read_byte_tokens, refusing (std::runtime_error naming `what`, the file, its size and the window) a file that
// does not hold one window of seq_len + 1 bytes: a window's seq_len inputs and their next-byte labels. Training
// and evaluation data are both checked here.
torch::Tensor read_byte_windows(const std::string& what, const std::string& path, int64_t seq_len);

class Batches {
 public:
  // batch_size: rows per step (with gradient accumulation, all micro-batches' rows).
  Batches(std::unique_ptr<TokenSource> source, int64_t batch_size, int64_t seq_len, int64_t total_steps,
          const torch::Device& device);
  // Moves to the next batch. Uploads a new chunk when the current one is used up (outside any step).
  void next();
  // Draws and drops the batches of `steps` steps, so that the next batch is the one a run that had taken
  // them would get next (a resume). The sources draw row after row from one generator whatever the
  // chunk size, so skipping in other pieces than the interrupted run's chunks gives the same rows.
  void skip(int64_t steps);
  const torch::Tensor& inputs() const { return inputs_; }  // [B, S], fixed device buffer
  const torch::Tensor& labels() const { return labels_; }  // [B, S], fixed device buffer
  const TokenSource& source() const { return *source_; }

 private:
  std::unique_ptr<TokenSource> source_;
  int64_t batch_size_, seq_len_, chunk_steps_, cursor_;
  torch::Tensor host_chunk_, device_chunk_, inputs_, labels_;
};

}  // namespace tt
