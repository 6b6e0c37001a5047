// What every command line that links LibTorch shares: flags.h, and error_message, which prints an exception's
// message without LibTorch's C++ backtrace.
#pragma once

#include "apps/cli/flags.h"
#include "apps/train/error_message.h"
