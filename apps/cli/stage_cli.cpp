#include "apps/cli/stage_cli.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>

#include "apps/cli/command_line.h"
#include "apps/train/device.h"
#include "apps/train/profiling.h"
#include "apps/train/system_info.h"
#include "kernels/ops/common.h"

namespace tt {
namespace {

// The config fields with a flag, in the --help group of their section.
void add_config_flags(cxxopts::Options& o) {
  for (const auto& f : config_fields()) {
    if (!f.flag) continue;
    const bool model = f.path.rfind("model.", 0) == 0;
    const std::string help =
        std::string(f.help) + (*f.help ? " " : "") + "[" + f.path + ", default " + f.default_value + "]";
    auto value = cxxopts::value<std::string>();
    if (f.boolean) value->implicit_value("true");
    o.add_options(model ? "Model (override config fields)" : "Training (override config fields)")(f.flag, help, value);
  }
}

cxxopts::Options make_options(const std::string& program) {
  cxxopts::Options o(program,
                     "Train the TinyTransformer model with this stage's components and write a result JSON.\n"
                     "Flags override fields of the --config file; unset fields keep the built-in defaults\n"
                     "(which equal configs/workshop.json).");
  o.add_options("Run")("config", "JSON config file (see configs/) [default none: the built-in defaults]",
                       cxxopts::value<std::string>())(
      "output", "result JSON path (default: results/<stage>_<config>_<dtype>_<UTC time>.json)",
      cxxopts::value<std::string>())("overwrite", "replace an existing --output, trace or --save-checkpoint file")(
      "use-amp", "the workshop's flag: same as --dtype bf16")(
      "save-checkpoint", "write weights, optimizer state, step and config here after training [default none]",
      cxxopts::value<std::string>())("load-checkpoint", "start from this checkpoint (its model config must match) [default none]",
                                     cxxopts::value<std::string>())(
      "validate", "check the config, print the effective config as JSON, and exit")(
      "doctor", "print backend, GPU, LibTorch version and installed profilers, and exit")(
      "no-graph", "stages that capture their step as a CUDA/HIP graph (v4_ultra): run the same kernels eagerly")(
      "pitfall",
      "v3_custom only, the debugging exercise (README): put one mistake back, one of " + stages::pitfall_names() +
          " (none = v3 as shipped, recorded as the exercise's stage 5)",
      cxxopts::value<std::string>(), "NAME")(
      "help", "show this help");
  o.add_options("Checkpoints and resume (docs/training.md)")(
      "checkpoint-dir",
      "write checkpoints into this folder as step_NNNNNN.pt: every --checkpoint-every steps, after the last step, "
      "and when a signal (SIGINT, SIGTERM) stops the run; a new run needs a folder without checkpoints, a --resume "
      "one holding only the resumed run's (--overwrite does not apply) [default none]",
      cxxopts::value<std::string>(), "DIR")(
      "checkpoint-every", "steps between checkpoints into --checkpoint-dir [default: none between, only the last and a stop]",
      cxxopts::value<int64_t>(), "N")(
      "keep-checkpoints", "keep this run's newest K periodic checkpoints in --checkpoint-dir, removing its older ones (never the "
      "last step's, a stop's or another run's) [default: all]",
      cxxopts::value<int64_t>(),
      "K")("resume",
           "continue the run this checkpoint was written by: weights, optimizer state, step, schedule, data position "
           "and random state; the stage, model and training config must match, except training.num_steps and "
           "training.log_every",
           cxxopts::value<std::string>(), "FILE");
  o.add_options("Profiling")(
      "profile",
      "after the measured steps, record --profile-steps extra steps with LibTorch's Kineto profiler: "
      "writes <output stem>.trace.json (open in ui.perfetto.dev) and a GPU kernel hotspot table (printed, "
      "and under \"profile\" in the result JSON); the extra steps are not in the timing statistics")(
      "profile-steps", "steps recorded by --profile [default 3]", cxxopts::value<int64_t>());
  o.add_options(
      "Evaluation (held-out loss per token and perplexity; windows of seq_len + 1 bytes, batch_size at once)")(
      "eval-data",
      "evaluate on this text file as bytes after training, or instead of it with --eval-only "
      "(needs vocab_size >= 256) [default none]",
      cxxopts::value<std::string>())(
      "eval-every",
      "also evaluate on --eval-data every N steps during training, outside the timed regions; "
      "0 = only after the last step [default 0]",
      cxxopts::value<int64_t>())(
      "eval-only", "no training: evaluate the --load-checkpoint weights on --eval-data and write an eval result file");
  o.add_options("Data parallel (one process per GPU, started by scripts/launch.sh, mpirun or srun)")(
      "dist-timeout",
      "seconds a rank waits for the others at the rendezvous and in a collective before it stops with an error "
      "[default 300]",
      cxxopts::value<int64_t>())(
      "scaling-baseline",
      "result JSON of a 1-GPU run of the same stage, config and per-GPU batch: fills in "
      "distributed.scaling_efficiency [default none]",
      cxxopts::value<std::string>())(
      "dp-sync",
      "how the gradients are averaged over ranks: layers (an all-reduce per layer as soon as its gradients are "
      "final; captured in v4_ultra's graph) or reducer (c10d's Reducer, as Python's DDP; the step runs eagerly) "
      "[default layers]",
      cxxopts::value<std::string>())(
      "dp-embedding-grad",
      "with --dp-sync layers, how the embedding's gradient is averaged where only its lookup writes it (bf16 "
      "stages, untied embeddings): rows (the rows the step's tokens touched, all-gathered with their token ids) or "
      "dense (all of it) [default rows]",
      cxxopts::value<std::string>())(
      "zero-gather",
      "with --shard-optimizer, when the updated weights are all-gathered: update (after each layer's update, beside "
      "the next one's) or forward (after layer 0, in the next step, each layer's before its forward reads them, "
      "beside the forward; on a GPU it needs CUDA_DEVICE_MAX_CONNECTIONS=32, and a rank whose environment sets "
      "none restarts itself with it) [default forward]",
      cxxopts::value<std::string>());
  add_config_flags(o);
  return o;
}

template <class T>
void override_field(const cxxopts::ParseResult& r, const char* flag, T& field) {
  if (!r.count(flag)) return;
  try {
    field = r[flag].as<T>();
  } catch (const cxxopts::exceptions::exception& e) {
    throw ConfigError(std::string("command line: --") + flag + ": " + e.what());
  }
}

// The energy figure (or why there is none) and, for the timing pitfall, the host clock beside the events.
void print_teaching_lines(const std::string& stage, const nlohmann::json& s) {
  if (s["energy_j_per_step"].is_number()) {
    const auto& w = s["energy_window"];
    std::printf(
        "[%s] energy %.3f J/step | %.0f tokens/J | %.0f W | over %lld %s steps (%.2f s)\n", stage.c_str(),
        s["energy_j_per_step"].get<double>(),
        s["tokens_per_joule"].is_number() ? s["tokens_per_joule"].get<double>() : NAN,
        w.contains("average_power_w") && w["average_power_w"].is_number() ? w["average_power_w"].get<double>() : NAN,
        static_cast<long long>(w["steps"].get<int64_t>()),
        w["extra_steps"].get<bool>() ? "extra, unrecorded" : "measured", w["seconds"].get<double>());
  } else {
    std::printf("[%s] %s\n", stage.c_str(), s["energy_note"].get<std::string>().c_str());
  }
  if (!s.contains("host_clock_ms")) return;
  const auto& host = s["host_clock_ms"];
  auto median = [](const nlohmann::json& spread) { return spread.is_null() ? NAN : spread["median"].get<double>(); };
  std::printf("[%s] median ms        forward  backward  optimizer     step\n", stage.c_str());
  std::printf("[%s] device events %9.3f %9.3f %10.3f %8.3f\n", stage.c_str(), median(s["forward_ms"]),
              median(s["backward_ms"]), median(s["optimizer_ms"]), median(s["step_ms"]));
  std::printf("[%s] host, no sync %9.3f %9.3f %10.3f %8.3f  <- %s\n", stage.c_str(), median(host["forward_ms"]),
              median(host["backward_ms"]), median(host["optimizer_ms"]), median(host["step_ms"]),
              host["note"].get<std::string>().c_str());
}

}  // namespace

ParsedCommandLine parse_command_line(const std::string& program, const std::vector<std::string>& args) {
  auto options = make_options(program);
  const cxxopts::ParseResult r = parse_flags(options, args);
  ParsedCommandLine parsed;
  parsed.help_text = options.help();
  if (r.count("help")) {
    parsed.help = true;
    return parsed;
  }
  // --doctor and --validate print and exit: a flag for the run beside them would be ignored.
  if (r.count("doctor") && r.arguments().size() > 1)
    throw ConfigError("--doctor prints what this machine has and exits: give it alone");
  if (r.count("validate"))
    for (const auto& given : r.arguments()) {
      const std::string& key = given.key();
      const bool config_flag = std::any_of(config_fields().begin(), config_fields().end(),
                                           [&](const ConfigField& f) { return f.flag && key == f.flag; });
      // The config and the stage's choice (--no-graph, --pitfall) are what --validate checks.
      static const char* const kChecked[] = {"validate", "config", "use-amp", "no-graph", "pitfall"};
      if (!config_flag && std::find(std::begin(kChecked), std::end(kChecked), key) == std::end(kChecked))
        throw ConfigError("--" + key + " is not allowed with --validate, which checks the config and the stage's "
                          "flags and exits: give it with --config, config-field flags, --no-graph or --pitfall");
    }
  RunConfig& c = parsed.config;
  if (r.count("config")) c = load_run_config(r["config"].as<std::string>());
  for (const auto& field : config_fields())
    if (field.flag && r.count(field.flag)) set_config_field(c, field, r[field.flag].as<std::string>());
  if (r.count("use-amp")) {
    if (r.count("dtype") && c.training.dtype != Precision::kBf16)
      throw ConfigError(std::string("command line: --use-amp means --dtype bf16 but --dtype ") +
                        to_string(c.training.dtype) + " was also given");
    c.training.dtype = Precision::kBf16;
  }
  try {
    validate(c);
  } catch (const ConfigError& e) {
    // The rule names the field; say where its value came from when a flag set it.
    std::string message = e.what();
    for (const auto& field : config_fields())
      if (field.flag && r.count(field.flag) && message.find("\"" + field.path + "\"") != std::string::npos)
        message += " (set by --" + std::string(field.flag) + ")";
    if (message == e.what() && r.count("config")) message += " (in " + r["config"].as<std::string>() + ")";
    throw ConfigError(message);
  }
  try {
    ops::check_programmatic_launch_environment();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("environment: ") + e.what());
  }

