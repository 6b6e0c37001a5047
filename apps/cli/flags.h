// What every command line of the project shares, without LibTorch (the compare tool links none): parsing with
// cxxopts into a clear error, and the checks of the files and folders a program will write.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <cxxopts.hpp>

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

// Checks, before any work, a file a program will write: not a folder, its folder creatable and writable (a
// probe file, removed at once), and, without `overwrite`, not there yet. The refusal ("<what> '<path>': why")
// if not; nothing for an empty path.
std::optional<std::string> refuse_output_file(const char* what, const std::string& path, bool overwrite);
// The same for a folder a program will write files into (created later, by the program).
std::optional<std::string> refuse_output_folder(const char* what, const std::string& path);

}  // namespace tt
