// Checkpoints a user can trust, at the run level (issue 26): a checkpoint folder is only ever pruned of the
// current run's own periodic files, resumes into shared folders are refused by name, a stop signal after the
// last counted step still cuts the run short, a second signal leaves no temporary file, and bad paths and
// values are refused before any work.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/cli/stage_cli.h"
#include "apps/train/training_run.h"
#include "apps/train/checkpointing.h"
#include "apps/train/stop_signal.h"
#include "tests/helpers.h"

namespace tt {
namespace {

namespace fs = std::filesystem;
using testing::smoke_config;

RunConfig short_run(int64_t warmup, int64_t num) {
  RunConfig c = smoke_config();
  c.training.warmup_steps = warmup;
  c.training.num_steps = num;
  return c;
}

// Trains a whole run with checkpoints into `dir` under `run_id`; stops after `stop_after` steps if given.
nlohmann::json train_into(const RunConfig& c, const CheckpointPolicy& policy, const std::string& run_id,
                          int64_t stop_after = -1, const Checkpoint* resume = nullptr,
                          std::vector<fs::path> own_periodic = {}) {
  Trainer trainer(stages::v1_baseline(), c, torch::kCPU);
  RunExtras extras;
  if (resume) extras.first_step = trainer.resume(*resume);
  extras.checkpoints = RunCheckpoints(policy, run_id, std::move(own_periodic));
  int64_t asked = extras.first_step;
  extras.stop_requested = [&] { return ++asked == stop_after; };
  std::ostringstream log;
  return run_training(trainer, extras, log);
}

CheckpointHeader header_of(const std::string& path) { return read_checkpoint_header(path); }

std::string refusal(const CheckpointPolicy& policy, const std::optional<CheckpointHeader>& resumed) {
  try {
    check_checkpoint_folder(policy, resumed);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The data losses, each reproduced and now refused or harmless: a new run into a folder of another
// run's checkpoints, a resume into a folder holding another run's file, and a resume from an older step of
// the same run beside its later files (which pruning used to delete, newest-step-first).
TEST(CheckpointFolder, AnotherRunsFilesAreNeverWrittenBesideOrPruned) {
  const auto dir = testing::fresh_dir("tt_policy_other");
  const CheckpointPolicy policy{dir.string(), 1, 1};
  train_into(short_run(0, 3), policy, "run-a");
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_000002.pt", "step_000003.pt"}));

  const std::string fresh = refusal(policy, std::nullopt);
  EXPECT_NE(fresh.find("already holds 2 checkpoint(s) (step_000002.pt, step_000003.pt)"), std::string::npos) << fresh;

  // A file of run B beside A's: resuming A's newest refuses to prune or write beside it, naming it.
  Trainer(stages::v1_baseline(), short_run(0, 3), torch::kCPU)
      .save_checkpoint((dir / "step_000001.pt").string(), true, 0, {"run-b", kPeriodicCheckpoint});
  const std::string other = refusal(policy, header_of((dir / "step_000003.pt").string()));
  EXPECT_NE(other.find("step_000001.pt: written by run run-b, not by the resumed run run-a"), std::string::npos)
      << other;
  fs::remove(dir / "step_000001.pt");

  // An older step of A beside its later ones: a fork of the same run, refused.
  const std::string fork = refusal(policy, header_of((dir / "step_000002.pt").string()));
  EXPECT_NE(fork.find("step_000003.pt: step 3 of the same run, after the resumed step 2"), std::string::npos) << fork;
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_000002.pt", "step_000003.pt"})) << "nothing removed";
}

// A resume continues the run's own pruning (its periodic files only) and never removes its last step's file,
// a stop's or a file it cannot prove is its own.
TEST(CheckpointFolder, AResumePrunesOnlyItsOwnPeriodicFiles) {
  const auto dir = testing::fresh_dir("tt_policy_resume");
  const CheckpointPolicy policy{dir.string(), 2, 1};
  const RunConfig c = short_run(0, 9);
  const auto first = train_into(c, policy, "run-a", /*stop_after=*/5);
  ASSERT_EQ(first["interrupted"], true);
  // Periodic 2 (pruned by 4), periodic 4, and step 5, the stop's.
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_000004.pt", "step_000005.pt"}));
  const std::string stop_path = checkpoint_path(dir.string(), 5);
  EXPECT_EQ(read_checkpoint(stop_path).kind, kStopCheckpoint);

  const auto resumed = header_of(stop_path);
  const RunCheckpoints folder = check_checkpoint_folder(policy, resumed);
  EXPECT_EQ(folder.run_id(), "run-a") << "a resume continues the resumed run's identity";
  const Checkpoint ck = read_checkpoint(stop_path);
  Trainer trainer(stages::v1_baseline(), c, torch::kCPU);
  RunExtras extras;
  extras.first_step = trainer.resume(ck);
  extras.checkpoints = folder;
  std::ostringstream log;
  const auto second = run_training(trainer, extras, log);
  EXPECT_EQ(second["interrupted"], false);
  // Periodic 6 and 8 (keep 1: 4 and 6 pruned in turn), the stop at 5 and the last at 9 kept.
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_000005.pt", "step_000008.pt", "step_000009.pt"}));
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir.string(), 9)).kind, kLastCheckpoint);
}

// A periodic checkpoint at the very step a signal stops the run is the stop's: rewritten as such, so that no
// later pruning takes it.
TEST(CheckpointFolder, AStopAtAPeriodicStepIsRecordedAsTheStop) {
  const auto dir = testing::fresh_dir("tt_policy_stop_at_periodic");
  train_into(short_run(0, 9), {dir.string(), 2, 0}, "run-a", /*stop_after=*/4);
  EXPECT_EQ(names_in(dir), (std::vector<std::string>{"step_000002.pt", "step_000004.pt"}));
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir.string(), 4)).kind, kStopCheckpoint);
}

