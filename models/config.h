// Model and training configuration: defaults, JSON (de)serialisation and validation, and the one table of
// config fields that the config file, the command line and the help text all read.
// Every error names the field, the value and the rule, and is raised before any GPU work.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tt {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The arithmetic a run trains in; "dtype" in configs, flags and result files.
enum class Precision {
  kFp32,  // fp32 everywhere (TF32 off, LibTorch's default)
  kBf16,  // bf16 autocast for the forward, fp32 master weights and optimizer state
};
const char* to_string(Precision precision);  // "fp32" | "bf16"
// Throws ConfigError `<what> "<text>" is not allowed: must be "fp32" or "bf16"`.
Precision parse_precision(const std::string& text, const std::string& what);

struct ModelConfig {
  int64_t vocab_size = 1000;
  int64_t hidden_dim = 512;
  int64_t n_layers = 8;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 4;
  int64_t intermediate_dim = 2048;
  int64_t max_seq_len = 4096;
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;
  bool tie_embeddings = true;
  double init_std = 0.02;

  int64_t head_dim() const { return hidden_dim / n_heads; }
  bool operator==(const ModelConfig& other) const;
  bool operator!=(const ModelConfig& other) const { return !(*this == other); }
};

struct TrainConfig {
  int64_t batch_size = 8;
  int64_t seq_len = 128;
  int64_t num_steps = 50;     // measured steps
  int64_t warmup_steps = 5;   // trained but not measured, run before the measured steps
  double learning_rate = 3e-4;           // the peak of the schedule
  std::string lr_schedule = "constant";  // constant | cosine | linear (kernels/lr_schedule.h)
  int64_t lr_warmup_steps = 0;           // linear ramp from 0 over the first optimizer steps (not warmup_steps)
  double min_lr = 0.0;                   // where cosine and linear end, at the last step
  int64_t grad_accum_steps = 1;          // micro-batches of batch_size per optimizer step, losses scaled by 1/k
  double beta1 = 0.9;
  double beta2 = 0.999;
  double adam_eps = 1e-8;
  double weight_decay = 0.01;
  double grad_clip = 0.0;     // max global gradient norm; 0 turns clipping off
  // Our AdamW (v4): update each layer during the backward, as its gradients become final (bitwise the same
  // arithmetic). Off by default: measured slower on H200 (docs/training.md). Off under data parallel and for
  // other optimizers.
  bool optimizer_overlap = false;
  // Our AdamW (v4): the dtype of the moments m and v. bf16 moves 20 bytes per parameter in the update
  // instead of 28 (the update still computes in fp32); a resume must keep the checkpoint's.
  Precision optimizer_state_dtype = Precision::kFp32;
  // Data parallel with a multi-tensor AdamW (v2-v4): ZeRO-1, each of N ranks keeps and updates 1/N of the
  // optimizer's moments (apps/train/sharded_adamw.h). Checkpoints stay whole, so a resume may switch it (and the world
  // size).
  bool shard_optimizer = false;
  Precision dtype = Precision::kFp32;
  bool allow_tf32 = false;    // fp32 matmuls on TF32 tensor cores (LibTorch's default, and the workshop's: off)
  int64_t seed = 42;
  std::string device = "auto"; // auto | cpu | cuda
  int64_t log_every = 10;     // progress line every N steps; 0 turns it off
  std::string data;           // empty: synthetic tokens; otherwise a text file read as bytes

  // What one optimizer step consumes: all grad_accum_steps micro-batches. Every per-step rate (tokens/s, MFU,
  // tokens per joule) divides by these, so they live in one place.
  int64_t rows_per_step() const { return batch_size * grad_accum_steps; }
  int64_t tokens_per_step() const { return rows_per_step() * seq_len; }
};

struct RunConfig {
  std::string name = "custom";  // config file stem, recorded in results
  ModelConfig model;
  TrainConfig training;
};

// Strict parsing: unknown keys, wrong types and out-of-range values throw ConfigError.
RunConfig run_config_from_json(const nlohmann::json& json, const std::string& origin);
RunConfig load_run_config(const std::string& path);
nlohmann::json to_json(const ModelConfig& config);
nlohmann::json to_json(const TrainConfig& config);
nlohmann::json to_json(const RunConfig& config);
ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& origin);

// Sanity limits that validate() applies beyond the per-field rules: a model of more parameters (4 TB of fp32
// weights), or a micro-batch of more tokens, cannot run on any machine this project targets.
constexpr double kMaxParameters = 1e12;
constexpr double kMaxTokensPerBatch = 2147483648.0;  // 2^31
// A step's batch (all its micro-batches) is drawn into one device buffer: the same bound for it.
constexpr double kMaxTokensPerStep = 2147483648.0;  // 2^31
// The loss of every step is kept on the device until the end (4 bytes a step): 400 MB at this bound.
constexpr double kMaxSteps = 1e8;

// Throws ConfigError naming the first violated rule.
void validate(const ModelConfig& config);
void validate(const RunConfig& config);

// One field of the "model" or "training" section, as the command line sees it.
struct ConfigField {
  std::string path;   // "training.batch_size"
  const char* flag;   // "batch-size"; nullptr when only a config file sets the field
  const char* help;   // what the flag means, "" when its path says it all
  std::string default_value;  // the built-in default, as the help text shows it ("8", "fp32", "(empty)")
  bool boolean = false;       // a switch: the flag alone means true
};
// Every field, model section first, in the order of the config structs.
const std::vector<ConfigField>& config_fields();
// Sets the field from a flag's text, parsed and checked as its JSON value would be. Throws ConfigError
// naming the flag, the text and what the field needs.
void set_config_field(RunConfig& config, const ConfigField& field, const std::string& text);

}  // namespace tt
