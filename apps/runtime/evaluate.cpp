#include "apps/runtime/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <stdexcept>

#include "apps/runtime/data.h"
#include "apps/runtime/device.h"
#include "apps/runtime/system_info.h"
#include "models/checkpoint.h"

namespace tt {
namespace {

constexpr int kEvalResultSchemaVersion = 1;
constexpr int64_t kByteVocab = 256;
constexpr const char* kDefinition =
    "sum of -log softmax(logits)[next byte] over every predicted token / number of predicted tokens; "
    "consecutive non-overlapping windows of seq_len + 1 bytes from the start of the file, the trailing "
    "partial window dropped; log-softmax in fp32, sum in fp64";

enum class Kind { kNumberOrNull, kString, kInteger, kArray };

void expect(const nlohmann::json& node, const std::string& parent, const std::string& key, Kind kind) {
  const std::string path = parent.empty() ? key : parent + "." + key;
  if (!node.is_object() || !node.contains(key))
    throw std::runtime_error("result JSON: field \"" + path + "\" is missing");
  const auto& v = node[key];
  bool ok = false;
  switch (kind) {
    case Kind::kNumberOrNull:
      ok = v.is_number() || v.is_null();
      break;
    case Kind::kString:
      ok = v.is_string();
      break;
    case Kind::kInteger:
      ok = v.is_number_integer();
      break;
    case Kind::kArray:
      ok = v.is_array();
      break;
  }
  if (!ok) throw std::runtime_error("result JSON: field \"" + path + "\" has the wrong type: " + v.dump());
}

std::string fixed(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

}  // namespace

EvalData load_eval_data(const std::string& path, int64_t seq_len) {
  EvalData data{path, read_byte_tokens(path)};
  if (data.tokens.numel() < seq_len + 1)
    throw std::runtime_error("eval data '" + path + "' has " + std::to_string(data.tokens.numel()) +
                             " bytes; evaluating with seq_len " + std::to_string(seq_len) +
                             " needs at least one window of seq_len + 1 = " + std::to_string(seq_len + 1) + " bytes");
  return data;
}

EvalResult evaluate(Transformer& model, const torch::Tensor& tokens, int64_t seq_len, int64_t batch_size,
                    const torch::Device& device, bool bf16) {
  const ModelConfig& c = model->config();
  if (c.vocab_size < kByteVocab)
    throw std::runtime_error("evaluation reads bytes as tokens: model.vocab_size = " + std::to_string(c.vocab_size) +
                             " is not allowed, it must be >= 256");
  if (seq_len <= 0 || seq_len > c.max_seq_len)
    throw std::runtime_error("evaluation: seq_len = " + std::to_string(seq_len) +
                             " is not allowed: it must be in [1, model.max_seq_len = " + std::to_string(c.max_seq_len) +
                             "]");
  if (batch_size <= 0)
    throw std::runtime_error("evaluation: batch_size = " + std::to_string(batch_size) +
                             " is not allowed: must be positive");
  TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == torch::kLong,
              "evaluation: tokens must be a 1-D int64 tensor, got ", tokens.scalar_type(), " ", tokens.sizes());
  const int64_t window = seq_len + 1;
  EvalResult result;
  result.windows = tokens.numel() / window;
  if (result.windows == 0)
    throw std::runtime_error("evaluation: " + std::to_string(tokens.numel()) +
                             " tokens do not fill one window of seq_len + 1 = " + std::to_string(window));
  result.tokens = result.windows * seq_len;
  result.dropped_bytes = tokens.numel() - result.windows * window;

  auto rows = tokens.narrow(0, 0, result.windows * window).view({result.windows, window});
  EvalModeScope mode(model);
  torch::NoGradGuard no_grad;
  // Accumulated on the device so that the only host sync is the final read.
  auto total = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  for (int64_t start = 0; start < result.windows; start += batch_size) {
    const int64_t n = std::min(batch_size, result.windows - start);
    auto batch = rows.narrow(0, start, n).to(device);
    auto inputs = batch.narrow(1, 0, seq_len).contiguous();
    auto labels = batch.narrow(1, 1, seq_len);
    torch::Tensor logits;
    {
      AutocastScope autocast(device, bf16);
      logits = model->forward(inputs);
    }
    auto log_probs = torch::log_softmax(logits.to(torch::kFloat32), -1);
    total -= log_probs.gather(-1, labels.unsqueeze(-1)).sum(torch::kFloat64);
  }
  result.loss = total.item<double>() / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.loss);
  return result;
}

nlohmann::json to_json(const EvalResult& r, const EvalData& data, int64_t seq_len, int64_t batch_size,
                       const std::string& dtype) {
  return {{"data", data.path},        {"bytes", data.tokens.numel()},
          {"seq_len", seq_len},       {"batch_size", batch_size},
          {"dtype", dtype},           {"windows", r.windows},
          {"tokens", r.tokens},       {"dropped_bytes", r.dropped_bytes},
          {"loss", r.loss},           {"perplexity", r.perplexity},
          {"definition", kDefinition}};
}

