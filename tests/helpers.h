// Shared test helpers, each once for the CPU and GPU suites: the smoke configs, error measures, the one GPU
// guard (TT_REQUIRE_GPU), fresh folders, running a stage's main in-process.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "apps/cli/stage_cli.h"
#include "apps/train/training_run.h"
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

// An empty folder for one test's files in the test temp folder, new on every call; the process id in its name
// keeps suites that run at the same time apart.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
  remove_tree(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The message of the E that fn throws, or "(nothing thrown)". Another exception propagates and fails the test:
// error_of<ConfigError> also checks that the refusal is a configuration error.
template <class E = std::exception>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// A stage executable's main run in this process: its exit code and what it wrote on stderr.
struct StageRun {
  int code = 0;
  std::string err;
};
// args without the program name (the stage's name is put first, as the executable's argv[0]).
inline StageRun run_stage(const StageSpec& spec, std::vector<std::string> args) {
  args.insert(args.begin(), spec.name);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);  // as main's
  ::testing::internal::CaptureStderr();
  const int code = stage_main(static_cast<int>(argv.size()) - 1, argv.data(), spec);
  return {code, ::testing::internal::GetCapturedStderr()};
}

#if defined(TT_BACKEND_CUDA) || defined(TT_BACKEND_HIP)
constexpr bool kBuiltWithKernels = true;
#else
constexpr bool kBuiltWithKernels = false;
#endif

// The GPU guard of every GPU test: skips without a GPU. With a GPU but a build without kernels (CMake found no
// nvcc/hipcc, which it reports only as a warning) the kernel tests would skip and the suite would look green:
// that fails, unless TT_ALLOW_NO_GPU_KERNELS=1 says the build is meant that way.
#define TT_REQUIRE_GPU()                                                                                   \
  do {                                                                                                     \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU: torch::cuda::is_available() is false";      \
    if (!::tt::testing::kBuiltWithKernels) {                                                               \
      const char* allow = std::getenv("TT_ALLOW_NO_GPU_KERNELS");                                          \
      if (allow != nullptr && std::string(allow) == "1")                                                   \
        GTEST_SKIP() << "no GPU kernels: built without TT_BACKEND_CUDA/HIP (TT_ALLOW_NO_GPU_KERNELS=1)";   \
      GTEST_FAIL() << "a GPU is visible but this build has no GPU kernels (no TT_BACKEND_CUDA/HIP: CMake "  \
                      "found no nvcc or hipcc); set TT_ALLOW_NO_GPU_KERNELS=1 if that is intended";        \
    }                                                                                                      \
  } while (false)

}  // namespace tt::testing
