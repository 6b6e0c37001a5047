// Embedding backward launcher: the gradient of a lookup table from the gradient of its looked-up rows. fp32 only:
// the table is an fp32 master weight in every run (bf16 runs included), and so is the gradient of its rows.
// Plain pointers and sizes; inputs are checked by the op layer (kernels/ops/embedding.cpp).
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

struct EmbeddingBackwardParams {
  const int64_t* ids;     // [tokens], contiguous, each in [0, vocab)
  const float* grad_out;  // [tokens, dim], contiguous
  float* grad_weight;     // [vocab, dim], contiguous
  int64_t tokens;
  int64_t vocab;
  int64_t dim;
};

// grad_weight[v] = the sum of grad_out[i] over the positions i with ids[i] == v, added in ascending i (the same
// order on every run, so bitwise reproducible). Every row is written, zeros where no position looks it up, so the
// output needs no zeroing pass.
LaunchStatus embedding_backward(const EmbeddingBackwardParams& params, void* stream);

}  // namespace tt::kernels
