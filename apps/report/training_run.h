// A whole training run as the stage executables do it, from a ready Trainer to its result JSON: the
// header line, the training loop (apps/train/loop.h), held-out evaluation between steps, the optional
// Kineto profile of extra steps, and the result file's contents.
#pragma once

#include <iosfwd>
#include <optional>

#include <nlohmann/json.hpp>

#include "apps/report/profiling.h"
#include "apps/train/evaluate.h"
#include "apps/train/trainer.h"

namespace tt {

struct RunExtras {
  // Held-out evaluation after every `eval_every` steps (0: none during training) and after the last step,
  // between steps and outside their timed regions. The result gains an "evaluation" object.
  std::optional<EvalData> eval_data;
  int64_t eval_every = 0;
  // profile.steps extra steps after the measured ones, recorded with Kineto; the result gains "profile".
  ProfileRequest profile;
};

// Trains with the run's data (synthetic tokens or the config's text file), then returns the result JSON.
nlohmann::json run_training(Trainer& trainer, const RunExtras& extras, std::ostream& log);

}  // namespace tt
