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
  bool validate_only = false;   // print the effective config and exit
  bool doctor = false;
  std::string eval_data;        // held-out text file: evaluated after training (or instead, with eval_only)
  int64_t eval_every = 0;       // also evaluate every N steps during training; 0: only after the last
  bool eval_only = false;       // evaluate the load_checkpoint weights, no training
  int64_t profile_steps = 0;    // --profile: extra steps recorded with Kineto after the measured ones; 0 = off
  bool no_graph = false;        // run a graphed stage's step eagerly (the same kernels, launched one by one)
  std::optional<Pitfall> pitfall;  // --pitfall NAME: the debugging exercise (v3_custom only)
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
