#include "apps/cli/command_line.h"

#include <c10/util/Exception.h>

namespace tt {

cxxopts::ParseResult parse_flags(cxxopts::Options& options, const std::vector<std::string>& args) {
  std::vector<const char*> argv{options.program().c_str()};
  for (const auto& a : args) argv.push_back(a.c_str());
  cxxopts::ParseResult r;
  try {
    r = options.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw ConfigError(std::string("command line: ") + e.what() + " (see --help)");
  }
  if (!r.unmatched().empty())
    throw ConfigError("command line: unexpected argument '" + r.unmatched().front() + "' (see --help)");
  return r;
}

std::string error_message(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

}  // namespace tt
