#include "apps/train/checkpointing.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <regex>

#include "apps/train/error_message.h"
#include "models/config.h"

namespace tt {
namespace {

const std::regex kCheckpointName(R"(step_(\d+)\.pt)");

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code error;
  return std::filesystem::equivalent(a, b, error);
}

}  // namespace

std::string new_run_id() {
  std::random_device device;
  const uint64_t clock = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  std::seed_seq seed{device(), device(), static_cast<unsigned>(clock), static_cast<unsigned>(clock >> 32),
                     static_cast<unsigned>(::getpid())};
  std::mt19937_64 mix(seed);
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(mix()));
  return id;
}

std::string checkpoint_path(const std::string& dir, int64_t run_step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld.pt", static_cast<long long>(run_step));
  return (std::filesystem::path(dir) / name).string();
}

bool is_checkpoint_name(const std::string& name) { return std::regex_match(name, kCheckpointName); }

std::vector<std::filesystem::path> checkpoints_in(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<long long, fs::path>> found;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return {};
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, kCheckpointName))
      found.emplace_back(std::stoll(match[1].str()), entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

RunCheckpoints::RunCheckpoints(CheckpointPolicy policy, std::string run_id,
                               std::vector<std::filesystem::path> own_periodic)
    : policy_(std::move(policy)), run_id_(std::move(run_id)), own_periodic_(std::move(own_periodic)) {}

std::string RunCheckpoints::write(Trainer& trainer, int64_t run_step, const char* kind) {
  std::filesystem::create_directories(policy_.dir);
  const std::string path = checkpoint_path(policy_.dir, run_step);
  // The folder check made sure no other run's file, and no later one of this run, is here: a file of this
  // name can only be this run's own, of this very step.
  trainer.save_checkpoint(path, /*overwrite=*/true, run_step, {run_id_, kind});
  if (std::string(kind) != kPeriodicCheckpoint) return path;
  own_periodic_.erase(std::remove_if(own_periodic_.begin(), own_periodic_.end(),
                                     [&](const std::filesystem::path& p) { return same_file(p, path); }),
                      own_periodic_.end());
  own_periodic_.emplace_back(path);
  // Removed only after the new one is in place: a crash in between leaves one too many, never one too few.
  while (policy_.keep > 0 && own_periodic_.size() > static_cast<size_t>(policy_.keep)) {
    std::error_code error;
    std::filesystem::remove(own_periodic_.front(), error);
    own_periodic_.erase(own_periodic_.begin());
  }
  return path;
}

RunCheckpoints check_checkpoint_folder(const CheckpointPolicy& policy,
                                       const std::optional<CheckpointHeader>& resumed) {
  const std::string run_id = resumed && !resumed->run_id.empty() ? resumed->run_id : new_run_id();
  if (!policy.enabled()) return RunCheckpoints(policy, run_id);
  const std::string folder = "--checkpoint-dir '" + policy.dir + "'";
  std::error_code error;
  if (std::filesystem::exists(policy.dir, error) && !std::filesystem::is_directory(policy.dir, error))
    throw ConfigError(folder + " is not a folder");
  const auto existing = checkpoints_in(policy.dir);
  for (const auto& path : existing)
    if (std::filesystem::is_directory(path, error))
      throw ConfigError(folder + ": '" + path.filename().string() +
                        "' is a folder where this run would write a checkpoint; move it away");
  if (!resumed) {
    if (existing.empty()) return RunCheckpoints(policy, run_id);
    std::string names;
    for (const auto& p : existing) names += (names.empty() ? "" : ", ") + p.filename().string();
    throw ConfigError(folder + " already holds " + std::to_string(existing.size()) + " checkpoint(s) (" + names +
                      "): a new run never writes into a folder with checkpoints, since they may be another run's "
                      "(--overwrite does not apply to checkpoint folders). --resume the newest to continue that run, "
                      "or choose another folder");
  }
  std::vector<std::filesystem::path> own_periodic;
  std::string problems;
  for (const auto& path : existing) {
    if (same_file(path, resumed->path)) {
      if (resumed->kind == kPeriodicCheckpoint) own_periodic.push_back(path);
      continue;
    }
    CheckpointHeader header;
    try {
      header = read_checkpoint_header(path.string());
    } catch (const std::exception& e) {
      problems += "\n  " + path.filename().string() + ": unreadable (" + error_message(e) + ")";
      continue;
    }
    if (header.run_id != resumed->run_id || header.run_id.empty()) {
      // A file without an id beside a resumed file without one may well be that run's, but nothing proves it:
      // it stays, and is never pruned, if it is not in the way of the steps to come.
      if (header.run_id.empty() && resumed->run_id.empty() && header.run_step <= resumed->run_step) continue;
      problems += "\n  " + path.filename().string() + ": written by " +
                  (header.run_id.empty() ? std::string("a run without an id") : "run " + header.run_id) +
                  ", not by the resumed run " + (resumed->run_id.empty() ? "(no id)" : resumed->run_id);
    } else if (header.run_step > resumed->run_step) {
      problems += "\n  " + path.filename().string() + ": step " + std::to_string(header.run_step) +
                  " of the same run, after the resumed step " + std::to_string(resumed->run_step) +
                  " (resuming here would fork the run and write over it)";
    } else if (header.kind == kPeriodicCheckpoint) {
      own_periodic.push_back(path);
    }
  }
  if (!problems.empty())
    throw ConfigError(folder + " holds checkpoints that the resumed run '" + resumed->path +
                      "' must not write beside or prune:" + problems +
                      "\nMove them away, resume the newest of this run, or choose another --checkpoint-dir");
  return RunCheckpoints(policy, run_id, std::move(own_periodic));
}

}  // namespace tt