  RunOptions& o = parsed.options;
  override_field(r, "output", o.output);
  o.overwrite = r.count("overwrite") > 0;
  override_field(r, "save-checkpoint", o.save_checkpoint);
  override_field(r, "load-checkpoint", o.load_checkpoint);
  o.validate_only = r.count("validate") > 0;
  o.doctor = r.count("doctor") > 0;
  o.no_graph = r.count("no-graph") > 0;
  if (r.count("pitfall")) {
    o.pitfall = stages::parse_pitfall(r["pitfall"].as<std::string>());
    if (r.count("eval-only")) throw ConfigError("--pitfall is not allowed with --eval-only: nothing is trained");
  }
  if (r.count("profile-steps") && !r.count("profile")) throw ConfigError("--profile-steps needs --profile");
  if (r.count("profile")) {
    o.profile_steps = kDefaultProfileSteps;
    override_field(r, "profile-steps", o.profile_steps);
    if (o.profile_steps < 1)
      throw ConfigError("--profile-steps " + std::to_string(o.profile_steps) + " is not allowed: must be >= 1");
    if (r.count("eval-only")) throw ConfigError("--profile is not allowed with --eval-only: nothing is trained");
  }
  override_field(r, "eval-data", o.eval_data);
  override_field(r, "eval-every", o.eval_every);
  o.eval_only = r.count("eval-only") > 0;
  if (o.eval_every < 0)
    throw ConfigError("--eval-every " + std::to_string(o.eval_every) +
                      " is not allowed: must be >= 0 (0 = only after the last step)");
  if ((o.eval_every > 0 || o.eval_only) && o.eval_data.empty())
    throw ConfigError(std::string(o.eval_only ? "--eval-only" : "--eval-every") + " needs --eval-data FILE");
  if (o.eval_only && o.load_checkpoint.empty())
    throw ConfigError("--eval-only needs --load-checkpoint FILE: the weights to evaluate");
  if (o.eval_only && !o.save_checkpoint.empty())
    throw ConfigError("--save-checkpoint is not allowed with --eval-only: nothing is trained");
  if (o.eval_only && o.eval_every > 0)
    throw ConfigError("--eval-every is not allowed with --eval-only: nothing is trained");
  if (o.eval_only) {
    // Evaluation reads the model section and these training fields; a flag for any other would do nothing.
    static const char* const kEvalReads[] = {"training.seq_len", "training.batch_size", "training.dtype",
                                             "training.allow_tf32", "training.device"};
    for (const auto& field : config_fields()) {
      if (!field.flag || !r.count(field.flag) || field.path.rfind("training.", 0) != 0) continue;
      if (std::find(std::begin(kEvalReads), std::end(kEvalReads), field.path) != std::end(kEvalReads)) continue;
      throw ConfigError(std::string("--") + field.flag + " is not allowed with --eval-only: it sets " + field.path +
                        ", which evaluation does not use (it reads the model fields and training.seq_len, "
                        "batch_size, dtype, allow_tf32 and device)");
    }
  }
  if (!o.eval_data.empty() && !std::filesystem::is_regular_file(o.eval_data))
    throw ConfigError("--eval-data: file '" + o.eval_data + "' does not exist (or is not a file)");
  if (!o.eval_data.empty() && c.model.vocab_size < 256)
    throw ConfigError("--eval-data reads bytes as tokens: model.vocab_size = " + std::to_string(c.model.vocab_size) +
                      " is not allowed, it must be >= 256");
  if (!o.load_checkpoint.empty() && !std::filesystem::is_regular_file(o.load_checkpoint))
    throw ConfigError("--load-checkpoint: file '" + o.load_checkpoint + "' does not exist (or is not a file)");
  if (!c.training.data.empty() && !std::filesystem::is_regular_file(c.training.data))
    throw ConfigError("training.data: file '" + c.training.data + "' does not exist (or is not a file)");
  override_field(r, "checkpoint-dir", o.checkpoint_dir);
  override_field(r, "checkpoint-every", o.checkpoint_every);
  override_field(r, "keep-checkpoints", o.keep_checkpoints);
  override_field(r, "resume", o.resume);
  for (const auto& [flag, value] : {std::pair<const char*, int64_t>{"checkpoint-every", o.checkpoint_every},
                                    {"keep-checkpoints", o.keep_checkpoints}}) {
    if (!r.count(flag)) continue;
    if (value < 1)
      throw ConfigError(std::string("--") + flag + " " + std::to_string(value) + " is not allowed: must be >= 1");
    if (o.checkpoint_dir.empty()) throw ConfigError(std::string("--") + flag + " needs --checkpoint-dir DIR");
  }
  if (!o.resume.empty()) {
    if (!o.load_checkpoint.empty())
      throw ConfigError(
          "--resume and --load-checkpoint are not allowed together: --resume continues a run "
          "(weights, optimizer, step, data position); --load-checkpoint starts a new one from weights");
    if (r.count("eval-only")) throw ConfigError("--resume is not allowed with --eval-only: nothing is trained");
    if (!std::filesystem::is_regular_file(o.resume))
      throw ConfigError("--resume: file '" + o.resume + "' does not exist (or is not a file)");
  }
  if (!o.checkpoint_dir.empty() && r.count("eval-only"))
    throw ConfigError("--checkpoint-dir is not allowed with --eval-only: nothing is trained");
  o.dist_timeout_given = r.count("dist-timeout") > 0;
  override_field(r, "dist-timeout", o.dist_timeout_s);
  if (o.dist_timeout_s < 1)
    throw ConfigError("--dist-timeout " + std::to_string(o.dist_timeout_s) + " is not allowed: must be >= 1 second");
  override_field(r, "scaling-baseline", o.scaling_baseline);
  if (r.count("dp-sync")) o.dp_sync = parse_gradient_sync(r["dp-sync"].as<std::string>());
  if (r.count("dp-embedding-grad"))
    o.dp_embedding_grad = parse_embedding_grad_exchange(r["dp-embedding-grad"].as<std::string>());
  if (r.count("zero-gather")) o.zero_gather = parse_zero_gather(r["zero-gather"].as<std::string>());
  if (!o.scaling_baseline.empty() && !std::filesystem::is_regular_file(o.scaling_baseline))
    throw ConfigError("--scaling-baseline: file '" + o.scaling_baseline + "' does not exist (or is not a file)");
  return parsed;
}

