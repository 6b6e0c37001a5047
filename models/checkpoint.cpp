#include "models/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace tt {
namespace {

const std::string kExpAvg = "optimizer.exp_avg.";
const std::string kExpAvgSq = "optimizer.exp_avg_sq.";

}  // namespace

void write_checkpoint(const std::string& path, const Checkpoint& ck, bool overwrite) {
  TORCH_CHECK(overwrite || !std::filesystem::exists(path), "--save-checkpoint: file '", path,
              "' exists; pass --overwrite to replace it or choose another path");
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("format", std::string(kCheckpointFormat));
  dict.insert("stage", ck.stage);
  dict.insert("step", ck.step);
  dict.insert("config", to_json(ck.config).dump());
  if (ck.run_step >= 0) dict.insert(kRunStepKey, ck.run_step);
  if (ck.cpu_rng_state.defined()) dict.insert(kCpuRngKey, ck.cpu_rng_state);
  if (!ck.run_id.empty()) dict.insert(kRunIdKey, ck.run_id);
  if (!ck.kind.empty()) dict.insert(kKindKey, ck.kind);
  for (const auto& [name, tensor] : ck.weights) dict.insert(name, tensor);
  for (const auto& [name, tensor] : ck.exp_avg) dict.insert(kExpAvg + name, tensor);
  for (const auto& [name, tensor] : ck.exp_avg_sq) dict.insert(kExpAvgSq + name, tensor);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  const std::string tmp = checkpoint_temp_path(path);
  {
    std::ofstream out(tmp, std::ios::binary);
    TORCH_CHECK(out.good(), "cannot write checkpoint '", tmp, "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    TORCH_CHECK(out.good(), "writing checkpoint '", tmp, "' failed");
  }
  TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot move checkpoint into place at '", path, "'");
}

std::string checkpoint_temp_path(const std::string& path) { return path + ".tmp"; }

Checkpoint read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "cannot open checkpoint '", path, "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    // The unpickler's own message without its C++ backtrace: the user needs the first line only.
    TORCH_CHECK(false, "'", path, "' is not a readable checkpoint: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "'", path, "' is not a readable checkpoint: ", e.what());
  }
  TORCH_CHECK(value.isGenericDict(), "'", path, "' is not a TinyTransformer checkpoint (not a dict)");
  Checkpoint ck;
  bool format_ok = false;
  for (const auto& entry : value.toGenericDict()) {
    const std::string key = entry.key().toStringRef();
    const auto& v = entry.value();
    if (key == "format") {
      format_ok = v.isString() && v.toStringRef() == kCheckpointFormat;
    } else if (key == "stage") {
      ck.stage = v.toStringRef();
    } else if (key == "step") {
      ck.step = v.toInt();
    } else if (key == kRunStepKey) {
      ck.run_step = v.toInt();
    } else if (key == kRunIdKey) {
      ck.run_id = v.toStringRef();
    } else if (key == kKindKey) {
      ck.kind = v.toStringRef();
    } else if (key == kCpuRngKey) {
      ck.cpu_rng_state = v.toTensor();
    } else if (key == "config") {
      ck.config = run_config_from_json(nlohmann::json::parse(v.toStringRef()), path + " (embedded config)");
    } else if (key.rfind(kExpAvgSq, 0) == 0) {
      ck.exp_avg_sq[key.substr(kExpAvgSq.size())] = v.toTensor();
    } else if (key.rfind(kExpAvg, 0) == 0) {
      ck.exp_avg[key.substr(kExpAvg.size())] = v.toTensor();
    } else {
      ck.weights[key] = v.toTensor();
    }
  }
  TORCH_CHECK(format_ok, "'", path, "' is not a TinyTransformer checkpoint (format field missing or not ",
              kCheckpointFormat, ")");
  return ck;
}

CheckpointHeader read_checkpoint_header(const std::string& path) {
  // Reads the whole file for now; a format with a separate header record makes this cheap.
  const Checkpoint ck = read_checkpoint(path);
  return {path, ck.stage, ck.step, ck.run_step, ck.run_id, ck.kind, ck.config};
}

void check_model_config(const Checkpoint& ck, const ModelConfig& model) {
  const auto mine = to_json(model);
  const auto theirs = to_json(ck.config.model);
  std::string diff;
  for (const auto& [key, value] : mine.items())
    if (theirs.at(key) != value)
      diff += "\n  model." + key + ": checkpoint has " + theirs.at(key).dump() + ", this run has " + value.dump();
  TORCH_CHECK(diff.empty(), "the checkpoint's model config does not match this run's:", diff);
}

void restore_weights(const Checkpoint& ck, Transformer& model) {
  check_model_config(ck, model->config());
  model->load_canonical_state(ck.weights);
}

}  // namespace tt
