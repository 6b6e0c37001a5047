#include "apps/cli/flags.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <unistd.h>

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

namespace {

// Whether the run could create files in `folder` (and the folder itself, when missing): its nearest existing
// ancestor must be a folder that takes a probe file, written and removed at once. A probe also catches what
// permission bits do not show (root on /proc, a read-only mount). Nothing is left behind. The reason if not.
std::optional<std::string> unwritable_folder(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path existing = fs::absolute(folder, error);
  while (!fs::exists(existing, error) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, error)) return "'" + existing.string() + "' is not a folder";
  const fs::path probe = existing / (".tt_write_probe_" + std::to_string(::getpid()));
  const bool written = static_cast<bool>(std::ofstream(probe));
  fs::remove(probe, error);
  if (!written)
    return existing == fs::absolute(folder, error) ? "cannot write into folder '" + existing.string() + "'"
                                                   : "cannot create folder '" + folder.string() + "': '" +
                                                         existing.string() + "' is not writable";
  return std::nullopt;
}

}  // namespace

std::optional<std::string> refuse_output_file(const char* what, const std::string& path, bool overwrite) {
  namespace fs = std::filesystem;
  if (path.empty()) return std::nullopt;
  if (fs::is_directory(path)) return std::string(what) + " '" + path + "' is a folder; give a file path";
  if (!overwrite && fs::exists(path))
    return std::string(what) + " '" + path + "' exists; pass --overwrite to replace it or choose another path";
  const fs::path folder = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (const auto why = unwritable_folder(folder)) return std::string(what) + " '" + path + "': " + *why;
  return std::nullopt;
}

std::optional<std::string> refuse_output_folder(const char* what, const std::string& path) {
  if (path.empty()) return std::nullopt;
  if (const auto why = unwritable_folder(path)) return std::string(what) + ": " + *why;
  return std::nullopt;
}

}  // namespace tt
