// The trainer's run control on the CPU (issue 23): the learning-rate schedule against its closed form and
// in every optimizer, gradient accumulation against one large batch in every stage, periodic checkpoints,
// an interrupted and resumed run against the uninterrupted one (bitwise) in every stage, refused resumes,
// and bad flags and config fields.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/cli/stage_cli.h"
#include "apps/train/run_result.h"
#include "apps/train/training_run.h"
#include "apps/train/checkpointing.h"
#include "kernels/ops/adamw.h"
#include "tests/adamw_reference.h"
#include "tests/helpers.h"

namespace tt {
namespace {

using testing::fresh_dir;
using testing::run_stage;
using testing::smoke_config;

// v3 as shipped and v4 on the CPU (its step runs eagerly there): every stage's components.
std::vector<StageSpec> all_stages() {
  return {stages::v1_baseline(), stages::v2_fused(), stages::v3_custom(), stages::v4_ultra()};
}

std::string config_error(const RunConfig& c) {
  try {
    validate(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// The smoke config with a decaying schedule over warmup + num steps: a 2-step ramp, then down to 1e-4.
RunConfig scheduled(const std::string& kind, int64_t warmup, int64_t num) {
  RunConfig c = smoke_config();
  c.training.warmup_steps = warmup;
  c.training.num_steps = num;
  c.training.lr_schedule = kind;
  c.training.lr_warmup_steps = 2;
  c.training.min_lr = 1e-4;
  return c;
}

// ---- Schedule -----------------------------------------------------------------------------------------

TEST(LrSchedule, MatchesTheClosedFormAtChosenSteps) {
  LrSchedule s;
  s.peak_lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 10;
  s.total_steps = 110;
  const double pi = std::acos(-1.0);
  for (auto kind : {LrScheduleKind::kConstant, LrScheduleKind::kCosine, LrScheduleKind::kLinear}) {
    s.kind = kind;
    EXPECT_DOUBLE_EQ(lr_at(s, 1), 1e-4);  // the ramp from 0: peak / W at the first step
    EXPECT_DOUBLE_EQ(lr_at(s, 5), 5e-4);
    EXPECT_EQ(lr_at(s, 10), 1e-3);  // exactly the peak at the end of the ramp
  }
  s.kind = LrScheduleKind::kConstant;
  for (int step : {11, 60, 110, 500}) EXPECT_EQ(lr_at(s, step), 1e-3) << step;  // exactly: no arithmetic
  s.kind = LrScheduleKind::kCosine;
  EXPECT_DOUBLE_EQ(lr_at(s, 35), 1e-4 + 9e-4 * 0.5 * (1 + std::cos(pi * 0.25)));
  EXPECT_DOUBLE_EQ(lr_at(s, 60), 5.5e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 110), 1e-4);  // min_lr at the last step
  EXPECT_DOUBLE_EQ(lr_at(s, 200), 1e-4);  // and after it
  s.kind = LrScheduleKind::kLinear;
  EXPECT_DOUBLE_EQ(lr_at(s, 35), 1e-3 - 9e-4 * 0.25);
  EXPECT_DOUBLE_EQ(lr_at(s, 60), 5.5e-4);
  EXPECT_DOUBLE_EQ(lr_at(s, 110), 1e-4);
  s.warmup_steps = 0;  // no ramp: the decay starts at the first step
  EXPECT_DOUBLE_EQ(lr_at(s, 1), 1e-3 - 9e-4 / 110);
}

TEST(LrSchedule, ConfigSpansEveryOptimizerStep) {
  RunConfig c = smoke_config();
  c.training.lr_schedule = "cosine";
  c.training.warmup_steps = 3;
  c.training.num_steps = 7;
  c.training.lr_warmup_steps = 2;
  c.training.min_lr = 1e-4;
  const LrSchedule s = lr_schedule_of(c.training);
  EXPECT_EQ(s.kind, LrScheduleKind::kCosine);
  EXPECT_EQ(s.total_steps, 10);  // the unmeasured warm-up steps count
  EXPECT_EQ(s.warmup_steps, 2);
  EXPECT_EQ(s.peak_lr, c.training.learning_rate);
  EXPECT_EQ(s.min_lr, 1e-4);
}

// Our AdamW (the v3/v4 optimizer) on the CPU against LibTorch's with the rate set per step on its param group.
TEST(LrSchedule, OurAdamWFollowsTheScheduleLikeTorchAdamW) {
  for (auto kind : {LrScheduleKind::kCosine, LrScheduleKind::kLinear}) {
    ops::AdamWHyperparameters h;
    h.lr = 1e-2;
    h.schedule.kind = kind;
    h.schedule.min_lr = 1e-3;
    h.schedule.warmup_steps = 5;
    h.schedule.total_steps = 30;
    const auto r = testing::compare_with_torch_adamw({{7}, {33, 17}}, h, 30, torch::kCPU);
    EXPECT_LT(r.max_param_rel, 1e-5);
    EXPECT_LT(r.max_moment_rel, 1e-5);
    EXPECT_EQ(r.state[ops::kAdamWLr].item<float>(), static_cast<float>(1e-3));  // min_lr at the last step
  }
}

// The three optimizers behind the stages (v1 LibTorch's param group, v2 at::_fused_adamw_, v3/v4 ours) take
// the same scheduled steps: the same weights after training with a cosine schedule, which differ clearly
// from those of a constant rate.
TEST(LrSchedule, EveryOptimizerKindAppliesTheSchedule) {
  const RunConfig c = scheduled("cosine", 1, 6);
  RunConfig constant = c;
  constant.training.lr_schedule = "constant";
  constant.training.lr_warmup_steps = 0;
  constant.training.min_lr = 0;
  auto weights_after = [](OptimizerKind kind, const RunConfig& config) {
    StageSpec spec = stages::v1_baseline();
    spec.optimizer = kind;
    Trainer trainer(spec, config, torch::kCPU);
    std::ostringstream log;
    run_training(trainer, {}, log);
    return trainer.model()->canonical_state();
  };
  const auto reference = weights_after(OptimizerKind::kTorchAdamW, c);
  const auto unscheduled = weights_after(OptimizerKind::kTorchAdamW, constant);
  const auto& name = reference.begin()->first;
  EXPECT_GT(testing::rel_error(unscheduled.at(name), reference.at(name)), 1e-4) << "the schedule changed nothing";
  for (auto kind : {OptimizerKind::kAtenFusedAdamW, OptimizerKind::kOurAdamW}) {
    const auto w = weights_after(kind, c);
    for (const auto& [n, t] : reference)
      EXPECT_LT(testing::rel_error(w.at(n), t), 1e-4) << implementation(kind).name << " " << n;
  }
}

TEST(LrSchedule, ResultRecordsTheScheduleAndEveryStepsRate) {
  const RunConfig c = scheduled("linear", 2, 4);
  std::ostringstream log;
  const auto r = testing::train_result(stages::v3_custom(), c, torch::kCPU, log);
  const auto& s = r.at("training").at("optimizer").at("lr_schedule");
  EXPECT_EQ(s.at("kind"), "linear");
  EXPECT_EQ(s.at("total_steps"), 6);
  EXPECT_EQ(s.at("lr_warmup_steps"), 2);
  ASSERT_EQ(r.at("lr").size(), 6u);
  const double peak = c.training.learning_rate;
  EXPECT_DOUBLE_EQ(r["lr"][0].get<double>(), peak / 2);
  EXPECT_DOUBLE_EQ(r["lr"][1].get<double>(), peak);
  EXPECT_DOUBLE_EQ(r["lr"][5].get<double>(), 1e-4);
  EXPECT_EQ(r.at("interrupted"), false);
  EXPECT_NO_THROW(validate_result_json(r));

  // The checker holds the new fields to their shape: a rate per recorded step, a bool for the stop.
  auto rejects = [](const nlohmann::json& broken, const std::string& fragment) {
    try {
      validate_result_json(broken);
      ADD_FAILURE() << "validate_result_json accepted a result it should refuse with \"" << fragment << "\"";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto short_rates = r;
  short_rates["lr"].erase(short_rates["lr"].size() - 1);
  rejects(short_rates, "\"lr\" has 5 entries but \"losses\" has 6");
  auto bad_stop = r;
  bad_stop["interrupted"] = "no";
  rejects(bad_stop, "field \"interrupted\" has the wrong type");
  auto no_kind = r;
  no_kind["training"]["optimizer"]["lr_schedule"].erase("kind");
  rejects(no_kind, "field \"training.optimizer.lr_schedule.kind\" is missing");
}

// ---- Gradient accumulation ------------------------------------------------------------------------------

// k micro-batches of B rows = one batch of k x B rows: the same rows (drawn in the same order), the same
// start weights, the same updates up to fp32 summation order.
TEST(GradAccumulation, FourMicroBatchesEqualOneBatchOfFourTimesTheRowsInEveryStage) {
  RunConfig accumulated = smoke_config();
  accumulated.training.warmup_steps = 1;
  accumulated.training.num_steps = 4;
  accumulated.training.batch_size = 2;
  accumulated.training.grad_accum_steps = 4;
  accumulated.training.grad_clip = 1.0;  // clipping sees the accumulated gradient
  RunConfig large = accumulated;
  large.training.batch_size = 8;
  large.training.grad_accum_steps = 1;
  for (const auto& spec : all_stages()) {
    SCOPED_TRACE(spec.name);
    std::ostringstream log;
    Trainer a(spec, accumulated, torch::kCPU), b(spec, large, torch::kCPU);
    const auto ra = run_training(a, {}, log), rb = run_training(b, {}, log);
    ASSERT_EQ(ra["losses"].size(), 5u);
    for (size_t i = 0; i < 5; ++i)
      EXPECT_NEAR(ra["losses"][i].get<double>(), rb["losses"][i].get<double>(), 1e-5 * rb["losses"][i].get<double>())
          << "step " << i;
    // Weights looser than losses: Adam divides by sqrt(v), which for the first steps' small gradients
    // turns their fp32 summation-order differences into relative update differences of ~1e-5 (seen 2e-5).
    const auto wa = a.model()->canonical_state(), wb = b.model()->canonical_state();
    for (const auto& [name, w] : wb) EXPECT_LT(testing::rel_error(wa.at(name), w), 1e-4) << name;
    // Throughput counts every token of an optimizer step.
    EXPECT_EQ(ra["training"]["tokens_per_step"], 8 * accumulated.training.seq_len);
    EXPECT_EQ(ra["training"]["grad_accum_steps"], 4);
    EXPECT_EQ(ra["summary"]["model_tflop_per_step"], rb["summary"]["model_tflop_per_step"]);
    const double median = ra["summary"]["step_ms"]["median"].get<double>();
    EXPECT_NEAR(ra["summary"]["samples_per_s"].get<double>(), 1000.0 * 8 / median, 1e-9 * 8000 / median);
    EXPECT_NEAR(ra["summary"]["tokens_per_s"].get<double>(), 1000.0 * 8 * accumulated.training.seq_len / median,
                1e-9 * 8000 * accumulated.training.seq_len / median);
    // Phases interleave across micro-batches: not timed apart.
    EXPECT_TRUE(ra["summary"]["forward_ms"].is_null());
  }
}

// ---- Checkpoints, resume, stop ----------------------------------------------------------------------------

RunConfig resume_config() {
  RunConfig c = scheduled("cosine", 2, 7);
  c.training.batch_size = 2;
  c.training.grad_accum_steps = 2;
  return c;
}

// Stops after `stop_after` steps, as a signal would, with checkpoints into dir.
nlohmann::json run_until(const StageSpec& spec, const RunConfig& c, int64_t stop_after, const std::string& dir) {
  Trainer trainer(spec, c, torch::kCPU);
  RunExtras extras;
  extras.checkpoints = RunCheckpoints({dir, 0, 0}, new_run_id());
  int64_t steps = 0;
  extras.stop_requested = [&] { return ++steps == stop_after; };
  std::ostringstream log;
  return run_training(trainer, extras, log);
}

nlohmann::json resume_from(const StageSpec& spec, const RunConfig& c, const std::string& path) {
  const Checkpoint ck = read_checkpoint(path);
  check_resumable(ck, path, spec.name, c, /*graphed=*/false);
  Trainer trainer(spec, c, torch::kCPU);
  RunExtras extras;
  extras.first_step = trainer.resume(ck);
  std::ostringstream log;
  return run_training(trainer, extras, log);
}

// Interrupted after the warm-up (step 5) and inside it (step 1): the resumed losses continue the
// uninterrupted run's bit for bit, with the schedule (cosine, ramp), accumulation and data stream.
TEST(Resume, InterruptedAndResumedEqualsUninterruptedBitwiseInEveryStage) {
  const RunConfig c = resume_config();
  for (const auto& spec : all_stages()) {
    SCOPED_TRACE(spec.name);
    std::ostringstream log;
    const auto whole = testing::train_result(spec, c, torch::kCPU, log);
    ASSERT_EQ(whole["losses"].size(), 9u);
    for (int64_t stop : {5, 1}) {
      SCOPED_TRACE("stopped after step " + std::to_string(stop));
      const auto dir = fresh_dir("tt_resume_" + spec.name);
      const auto first = run_until(spec, c, stop, dir.string());
      EXPECT_EQ(first["interrupted"], true);
      EXPECT_EQ(first["steps_done"], stop);
      ASSERT_EQ(first["losses"].size(), static_cast<size_t>(stop));
      const std::string path = checkpoint_path(dir.string(), stop);
      ASSERT_TRUE(std::filesystem::exists(path)) << "no checkpoint at the stop";
      const auto second = resume_from(spec, c, path);
      EXPECT_EQ(second["first_step"], stop);
      EXPECT_EQ(second["interrupted"], false);
      nlohmann::json losses = first["losses"], rates = first["lr"];
      for (const auto& l : second["losses"]) losses.push_back(l);
      for (const auto& l : second["lr"]) rates.push_back(l);
      EXPECT_EQ(losses, whole["losses"]);  // bitwise: JSON keeps every double's digits
      EXPECT_EQ(rates, whole["lr"]);
      if (stop == 1) {
        EXPECT_TRUE(first["summary"].is_null()) << "nothing was measured before the stop";
      }
    }
  }
}

TEST(Resume, ANewNumStepsContinuesAndTheCheckpointKeepsTheHuggingFaceNames) {
  RunConfig c = resume_config();
  const auto dir = fresh_dir("tt_resume_longer");
  run_until(stages::v1_baseline(), c, 4, dir.string());
  const Checkpoint ck = read_checkpoint(checkpoint_path(dir.string(), 4));
  EXPECT_EQ(ck.run_step, 4);
  EXPECT_EQ(ck.step, 4);
  EXPECT_TRUE(ck.weights.count("model.embed_tokens.weight"));
  EXPECT_TRUE(ck.exp_avg.count("model.layers.0.self_attn.q_proj.weight"));
  c.training.num_steps = 9;  // may change
  c.training.log_every = 3;  // may change
  const auto r = resume_from(stages::v1_baseline(), c, checkpoint_path(dir.string(), 4));
  EXPECT_EQ(r["losses"].size(), 7u);
  EXPECT_EQ(r["training"]["measured_steps"], 7);
}

TEST(Resume, AnotherRunsCheckpointIsRefusedNamingTheFields) {
  const RunConfig c = resume_config();
  const auto dir = fresh_dir("tt_resume_refused");
  run_until(stages::v2_fused(), c, 3, dir.string());
  const std::string path = checkpoint_path(dir.string(), 3);
  const Checkpoint ck = read_checkpoint(path);
  auto refusal = [&](const std::string& stage, const RunConfig& config, bool graphed = false) -> std::string {
    try {
      check_resumable(ck, path, stage, config, graphed);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal("v2_fused", c), "");
  RunConfig other = c;
  other.training.batch_size = 3;
  other.training.lr_schedule = "linear";
  other.model.n_layers = 3;
  const std::string m = refusal("v2_fused", other);
  for (const char* field : {"training.batch_size: checkpoint has 2, this run has 3", "training.lr_schedule",
                            "model.n_layers", path.c_str(), "training.num_steps, training.log_every"})
    EXPECT_NE(m.find(field), std::string::npos) << "missing \"" << field << "\" in: " << m;
  EXPECT_NE(refusal("v1_baseline", c).find("stage: checkpoint has \"v2_fused\""), std::string::npos);
  RunConfig done = c;
  done.training.num_steps = 1;  // 3 steps done of 2 + 1
  EXPECT_NE(refusal("v2_fused", done).find("nothing is left"), std::string::npos);
  RunConfig two_left = c;
  two_left.training.num_steps = 3;  // steps 3, 4 left: a graph needs both to capture again
  EXPECT_EQ(refusal("v2_fused", two_left), "");
  EXPECT_NE(refusal("v2_fused", two_left, /*graphed=*/true).find("capture again"), std::string::npos);
  // A checkpoint from --save-checkpoint without run state (as every checkpoint before resume existed).
  Trainer plain(stages::v2_fused(), c, torch::kCPU);
  const std::string old = (dir / "old.pt").string();
  plain.save_checkpoint(old, true);
  try {
    check_resumable(read_checkpoint(old), old, "v2_fused", c, false);
    ADD_FAILURE() << "a checkpoint without run state was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--load-checkpoint"), std::string::npos) << e.what();
  }
}

TEST(Checkpoints, EveryNStepsKeepingTheNewestK) {
  RunConfig c = smoke_config();
  c.training.warmup_steps = 1;
  c.training.num_steps = 6;
  const auto dir = fresh_dir("tt_periodic");
  Trainer trainer(stages::v1_baseline(), c, torch::kCPU);
  RunExtras extras;
  extras.checkpoints = RunCheckpoints({dir.string(), 2, 2}, "run-a");
  std::ostringstream log;
  run_training(trainer, extras, log);
  // Periodic after steps 2, 4 and 6, the newest two of them kept; step 7's, the run's last, is never pruned.
  std::vector<std::string> names;
  for (const auto& p : checkpoints_in(dir.string())) names.push_back(p.filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"step_000004.pt", "step_000006.pt", "step_000007.pt"}));
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir.string(), 6)).kind, kPeriodicCheckpoint);
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir.string(), 7)).kind, kLastCheckpoint);
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir.string(), 7)).run_id, "run-a");
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(entry.path().extension(), ".pt") << "left behind: " << entry.path();
  EXPECT_EQ(read_checkpoint(checkpoint_path(dir.string(), 7)).run_step, 7);
  EXPECT_NE(log.str().find("checkpoint " + checkpoint_path(dir.string(), 4)), std::string::npos) << log.str();
}

