// What every command line of the project shares: parsing with cxxopts into a clear error, and printing an
// exception's message without LibTorch's C++ backtrace.
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "models/config.h"

namespace tt {

// Parses args (without the program name); a bad flag, a bad value or a stray argument throws ConfigError
// "command line: <what> (see --help)". Positional arguments declared with parse_positional are allowed.
cxxopts::ParseResult parse_flags(cxxopts::Options& options, const std::vector<std::string>& args);

// Checks, before any work, a file a program will write: not a folder, its folder creatable and writable (a
// probe file, removed at once), and, without `overwrite`, not there yet. The refusal ("<what> '<path>': why")
// if not; nothing for an empty path.
std::optional<std::string> refuse_output_file(const char* what, const std::string& path, bool overwrite);
// The same for a folder a program will write files into (created later, by the program).
std::optional<std::string> refuse_output_folder(const char* what, const std::string& path);

// The message for the user: c10::Error's without its backtrace, any other exception's what().
std::string error_message(const std::exception& error);

}  // namespace tt
