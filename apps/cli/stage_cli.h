// Command line of the stage executables: config file + flag overrides, validation before any GPU work,
// the run itself, the result file.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/stage.h"

namespace tt {

struct RunOptions {
  std::string output;           // result JSON; empty: results/<stage>_<config>_<dtype>_<time>.json
  bool overwrite = false;       // replace an existing result, trace or checkpoint file
  std::string save_checkpoint;
  std::string load_checkpoint;
  // Checkpoints during training (apps/train/checkpointing.h) and the exact continuation of a run.
  std::string checkpoint_dir;    // empty: none; set alone: one at the last step or at a stop on a signal
  int64_t checkpoint_every = 0;  // also every N steps
  int64_t keep_checkpoints = 0;  // newest N kept; 0: all
  std::string resume;            // a checkpoint of this run (same stage, model and training config)
  bool validate_only = false;   // print the effective config and exit
  bool doctor = false;
  std::string eval_data;        // held-out text file: evaluated after training (or instead, with eval_only)
  int64_t eval_every = 0;       // also evaluate every N steps during training; 0: only after the last
  bool eval_only = false;       // evaluate the load_checkpoint weights, no training
  int64_t profile_steps = 0;    // --profile: extra steps recorded with Kineto after the measured ones; 0 = off
  bool no_graph = false;        // run a graphed stage's step eagerly (the same kernels, launched one by one)
  std::optional<Pitfall> pitfall;  // --pitfall NAME: the debugging exercise (v3_custom only)
  // Data parallel (a launcher set RANK/WORLD_SIZE, OMPI_COMM_WORLD_* or SLURM_*): apps/train/distributed.h.
  int64_t dist_timeout_s = 300;    // rendezvous and NCCL watchdog: a dead or hung rank stops the run after it
  bool dist_timeout_given = false;
  std::string scaling_baseline;    // a 1-GPU result JSON: fills in the result's scaling efficiency
};

struct ParsedCommandLine {
  RunConfig config;
  RunOptions options;
  bool help = false;
  std::string help_text;
};

// Throws ConfigError (bad flags, files or values) with a message naming the flag or field.
ParsedCommandLine parse_command_line(const std::string& program, const std::vector<std::string>& args);

// main() of v1_baseline, v2_fused, v3_custom: returns the process exit code.
int stage_main(int argc, char** argv, const StageSpec& spec);

}  // namespace tt
