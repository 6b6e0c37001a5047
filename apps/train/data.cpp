#include "apps/train/data.h"

#include <algorithm>
#include <fstream>
#include <iterator>

namespace tt {
namespace {

// Keeps the uploaded chunk under this size; a whole workshop run fits in one chunk.
constexpr int64_t kMaxChunkBytes = 256ll << 20;

class SyntheticSource final : public TokenSource {
 public:
  SyntheticSource(int64_t vocab, uint64_t seed) : vocab_(vocab), generator_(at::detail::createCPUGenerator(seed)) {}
  void fill(torch::Tensor& rows) override { rows.random_(1, vocab_, generator_); }
  std::string describe() const override { return "synthetic uniform tokens in [1, " + std::to_string(vocab_) + ")"; }

 private:
  int64_t vocab_;
  at::Generator generator_;
};

class TextSource final : public TokenSource {
 public:
  TextSource(const std::string& path, int64_t seq_len, uint64_t seed)
      : path_(path),
        tokens_(read_byte_windows("data file", path, seq_len)),
        generator_(at::detail::createCPUGenerator(seed)) {}
  void fill(torch::Tensor& rows) override {
    const int64_t window = rows.size(1);
    auto starts = torch::randint(0, tokens_.numel() - window + 1, {rows.size(0)}, generator_, torch::kLong);
    auto index = starts.unsqueeze(1) + torch::arange(window, torch::kLong).unsqueeze(0);
    rows.copy_(tokens_.index({index}));
  }
  std::string describe() const override {
    return "bytes of '" + path_ + "' (" + std::to_string(tokens_.numel()) + " tokens), random windows";
  }

 private:
  std::string path_;
  torch::Tensor tokens_;
  at::Generator generator_;
};

}  // namespace

torch::Tensor read_byte_windows(const std::string& what, const std::string& path, int64_t seq_len) {
  torch::Tensor tokens = read_byte_tokens(path);
  if (tokens.numel() < seq_len + 1)
    throw std::runtime_error(what + " '" + path + "' has " + std::to_string(tokens.numel()) + " bytes; seq_len " +
                             std::to_string(seq_len) + " needs at least one window of seq_len + 1 = " +
                             std::to_string(seq_len + 1) + " bytes");
  return tokens;
}

torch::Tensor read_byte_tokens(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open data file '" + path + "'");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) throw std::runtime_error("data file '" + path + "' is empty");
  auto raw = torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  return raw.to(torch::kLong);
}

std::unique_ptr<TokenSource> make_synthetic_source(int64_t vocab_size, uint64_t seed) {
  return std::make_unique<SyntheticSource>(vocab_size, seed);
}

std::unique_ptr<TokenSource> make_text_source(const std::string& path, int64_t seq_len, uint64_t seed) {
  return std::make_unique<TextSource>(path, seq_len, seed);
}

Batches::Batches(std::unique_ptr<TokenSource> source, int64_t batch_size, int64_t seq_len, int64_t total_steps,
                 const torch::Device& device)
    : source_(std::move(source)), batch_size_(batch_size), seq_len_(seq_len) {
  const int64_t step_bytes = batch_size * (seq_len + 1) * static_cast<int64_t>(sizeof(int64_t));
  chunk_steps_ = std::max<int64_t>(1, std::min<int64_t>(std::max<int64_t>(total_steps, 1), kMaxChunkBytes / step_bytes));
  cursor_ = chunk_steps_;  // forces an upload on the first next()
  host_chunk_ = torch::empty({chunk_steps_ * batch_size, seq_len + 1}, torch::kLong);
  auto options = torch::TensorOptions().dtype(torch::kLong).device(device);
  device_chunk_ = torch::empty({chunk_steps_, batch_size, seq_len + 1}, options);
  inputs_ = torch::empty({batch_size, seq_len}, options);
  labels_ = torch::empty({batch_size, seq_len}, options);
}

void Batches::next() {
  if (cursor_ == chunk_steps_) {
    source_->fill(host_chunk_);
    device_chunk_.copy_(host_chunk_.view({chunk_steps_, batch_size_, seq_len_ + 1}));
    cursor_ = 0;
  }
  auto rows = device_chunk_[cursor_++];
  inputs_.copy_(rows.narrow(1, 0, seq_len_), /*non_blocking=*/true);
  labels_.copy_(rows.narrow(1, 1, seq_len_), /*non_blocking=*/true);
}

void Batches::skip(int64_t steps) {
  for (int64_t left = steps; left > 0;) {
    const int64_t piece = std::min(left, chunk_steps_);
    auto rows = host_chunk_.narrow(0, 0, piece * batch_size_);
    source_->fill(rows);
    left -= piece;
  }
  cursor_ = chunk_steps_;  // the next batch comes from a fresh draw
}

}  // namespace tt
