// Checkpoints during training: every N steps into a folder, named by the run's step, written atomically
// (models/checkpoint.h), keeping the newest K. The format is that of --save-checkpoint, which Python's
// torch.load reads; each file also holds what --resume needs to continue the run exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/train/trainer.h"

namespace tt {

struct CheckpointPolicy {
  std::string dir;    // empty: no checkpoints during training
  int64_t every = 0;  // steps between checkpoints; the last step and a stop on a signal write one too
  int64_t keep = 0;   // newest checkpoints kept in dir, older ones of the form below removed; 0: all
  bool enabled() const { return !dir.empty(); }
};

// dir/step_000123.pt: zero-padded, so names sort as steps do.
std::string checkpoint_path(const std::string& dir, int64_t run_step);
// The files of that form in dir, oldest step first; none when dir does not exist.
std::vector<std::filesystem::path> checkpoints_in(const std::string& dir);

// Writes trainer's checkpoint at run_step (replacing one of the same step: the same run's state), then
// removes all but the newest policy.keep. Returns the path written.
std::string write_periodic_checkpoint(const Trainer& trainer, const CheckpointPolicy& policy, int64_t run_step);

}  // namespace tt
