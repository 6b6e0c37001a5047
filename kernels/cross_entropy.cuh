// Fused softmax cross-entropy launchers: loss = mean over rows whose label != ignore_index of
// logsumexp(logits[row]) - logits[row, label], for logits [rows, vocab] and int64 labels [rows].
// Plain pointers and sizes; inputs are checked by the op layer (kernels/ops/cross_entropy.cpp).
#pragma once

#include <cstdint>

#include "vendor.cuh"

namespace tt::kernels {

struct CrossEntropyForwardParams {
  const void* logits;     // [rows, vocab], contiguous, dtype
  const int64_t* labels;  // [rows]
  float* lse;             // [rows]: logsumexp of each row, kept for the backward
  float* row_loss;        // [rows] scratch: each row's loss, 0 for ignored rows
  float* loss;            // [1]: the mean (NaN when every row is ignored, as in LibTorch); nullptr: no mean
                          // (a caller that takes the rows chunk by chunk sums row_loss itself)
  float* num_valid;       // [1]: number of rows not ignored, kept for the backward; unused without `loss`
  int64_t rows;
  int64_t vocab;
  int64_t ignore_index;
};

struct CrossEntropyBackwardParams {
  const void* logits;      // [rows, vocab], contiguous, dtype
  const int64_t* labels;   // [rows]
  const float* lse;        // [rows], from the forward
  const float* grad_loss;  // [1]: gradient of the mean loss; nullptr: 1 (no tensor of ones to fill)
  const float* num_valid;  // [1], from the forward
  void* grad_logits;       // [rows, vocab], contiguous, dtype; may be `logits` itself (computed in place)
  int64_t rows;
  int64_t vocab;
  int64_t ignore_index;
};

// Per-row losses, then their mean in a fixed order (deterministic, and the count of valid rows stays
// on the device: no host synchronisation). A label outside [0, vocab) that is not ignore_index makes
// its row's loss NaN; the op layer cannot check labels on the GPU without a host synchronisation.
LaunchStatus cross_entropy_forward(const CrossEntropyForwardParams& params, DType dtype, void* stream);

// grad_logits[row, j] = (softmax(logits[row])_j - [j == label]) * grad_loss / num_valid, 0 on ignored
// rows. The softmax is recomputed from the saved logsumexp, never stored.
LaunchStatus cross_entropy_backward(const CrossEntropyBackwardParams& params, DType dtype, void* stream);

}  // namespace tt::kernels
