// Shared test helpers: the smoke config, error measures, a GPU guard.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <string>

#include "apps/report/training_run.h"
#include "apps/train/trainer.h"
#include "models/config.h"
#include "models/stage.h"
#include "models/transformer.h"

namespace tt::testing {

inline RunConfig smoke_config() {
  RunConfig c = load_run_config(std::string(TT_SOURCE_DIR) + "/configs/smoke.json");
  c.training.device = "cpu";
  c.training.log_every = 0;
  return c;
}

// ||a - b|| / ||b||, in float64; the measure every tolerance in the suite is stated in.
inline double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  auto x = a.detach().to(torch::kCPU, torch::kFloat64);
  auto y = b.detach().to(torch::kCPU, torch::kFloat64);
  const double denom = y.norm().item<double>();
  const double diff = (x - y).norm().item<double>();
  return denom == 0 ? diff : diff / denom;
}

// Removes a folder and everything under it, deepest entries first. Not fs::remove_all: in a program
// linked with the LibTorch 2.11 wheel that call binds to the copy libtorch.so exports, which jumps to a
// null pointer (a segfault after the test's work is done, seen on the GPU machine).
inline void remove_tree(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(fs::symlink_status(path, error))) {
    for (const auto& entry : fs::directory_iterator(path)) remove_tree(entry.path());
  }
  fs::remove(path, error);
}

inline torch::Tensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return torch::randint(1, vocab, {batch, seq}, gen, torch::kLong);
}

// Runs `fn`, expects a c10::Error whose message contains `fragment`.
inline void expect_error(const std::function<void()>& fn, const std::string& fragment) {
  try {
    fn();
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    EXPECT_NE(message.find(fragment), std::string::npos)
        << "error message lacks \"" << fragment << "\"; it was: " << message;
    return;
  }
  ADD_FAILURE() << "expected an error containing \"" << fragment << "\", but nothing was thrown";
}

// The smoke model with weights wider than the default init (std 0.3), so per-token losses and the logits
// of different tokens are well apart: a wrongly weighted mean or a greedy choice cannot hide in rounding.
inline Transformer spread_out_model(const StageSpec& spec, uint64_t seed) {
  ModelConfig m = smoke_config().model;
  m.init_std = 0.3;
  Transformer model(m, spec);
  model->init_weights(seed);
  return model;
}

// The smoke config on the GPU at `precision`, with clipping on (a graphed step captures the device-side
// clipping too).
inline RunConfig gpu_smoke_config(Precision precision, int64_t warmup_steps, int64_t num_steps) {
  RunConfig c = smoke_config();
  c.training.device = "cuda";
  c.training.dtype = precision;
  c.training.warmup_steps = warmup_steps;
  c.training.num_steps = num_steps;
  c.training.grad_clip = 1.0;
  return c;
}

// The stage with its step run eagerly (v4 without its graph: the same kernels, launched one by one).
inline StageSpec eager_step(StageSpec spec) {
  spec.step = StepKind::kEager;
  return spec;
}

// A whole training run of a fresh trainer, as the stage executables do it; returns the result JSON.
inline nlohmann::json train_result(const StageSpec& spec, const RunConfig& config, const torch::Device& device,
                                   std::ostream& log, const RunExtras& extras = {}) {
  Trainer trainer(spec, config, device);
  return run_training(trainer, extras, log);
}

#define TT_REQUIRE_GPU()                                                                   \
  do {                                                                                     \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU visible to LibTorch: skipped"; \
  } while (0)

}  // namespace tt::testing