// ---- Bad input ---------------------------------------------------------------------------------------------

TEST(TrainerConfig, BadScheduleAndAccumulationFieldsNameTheFieldAndWhatIsAllowed) {
  RunConfig c = smoke_config();
  c.training.grad_accum_steps = 0;
  EXPECT_NE(config_error(c).find("\"training.grad_accum_steps\" = 0 is not allowed: must be >= 1"), std::string::npos)
      << config_error(c);
  c = smoke_config();
  c.training.lr_schedule = "step";
  EXPECT_NE(
      config_error(c).find("\"training.lr_schedule\" = \"step\" is not allowed: must be \"constant\", \"cosine\""),
      std::string::npos)
      << config_error(c);
  c = smoke_config();
  c.training.min_lr = 1.0;
  EXPECT_NE(config_error(c).find("\"training.min_lr\" = 1 is not allowed: must be in [0, training.learning_rate"),
            std::string::npos)
      << config_error(c);
  c = smoke_config();
  c.training.lr_schedule = "cosine";
  c.training.lr_warmup_steps = 12;  // = warmup_steps 2 + num_steps 10
  EXPECT_NE(config_error(c).find("\"training.lr_warmup_steps\" = 12 is not allowed"), std::string::npos)
      << config_error(c);
}

std::string parse_error(const std::vector<std::string>& args) {
  try {
    parse_command_line("v1_baseline", args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainerCommandLine, BadFlagsNameTheFlagAndWhatIsAllowed) {
  const std::string config = std::string(TT_SOURCE_DIR) + "/configs/smoke.json";
  EXPECT_NE(parse_error({"--config", config, "--grad-accum-steps", "0"}).find("training.grad_accum_steps"),
            std::string::npos);
  EXPECT_NE(parse_error({"--config", config, "--lr-schedule", "exp"}).find("\"exp\" is not allowed"),
            std::string::npos);
  EXPECT_NE(
      parse_error({"--checkpoint-every", "0", "--checkpoint-dir", "x"}).find("--checkpoint-every 0 is not allowed"),
      std::string::npos);
  EXPECT_NE(parse_error({"--checkpoint-every", "5"}).find("--checkpoint-every needs --checkpoint-dir"),
            std::string::npos);
  EXPECT_NE(parse_error({"--keep-checkpoints", "2"}).find("--keep-checkpoints needs --checkpoint-dir"),
            std::string::npos);
  EXPECT_NE(parse_error({"--resume", "/nonexistent/step_000001.pt"})
                .find("--resume: file '/nonexistent/step_000001.pt' does not exist"),
            std::string::npos);
  const auto parsed = parse_command_line("v1_baseline", {"--config", config, "--lr-schedule", "cosine", "--min-lr",
                                                         "1e-4", "--lr-warmup-steps", "2", "--grad-accum-steps", "3"});
  EXPECT_EQ(parsed.config.training.lr_schedule, "cosine");
  EXPECT_EQ(parsed.config.training.min_lr, 1e-4);
  EXPECT_EQ(parsed.config.training.lr_warmup_steps, 2);
  EXPECT_EQ(parsed.config.training.grad_accum_steps, 3);
}

TEST(TrainerCommandLine, AForeignOrMismatchedResumeExitsWithTwoAndWritesNothing) {
  const auto dir = fresh_dir("tt_resume_cli");
  const std::string config = std::string(TT_SOURCE_DIR) + "/configs/smoke.json";
  const std::string output = (dir / "result.json").string();
  const std::string foreign = (dir / "foreign.pt").string();
  std::ofstream(foreign) << "{\"not\": \"a checkpoint\"}";
  const std::vector<std::string> common = {"--config", config, "--device",         "cpu",
                                           "--output", output, "--checkpoint-dir", (dir / "ck").string()};
  auto with = [&](std::vector<std::string> extra) {
    auto args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  // Each refusal for its own reason: the exit code alone would pass for any early usage error.
  auto expect_refused = [&](const std::vector<std::string>& args, const std::string& reason) {
    const auto [code, err] = run_stage(stages::v1_baseline(), args);
    EXPECT_EQ(code, 2) << reason;
    EXPECT_NE(err.find(reason), std::string::npos) << err;
  };
  expect_refused(with({"--resume", foreign}), "--resume: '" + foreign + "' is not a readable checkpoint");
  expect_refused(with({"--load-checkpoint", foreign}), "--load-checkpoint: '" + foreign + "' is not a readable checkpoint");
  // A real checkpoint of another config: refused before any work.
  RunConfig c = smoke_config();
  c.training.num_steps = 2;
  const std::string other = (dir / "other.pt").string();
  Trainer(stages::v1_baseline(), c, torch::kCPU).save_checkpoint(other, true, 0);
  expect_refused(with({"--resume", other, "--batch-size", "3"}), "is of another run; these fields differ");
  expect_refused(with({"--grad-accum-steps", "-1"}), "\"training.grad_accum_steps\" = -1 is not allowed");
  EXPECT_FALSE(std::filesystem::exists(output));
  EXPECT_FALSE(std::filesystem::exists(dir / "ck"));
  // The control: the same common flags alone run.
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_stage(stages::v1_baseline(), with({"--num-steps", "1", "--warmup-steps", "0"})).code, 0);
  ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(std::filesystem::exists(output));
}

// --load-checkpoint through the command line starts from the checkpoint's weights: the run's first loss is the
// loaded model's on that batch (computed in-process), not a fresh model's.
TEST(TrainerCommandLine, LoadCheckpointStartsFromItsWeights) {
  const auto dir = fresh_dir("tt_load_cli");
  RunConfig c = smoke_config();
  c.training.num_steps = 1;
  c.training.warmup_steps = 0;
  Trainer trained(stages::v1_baseline(), c, torch::kCPU);
  auto tokens = testing::random_tokens(4, 33, 256, 5);
  for (int i = 0; i < 5; ++i) trained.step(tokens.narrow(1, 0, 32), tokens.narrow(1, 1, 32));
  const std::string checkpoint = (dir / "trained.pt").string();
  trained.save_checkpoint(checkpoint, true);  // weights and moments: what --load-checkpoint reads

  std::ostringstream log;
  Trainer loaded(stages::v1_baseline(), c, torch::kCPU);
  loaded.load_checkpoint(checkpoint);
  const double expected = run_training(loaded, {}, log)["losses"][0].get<double>();
  const double fresh = testing::train_result(stages::v1_baseline(), c, torch::kCPU, log)["losses"][0].get<double>();
  ASSERT_NE(expected, fresh) << "the checkpoint must change the first loss for this test to mean anything";

  const std::string output = (dir / "r.json").string();
  ::testing::internal::CaptureStdout();
  const auto [code, err] = run_stage(stages::v1_baseline(), {"--config", std::string(TT_SOURCE_DIR) + "/configs/smoke.json",
                                                              "--device", "cpu", "--num-steps", "1", "--warmup-steps",
                                                              "0", "--load-checkpoint", checkpoint, "--output", output});
  ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(code, 0) << err;
  std::ifstream in(output);
  EXPECT_EQ(nlohmann::json::parse(in)["losses"][0].get<double>(), expected);
}

// Another run's checkpoints in --checkpoint-dir would mix with this run's (and --keep-checkpoints would count
// them): refused before any step, unless the run resumes from there; --overwrite does not change that.
TEST(TrainerCommandLine, ACheckpointFolderOfAnotherRunIsRefused) {
  const auto dir = fresh_dir("tt_checkpoint_dir_cli");
  std::filesystem::create_directories(dir / "ck");
  RunConfig c = smoke_config();
  Trainer(stages::v1_baseline(), c, torch::kCPU).save_checkpoint((dir / "ck" / "step_000003.pt").string(), true, 3);
  const std::string output = (dir / "result.json").string();
  const std::vector<std::string> args = {"--config", std::string(TT_SOURCE_DIR) + "/configs/smoke.json", "--device",
                                         "cpu", "--num-steps", "1", "--warmup-steps", "0", "--output", output,
                                         "--checkpoint-dir", (dir / "ck").string()};
  const auto [code, err] = run_stage(stages::v1_baseline(), args);
  EXPECT_EQ(code, 2);
  EXPECT_NE(err.find("already holds 1 checkpoint(s) (step_000003.pt)"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(output));
  auto overwriting = args;
  overwriting.push_back("--overwrite");
  const auto refused = run_stage(stages::v1_baseline(), overwriting);
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.err.find("--overwrite does not apply to checkpoint folders"), std::string::npos) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(output));
  EXPECT_TRUE(std::filesystem::exists(dir / "ck" / "step_000003.pt"));
}

// Every file and folder the run would write is checked before any step: a folder given as --output, a
// --checkpoint-dir that is a file, a path under a folder nothing can be created in. Each exits with 2 and
// leaves nothing behind.
TEST(TrainerCommandLine, UnwritableOutputsAreRefusedBeforeAnyStep) {
  const auto dir = fresh_dir("tt_unwritable_cli");
  std::filesystem::create_directories(dir / "a_folder");
  const std::string a_file = (dir / "a_file").string();
  std::ofstream(a_file) << "x";
  const std::string config = std::string(TT_SOURCE_DIR) + "/configs/smoke.json";
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--config", config, "--device", "cpu"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_stage(stages::v1_baseline(), args);
  };
  const std::string result = (dir / "r.json").string();
  for (const auto& [args, phrase] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--output", (dir / "a_folder").string(), "--overwrite"}, "is a folder; give a file path"},
           {{"--output", result, "--checkpoint-dir", a_file}, "is not a folder"},
           {{"--output", result, "--save-checkpoint", a_file + "/x.pt"}, "is not a folder"},
           {{"--output", "/proc/tt_no_such_folder/r.json"}, "is not writable"}}) {
    const auto [code, err] = run(args);
    EXPECT_EQ(code, 2) << err;
    EXPECT_NE(err.find(phrase), std::string::npos) << err;
  }
  EXPECT_FALSE(std::filesystem::exists(result));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 2)
      << "only a_folder and a_file: the probe left nothing";
}

}  // namespace
}  // namespace tt

