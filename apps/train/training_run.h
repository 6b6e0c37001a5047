// A whole training run as the stage executables do it, from a ready Trainer to its result JSON: the
// header line, the training loop (apps/train/loop.h), held-out evaluation between steps, the optional
// Kineto profile of extra steps, and the result file's contents.
#pragma once

#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/train/profiling.h"
#include "apps/train/checkpointing.h"
#include "apps/train/distributed.h"
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
  // Data parallel (the trainer's runner is then a DataParallelStep): this rank trains its shard of every
  // global batch, only rank 0 profiles, and the result gains a "distributed" object. Every rank must call
  // run_training (its collectives run on all of them).
  DistributedContext* distributed = nullptr;
  // Called on every rank after the last counted step and the final evaluation, before any extra step
  // (--profile's, the energy figure's): work that must see the state of the last counted step, the
  // end-of-run checkpoint above all, goes here.
  std::function<void(int64_t steps_done)> after_last_counted_step;
  // A resume: the run continues with this step (Trainer::resume restored the rest), its data stream too.
  int64_t first_step = 0;
  // Checkpoints between steps, and after the last step or a stop (rank 0 alone writes them), into a folder
  // check_checkpoint_folder allowed.
  RunCheckpoints checkpoints;
  // Asked after every step and between the steps of what follows the last one; true ends the run there,
  // marked "interrupted" (data parallel: every rank must give the same answer at the same step). After the
  // last counted step it cuts the final evaluation, the --profile steps and the energy figure's extra steps.
  std::function<bool()> stop_requested;
};

// Trains with the run's data (synthetic tokens or the config's text file), then returns the result JSON.
// Order after the measured steps: final evaluation, extras.after_last_counted_step, the --profile steps, the
// result, and last the energy figure's extra steps where the measured window was too short for the counter
// (apps/train/energy.h: finish_energy), which only replace the result's energy fields.
nlohmann::json run_training(Trainer& trainer, const RunExtras& extras, std::ostream& log);

// The result's "distributed" object for a finished data-parallel run whose result is `result`: world size,
// backend, per-GPU and total throughput, the gradient all-reduce alone (timed here: collectives on every
// rank), and how far the ranks' weights are apart (0 when data parallel works).
nlohmann::json distributed_report(DistributedContext& context, Trainer& trainer, const nlohmann::json& result);

}  // namespace tt
