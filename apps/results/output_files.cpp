#include "apps/results/output_files.h"

#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>

namespace tt {
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

// A path the file system would refuse for its length: a component longer than NAME_MAX once the longest
// suffix the program adds to it (a temporary file's ".tmp", say) is counted, or the whole over PATH_MAX.
std::optional<std::string> overlong_path(const std::string& path, size_t suffix) {
  if (path.size() + suffix >= PATH_MAX)
    return "the path is " + std::to_string(path.size()) + " characters long; at most " +
           std::to_string(PATH_MAX - 1 - suffix) + " are allowed";
  for (const auto& part : std::filesystem::path(path))
    if (part.string().size() + suffix > NAME_MAX)
      return "its part '" + part.string().substr(0, 40) + "...' is " + std::to_string(part.string().size()) +
             " characters long; the file system allows " + std::to_string(NAME_MAX) + " per name" +
             (suffix ? ", and the program adds up to " + std::to_string(suffix) + " for its temporary files" : "");
  return std::nullopt;
}

}  // namespace

std::optional<std::string> refuse_output_file(const char* what, const std::string& path, bool overwrite) {
  namespace fs = std::filesystem;
  if (path.empty()) return std::nullopt;
  // ".tmp" (written, then renamed into place) and ".trace.json" (beside a result) are the longest additions.
  if (const auto why = overlong_path(path, 16)) return std::string(what) + " '" + path.substr(0, 80) + "': " + *why;
  if (fs::is_directory(path)) return std::string(what) + " '" + path + "' is a folder; give a file path";
  if (!overwrite && fs::exists(path))
    return std::string(what) + " '" + path + "' exists; pass --overwrite to replace it or choose another path";
  const fs::path folder = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (const auto why = unwritable_folder(folder)) return std::string(what) + " '" + path + "': " + *why;
  return std::nullopt;
}

std::optional<std::string> refuse_output_folder(const char* what, const std::string& path) {
  if (path.empty()) return std::nullopt;
  // The folder's files (step_000123.pt.tmp) are short; the folder's own names and the whole path must fit.
  if (const auto why = overlong_path(path + "/step_000000000000.pt.tmp", 0))
    return std::string(what) + " '" + path.substr(0, 80) + "': " + *why;
  if (const auto why = unwritable_folder(path)) return std::string(what) + ": " + *why;
  return std::nullopt;
}

}  // namespace tt
