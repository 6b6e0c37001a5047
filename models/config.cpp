#include "models/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <variant>

namespace tt {
namespace {

using json = nlohmann::json;

// One JSON key of a config section: the member it sets and, when the command line may set it too, the flag.
template <class Config>
struct Field {
  const char* key;
  std::variant<int64_t Config::*, double Config::*, bool Config::*, std::string Config::*, Precision Config::*> member;
  const char* flag = nullptr;
  const char* help = "";
};

const std::vector<Field<ModelConfig>>& model_fields() {
  static const std::vector<Field<ModelConfig>> fields = {
      {"vocab_size", &ModelConfig::vocab_size, "vocab-size"},
      {"hidden_dim", &ModelConfig::hidden_dim, "hidden-dim"},
      {"n_layers", &ModelConfig::n_layers, "num-layers"},
      {"n_heads", &ModelConfig::n_heads, "num-heads"},
      {"n_kv_heads", &ModelConfig::n_kv_heads, "num-kv-heads"},
      {"intermediate_dim", &ModelConfig::intermediate_dim, "intermediate-dim"},
      {"max_seq_len", &ModelConfig::max_seq_len, "max-seq-len"},
      {"rope_theta", &ModelConfig::rope_theta},
      {"norm_eps", &ModelConfig::norm_eps},
      {"tie_embeddings", &ModelConfig::tie_embeddings},
      {"init_std", &ModelConfig::init_std},
  };
  return fields;
}

const std::vector<Field<TrainConfig>>& train_fields() {
  static const std::vector<Field<TrainConfig>> fields = {
      {"batch_size", &TrainConfig::batch_size, "batch-size"},
      {"seq_len", &TrainConfig::seq_len, "seq-len"},
      {"num_steps", &TrainConfig::num_steps, "num-steps", "measured steps"},
      {"warmup_steps", &TrainConfig::warmup_steps, "warmup-steps", "steps run before measuring"},
      {"learning_rate", &TrainConfig::learning_rate, "learning-rate", "the schedule's peak"},
      {"lr_schedule", &TrainConfig::lr_schedule, "lr-schedule",
       "constant | cosine | linear: decay from learning_rate to min_lr over all steps (warm-up included)"},
      {"lr_warmup_steps", &TrainConfig::lr_warmup_steps, "lr-warmup-steps",
       "linear learning-rate ramp from 0 over the first N optimizer steps (not --warmup-steps)"},
      {"min_lr", &TrainConfig::min_lr, "min-lr", "learning rate at the last step of cosine and linear"},
      {"grad_accum_steps", &TrainConfig::grad_accum_steps, "grad-accum-steps",
       "micro-batches of batch_size accumulated per optimizer step (losses scaled by 1/N)"},
      {"beta1", &TrainConfig::beta1},
      {"beta2", &TrainConfig::beta2},
      {"adam_eps", &TrainConfig::adam_eps},
      {"weight_decay", &TrainConfig::weight_decay, "weight-decay"},
      {"grad_clip", &TrainConfig::grad_clip, "grad-clip", "max global gradient norm, 0 = off"},
      {"optimizer_overlap", &TrainConfig::optimizer_overlap, "optimizer-overlap",
       "our AdamW (v4): update each layer during the backward instead of after it (bitwise the same result; "
       "slower on the GPUs measured, docs/training.md)"},
      {"optimizer_state_dtype", &TrainConfig::optimizer_state_dtype, "optimizer-state-dtype",
       "fp32 | bf16: our AdamW's moments (v4); bf16 moves 20 instead of 28 bytes per parameter"},
      {"shard_optimizer", &TrainConfig::shard_optimizer, "shard-optimizer",
       "data parallel, a multi-tensor AdamW (v2-v4): ZeRO-1, each of N GPUs keeps and updates 1/N of the optimizer "
       "state"},
      {"dtype", &TrainConfig::dtype, "dtype", "fp32 | bf16 (bf16: autocast mixed precision, fp32 master weights)"},
      {"allow_tf32", &TrainConfig::allow_tf32, "allow-tf32",
       "fp32 matmuls and convolutions on TF32 tensor cores (NVIDIA Ampere and later; the flag alone means true)"},
      {"seed", &TrainConfig::seed, "seed", "seed for weights and data"},
      {"device", &TrainConfig::device, "device", "auto | cpu | cuda (on ROCm builds, cuda is the HIP device)"},
      {"log_every", &TrainConfig::log_every, "log-every", "progress line every N steps, 0 = off"},
      {"data", &TrainConfig::data, "data",
       "train on this text file as bytes (needs vocab_size >= 256); empty = synthetic tokens"},
  };
  return fields;
}

std::string allowed_keys(const char* const* begin, const char* const* end) {
  std::string out;
  for (auto it = begin; it != end; ++it) out += (out.empty() ? "" : ", ") + std::string(*it);
  return out;
}

template <class Config>
std::string allowed_keys(const std::vector<Field<Config>>& fields) {
  std::string out;
  for (const auto& f : fields) out += (out.empty() ? "" : ", ") + std::string(f.key);
  return out;
}

[[noreturn]] void fail(const std::string& origin, const std::string& field, const std::string& what) {
  throw ConfigError(origin + ": field \"" + field + "\" " + what);
}

// Reads one field's JSON value into config; `name` is the field's path ("training.batch_size").
template <class Config>
void read_field(const json& value, const Field<Config>& field, Config& config, const std::string& name,
                const std::string& origin) {
  std::visit(
      [&](auto member) {
        using T = std::decay_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          if (!value.is_number_integer()) fail(origin, name, "must be an integer, got " + value.dump());
          // JSON keeps integers above INT64_MAX as unsigned; read as int64_t they would wrap to negatives.
          if (value.is_number_unsigned() &&
              value.template get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            fail(origin, name, "= " + value.dump() + " is not allowed: must be at most " +
                                   std::to_string(std::numeric_limits<int64_t>::max()));
          config.*member = value.template get<int64_t>();
        } else if constexpr (std::is_same_v<T, double>) {
          if (!value.is_number()) fail(origin, name, "must be a number, got " + value.dump());
          config.*member = value.template get<double>();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!value.is_boolean()) fail(origin, name, "must be true or false, got " + value.dump());
          config.*member = value.template get<bool>();
        } else if constexpr (std::is_same_v<T, Precision>) {
          if (!value.is_string()) fail(origin, name, "must be \"fp32\" or \"bf16\", got " + value.dump());
          config.*member = parse_precision(value.template get<std::string>(), origin + ": field \"" + name + "\" =");
        } else {
          if (value.is_null()) {
            config.*member = "";
          } else {
            if (!value.is_string()) fail(origin, name, "must be a string, got " + value.dump());
            config.*member = value.template get<std::string>();
          }
        }
      },
      field.member);
}

template <class Config>
void read_section(const json& section, const std::vector<Field<Config>>& fields, Config& config,
                  const std::string& prefix, const std::string& origin) {
  if (!section.is_object()) fail(origin, prefix, "must be a JSON object, got " + section.dump());
  for (const auto& [key, value] : section.items()) {
    const Field<Config>* field = nullptr;
    for (const auto& f : fields)
      if (key == f.key) field = &f;
    if (field == nullptr) fail(origin, prefix + "." + key, "is not a known key; allowed: " + allowed_keys(fields));
    read_field(value, *field, config, prefix + "." + key, origin);
  }
}

template <class Config>
json field_value(const Field<Config>& field, const Config& config) {
  return std::visit(
      [&](auto member) -> json {
        if constexpr (std::is_same_v<std::decay_t<decltype(config.*member)>, Precision>) {
          return to_string(config.*member);
        } else {
          return config.*member;
        }
      },
      field.member);
}

template <class Config>
json write_section(const std::vector<Field<Config>>& fields, const Config& config) {
  json out = json::object();
  for (const auto& f : fields) out[f.key] = field_value(f, config);
  return out;
}

// A flag's text as the JSON value its field expects: numbers and booleans parsed whole (so "8x" or "1e3"
// for an integer field are errors, not 8 or 1000), strings taken as they are.
template <class Config>
json flag_value(const Field<Config>& field, const std::string& text, const std::string& origin) {
  return std::visit(
      [&](auto member) -> json {
        using T = std::decay_t<decltype(std::declval<Config>().*member)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          char* end = nullptr;
          errno = 0;
          const long long v = std::strtoll(text.c_str(), &end, 10);
          if (text.empty() || *end != '\0' || errno == ERANGE)
            throw ConfigError(origin + " must be an integer, got '" + text + "'");
          return static_cast<int64_t>(v);
        } else if constexpr (std::is_same_v<T, double>) {
          char* end = nullptr;
          const double v = std::strtod(text.c_str(), &end);
          if (text.empty() || *end != '\0') throw ConfigError(origin + " must be a number, got '" + text + "'");
          return v;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "false") throw ConfigError(origin + " must be true or false, got '" + text + "'");
          return text == "true";
        } else {
          return text;
        }
      },
      field.member);
}