namespace {

// The one line every training run ends with, then the teaching lines.
void print_summary(const std::string& stage, const nlohmann::json& s, bool on_gpu) {
  // The caching allocator's peak exists on the GPU only.
  const std::string peak =
      on_gpu ? " | peak " + std::to_string(std::lround(s["peak_allocated_mb"].get<double>())) + " MB" : "";
  std::printf(
      "[%s] median step %.2f ms [p10 %.2f, p90 %.2f] | %.1f samples/s | %.0f tokens/s | %.2f TFLOP/s%s | loss %.4f "
      "-> %.4f\n",
      stage.c_str(), s["step_ms"]["median"].get<double>(), s["step_ms"]["p10"].get<double>(),
      s["step_ms"]["p90"].get<double>(), s["samples_per_s"].get<double>(), s["tokens_per_s"].get<double>(),
      s["achieved_tflops"].get<double>(), peak.c_str(), s["first_loss"].is_number() ? s["first_loss"].get<double>() : NAN,
      s["final_loss"].is_number() ? s["final_loss"].get<double>() : NAN);
  print_teaching_lines(stage, s);
}

// CUDA reads CUDA_DEVICE_MAX_CONNECTIONS once, when it starts (setting it later changes nothing: measured on
// 2 x H200, docs/multi-gpu.md). So a run that needs it (hardware_queues_needed) starts this program again with it
// set, before anything touched the GPU: the same process (a launcher still waits for and signals the same pid),
// the same arguments. Returns only if that fails.
void restart_with_hardware_queues(char** argv, const std::string& queues, bool say) {
  if (say)
    std::cerr << "[note] --zero-gather forward runs the weights' all-gathers beside the forward, which needs more of "
                 "the GPU's hardware queues than CUDA's default 8: restarting with CUDA_DEVICE_MAX_CONNECTIONS="
              << queues << std::endl;
  // Once set, hardware_queues_needed says no: the restarted process goes on.
  if (::setenv("CUDA_DEVICE_MAX_CONNECTIONS", queues.c_str(), /*overwrite=*/1) == 0) ::execv("/proc/self/exe", argv);
  throw std::runtime_error("could not restart with CUDA_DEVICE_MAX_CONNECTIONS=" + queues + " (" +
                           std::strerror(errno) + "): set it in the launching environment");
}

}  // namespace