namespace tt {
namespace {

// ---- Optimizer moments in bf16 (issue 27) -----------------------------------------------------------------

// bf16 moments in v4 (the stage whose AdamW is ours): the losses follow the fp32-moment run closely but not bit
// for bit, the moments are bf16 tensors, the result says so, and a checkpoint keeps them in bf16; v1 to v3 refuse
// them by name.
TEST(OptimizerStateDtype, Bf16MomentsTrainCloseToFp32AndAreKeptInBf16) {
  RunConfig c = resume_config();
  for (const auto& spec : {stages::v4_ultra()}) {
    SCOPED_TRACE(spec.name);
    std::ostringstream log;
    const auto fp32 = testing::train_result(spec, c, torch::kCPU, log);
    RunConfig bf16_config = c;
    bf16_config.training.optimizer_state_dtype = Precision::kBf16;
    const auto dir = fresh_dir("tt_bf16_moments_" + spec.name);
    const auto bf16 = run_until(spec, bf16_config, -1, dir.string());
    ASSERT_EQ(bf16["losses"].size(), fp32["losses"].size());
    int different = 0;
    for (size_t i = 0; i < fp32["losses"].size(); ++i) {
      const double a = bf16["losses"][i].get<double>(), b = fp32["losses"][i].get<double>();
      EXPECT_NEAR(a, b, 1e-3 * b) << "step " << i;
      different += a != b;
    }
    EXPECT_GT(different, 0) << "bf16 moments changed no loss: are they used?";
    EXPECT_EQ(bf16["training"]["optimizer"]["state_dtype"], "bf16");
    EXPECT_EQ(fp32["training"]["optimizer"]["state_dtype"], "fp32");
    const int64_t last = c.training.warmup_steps + c.training.num_steps;
    const Checkpoint ck = read_checkpoint(checkpoint_path(dir.string(), last));
    for (const auto& [name, m] : ck.exp_avg) EXPECT_EQ(m.scalar_type(), torch::kBFloat16) << name;
    // A resume must keep the checkpoint's moment dtype: the refusal names the field.
    const std::string refusal = testing::error_of<ConfigError>(
        [&] { check_resumable(ck, "ck.pt", spec.name, c, /*graphed=*/false); });
    EXPECT_NE(refusal.find("training.optimizer_state_dtype: checkpoint has \"bf16\", this run has \"fp32\""),
              std::string::npos)
        << refusal;
  }
  RunConfig bad = c;
  bad.training.optimizer_state_dtype = Precision::kBf16;
  RunOptions o;
  o.output = "unused.json";
  for (const auto& spec : {stages::v1_baseline(), stages::v2_fused(), stages::v3_custom()}) {
    const std::string refusal = testing::error_of<ConfigError>([&] { plan_run(spec, bad, o, {}); });
    EXPECT_NE(refusal.find("\"training.optimizer_state_dtype\" = \"bf16\" is not allowed for " + spec.name),
              std::string::npos)
        << refusal;
  }
}

}  // namespace
}  // namespace tt