std::string str(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void require_positive(const std::string& field, int64_t value) {
  if (value <= 0) fail("config", field, "= " + std::to_string(value) + " is not allowed: must be positive");
}

// The built-in default as the help text shows it: strings without quotes, "" as "(empty)".
std::string default_text(const json& value) {
  if (value.is_number_float()) return str(value.get<double>());
  if (!value.is_string()) return value.dump();
  const auto s = value.get<std::string>();
  return s.empty() ? "(empty)" : s;
}

}  // namespace

const char* to_string(Precision precision) { return precision == Precision::kBf16 ? "bf16" : "fp32"; }

Precision parse_precision(const std::string& text, const std::string& what) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  throw ConfigError(what + " \"" + text + "\" is not allowed: must be \"fp32\" or \"bf16\"");
}

bool ModelConfig::operator==(const ModelConfig& o) const {
  return to_json(*this) == to_json(o);
}
ModelConfig model_config_from_json(const json& j, const std::string& origin) {
  ModelConfig config;
  read_section(j, model_fields(), config, "model", origin);
  return config;
}

RunConfig run_config_from_json(const json& j, const std::string& origin) {
  static const char* const kTopKeys[] = {"name", "description", "model", "training"};
  if (!j.is_object()) throw ConfigError(origin + ": the config must be a JSON object");
  RunConfig config;
  for (const auto& [key, value] : j.items()) {
    if (key == "name") {
      if (!value.is_string()) fail(origin, key, "must be a string, got " + value.dump());
      config.name = value.template get<std::string>();
    } else if (key == "description") {
      if (!value.is_string()) fail(origin, key, "must be a string, got " + value.dump());
    } else if (key == "model") {
      read_section(value, model_fields(), config.model, "model", origin);
    } else if (key == "training") {
      read_section(value, train_fields(), config.training, "training", origin);
    } else {
      fail(origin, key, "is not a known key; allowed: " + allowed_keys(std::begin(kTopKeys), std::end(kTopKeys)));
    }
  }
  return config;
}

