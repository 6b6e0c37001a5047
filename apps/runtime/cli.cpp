#include "apps/runtime/cli.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cxxopts.hpp>
#include <filesystem>
#include <iostream>
#include <optional>

#include "apps/runtime/device.h"
#include "apps/runtime/evaluate.h"
#include "apps/runtime/profiling.h"
#include "apps/runtime/results.h"
#include "apps/runtime/system_info.h"
#include "apps/runtime/trainer.h"

namespace tt {
namespace {

cxxopts::Options make_options(const std::string& program) {
  cxxopts::Options o(program,
                     "Train the TinyTransformer model with this stage's components and write a result JSON.\n"
                     "Flags override fields of the --config file; unset fields keep the built-in defaults\n"
                     "(which equal configs/workshop.json).");
  o.add_options("Run")("config", "JSON config file (see configs/)", cxxopts::value<std::string>())(
      "output", "result JSON path (default: results/<stage>_<config>_<dtype>_<UTC time>.json)",
      cxxopts::value<std::string>())("overwrite", "replace an existing --output file")(
      "device", "auto | cpu | cuda (on ROCm builds, cuda is the HIP device) [training.device, default auto]",
      cxxopts::value<std::string>())(
      "dtype", "fp32 | bf16 (bf16: autocast mixed precision, fp32 master weights) [training.dtype, default fp32]",
      cxxopts::value<std::string>())("use-amp", "the workshop's flag: same as --dtype bf16")(
      "seed", "seed for weights and data [training.seed, default 42]", cxxopts::value<int64_t>())(
      "data", "train on this text file as bytes (needs vocab_size >= 256) [training.data, default synthetic]",
      cxxopts::value<std::string>())(
      "log-every", "progress line every N steps, 0 = off [training.log_every, default 10]", cxxopts::value<int64_t>())(
      "save-checkpoint", "write weights, optimizer state, step and config here after training",
      cxxopts::value<std::string>())("load-checkpoint", "start from this checkpoint (its model config must match)",
                                     cxxopts::value<std::string>())(
      "validate", "check the config, print the effective config as JSON, and exit")(
      "doctor", "print backend, GPU, LibTorch version and installed profilers, and exit")("help", "show this help");
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
  o.add_options("Training (override config fields)")("batch-size", "[training.batch_size, default 8]",
                                                     cxxopts::value<int64_t>())(
      "seq-len", "[training.seq_len, default 128]", cxxopts::value<int64_t>())(
      "num-steps", "measured steps [training.num_steps, default 50]", cxxopts::value<int64_t>())(
      "warmup-steps", "steps run before measuring [training.warmup_steps, default 5]", cxxopts::value<int64_t>())(
      "learning-rate", "[training.learning_rate, default 3e-4]", cxxopts::value<double>())(
      "weight-decay", "[training.weight_decay, default 0.01]", cxxopts::value<double>())(
      "grad-clip", "max global gradient norm, 0 = off [training.grad_clip, default 0]", cxxopts::value<double>());
  o.add_options("Model (override config fields)")("vocab-size", "[model.vocab_size, default 1000]",
                                                  cxxopts::value<int64_t>())(
      "hidden-dim", "[model.hidden_dim, default 512]", cxxopts::value<int64_t>())(
      "num-layers", "[model.n_layers, default 8]", cxxopts::value<int64_t>())("num-heads", "[model.n_heads, default 8]",
                                                                              cxxopts::value<int64_t>())(
      "num-kv-heads", "[model.n_kv_heads, default 4]", cxxopts::value<int64_t>())(
      "intermediate-dim", "[model.intermediate_dim, default 2048]", cxxopts::value<int64_t>())(
      "max-seq-len", "[model.max_seq_len, default 4096]", cxxopts::value<int64_t>());
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
  return "results/" + stage + "_" + c.name + "_" + c.training.dtype + "_" + utc_timestamp(true) + ".json";
}

}  // namespace

ParsedCommandLine parse_command_line(const std::string& program, const std::vector<std::string>& args) {
  auto options = make_options(program);
  std::vector<const char*> argv{program.c_str()};
  for (const auto& a : args) argv.push_back(a.c_str());
  cxxopts::ParseResult r;
  try {
    r = options.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw ConfigError(std::string("command line: ") + e.what() + " (see --help)");
  }
  if (!r.unmatched().empty())
    throw ConfigError("command line: unexpected argument '" + r.unmatched().front() + "' (see --help)");

  ParsedCommandLine parsed;
  parsed.help_text = options.help();
  if (r.count("help")) {
    parsed.help = true;
    return parsed;
  }
  RunConfig& c = parsed.config;
  if (r.count("config")) c = load_run_config(r["config"].as<std::string>());
  override_field(r, "device", c.training.device);
  override_field(r, "dtype", c.training.dtype);
  if (r.count("use-amp")) {
    if (r.count("dtype") && c.training.dtype != "bf16")
      throw ConfigError("command line: --use-amp means --dtype bf16 but --dtype " + c.training.dtype +
                        " was also given");
    c.training.dtype = "bf16";
  }
  override_field(r, "seed", c.training.seed);
  override_field(r, "data", c.training.data);
  override_field(r, "log-every", c.training.log_every);
  override_field(r, "batch-size", c.training.batch_size);
  override_field(r, "seq-len", c.training.seq_len);
  override_field(r, "num-steps", c.training.num_steps);
  override_field(r, "warmup-steps", c.training.warmup_steps);
  override_field(r, "learning-rate", c.training.learning_rate);
  override_field(r, "weight-decay", c.training.weight_decay);
  override_field(r, "grad-clip", c.training.grad_clip);
  override_field(r, "vocab-size", c.model.vocab_size);
  override_field(r, "hidden-dim", c.model.hidden_dim);
  override_field(r, "num-layers", c.model.n_layers);
  override_field(r, "num-heads", c.model.n_heads);
  override_field(r, "num-kv-heads", c.model.n_kv_heads);
  override_field(r, "intermediate-dim", c.model.intermediate_dim);
  override_field(r, "max-seq-len", c.model.max_seq_len);
  validate(c);

  RunOptions& o = parsed.options;
  override_field(r, "output", o.output);
  o.overwrite = r.count("overwrite") > 0;
  override_field(r, "save-checkpoint", o.save_checkpoint);
  override_field(r, "load-checkpoint", o.load_checkpoint);
  o.validate_only = r.count("validate") > 0;
  o.doctor = r.count("doctor") > 0;
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
  if (!o.eval_data.empty() && !std::filesystem::exists(o.eval_data))
    throw ConfigError("--eval-data: file '" + o.eval_data + "' does not exist");
  if (!o.eval_data.empty() && c.model.vocab_size < 256)
    throw ConfigError("--eval-data reads bytes as tokens: model.vocab_size = " + std::to_string(c.model.vocab_size) +
                      " is not allowed, it must be >= 256");
  if (!o.load_checkpoint.empty() && !std::filesystem::exists(o.load_checkpoint))
    throw ConfigError("--load-checkpoint: file '" + o.load_checkpoint + "' does not exist");
  if (!c.training.data.empty() && !std::filesystem::exists(c.training.data))
    throw ConfigError("training.data: file '" + c.training.data + "' does not exist");
  return parsed;
}

int stage_main(int argc, char** argv, const StageSpec& spec) {
  ParsedCommandLine parsed;
  try {
    parsed = parse_command_line(spec.name, std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << spec.name << ": error: " << e.what() << std::endl;
    return 2;
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
  const std::string output =
      options.output.empty() ? default_output(spec.name + (options.eval_only ? "_eval" : ""), config) : options.output;
  if (!options.overwrite && std::filesystem::exists(output)) {
    std::cerr << spec.name << ": error: output file '" << output
              << "' exists; pass --overwrite to replace it or choose another --output" << std::endl;
    return 2;
  }
  const std::string trace = trace_path_for(output);
  if (options.profile_steps > 0 && !options.overwrite && std::filesystem::exists(trace)) {
    std::cerr << spec.name << ": error: --profile would write the trace '" << trace
              << "', which exists; pass --overwrite to replace it or choose another --output" << std::endl;
    return 2;
  }

  torch::Device device = torch::kCPU;
  try {
    std::optional<EvalData> eval_data;
    if (!options.eval_data.empty()) eval_data = load_eval_data(options.eval_data, config.training.seq_len);
    device = resolve_device(config.training.device);
    if (options.eval_only) {
      const nlohmann::json result =
          evaluate_checkpoint(spec, config, options.load_checkpoint, *eval_data, device, std::cout);
      write_json_atomically(output, result, options.overwrite);
      std::cout << "result written to " << output << std::endl;
      return 0;
    }
    Trainer trainer(spec, config, device);
    if (!options.load_checkpoint.empty()) trainer.load_checkpoint(options.load_checkpoint);
    if (eval_data) trainer.set_eval_data(std::move(*eval_data), options.eval_every);
    if (options.profile_steps > 0) trainer.set_profile({options.profile_steps, trace});
    nlohmann::json result = trainer.run(std::cout);
    if (!options.save_checkpoint.empty()) {
      trainer.save_checkpoint(options.save_checkpoint);
      std::cout << "checkpoint written to " << options.save_checkpoint << std::endl;
    }
    write_json_atomically(output, result, options.overwrite);
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
    std::cout << "result written to " << output << std::endl;
  } catch (const c10::OutOfMemoryError& e) {
    const auto mem = peak_memory(device);
    std::cerr << spec.name << ": out of GPU memory on config '" << config.name << "' (batch "
              << config.training.batch_size << ", seq " << config.training.seq_len << ", hidden "
              << config.model.hidden_dim << ", layers " << config.model.n_layers << ", " << config.training.dtype
              << "): the GPU has " << (total_device_memory(device) >> 20) << " MB, peak allocated by this run "
              << (mem.peak_allocated_bytes >> 20)
              << " MB. No result file was written. Reduce --batch-size or --seq-len.\n"
              << "LibTorch said: " << e.what_without_backtrace() << std::endl;
    return 3;
  } catch (const c10::Error& e) {
    std::cerr << spec.name << ": error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << spec.name << ": error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace tt
