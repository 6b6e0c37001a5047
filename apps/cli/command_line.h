// What every command line that links LibTorch shares: flags.h, error_message (which prints an exception's
// message without LibTorch's C++ backtrace), and how a tool's errors become its exit code.
#pragma once

#include <functional>
#include <ostream>
#include <stdexcept>

#include "apps/cli/flags.h"
#include "apps/train/error_message.h"

namespace tt {

// A bad flag or value: the user fixes the command line (exit code 2). Distinct from ConfigError, which a
// checkpoint with a malformed embedded config also throws (exit code 1: the checkpoint cannot be read).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
