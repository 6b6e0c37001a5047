#include "apps/cli/stage_cli.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <unistd.h>

#include "apps/cli/command_line.h"
#include "apps/report/evaluation_report.h"
#include "apps/report/profiling.h"
#include "apps/report/run_result.h"
#include "apps/report/system_info.h"
#include "apps/report/training_run.h"
#include "apps/train/checkpointing.h"
#include "apps/train/device.h"
#include "apps/train/distributed.h"
#include "apps/train/stop_signal.h"
#include "apps/train/trainer.h"

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

std::string default_output(const std::string& stage, const RunConfig& c) {
  return "results/" + stage + "_" + c.name + "_" + to_string(c.training.dtype) + "_" + utc_timestamp(true) + ".json";
}

// The energy figure (or why there is none) and, for the timing pitfall, the host clock beside the events.
void print_teaching_lines(const std::string& stage, const nlohmann::json& s) {
  if (s["energy_j_per_step"].is_number()) {
    const auto& w = s["energy_window"];
    std::printf("[%s] energy %.3f J/step | %.0f tokens/J | over %lld %s steps (%.2f s)\n", stage.c_str(),
                s["energy_j_per_step"].get<double>(),
                s["tokens_per_joule"].is_number() ? s["tokens_per_joule"].get<double>() : NAN,
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
  if (!o.scaling_baseline.empty() && !std::filesystem::is_regular_file(o.scaling_baseline))
    throw ConfigError("--scaling-baseline: file '" + o.scaling_baseline + "' does not exist (or is not a file)");
  return parsed;
}

// --- Data parallel ---------------------------------------------------------------------------------
namespace {

// What every rank must agree on (checked at start-up by check_same_run): output paths may differ.
nlohmann::json run_description(const StageSpec& spec, const RunConfig& config, const RunOptions& o, int world_size) {
  return {{"stage", spec.name},
          {"world_size", world_size},
          {"config", to_json(config)},
          {"flags",
           {{"no_graph", o.no_graph},
            {"load_checkpoint", o.load_checkpoint},
            {"resume", o.resume},
            {"checkpoint_every", o.checkpoint_every},
            {"eval_data", o.eval_data},
            {"eval_every", o.eval_every},
            {"profile_steps", o.profile_steps},
            {"dist_timeout_s", o.dist_timeout_s}}}};
}

// Refuses what data parallel cannot do, before any work; throws ConfigError.
void check_data_parallel_options(const DistributedEnv& env, const StageSpec& spec, const RunConfig& config,
                                 const RunOptions& o) {
  if (!env.enabled) {
    if (o.dist_timeout_given || !o.scaling_baseline.empty())
      throw ConfigError(std::string(o.dist_timeout_given ? "--dist-timeout" : "--scaling-baseline") +
                        " applies to data-parallel runs, and this process was not started by a launcher (no RANK/"
                        "WORLD_SIZE, OMPI_COMM_WORLD_* or SLURM_PROCID variables): use scripts/launch.sh --nproc N");
    return;
  }
  if (o.eval_only) throw ConfigError("--eval-only is not allowed under a data-parallel launcher: run it as one process");
  if (config.training.device == "cpu")
    throw ConfigError("config: field \"training.device\" = \"cpu\" is not allowed under a data-parallel launcher (" +
                      env.source + " variables are set): data parallel runs one process per GPU over NCCL");
  if (o.scaling_baseline.empty()) return;
  const nlohmann::json base = read_json_file(o.scaling_baseline);
  validate_result_json(base);
  auto refuse = [&](const std::string& field, const nlohmann::json& theirs, const nlohmann::json& ours) {
    if (theirs != ours)
      throw ConfigError("--scaling-baseline '" + o.scaling_baseline + "': its " + field + " is " + theirs.dump() +
                        ", this run's is " + ours.dump() + "; the baseline must be a 1-GPU run of the same stage, "
                        "model, dtype and per-GPU batch");
  };
  refuse("stage.name", base["stage"]["name"], spec.name);
  refuse("config.model", base["config"]["model"], to_json(config.model));
  refuse("training.dtype", base["training"]["dtype"], to_string(config.training.dtype));
  refuse("training.batch_size", base["training"]["batch_size"], config.training.batch_size);
  refuse("training.seq_len", base["training"]["seq_len"], config.training.seq_len);
  refuse("distributed.world_size", base.contains("distributed") ? base["distributed"]["world_size"] : nlohmann::json(1),
         1);
}

void fill_scaling_efficiency(nlohmann::json& result, const std::string& baseline_path) {
  const nlohmann::json base = read_json_file(baseline_path);
  auto& d = result["distributed"];
  const double base_tokens = base["summary"]["tokens_per_s"].get<double>();
  d["scaling_efficiency"] = d["total_tokens_per_s"].get<double>() / (d["world_size"].get<double>() * base_tokens);
  d["scaling_baseline"] = {{"result", baseline_path}, {"tokens_per_s", base_tokens}};
}

}  // namespace

int stage_main(int argc, char** argv, const StageSpec& stage) {
  ParsedCommandLine parsed;
  try {
    parsed = parse_command_line(stage.name, std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << stage.name << ": error: " << error_message(e) << std::endl;
    return 2;
  }
  StageSpec spec = stage;
  if (parsed.options.no_graph) {
    if (spec.step != StepKind::kGraph) {
      std::cerr << spec.name << ": error: --no-graph applies to stages that capture their step as a graph "
                << "(v4_ultra); " << spec.name << " runs its step eagerly already" << std::endl;
      return 2;
    }
    spec.step = StepKind::kEager;
    spec.summary += "; this run: --no-graph, the same kernels launched eagerly";
  }
  if (parsed.options.pitfall) {
    try {
      spec = stages::with_pitfall(spec, *parsed.options.pitfall);
    } catch (const std::exception& e) {
      std::cerr << spec.name << ": error: " << error_message(e) << std::endl;
      return 2;
    }
  }
  if (parsed.help) {
    std::cout << parsed.help_text << std::endl;
    return 0;
  }
  if (parsed.options.doctor) {
    std::cout << doctor_report();
    return 0;
  }
  const RunConfig& config = parsed.config;
  const RunOptions& options = parsed.options;
  if (options.validate_only) {
    std::cout << to_json(config).dump(2) << std::endl;
    return 0;
  }
  DistributedEnv dist;  // data parallel when a launcher set its variables
  try {
    dist = parse_distributed_env(process_env());
    check_data_parallel_options(dist, spec, config, options);
  } catch (const std::exception& e) {
    std::cerr << spec.name << ": error: " << error_message(e) << std::endl;
    return 2;
  }
  if (dist.enabled && spec.step == StepKind::kGraph) {
    spec.step = StepKind::kEager;
    spec.summary += "; this run: data parallel, the step runs eagerly (the Reducer's bucket bookkeeping runs on "
                    "the host during the backward, which a graph replay cannot repeat)";
  }
  const bool writes_files = dist.rank == 0;  // data parallel: rank 0 alone writes results and checkpoints
  const std::string output =
      options.output.empty()
          ? default_output(spec.name + (spec.pitfall ? std::string("_") + stages::pitfall(*spec.pitfall).name : "") +
                               (options.eval_only ? "_eval" : ""),
                           config)
          : options.output;
  const std::string trace = trace_path_for(output);
  // Every file the run would write is checked before any work, under one policy: never replaced without
  // --overwrite.
  for (const auto& refusal :
       {refuse_output_file("--output file", writes_files ? output : "", options.overwrite),
        refuse_output_file("--profile trace", writes_files && options.profile_steps > 0 ? trace : "",
                           options.overwrite),
        refuse_output_file("--save-checkpoint file", writes_files ? options.save_checkpoint : "", options.overwrite),
        refuse_output_folder("--checkpoint-dir", writes_files ? options.checkpoint_dir : "")}) {
    if (!refusal) continue;
    std::cerr << spec.name << ": error: " << *refusal << std::endl;
    return 2;
  }
  // --save-checkpoint inside the checkpoint folder under a name of the folder's own form would be taken for one
  // of the run's checkpoints (and written over by one, or pruned).
  if (writes_files && !options.save_checkpoint.empty() && !options.checkpoint_dir.empty()) {
    namespace fs = std::filesystem;
    const fs::path saved = fs::absolute(options.save_checkpoint).lexically_normal();
    const fs::path folder = fs::absolute(options.checkpoint_dir).lexically_normal();
    std::error_code error;
    const bool inside = saved.parent_path() == folder || fs::equivalent(saved.parent_path(), folder, error);
    if (inside && is_checkpoint_name(saved.filename().string())) {
      std::cerr << spec.name << ": error: --save-checkpoint '" << options.save_checkpoint << "' is inside --checkpoint-dir '"
                << options.checkpoint_dir << "' under a name of the form step_<N>.pt, which that folder's checkpoints use: "
                << "choose another name or folder" << std::endl;
      return 2;
    }
  }

  torch::Device device = torch::kCPU;
  std::optional<Checkpoint> resume_from;
  RunCheckpoints checkpoints;
  // Checked here as well as in Trainer, so that the run stops before any file is read or GPU memory taken.
  try {
    // Resolved here for every stage, so that a missing GPU is a usage error (exit 2) before any work.
    const bool on_gpu = resolve_device(config.training.device).is_cuda();
    const bool graphed = spec.step == StepKind::kGraph && !options.eval_only && on_gpu;
    if (graphed) require_graph_warmup(spec, config.training);
    if (!options.resume.empty()) {
      try {
        resume_from = read_checkpoint(options.resume);
      } catch (const c10::Error& e) {
        throw ConfigError("--resume: " + std::string(e.what_without_backtrace()));
      }
      check_resumable(*resume_from, options.resume, spec.name, config, graphed);
    }
    std::optional<CheckpointHeader> resumed;
    if (resume_from)
      resumed = CheckpointHeader{options.resume,       resume_from->stage,  resume_from->step, resume_from->run_step,
                                 resume_from->run_id, resume_from->kind, resume_from->config};
    const CheckpointPolicy policy{options.checkpoint_dir, options.checkpoint_every, options.keep_checkpoints};
    // Rank 0 alone writes checkpoints; the others keep the policy only to know that there are some.
    checkpoints = writes_files ? check_checkpoint_folder(policy, resumed) : RunCheckpoints(policy, "");
  } catch (const std::exception& e) {
    std::cerr << spec.name << ": error: " << error_message(e) << std::endl;
    return 2;
  }
  std::unique_ptr<DistributedContext> context;
  if (dist.enabled) {
    try {
      context = std::make_unique<DistributedContext>(dist, DistributedOptions{std::chrono::seconds(options.dist_timeout_s)});
      check_same_run(context->store(), dist.rank, dist.world_size,
                     run_description(spec, config, options, dist.world_size));
    } catch (const ConfigError& e) {
      std::cerr << spec.name << ": error: rank " << dist.rank << ": " << error_message(e) << std::endl;
      return 2;
    } catch (const std::exception& e) {
      std::cerr << spec.name << ": error: rank " << dist.rank << ": " << error_message(e) << std::endl;
      return 1;
    }
  }
  std::ostream quiet(nullptr);  // ranks other than 0 train silently
  std::ostream& log = writes_files ? std::cout : quiet;
  try {
    std::optional<EvalData> eval_data;
    if (!options.eval_data.empty()) eval_data = load_eval_data(options.eval_data, config.training.seq_len);
    device = context ? context->device() : resolve_device(config.training.device);
    if (options.eval_only) {
      const nlohmann::json result =
          evaluate_checkpoint(spec, config, options.load_checkpoint, *eval_data, device, std::cout);
      write_json_atomically(output, result, options.overwrite);
      std::cout << "result written to " << output << std::endl;
      return 0;
    }
    Trainer trainer(spec, config, device);
    if (!options.load_checkpoint.empty()) {
      // A file that is no checkpoint, or one of another model, is the user's input: exit 2, as --resume's.
      try {
        trainer.load_checkpoint(options.load_checkpoint);
      } catch (const std::exception& e) {
        std::cerr << spec.name << ": error: --load-checkpoint: " << error_message(e) << std::endl;
        if (context) context->abort();
        return 2;
      }
    }
    RunExtras extras;
    if (resume_from) {
      extras.first_step = trainer.resume(*resume_from);
      resume_from.reset();  // its tensors are in the model and optimizer now
    }
    if (context) {
      broadcast_weights(*context, trainer.model());
      trainer.use_runner(std::make_unique<DataParallelStep>(*context, trainer.model(), trainer.optimizer(),
                                                            config.training.grad_accum_steps));
    }
    extras.distributed = context.get();
    extras.eval_data = std::move(eval_data);
    extras.eval_every = options.eval_every;
    if (options.profile_steps > 0) extras.profile = {options.profile_steps, trace};
    extras.checkpoints = checkpoints;
    // The checkpoint holds the last counted step (or the stop's): written before the extra steps of --profile
    // and of the energy figure (apps/report/training_run.h).
    extras.after_last_counted_step = [&](int64_t steps_done) {
      if (!writes_files || options.save_checkpoint.empty()) return;
      trainer.save_checkpoint(options.save_checkpoint, options.overwrite, steps_done,
                              {checkpoints.run_id(), kSavedCheckpoint});
      std::cout << "checkpoint written to " << options.save_checkpoint << std::endl;
    };
    // Installed for the training only: before it a signal ends the process as usual (nothing to save yet).
    StopSignalGuard stop_on_signal;
    std::unique_ptr<StopVote> vote;
    if (context) vote = std::make_unique<StopVote>(*context);
    extras.stop_requested = [&vote] {
      const bool mine = stop_signal_received() != 0;
      return vote ? (*vote)(mine) : mine;
    };
    nlohmann::json result = run_training(trainer, extras, log);
    // 128 + the signal, the shell's code for a process the signal ended (ranks stopped by another rank's
    // signal report SIGTERM's).
    const int received = stop_signal_received();
    const int exit_code = result["interrupted"].get<bool>() ? 128 + (received ? received : SIGTERM) : 0;
    if (!writes_files) return exit_code;
    if (!options.scaling_baseline.empty() && !result["summary"].is_null())
      fill_scaling_efficiency(result, options.scaling_baseline);
    write_json_atomically(output, result, options.overwrite);
    if (result["summary"].is_null()) {
      std::cout << "result written to " << output << " (" << result["summary_note"].get<std::string>() << ")"
                << std::endl;
      return exit_code;
    }
    const auto& s = result["summary"];
    // The caching allocator's peak exists on the GPU only.
    const std::string peak =
        device.is_cuda() ? " | peak " + std::to_string(std::lround(s["peak_allocated_mb"].get<double>())) + " MB" : "";
    std::printf(
        "[%s] median step %.2f ms [p10 %.2f, p90 %.2f] | %.1f samples/s | %.0f tokens/s | %.2f TFLOP/s%s | loss %.4f "
        "-> %.4f\n",
        spec.name.c_str(), s["step_ms"]["median"].get<double>(), s["step_ms"]["p10"].get<double>(),
        s["step_ms"]["p90"].get<double>(), s["samples_per_s"].get<double>(), s["tokens_per_s"].get<double>(),
        s["achieved_tflops"].get<double>(), peak.c_str(),
        s["first_loss"].is_number() ? s["first_loss"].get<double>() : NAN,
        s["final_loss"].is_number() ? s["final_loss"].get<double>() : NAN);
    print_teaching_lines(spec.name, s);
    std::cout << "result written to " << output << std::endl;
    if (exit_code != 0) return exit_code;
  } catch (const c10::OutOfMemoryError& e) {
    const auto mem = peak_memory(device);
    std::cerr << spec.name << ": out of GPU memory on config '" << config.name << "' (batch "
              << config.training.batch_size << ", seq " << config.training.seq_len << ", hidden "
              << config.model.hidden_dim << ", layers " << config.model.n_layers << ", "
              << to_string(config.training.dtype) << "): the GPU has " << (total_device_memory(device) >> 20)
              << " MB, peak allocated by this run " << (mem.peak_allocated_bytes >> 20)
              << " MB. No result file was written. Reduce --batch-size or --seq-len.\n"
              << "LibTorch said: " << e.what_without_backtrace() << std::endl;
    if (context) context->abort();
    return 3;
  } catch (const std::exception& e) {
    std::cerr << spec.name << ": error: " << (context ? "rank " + std::to_string(dist.rank) + ": " : "")
              << error_message(e) << std::endl;
    if (context) context->abort();
    return 1;
  }
  return 0;
}

}  // namespace tt
