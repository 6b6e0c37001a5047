#include "apps/cli/command_line.h"

#include <c10/util/Exception.h>

#include <map>

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
  // cxxopts keeps the last of a repeated flag: "--batch-size 4 ... --batch-size 8" would drop the 4 unsaid.
  std::map<std::string, int> given;
  for (const auto& a : args) {
    if (a.size() <= 2 || a.compare(0, 2, "--") != 0) continue;
    const std::string name = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (++given[name] == 2) throw ConfigError("command line: --" + name + " is given more than once; give it once");
  }
  return r;
}

std::string error_message(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

}  // namespace tt
