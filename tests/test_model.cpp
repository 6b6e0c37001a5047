#include <gtest/gtest.h>

#include <fstream>

#include <cmath>

#include "apps/train/trainer.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::random_tokens;
using testing::rel_error;
using testing::smoke_config;

TEST(Model, InitialLossIsNearLnVocab) {
  for (const auto& spec : stages::all()) {
    RunConfig c = smoke_config();
    Trainer trainer(spec, c, torch::kCPU);
    auto tokens = random_tokens(4, 33, c.model.vocab_size, 5);
    torch::NoGradGuard no_grad;
    auto loss = trainer.model()->loss(tokens.narrow(1, 0, 32), tokens.narrow(1, 1, 32)).item<double>();
    EXPECT_NEAR(loss, std::log(static_cast<double>(c.model.vocab_size)), 0.1) << spec.name;
  }
}

TEST(Model, EveryParameterReceivesAGradient) {
  // Tied and untied heads: an untied head adds lm_head.weight, which must receive a gradient too.
  for (bool tied : {true, false}) {
    for (const auto& spec : stages::all()) {
      RunConfig c = smoke_config();
      c.model.tie_embeddings = tied;
      Trainer trainer(spec, c, torch::kCPU);
      auto tokens = random_tokens(2, 17, 256, 6);
      trainer.forward_backward(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16));
      const auto grads = trainer.model()->canonical_grads();
      // The loop below proves nothing if it runs over fewer tensors than the model has: the embedding, 9 per
      // layer (2 norms, q, k, v, o, gate, up, down), the final norm, and lm_head when the head is untied.
      const size_t expected = 1 + 9 * static_cast<size_t>(c.model.n_layers) + 1 + (tied ? 0 : 1);
      EXPECT_EQ(grads.size(), expected) << spec.name << (tied ? " (tied)" : " (untied)");
      EXPECT_EQ(grads.count("lm_head.weight"), tied ? 0u : 1u) << spec.name;
      for (const auto& [name, grad] : grads) {
        ASSERT_TRUE(grad.defined()) << spec.name << ": " << name;
        EXPECT_GT(grad.abs().sum().item<double>(), 0) << spec.name << ": " << name;
      }
    }
  }
}

// The gathered casts a sharded optimizer keeps in bf16 autocast runs (v2, v3 under ZeRO-1): the forward reads them
// where autocast would cast the fp32 weights, so the loss and every gradient are bitwise those of autocast's casts;
// enabling them twice is refused, and so is reading one outside autocast.
TEST(Model, GatheredCastsGiveAutocastsLossAndGradientsBitwise) {
  RunConfig c = smoke_config();
  c.training.dtype = Precision::kBf16;
  Trainer trainer(stages::v3_custom(), c, torch::kCPU);
  auto tokens = random_tokens(2, 17, c.model.vocab_size, 8);
  const auto x = tokens.narrow(1, 0, 16), y = tokens.narrow(1, 1, 16);
  auto model = trainer.model();
  const double plain = trainer.forward_backward(x, y).item<double>();
  const auto plain_grads = model->canonical_grads();
  model->zero_grad();
  model->enable_gathered_casts(torch::kBFloat16);
  EXPECT_THROW(model->enable_gathered_casts(torch::kBFloat16), c10::Error);
  const double cast = trainer.forward_backward(x, y).item<double>();
  EXPECT_EQ(cast, plain);
  for (const auto& [name, grad] : model->canonical_grads())
    EXPECT_TRUE(torch::equal(grad, plain_grads.at(name))) << name;
  auto* projection = model->projection_of(model->layers[0]->as<BlockImpl>()->self_attn->o_proj->weight);
  ASSERT_NE(projection, nullptr);
  EXPECT_THROW(projection->forward(torch::randn({2, c.model.hidden_dim})), c10::Error);  // no autocast here
  model->disable_gathered_casts();
  EXPECT_NO_THROW(projection->forward(torch::randn({2, c.model.hidden_dim})));
}

TEST(Model, TiedHeadSharesTheEmbeddingStorage) {
  Transformer model(smoke_config().model, stages::v1_baseline());
  EXPECT_EQ(model->lm_head_weight.data_ptr(), model->embed_tokens->weight.data_ptr());
  size_t params = 0;
  for (const auto& p : model->named_parameters()) params += p.value().data_ptr() == model->embed_tokens->weight.data_ptr();
  EXPECT_EQ(params, 1u) << "the tied head must not be a second parameter";
  auto layout = model->canonical_layout();
  EXPECT_EQ(layout.front().name, "model.embed_tokens.weight");
  for (const auto& s : layout) EXPECT_NE(s.name, "lm_head.weight");
}