RunConfig load_run_config(const std::string& path) {
  if (!std::filesystem::is_regular_file(path))
    throw ConfigError("cannot open config file '" + path + "': it does not exist or is not a file");
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot open config file '" + path + "'");
  json j;
  // A key given twice in one object would silently keep the last value (nlohmann's rule) and drop the
  // first section or value without a word: refused, naming the key and its object.
  std::vector<std::set<std::string>> keys_seen;
  std::vector<std::string> object_path{""};
  std::string last_key;
  const json::parser_callback_t refuse_duplicates = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys_seen.emplace_back();
        if (keys_seen.size() > 1) object_path.push_back(object_path.back() + (object_path.back().empty() ? "" : ".") + last_key);
        break;
      case json::parse_event_t::object_end:
        keys_seen.pop_back();
        if (object_path.size() > 1) object_path.pop_back();
        break;
      case json::parse_event_t::key:
        last_key = parsed.get<std::string>();
        if (!keys_seen.back().insert(last_key).second)
          throw ConfigError("config file '" + path + "': key \"" +
                            (object_path.back().empty() ? "" : object_path.back() + ".") + last_key +
                            "\" appears twice; give each key once");
        break;
      default:
        break;
    }
    return true;
  };
  try {
    j = json::parse(in, refuse_duplicates);
  } catch (const json::parse_error& e) {
    // nlohmann's message gives the line and column ("parse error at line 3, column 5: ...").
    throw ConfigError("config file '" + path + "' is not valid JSON: " + e.what());
  } catch (const json::out_of_range& e) {
    // A number beyond a double's range (1e999) is thrown as out_of_range, not as a parse error.
    throw ConfigError("config file '" + path + "' is not valid JSON: " + e.what());
  }
  RunConfig config = run_config_from_json(j, path);
  if (!j.contains("name")) {
    auto slash = path.find_last_of('/');
    std::string stem = path.substr(slash == std::string::npos ? 0 : slash + 1);
    config.name = stem.substr(0, stem.rfind(".json") == std::string::npos ? stem.size() : stem.rfind(".json"));
  }
  return config;
}