nlohmann::json curve_point(int64_t step, const EvalResult& r) {
  return {{"step", step}, {"loss", r.loss}, {"perplexity", r.perplexity}};
}

void validate_evaluation_json(const nlohmann::json& e) {
  if (!e.is_object()) throw std::runtime_error("result JSON: field \"evaluation\" must be an object, got " + e.dump());
  for (const char* key : {"data", "dtype", "definition"}) expect(e, "evaluation", key, Kind::kString);
  for (const char* key : {"bytes", "seq_len", "batch_size", "windows", "tokens", "dropped_bytes"})
    expect(e, "evaluation", key, Kind::kInteger);
  // A diverged model's loss is inf or NaN, which JSON writes as null.
  for (const char* key : {"loss", "perplexity"}) expect(e, "evaluation", key, Kind::kNumberOrNull);
  if (!e.contains("curve")) return;
  expect(e, "evaluation", "curve", Kind::kArray);
  for (size_t i = 0; i < e["curve"].size(); ++i) {
    const std::string parent = "evaluation.curve[" + std::to_string(i) + "]";
    expect(e["curve"][i], parent, "step", Kind::kInteger);
    expect(e["curve"][i], parent, "loss", Kind::kNumberOrNull);
    expect(e["curve"][i], parent, "perplexity", Kind::kNumberOrNull);
  }
}

nlohmann::json evaluate_checkpoint(const StageSpec& spec, const RunConfig& config, const std::string& checkpoint,
                                   const EvalData& data, const torch::Device& device, std::ostream& log) {
  const Checkpoint ck = read_checkpoint(checkpoint);
  Transformer model(config.model, spec);
  try {
    restore_checkpoint(ck, model, nullptr);
  } catch (const c10::Error& e) {
    if (ck.config.model == config.model) throw;
    throw std::runtime_error(
        std::string(e.what_without_backtrace()) +
        "\n--eval-only builds the model from this run's config: pass the config the checkpoint was "
        "trained with (its name: \"" +
        ck.config.name + "\")");
  }
  model->to(device);
  const TrainConfig& t = config.training;
  const EvalResult r = evaluate(model, data.tokens, t.seq_len, t.batch_size, device, t.dtype == "bf16");
  log << "[" << spec.name << "] eval of '" << checkpoint << "' (" << ck.stage << ", step " << ck.step << ") on '"
      << data.path << "' | " << t.dtype << " | device " << device.str() << " | " << r.windows << " windows x "
      << t.seq_len << " = " << r.tokens << " tokens (" << r.dropped_bytes << " trailing bytes dropped) | loss "
      << fixed("%.4f", r.loss) << " | perplexity " << fixed("%.3f", r.perplexity) << std::endl;
  return {{"schema_version", kEvalResultSchemaVersion},
          {"kind", "evaluation"},
          {"stage", to_json(spec)},
          {"config", to_json(config)},
          {"checkpoint", {{"path", checkpoint}, {"stage", ck.stage}, {"step", ck.step}}},
          {"system", to_json(collect_system_info(device))},
          {"evaluation", to_json(r, data, t.seq_len, t.batch_size, t.dtype)}};
}

void validate_eval_result_json(const nlohmann::json& r) {
  expect(r, "", "schema_version", Kind::kInteger);
  if (r["schema_version"] != kEvalResultSchemaVersion)
    throw std::runtime_error("eval result JSON: schema_version " + r["schema_version"].dump() +
                             " is not supported (expected " + std::to_string(kEvalResultSchemaVersion) + ")");
  expect(r, "", "kind", Kind::kString);
  if (r["kind"] != "evaluation")
    throw std::runtime_error("eval result JSON: field \"kind\" is " + r["kind"].dump() + ", expected \"evaluation\"");
  for (const char* key : {"stage", "config", "checkpoint", "system"})
    if (!r.contains(key) || !r[key].is_object())
      throw std::runtime_error(std::string("eval result JSON: field \"") + key + "\" is missing or not an object");
  expect(r["stage"], "stage", "name", Kind::kString);
  expect(r["checkpoint"], "checkpoint", "path", Kind::kString);
  expect(r["checkpoint"], "checkpoint", "stage", Kind::kString);
  expect(r["checkpoint"], "checkpoint", "step", Kind::kInteger);
  for (const char* key : {"device", "device_name", "libtorch_version", "git_commit", "timestamp"})
    expect(r["system"], "system", key, Kind::kString);
  if (!r.contains("evaluation")) throw std::runtime_error("eval result JSON: field \"evaluation\" is missing");
  validate_evaluation_json(r["evaluation"]);
}

}  // namespace tt