// A stop signal after the last counted step: the final evaluation and the profile are cut short, and the
// result says "interrupted" (it used to say false and go on for up to 34 s).
TEST(LateSignal, AfterTheLastStepCutsTheEvaluationAndTheProfile) {
  const auto dir = testing::fresh_dir("tt_late_signal");
  const std::string eval_file = (dir / "eval.txt").string();
  std::ofstream(eval_file) << std::string(4000, 'x');
  RunConfig c = short_run(0, 3);
  for (const bool profiled : {false, true}) {
    SCOPED_TRACE(profiled ? "with --profile" : "with the final evaluation");
    Trainer trainer(stages::v1_baseline(), c, torch::kCPU);
    RunExtras extras;
    if (profiled)
      extras.profile = {2, (dir / "trace.json").string()};
    else
      extras.eval_data = load_eval_data(eval_file, c.training.seq_len);
    int64_t asked = 0;
    extras.stop_requested = [&] { return ++asked > 3; };  // after the loop's three questions, one per step
    std::ostringstream log;
    const auto result = run_training(trainer, extras, log);
    EXPECT_EQ(result["interrupted"], true) << log.str();
    EXPECT_EQ(result["steps_done"], 3);
    EXPECT_FALSE(result.contains("evaluation")) << "a cut evaluation is not recorded";
    EXPECT_FALSE(result.contains("profile")) << "a cut profile is not recorded";
    EXPECT_NE(log.str().find("stop requested after the last step"), std::string::npos) << log.str();
  }
}

// A second signal during a write ends the process at once, and removes the write's temporary file first.
// In a child process: the handler exits it.
TEST(StopSignal, ASecondSignalDuringAWriteLeavesNoTemporaryFile) {
  const auto dir = testing::fresh_dir("tt_second_signal");
  const fs::path tmp = dir / "step_000007.pt.tmp";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    StopSignalGuard guard;
    raise(SIGTERM);  // the first: asks to stop
    if (stop_signal_received() != SIGTERM) _exit(3);
    const PendingFile pending(tmp.string());
    std::ofstream(tmp) << "half a checkpoint";
    raise(SIGTERM);  // the second: exits now
    _exit(4);        // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_FALSE(fs::exists(tmp)) << "the temporary file was left behind";
}

// Every one of these is refused with exit code 2, naming the flag, field or file, before any step: nothing
// is written.
TEST(RefusedBeforeAnyWork, EmptyPathsCollisionsOverlongNamesAndOverflowingProducts) {
  const auto dir = testing::fresh_dir("tt_refused_before_work");
  const std::string result = (dir / "r.json").string();
  const std::string ck = (dir / "ck").string();
  const std::vector<std::string> base = {"--config", std::string(TT_SOURCE_DIR) + "/configs/smoke.json",
                                         "--device", "cpu", "--num-steps", "1", "--warmup-steps", "0",
                                         "--output", result};
  const std::string long_name(300, 'd');
  for (const auto& [extra, phrase] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--resume", ""}, "--resume was given an empty value"},
           {{"--checkpoint-dir", ""}, "--checkpoint-dir was given an empty value"},
           {{"--save-checkpoint="}, "--save-checkpoint was given an empty value"},
           {{"--checkpoint-dir", ck, "--save-checkpoint", ck + "/step_000001.pt"}, "under a name of the form step_<N>.pt"},
           {{"--checkpoint-dir", (dir / long_name).string()}, "characters long; the file system allows 255 per name"},
           {{"--save-checkpoint", (dir / (long_name + ".pt")).string()}, "the file system allows 255 per name"},
           {{"--grad-accum-steps", "4611686018427387904"}, "batch_size x seq_len x grad_accum_steps must be at most"},
           {{"--num-steps", "1000000000000"}, "warmup_steps + num_steps must be at most"}}) {
    auto args = base;
    // The later flag wins in this list: drop base's --num-steps when the case gives its own.
    if (extra.front() == "--num-steps") args.erase(args.begin() + 4, args.begin() + 6);
    args.insert(args.end(), extra.begin(), extra.end());
    const auto [code, err] = testing::run_stage(stages::v1_baseline(), args);
    EXPECT_EQ(code, 2) << err;
    EXPECT_NE(err.find(phrase), std::string::npos) << "for " << extra.front() << ": " << err;
  }
  EXPECT_EQ(names_in(dir), std::vector<std::string>{}) << "nothing is written by a refused run";
  // --validate checks the same products.
  const auto [code, err] = testing::run_stage(stages::v1_baseline(), {"--validate", "--grad-accum-steps", "4611686018427387904"});
  EXPECT_EQ(code, 2) << err;
  EXPECT_NE(err.find("training.grad_accum_steps"), std::string::npos) << err;
}

}  // namespace
}  // namespace tt