int stage_main(int argc, char** argv, const StageSpec& stage) {
  auto refuse = [&](const std::string& name, const std::exception& e) {
    std::cerr << name << ": error: " << error_message(e) << std::endl;
    return 2;
  };
  ParsedCommandLine parsed;
  try {
    parsed = parse_command_line(stage.name, std::vector<std::string>(argv + 1, argv + argc));
    effective_stage(stage, parsed.options, {});  // --no-graph and --pitfall refused before anything else
  } catch (const std::exception& e) {
    return refuse(stage.name, e);
  }
  if (parsed.help) {
    std::cout << parsed.help_text << std::endl;
    return 0;
  }
  if (parsed.options.doctor) {
    std::cout << doctor_report();
    return 0;
  }
  if (parsed.options.validate_only) {
    std::cout << to_json(parsed.config).dump(2) << std::endl;
    return 0;
  }
  RunPlan plan;
  try {
    const DistributedEnv dist = parse_distributed_env(process_env());
    if (const auto queues = hardware_queues_needed(stage, parsed.config, parsed.options, dist))
      restart_with_hardware_queues(argv, *queues, dist.rank == 0);
    plan = plan_run(stage, parsed.config, parsed.options, dist);
  } catch (const std::exception& e) {
    return refuse(stage.name, e);
  }
  const std::string name = plan.spec.name;
  const bool on_gpu = resolve_device(plan.config.training.device).is_cuda();
  std::ostream quiet(nullptr);  // ranks other than 0 train silently
  std::ostream& log = plan.writes_files ? std::cout : quiet;
  RunOutcome outcome;
  try {
    outcome = execute_run(std::move(plan), log);
  } catch (const RunError& e) {
    std::cerr << name << ": error: " << e.what() << std::endl;
    return e.exit_code;
  }
  const nlohmann::json& result = outcome.result;
  if (result.is_null()) return outcome.exit_code;  // a rank other than 0
  if (result.contains("summary_note") && result["summary"].is_null()) {
    std::cout << "result written to " << outcome.output << " (" << result["summary_note"].get<std::string>() << ")"
              << std::endl;
    return outcome.exit_code;
  }
  if (result.contains("steps_done")) print_summary(name, result["summary"], on_gpu);  // not for --eval-only
  std::cout << "result written to " << outcome.output << std::endl;
  return outcome.exit_code;
}

}  // namespace tt