json to_json(const ModelConfig& config) { return write_section(model_fields(), config); }
json to_json(const TrainConfig& config) { return write_section(train_fields(), config); }
json to_json(const RunConfig& config) {
  return {{"name", config.name}, {"model", to_json(config.model)}, {"training", to_json(config.training)}};
}

void validate(const ModelConfig& m) {
  require_positive("model.vocab_size", m.vocab_size);
  require_positive("model.hidden_dim", m.hidden_dim);
  require_positive("model.n_layers", m.n_layers);
  require_positive("model.n_heads", m.n_heads);
  require_positive("model.n_kv_heads", m.n_kv_heads);
  require_positive("model.intermediate_dim", m.intermediate_dim);
  require_positive("model.max_seq_len", m.max_seq_len);
  if (m.hidden_dim % m.n_heads != 0)
    fail("config", "model.hidden_dim",
         "= " + std::to_string(m.hidden_dim) + " is not allowed: must be divisible by model.n_heads (" +
             std::to_string(m.n_heads) + ")");
  if (m.n_heads % m.n_kv_heads != 0)
    fail("config", "model.n_heads",
         "= " + std::to_string(m.n_heads) + " is not allowed: must be a multiple of model.n_kv_heads (" +
             std::to_string(m.n_kv_heads) + ")");
  if (m.head_dim() % 2 != 0)
    fail("config", "model.hidden_dim",
         "= " + std::to_string(m.hidden_dim) + " is not allowed: head_dim = hidden_dim / n_heads = " +
             std::to_string(m.head_dim()) + " must be even for RoPE");
  if (!(m.rope_theta > 0)) fail("config", "model.rope_theta", "= " + str(m.rope_theta) + " is not allowed: must be > 0");
  if (!(m.norm_eps > 0)) fail("config", "model.norm_eps", "= " + str(m.norm_eps) + " is not allowed: must be > 0");
  if (!(m.init_std > 0)) fail("config", "model.init_std", "= " + str(m.init_std) + " is not allowed: must be > 0");
  // Sizes that pass the rules above can still ask for more memory than any machine has; said here, by
  // name, rather than by an allocator's overflow or out-of-memory message after the start.
  const double h = static_cast<double>(m.hidden_dim), kv = static_cast<double>(m.n_kv_heads * m.head_dim());
  const double per_layer = h * (h + 2 * kv) + h * h + 3 * h * static_cast<double>(m.intermediate_dim) + 2 * h;
  const double parameters = static_cast<double>(m.vocab_size) * h * (m.tie_embeddings ? 1 : 2) +
                            static_cast<double>(m.n_layers) * per_layer + h;
  if (parameters > kMaxParameters)
    fail("config", "model",
         "is not allowed: vocab_size " + std::to_string(m.vocab_size) + ", hidden_dim " + std::to_string(m.hidden_dim) +
             ", n_layers " + std::to_string(m.n_layers) + " and intermediate_dim " +
             std::to_string(m.intermediate_dim) + " make " + str(parameters) + " parameters; at most " +
             str(kMaxParameters) + " are allowed");
}