TEST(Model, CanonicalNamesFollowHuggingFaceLlama) {
  for (const auto& spec : {stages::v1_baseline(), stages::v2_fused()}) {
    Transformer model(smoke_config().model, spec);
    auto state = model->canonical_state();
    for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                             "model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
                             "model.layers.1.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                             "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                             "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                             "model.norm.weight"})
      EXPECT_TRUE(state.count(name)) << spec.name << " lacks " << name;
    EXPECT_EQ(state.at("model.layers.0.self_attn.k_proj.weight").sizes(), (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(state.size(), 1u + 2 * 9 + 1);
  }
}

TEST(Model, SameSeedGivesIdenticalCanonicalWeightsInEveryStage) {
  auto reference = Transformer(smoke_config().model, stages::v1_baseline());
  reference->init_weights(42);
  auto expected = reference->canonical_state();
  for (const auto& spec : stages::all()) {
    Transformer model(smoke_config().model, spec);
    model->init_weights(42);
    for (const auto& [name, value] : model->canonical_state())
      EXPECT_TRUE(torch::equal(value, expected.at(name))) << spec.name << ": " << name;
  }
  auto w = expected.at("model.layers.0.mlp.down_proj.weight");
  EXPECT_NEAR(w.std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(w.mean().item<double>(), 0.0, 0.002);
}

TEST(Model, UntiedHeadIsItsOwnParameter) {
  ModelConfig c = smoke_config().model;
  c.tie_embeddings = false;
  Transformer model(c, stages::v1_baseline());
  model->init_weights(1);
  EXPECT_NE(model->lm_head_weight.data_ptr(), model->embed_tokens->weight.data_ptr());
  EXPECT_TRUE(model->canonical_state().count("lm_head.weight"));
}

TEST(Model, LoadCanonicalStateRejectsMissingExtraAndMisshapedTensors) {
  Transformer model(smoke_config().model, stages::v2_fused());
  auto state = model->canonical_state();
  auto missing = state;
  missing.erase("model.norm.weight");
  EXPECT_THROW(model->load_canonical_state(missing), c10::Error);
  auto extra = state;
  extra["model.layers.9.mlp.up_proj.weight"] = torch::zeros({1});
  EXPECT_THROW(model->load_canonical_state(extra), c10::Error);
  auto bad = state;
  bad["model.norm.weight"] = torch::zeros({3});
  EXPECT_THROW(model->load_canonical_state(bad), c10::Error);
}

// Every stage and dtype: v3 and v4 keep their optimizer state in our AdamW (step counter and rate on the
// device), and v4 in bf16 also keeps bf16 compute copies that a load must rebuild from the masters.
TEST(Checkpoint, SaveLoadGivesIdenticalLogitsAndOptimizerState) {
  for (const auto& spec : stages::all())
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(spec.name + " " + to_string(precision));
    RunConfig c = smoke_config();
    c.training.dtype = precision;
    Trainer a(spec, c, torch::kCPU);
    auto tokens = random_tokens(2, 17, 256, 9);
    auto x = tokens.narrow(1, 0, 16), y = tokens.narrow(1, 1, 16);
    for (int i = 0; i < 3; ++i) a.step(x, y);
    const std::string path = ::testing::TempDir() + "/ck_" + spec.name + "_" + to_string(precision) + ".pt";
    a.save_checkpoint(path, /*overwrite=*/true);

    c.training.seed = 1234;  // different initial weights, so the load must overwrite them
    Trainer b(spec, c, torch::kCPU);
    b.load_checkpoint(path);
    auto logits = [&](Trainer& t) {
      torch::NoGradGuard no_grad;  // at the trainer's precision, as the step runs it (v4's bf16 copies need it)
      return t.model()->forward(x);
    };
    EXPECT_TRUE(torch::equal(logits(a), logits(b))) << spec.name;
    EXPECT_EQ(b.optimizer().step_count(), 3);
    for (size_t i = 0; i < a.optimizer().parameters().size(); ++i) {
      EXPECT_TRUE(torch::equal(a.optimizer().exp_avg(i), b.optimizer().exp_avg(i))) << spec.name;
      EXPECT_TRUE(torch::equal(a.optimizer().exp_avg_sq(i), b.optimizer().exp_avg_sq(i))) << spec.name;
    }
    // The next step continues identically.
    EXPECT_EQ(a.step(x, y).item<double>(), b.step(x, y).item<double>());
    EXPECT_TRUE(torch::equal(logits(a), logits(b)));
  }
}

TEST(Checkpoint, IsPortableBetweenStages) {
  RunConfig c = smoke_config();
  Trainer v1(stages::v1_baseline(), c, torch::kCPU);
  auto tokens = random_tokens(2, 17, 256, 9);
  v1.step(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16));
  const std::string path = ::testing::TempDir() + "/ck_portable.pt";
  v1.save_checkpoint(path, /*overwrite=*/true);
  c.training.seed = 99;
  Trainer v2(stages::v2_fused(), c, torch::kCPU);
  v2.load_checkpoint(path);
  for (const auto& [name, value] : v1.model()->canonical_state())
    EXPECT_TRUE(torch::equal(value, v2.model()->canonical_state().at(name))) << name;
}

TEST(Checkpoint, MismatchedConfigAndForeignFilesFailClearly) {
  RunConfig c = smoke_config();
  Trainer a(stages::v1_baseline(), c, torch::kCPU);
  const std::string path = ::testing::TempDir() + "/ck_mismatch.pt";
  a.save_checkpoint(path, /*overwrite=*/true);
  c.model.n_layers = 3;
  Trainer b(stages::v1_baseline(), c, torch::kCPU);
  try {
    b.load_checkpoint(path);
    FAIL() << "expected a config mismatch error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_layers: checkpoint has 2, this run has 3"), std::string::npos) << e.what();
  }
  const std::string foreign = ::testing::TempDir() + "/not_a_checkpoint.pt";
  std::ofstream(foreign) << "hello";
  EXPECT_THROW(b.load_checkpoint(foreign), c10::Error);
}

}  // namespace
}  // namespace tt
