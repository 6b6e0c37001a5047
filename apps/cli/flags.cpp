#include "apps/cli/flags.h"

#include <map>
#include <ostream>

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
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() <= 2 || a.compare(0, 2, "--") != 0) continue;
    const size_t equals = a.find('=');
    const std::string name = a.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
    if (++given[name] == 2) throw ConfigError("command line: --" + name + " is given more than once; give it once");
    // An empty value is what a script's expansion that found nothing gives (--resume "$(ls ck/*.pt | tail -1)"
    // in an empty folder); taken as "not given", it would silently start over or write nothing.
    const bool empty_value = equals == std::string::npos ? i + 1 < args.size() && args[i + 1].empty() && r.count(name)
                                                         : equals + 1 == a.size();
    if (empty_value)
      throw ConfigError("command line: --" + name +
                        " was given an empty value (a script's expansion that found nothing?); give a value or "
                        "leave the flag out");
  }
  return r;
}

ToolFlags parse_tool_flags(cxxopts::Options& options, const std::vector<std::string>& args, std::ostream& out,
                           std::ostream& err) {
  ToolFlags parsed;
  try {
    parsed.flags = parse_flags(options, args);
  } catch (const ConfigError& e) {
    err << options.program() << ": error: " << e.what() << std::endl;
    parsed.exit_code = 2;
    return parsed;
  }
  if (parsed.flags.count("help")) {
    out << options.help() << std::endl;
    parsed.exit_code = 0;
  }
  return parsed;
}

}  // namespace tt
