// What every command line that links LibTorch shares: flags.h, and printing an exception's message without
// LibTorch's C++ backtrace.
#pragma once

#include <exception>
#include <string>

#include "apps/cli/flags.h"

namespace tt {

// The message for the user: c10::Error's without its backtrace, any other exception's what().
std::string error_message(const std::exception& error);

}  // namespace tt
