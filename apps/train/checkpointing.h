// Checkpoints during training: every N steps into a folder, named by the run's step, written atomically
// (models/checkpoint.h), keeping the newest K. The format is that of --save-checkpoint, which Python's
// torch.load reads; each file also holds what --resume needs to continue the run exactly, and which run wrote
// it and why (its run id and kind), so that a folder is only ever pruned of the current run's own files.
//
// The folder's rules, decided once before any work (check_checkpoint_folder):
//   - a new run writes only into a folder without checkpoints (of any run: --overwrite does not apply to
//     checkpoint folders, a run's checkpoints are never written over);
//   - a resume continues the run that wrote the resumed file: every other checkpoint in the folder must be
//     that run's, at or before the resumed step (a later one would be a fork of the same run);
//   - pruning (--keep-checkpoints) removes only this run's own periodic checkpoints, never the last step's,
//     a stop's, a --save-checkpoint file or a file it cannot prove is this run's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "apps/train/trainer.h"

namespace tt {

// The kinds a checkpoint file records (Checkpoint::kind).
constexpr const char* kPeriodicCheckpoint = "periodic";
constexpr const char* kLastCheckpoint = "last";
constexpr const char* kStopCheckpoint = "stop";
constexpr const char* kSavedCheckpoint = "saved";

struct CheckpointPolicy {
  std::string dir;    // empty: no checkpoints during training
  int64_t every = 0;  // steps between checkpoints; the last step and a stop on a signal write one too
  int64_t keep = 0;   // this run's newest periodic checkpoints kept, its older ones removed; 0: all
  bool enabled() const { return !dir.empty(); }
};

// A new run's identity: 16 hex digits from the clock, the process and the system's random device.
std::string new_run_id();

// dir/step_000123.pt: zero-padded, so names sort as steps do.
std::string checkpoint_path(const std::string& dir, int64_t run_step);
// Whether `name` (a file name, no folder) has that form.
bool is_checkpoint_name(const std::string& name);
// The files of that form in dir, oldest step first; none when dir does not exist.
std::vector<std::filesystem::path> checkpoints_in(const std::string& dir);

// The checkpoint folder of one run: its policy, its run id and the periodic files it may prune.
class RunCheckpoints {
 public:
  RunCheckpoints() = default;
  RunCheckpoints(CheckpointPolicy policy, std::string run_id, std::vector<std::filesystem::path> own_periodic = {});
  bool enabled() const { return policy_.enabled(); }
  const CheckpointPolicy& policy() const { return policy_; }
  const std::string& run_id() const { return run_id_; }
  // Writes trainer's checkpoint at run_step as `kind` (kPeriodicCheckpoint, kLastCheckpoint or kStopCheckpoint);
  // after a periodic one, removes this run's periodic checkpoints beyond the newest policy.keep. The path.
  std::string write(Trainer& trainer, int64_t run_step, const char* kind);

 private:
  CheckpointPolicy policy_;
  std::string run_id_;
  std::vector<std::filesystem::path> own_periodic_;  // oldest first
};

// Decides, before any work, whether the run may use policy.dir (the rules above) and returns the folder of
// this run. `resumed` is the --resume checkpoint's header (its path and run id), none for a new run; a resume
// of a file written before runs had an id continues under a new id. Throws ConfigError naming the folder and
// each file in the way, with what to do.
RunCheckpoints check_checkpoint_folder(const CheckpointPolicy& policy, const std::optional<CheckpointHeader>& resumed);

}  // namespace tt
