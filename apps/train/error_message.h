// How an exception reads for a user: c10::Error's message without LibTorch's C++ backtrace ("Exception raised
// from ..."), any other exception's what(). Every command line, and every message that quotes another error,
// goes through here.
#pragma once

#include <exception>
#include <string>

namespace tt {

std::string error_message(const std::exception& error);

}  // namespace tt
