#include "apps/train/checkpointing.h"

#include <algorithm>
#include <cstdio>
#include <regex>

namespace tt {
namespace {

const std::regex kCheckpointName(R"(step_(\d+)\.pt)");

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t run_step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld.pt", static_cast<long long>(run_step));
  return (std::filesystem::path(dir) / name).string();
}

std::vector<std::filesystem::path> checkpoints_in(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<long long, fs::path>> found;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return {};
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, match, kCheckpointName))
      found.emplace_back(std::stoll(match[1].str()), entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

std::string write_periodic_checkpoint(const Trainer& trainer, const CheckpointPolicy& policy, int64_t run_step) {
  std::filesystem::create_directories(policy.dir);
  const std::string path = checkpoint_path(policy.dir, run_step);
  trainer.save_checkpoint(path, /*overwrite=*/true, run_step);
  if (policy.keep <= 0) return path;
  auto all = checkpoints_in(policy.dir);
  // Removed only after the new one is in place: a crash in between leaves one too many, never one too few.
  for (size_t i = 0; i + static_cast<size_t>(policy.keep) < all.size(); ++i) std::filesystem::remove(all[i]);
  return path;
}

}  // namespace tt
