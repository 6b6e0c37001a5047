// Autoregressive decoding from a trained model: incremental with a key/value cache (the prompt in one
// forward, then one position per token), or by recomputing the whole sequence per token (the check of
// the cache). Greedy (temperature 0) is deterministic; sampling draws on a seeded CPU generator, so a seed
// gives the same tokens on every device up to the logits' own rounding.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/config.h"
#include "models/transformer.h"

namespace tt {

struct GenerationOptions {
  int64_t max_new_tokens = 100;
  double temperature = 0.0;  // 0: greedy (argmax, first index on ties); > 0: sample softmax(logits / T)
  int64_t top_k = 0;         // sample among the k most likely tokens (ties at the k-th kept); 0: all
  uint64_t seed = 42;
  int64_t token_limit = 0;   // only tokens below this are produced (256: bytes); 0: the whole vocab
  bool use_cache = true;     // false: recompute the whole sequence for every new token
  bool keep_logits = false;  // return the fp32 logits each token was chosen from
};

struct Generation {
  std::vector<int64_t> tokens;       // the new tokens, prompt excluded
  torch::Tensor logits;              // [tokens, vocab] fp32 on the CPU, with keep_logits
  bool reached_max_seq_len = false;  // fewer than max_new_tokens: prompt + new tokens = model.max_seq_len
};

// Decodes after prompt. The sequence never exceeds model.max_seq_len: generation stops there (see
// reached_max_seq_len) rather than sliding, because RoPE positions of a slid window would no longer
// match the cached keys. on_token, when set, sees each token as soon as it is chosen.
// Throws std::invalid_argument naming the value and what is allowed for an empty prompt, a prompt of
// max_seq_len tokens or more, prompt tokens outside the vocab, and negative or out-of-range options.
Generation generate(Transformer& model, const std::vector<int64_t>& prompt, const GenerationOptions& options,
                    const torch::Device& device, const std::function<void(int64_t)>& on_token = {});

// The byte-level tokenizer: token = byte value.
std::vector<int64_t> byte_tokens(const std::string& text);
std::string bytes_to_text(const std::vector<int64_t>& tokens);

}  // namespace tt
