// The optimizer overlap's one promise (issue 27): updating each layer during the backward changes when the
// update runs, never what it computes. A run with the overlap and one without, from the same weights and
// batches, must give the same losses, weights and moments, bit for bit. Shared by the CPU and GPU suites.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/train/training_run.h"
#include "tests/helpers.h"

namespace tt::testing {

// What a run leaves after its last counted step: weights, moments, the optimizer's step count. Taken there,
// before the GPU's energy figure may run extra steps (as many as its counter needs: not the same in two runs).
struct TrainedState {
  std::map<std::string, torch::Tensor> weights;
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  int64_t steps = 0;
};

inline nlohmann::json train_keeping_state(Trainer& trainer, TrainedState& state) {
  RunExtras extras;
  extras.after_last_counted_step = [&](int64_t) {
    state.weights = trainer.model()->canonical_state();
    const Optimizer& o = trainer.optimizer();
    for (size_t i = 0; i < o.parameters().size(); ++i) {
      state.exp_avg.push_back(o.exp_avg(i).cpu().clone());
      state.exp_avg_sq.push_back(o.exp_avg_sq(i).cpu().clone());
    }
    state.steps = o.step_count();
  };
  std::ostringstream log;
  return run_training(trainer, extras, log);
}

// Trains `config` with and without the overlap; expects every loss, weight and moment bitwise equal.
inline void expect_overlap_changes_nothing(const StageSpec& spec, RunConfig config, const torch::Device& device) {
  SCOPED_TRACE(spec.name + " " + to_string(config.training.dtype) + " grad_clip " +
               std::to_string(config.training.grad_clip) + " grad_accum_steps " +
               std::to_string(config.training.grad_accum_steps) + " lr_schedule " + config.training.lr_schedule);
  TrainedState x, y;
  config.training.optimizer_overlap = true;
  Trainer overlapped(spec, config, device);
  const auto a = train_keeping_state(overlapped, x);
  config.training.optimizer_overlap = false;
  Trainer sequential(spec, config, device);
  const auto b = train_keeping_state(sequential, y);
  ASSERT_EQ(a["losses"].size(), b["losses"].size());
  for (size_t i = 0; i < a["losses"].size(); ++i)
    EXPECT_EQ(a["losses"][i].get<double>(), b["losses"][i].get<double>()) << "step " << i;
  for (const auto& [name, w] : y.weights) EXPECT_TRUE(torch::equal(x.weights.at(name), w)) << name;
  ASSERT_EQ(x.exp_avg.size(), y.exp_avg.size());
  for (size_t i = 0; i < y.exp_avg.size(); ++i) {
    EXPECT_TRUE(torch::equal(x.exp_avg[i], y.exp_avg[i])) << "exp_avg of parameter " << i;
    EXPECT_TRUE(torch::equal(x.exp_avg_sq[i], y.exp_avg_sq[i])) << "exp_avg_sq of parameter " << i;
  }
  EXPECT_EQ(x.steps, config.training.warmup_steps + config.training.num_steps);
  EXPECT_EQ(x.steps, y.steps);
  EXPECT_EQ(a["training"]["optimizer"]["overlap"].get<std::string>().rfind("each layer", 0), 0u)
      << a["training"]["optimizer"]["overlap"];
  EXPECT_EQ(b["training"]["optimizer"]["overlap"].get<std::string>().rfind("none", 0), 0u);
}

// The modes the promise covers: fp32 and bf16, clipping off and on, accumulation with a schedule.
inline std::vector<RunConfig> overlap_modes(const RunConfig& base) {
  std::vector<RunConfig> modes;
  for (Precision precision : {Precision::kFp32, Precision::kBf16})
    for (double clip : {0.0, 1.0})
      for (int64_t accum : {1, 3}) {
        RunConfig c = base;
        c.training.dtype = precision;
        c.training.grad_clip = clip;
        c.training.grad_accum_steps = accum;
        if (accum > 1) {
          c.training.lr_schedule = "cosine";
          c.training.lr_warmup_steps = 2;
          c.training.min_lr = 1e-4;
        }
        modes.push_back(c);
      }
  return modes;
}

}  // namespace tt::testing
