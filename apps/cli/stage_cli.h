// Command line of the stage executables: config file + flag overrides into a RunConfig and RunOptions, then
// the run (apps/train/run.h: plan, checks, execution) and its summary lines.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "apps/train/run.h"
#include "models/config.h"
#include "models/stage.h"

namespace tt {

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
