// Model and training configuration: defaults, JSON (de)serialisation and validation.
// Every error names the field, the value and the rule, and is raised before any GPU work.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace tt {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
  double learning_rate = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double adam_eps = 1e-8;
  double weight_decay = 0.01;
  double grad_clip = 0.0;     // max global gradient norm; 0 turns clipping off
  std::string dtype = "fp32"; // fp32 | bf16 (bf16 = autocast mixed precision, fp32 master weights)
  int64_t seed = 42;
  std::string device = "auto"; // auto | cpu | cuda
  int64_t log_every = 10;     // progress line every N steps; 0 turns it off
  std::string data;           // empty: synthetic tokens; otherwise a text file read as bytes
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

// Throws ConfigError naming the first violated rule.
void validate(const ModelConfig& config);
void validate(const RunConfig& config);

}  // namespace tt
