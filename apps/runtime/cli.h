// Command line of the stage executables: config file + flag overrides, validation before any GPU work,
// the run itself, the result file.
#pragma once

#include <string>
#include <vector>

#include "models/config.h"
#include "models/stage.h"

namespace tt {

struct RunOptions {
  std::string output;           // result JSON; empty: results/<stage>_<config>_<dtype>_<time>.json
  bool overwrite = false;
  std::string save_checkpoint;
  std::string load_checkpoint;
  bool validate_only = false;   // print the effective config and exit
  bool doctor = false;
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