void validate(const RunConfig& c) {
  validate(c.model);
  const TrainConfig& t = c.training;
  require_positive("training.batch_size", t.batch_size);
  require_positive("training.seq_len", t.seq_len);
  require_positive("training.num_steps", t.num_steps);
  if (static_cast<double>(t.batch_size) * static_cast<double>(t.seq_len) > kMaxTokensPerBatch)
    fail("config", "training.batch_size",
         "= " + std::to_string(t.batch_size) + " is not allowed with training.seq_len = " + std::to_string(t.seq_len) +
             ": batch_size x seq_len must be at most " + str(kMaxTokensPerBatch) + " tokens per micro-batch");
  if (t.seq_len > c.model.max_seq_len)
    fail("config", "training.seq_len",
         "= " + std::to_string(t.seq_len) + " is not allowed: must be <= model.max_seq_len (" +
             std::to_string(c.model.max_seq_len) + ")");
  if (t.warmup_steps < 0)
    fail("config", "training.warmup_steps", "= " + std::to_string(t.warmup_steps) + " is not allowed: must be >= 0");
  if (t.log_every < 0)
    fail("config", "training.log_every", "= " + std::to_string(t.log_every) + " is not allowed: must be >= 0");
  if (!(t.learning_rate > 0) || !std::isfinite(t.learning_rate))
    fail("config", "training.learning_rate", "= " + str(t.learning_rate) + " is not allowed: must be finite and > 0");
  if (t.lr_schedule != "constant" && t.lr_schedule != "cosine" && t.lr_schedule != "linear")
    fail("config", "training.lr_schedule",
         "= \"" + t.lr_schedule + "\" is not allowed: must be \"constant\", \"cosine\" or \"linear\"");
  if (t.lr_warmup_steps < 0)
    fail("config", "training.lr_warmup_steps",
         "= " + std::to_string(t.lr_warmup_steps) + " is not allowed: must be >= 0 (0 = no ramp)");
  if (t.lr_schedule == "constant" && t.lr_warmup_steps > t.warmup_steps + t.num_steps)
    fail("config", "training.lr_warmup_steps",
         "= " + std::to_string(t.lr_warmup_steps) + " is not allowed: the ramp must end within the run's " +
             std::to_string(t.warmup_steps + t.num_steps) +
             " optimizer steps (warmup_steps + num_steps), or the rate never reaches training.learning_rate");
  if (t.lr_schedule != "constant" && t.lr_warmup_steps >= t.warmup_steps + t.num_steps)
    fail("config", "training.lr_warmup_steps",
         "= " + std::to_string(t.lr_warmup_steps) + " is not allowed with lr_schedule \"" + t.lr_schedule +
             "\": must be below the run's optimizer steps, warmup_steps + num_steps = " +
             std::to_string(t.warmup_steps + t.num_steps) + ", so that some steps decay");
  if (!(t.min_lr >= 0) || !(t.min_lr <= t.learning_rate))
    fail("config", "training.min_lr",
         "= " + str(t.min_lr) + " is not allowed: must be in [0, training.learning_rate = " + str(t.learning_rate) +
             "]");
  if (t.lr_schedule == "constant" && t.min_lr != 0)
    fail("config", "training.min_lr",
         "= " + str(t.min_lr) + " is not allowed with lr_schedule \"constant\", which never decays: set "
         "lr_schedule to \"cosine\" or \"linear\", or leave min_lr at 0");
  if (t.grad_accum_steps <= 0)
    fail("config", "training.grad_accum_steps",
         "= " + std::to_string(t.grad_accum_steps) + " is not allowed: must be >= 1 (1 = no accumulation)");
  // In doubles: the products of values near INT64_MAX must not wrap before they are compared.
  if (static_cast<double>(t.batch_size) * static_cast<double>(t.seq_len) * static_cast<double>(t.grad_accum_steps) >
      kMaxTokensPerStep)
    fail("config", "training.grad_accum_steps",
         "= " + std::to_string(t.grad_accum_steps) + " is not allowed with training.batch_size = " +
             std::to_string(t.batch_size) + " and seq_len = " + std::to_string(t.seq_len) +
             ": batch_size x seq_len x grad_accum_steps must be at most " + str(kMaxTokensPerStep) +
             " tokens per optimizer step (one buffer holds them)");
  if (static_cast<double>(t.warmup_steps) + static_cast<double>(t.num_steps) > kMaxSteps)
    fail("config", "training.num_steps",
         "= " + std::to_string(t.num_steps) + " is not allowed with training.warmup_steps = " +
             std::to_string(t.warmup_steps) + ": warmup_steps + num_steps must be at most " + str(kMaxSteps) +
             " (every step's loss is kept on the device until the end)");
  if (!(t.beta1 >= 0 && t.beta1 < 1))
    fail("config", "training.beta1", "= " + str(t.beta1) + " is not allowed: must be in [0, 1)");
  if (!(t.beta2 >= 0 && t.beta2 < 1))
    fail("config", "training.beta2", "= " + str(t.beta2) + " is not allowed: must be in [0, 1)");
  if (!(t.adam_eps > 0) || !std::isfinite(t.adam_eps))
    fail("config", "training.adam_eps", "= " + str(t.adam_eps) + " is not allowed: must be finite and > 0");
  if (!(t.weight_decay >= 0) || !std::isfinite(t.weight_decay))
    fail("config", "training.weight_decay", "= " + str(t.weight_decay) + " is not allowed: must be finite and >= 0");
  if (!(t.grad_clip >= 0) || !std::isfinite(t.grad_clip))
    fail("config", "training.grad_clip",
         "= " + str(t.grad_clip) + " is not allowed: must be finite and >= 0 (0 = off)");
  if (t.device != "auto" && t.device != "cpu" && t.device != "cuda")
    fail("config", "training.device", "= \"" + t.device + "\" is not allowed: must be \"auto\", \"cpu\" or \"cuda\"");
  if (t.allow_tf32 && t.device == "cpu")
    fail("config", "training.allow_tf32",
         "= true is not allowed with training.device = \"cpu\": TF32 is a mode of the GPU's matrix units");
  // The name is part of the default result path (results/<stage>_<name>_<dtype>_<time>.json).
  const bool name_ok = !c.name.empty() && c.name.front() != '.' &&
                       std::all_of(c.name.begin(), c.name.end(), [](char ch) {
                         return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.';
                       });
  if (!name_ok)
    fail("config", "name",
         "= \"" + c.name + "\" is not allowed: letters, digits, '-', '_' and '.' only, not starting with '.' (it "
         "names the result file; a config without \"name\" takes its file name)");
  if (!t.data.empty() && c.model.vocab_size < 256)
    fail("config", "model.vocab_size",
         "= " + std::to_string(c.model.vocab_size) +
             " is not allowed with training.data: byte-level text needs vocab_size >= 256");
  if (t.data.empty() && c.model.vocab_size < 2)
    fail("config", "model.vocab_size", "= " + std::to_string(c.model.vocab_size) +
                                           " is not allowed: synthetic tokens are drawn from [1, vocab_size)");
}

const std::vector<ConfigField>& config_fields() {
  static const std::vector<ConfigField> fields = [] {
    const RunConfig defaults;
    const json model = to_json(defaults.model), training = to_json(defaults.training);
    std::vector<ConfigField> out;
    for (const auto& f : model_fields())
      out.push_back({std::string("model.") + f.key, f.flag, f.help, default_text(model.at(f.key)),
                     model.at(f.key).is_boolean()});
    for (const auto& f : train_fields())
      out.push_back({std::string("training.") + f.key, f.flag, f.help, default_text(training.at(f.key)),
                     training.at(f.key).is_boolean()});
    return out;
  }();
  return fields;
}

void set_config_field(RunConfig& config, const ConfigField& field, const std::string& text) {
  const std::string origin = "command line: --" + std::string(field.flag ? field.flag : field.path.c_str());
  for (const auto& f : model_fields())
    if (field.path == std::string("model.") + f.key)
      return read_field(flag_value(f, text, origin), f, config.model, field.path, origin);
  for (const auto& f : train_fields())
    if (field.path == std::string("training.") + f.key)
      return read_field(flag_value(f, text, origin), f, config.training, field.path, origin);
  throw ConfigError("no config field \"" + field.path + "\"");
}

}  // namespace tt
