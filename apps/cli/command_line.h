// What every command line that links LibTorch shares: flags.h, error_message (which prints an exception's
// message without LibTorch's C++ backtrace), and how a tool's errors become its exit code.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/cli/flags.h"
#include "apps/train/error_message.h"

namespace tt {

// A bad flag or value: the user fixes the command line (exit code 2). Distinct from ConfigError, which a
// checkpoint with a malformed embedded config also throws (exit code 1: the checkpoint cannot be read).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The flags and --dtype of a tool that reads a checkpoint (export_safetensors, generate): the parsed flags and
// precision, or nothing after the help on out for --help; a bad command line or dtype throws UsageError.
struct FlagsWithDtype {
  cxxopts::ParseResult flags;
  Precision precision = Precision::kFp32;
};
inline std::optional<FlagsWithDtype> parse_flags_with_dtype(cxxopts::Options& options,
                                                            const std::vector<std::string>& args, std::ostream& out) {
  FlagsWithDtype parsed;
  try {
    parsed.flags = parse_flags(options, args);
    if (parsed.flags.count("help")) {
      out << options.help() << std::endl;
      return std::nullopt;
    }
    parsed.precision = parse_precision(parsed.flags["dtype"].as<std::string>(), "--dtype");
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
  return parsed;
}

// Runs a tool's body and returns its exit code; an exception ends it after "<program>: error: <message>" on
// err, with 2 for a UsageError and 1 for anything else.
inline int run_tool(const char* program, const std::function<int()>& body, std::ostream& err) {
  try {
    return body();
  } catch (const UsageError& e) {
    err << program << ": error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    err << program << ": error: " << error_message(e) << std::endl;
    return 1;
  }
}

}  // namespace tt
