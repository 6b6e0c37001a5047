// What every command line of the project shares, without LibTorch (the compare tool links none): parsing with
// cxxopts into a clear error. The checks of the files a program will write are apps/results/output_files.h.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "apps/results/output_files.h"  // every command line checks its outputs
#include "models/config.h"

namespace tt {

// Parses args (without the program name); a bad flag, a bad value or a stray argument throws ConfigError
// "command line: <what> (see --help)". Positional arguments declared with parse_positional are allowed.
cxxopts::ParseResult parse_flags(cxxopts::Options& options, const std::vector<std::string>& args);

// A tool's flags (parse_flags), or the exit code it ends with at once: 2 after "<program>: error: <why>" on err
// for a bad command line, 0 after the help on out for --help (the options must declare "help").
struct ToolFlags {
  cxxopts::ParseResult flags;
  std::optional<int> exit_code;
};
ToolFlags parse_tool_flags(cxxopts::Options& options, const std::vector<std::string>& args, std::ostream& out,
                           std::ostream& err);

}  // namespace tt
