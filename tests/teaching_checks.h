// What the CPU and GPU tests of the debugging exercise (tests/test_teaching*.cpp) share: a model wide enough
// that the missing-init pitfall's loss is unmistakable, and the check that a pitfall stage computes v3's
// loss and gradients.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "apps/train/trainer.h"
#include "models/stage.h"
#include "tests/helpers.h"

namespace tt::testing {

// The smoke run with hidden 256: without initialisation a token's own embedding dominates the final
// hidden state, so the logit of the input token is about hidden_dim (|e|^2 / rms(e) for e ~ N(0, 1)),
// far above 10 ln(vocab) = 55 here; hidden 64 would give only about 64.
inline RunConfig wide_smoke_config() {
  RunConfig c = smoke_config();
  c.model.hidden_dim = 256;
  c.model.intermediate_dim = 512;
  c.training.batch_size = 2;
  c.training.seq_len = 16;
  return c;
}

inline double initial_loss(const StageSpec& spec, const RunConfig& config, const torch::Device& device) {
  Trainer trainer(spec, config, device);
  torch::NoGradGuard no_grad;
  const auto tokens =
      random_tokens(config.training.batch_size, config.training.seq_len + 1, config.model.vocab_size, 3).to(device);
  const auto seq = config.training.seq_len;
  return trainer.model()->loss(tokens.narrow(1, 0, seq), tokens.narrow(1, 1, seq)).item<double>();
}

// The pitfall stage and v3 as shipped, from the same weights on the same batch: the same loss and
// gradients to `rtol` (relative, per tensor).
inline void expect_same_as_v3(Pitfall pitfall, const torch::Device& device, double rtol) {
  const RunConfig config = smoke_config();
  const std::string what = std::string("--pitfall ") + stages::pitfall(pitfall).name;
  Trainer ours(stages::with_pitfall(stages::v3_custom(), pitfall), config, device);
  Trainer shipped(stages::with_pitfall(stages::v3_custom(), Pitfall::kNone), config, device);
  const auto tokens = random_tokens(4, config.training.seq_len + 1, config.model.vocab_size, 9).to(device);
  const auto inputs = tokens.narrow(1, 0, config.training.seq_len);
  const auto labels = tokens.narrow(1, 1, config.training.seq_len);
  const auto loss = ours.forward_backward(inputs, labels);
  const auto loss_ref = shipped.forward_backward(inputs, labels);
  EXPECT_LE(rel_error(loss, loss_ref), rtol)
      << what << ": loss " << loss.item<double>() << " vs v3's " << loss_ref.item<double>();
  const auto grads = ours.model()->canonical_grads();
  const auto grads_ref = shipped.model()->canonical_grads();
  ASSERT_EQ(grads.size(), grads_ref.size());
  // Every canonical tensor, so that the loop below cannot pass by running over none: the embedding, 9 per
  // layer (2 norms, q, k, v, o, gate, up, down), the final norm, and lm_head when the head is untied.
  ASSERT_EQ(grads.size(), 1 + 9 * static_cast<size_t>(config.model.n_layers) + 1 +
                              (config.model.tie_embeddings ? 0 : 1))
      << what;
  for (const auto& [name, grad] : grads) {
    ASSERT_TRUE(grad.defined()) << what << ": no gradient for " << name;
    ASSERT_TRUE(grads_ref.count(name) && grads_ref.at(name).defined()) << what << ": v3 has no gradient for " << name;
    EXPECT_LE(rel_error(grad, grads_ref.at(name)), rtol) << what << ": gradient of " << name;
  }
}

}  // namespace tt::testing
