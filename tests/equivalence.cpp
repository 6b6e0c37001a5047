#include "tests/equivalence.h"

#include <limits>

#include "models/reference.h"
#include "tests/helpers.h"

namespace tt::testing {

StageSnapshot snapshot(Trainer& trainer, const torch::Tensor& inputs, const torch::Tensor& labels) {
  StageSnapshot s;
  {
    torch::NoGradGuard no_grad;  // the model's forward runs at the trainer's precision
    s.logits = trainer.model()->forward(inputs).to(torch::kCPU, torch::kFloat32);
  }
  trainer.optimizer().zero_grad();
  s.loss = trainer.forward_backward(inputs, labels).item<double>();
  s.grads = trainer.model()->canonical_grads();
  trainer.optimizer().zero_grad();
  return s;
}

namespace {

// The gradient-name check both tolerance checks share: one failure naming every unmatched tensor.
void expect_same_gradient_names(const Comparison& c, const std::string& what) {
  EXPECT_FALSE(c.grad_rel.empty()) << what << ": gradients: none compared (no canonical tensor has a gradient on "
                                   << "both sides)";
  std::string list;
  for (const auto& entry : c.unmatched_grads) list += "\n  " + entry;
  EXPECT_TRUE(c.unmatched_grads.empty()) << what << ": gradients: the candidate's gradient names differ from the "
                                         << "reference's:" << list;
}

}  // namespace

void expect_fp32_equivalent(const Comparison& c, const std::string& what) {
  EXPECT_LT(c.loss_rel, 1e-5) << what << ": loss";
  EXPECT_LT(c.logits_rel, 1e-4) << what << ": logits";
  expect_same_gradient_names(c, what);
  EXPECT_LT(c.max_grad_rel(), 1e-4) << what << ": gradients: worst " << c.worst_grad();
}

void expect_bf16_equivalent(const Comparison& candidate, const Comparison& baseline, const std::string& what) {
  constexpr double kFloor = 1e-4, kLossFloor = 2.5e-4;
  EXPECT_LE(candidate.loss_rel, 2 * baseline.loss_rel + kLossFloor) << what << ": loss";
  EXPECT_LE(candidate.logits_rel, 2 * baseline.logits_rel + kFloor) << what << ": logits";
  expect_same_gradient_names(candidate, what);
  // The baseline (v1 in bf16 against v1 in fp32) must itself have compared every name the candidate did:
  // a name it lacks would have no budget, and skipping it would hide the candidate's error there.
  EXPECT_FALSE(baseline.grad_rel.empty()) << what << ": gradients: the baseline compared none";
  for (const auto& [name, error] : candidate.grad_rel) {
    auto it = baseline.grad_rel.find(name);
    if (it == baseline.grad_rel.end()) {
      ADD_FAILURE() << what << ": gradients: " << name << " has no baseline error to measure against";
      continue;
    }
    EXPECT_LE(error, 2 * it->second + kFloor) << what << ": gradients: " << name;
  }
}

Comparison compare(const StageSnapshot& a, const StageSnapshot& b) {
  Comparison c;
  c.loss_rel = std::abs(a.loss - b.loss) / std::abs(b.loss);
  // rel_error broadcasts: logits of another shape (a [1, ...] candidate, say) must not be compared that way.
  c.logits_rel = a.logits.defined() && b.logits.defined() && a.logits.sizes() == b.logits.sizes()
                     ? rel_error(a.logits, b.logits)
                     : std::numeric_limits<double>::infinity();
  for (const auto& [name, grad] : b.grads) {
    auto it = a.grads.find(name);
    if (it == a.grads.end()) {
      c.unmatched_grads.push_back(name + " (the candidate has no such tensor)");
    } else if (!grad.defined()) {
      c.unmatched_grads.push_back(name + " (no gradient in the reference)");
    } else if (!it->second.defined()) {
      c.unmatched_grads.push_back(name + " (no gradient in the candidate)");
    } else if (it->second.sizes() != grad.sizes()) {
      c.unmatched_grads.push_back(name + " (shapes differ)");
    } else {
      c.grad_rel[name] = rel_error(it->second, grad);
    }
  }
  for (const auto& [name, grad] : a.grads)
    if (!b.grads.count(name)) c.unmatched_grads.push_back(name + " (the reference has no such tensor)");
  return c;
}

EquivalenceRun run_equivalence(const StageSpec& candidate_spec, const RunConfig& candidate_config,
                               const StageSpec& reference_spec, const RunConfig& config, const torch::Device& device,
                               int steps) {
  TORCH_CHECK(to_json(candidate_config.model) == to_json(config.model), "equivalence: the model configs differ");
  Trainer reference(reference_spec, config, device);
  Trainer candidate(candidate_spec, candidate_config, device);
  candidate.model()->load_canonical_state(reference.model()->canonical_state());

  const auto& t = config.training;
  const int64_t vocab = config.model.vocab_size;
  auto batch = [&](uint64_t seed) {
    auto tokens = random_tokens(t.batch_size, t.seq_len + 1, vocab, seed).to(device);
    auto labels = tokens.narrow(1, 1, t.seq_len).clone();
    labels.index_put_({0, 0}, reference::kIgnoreIndex);  // exercise the ignore index in every stage
    return std::make_pair(tokens.narrow(1, 0, t.seq_len).contiguous(), labels);
  };

  EquivalenceRun run;
  auto [inputs, labels] = batch(1000);
  run.reference.push_back(snapshot(reference, inputs, labels));
  run.candidate.push_back(snapshot(candidate, inputs, labels));
  run.checkpoints.push_back(compare(run.candidate.back(), run.reference.back()));
  // Fixed batch buffers, as the training loop keeps them: a graphed stage replays reads of these addresses.
  auto step_inputs = torch::empty_like(inputs), step_labels = torch::empty_like(labels);
  for (int i = 0; i < steps; ++i) {
    auto [x, y] = batch(2000 + static_cast<uint64_t>(i));
    step_inputs.copy_(x);
    step_labels.copy_(y);
    reference.step(step_inputs, step_labels);
    candidate.step(step_inputs, step_labels);
  }
  run.reference.push_back(snapshot(reference, inputs, labels));
  run.candidate.push_back(snapshot(candidate, inputs, labels));
  run.checkpoints.push_back(compare(run.candidate.back(), run.reference.back()));
  return run;
}

}  // namespace tt::testing
