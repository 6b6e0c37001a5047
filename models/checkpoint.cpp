#include "models/checkpoint.h"

#include <cstdio>
#include <fstream>
#include <iterator>

namespace tt {
namespace {

size_t parameter_index(const Optimizer& optimizer, const torch::Tensor& parameter) {
  const auto& params = optimizer.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) return i;
  TORCH_CHECK(false, "checkpoint: a model parameter is not managed by the optimizer");
}

const std::string kExpAvg = "optimizer.exp_avg.";
const std::string kExpAvgSq = "optimizer.exp_avg_sq.";

}  // namespace

void save_checkpoint(const std::string& path, const Transformer& model, const Optimizer& optimizer, int64_t step,
                     const RunConfig& config) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("format", std::string(kCheckpointFormat));
  dict.insert("stage", model->spec().name);
  dict.insert("step", step);
  dict.insert("config", to_json(config).dump());
  for (const auto& slice : model->canonical_layout()) {
    dict.insert(slice.name, slice.of(slice.parameter).detach().to(torch::kCPU).clone());
    const size_t i = parameter_index(optimizer, slice.parameter);
    if (optimizer.exp_avg(i).defined()) {
      dict.insert(kExpAvg + slice.name, slice.of(optimizer.exp_avg(i)).detach().to(torch::kCPU).clone());
      dict.insert(kExpAvgSq + slice.name, slice.of(optimizer.exp_avg_sq(i)).detach().to(torch::kCPU).clone());
    }
  }
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    TORCH_CHECK(out.good(), "cannot write checkpoint '", tmp, "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    TORCH_CHECK(out.good(), "writing checkpoint '", tmp, "' failed");
  }
  TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot move checkpoint into place at '", path, "'");
}

Checkpoint read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "cannot open checkpoint '", path, "'");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
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

void restore_checkpoint(const Checkpoint& ck, Transformer& model, Optimizer* optimizer) {
  const auto mine = to_json(model->config());
  const auto theirs = to_json(ck.config.model);
  std::string diff;
  for (const auto& [key, value] : mine.items())
    if (theirs.at(key) != value)
      diff += "\n  model." + key + ": checkpoint has " + theirs.at(key).dump() + ", this run has " + value.dump();
  TORCH_CHECK(diff.empty(), "the checkpoint's model config does not match this run's:", diff);
  model->load_canonical_state(ck.weights);
  if (optimizer == nullptr || ck.exp_avg.empty()) return;
  std::vector<torch::Tensor> m, v;
  for (const auto& p : optimizer->parameters()) {
    m.push_back(torch::zeros_like(p));
    v.push_back(torch::zeros_like(p));
  }
  torch::NoGradGuard no_grad;
  for (const auto& slice : model->canonical_layout()) {
    const size_t i = parameter_index(*optimizer, slice.parameter);
    auto a = ck.exp_avg.find(slice.name), b = ck.exp_avg_sq.find(slice.name);
    TORCH_CHECK(a != ck.exp_avg.end() && b != ck.exp_avg_sq.end(), "checkpoint: optimizer state for '", slice.name,
                "' is missing");
    slice.of(m[i]).copy_(a->second);
    slice.of(v[i]).copy_(b->second);
  }
  optimizer->load_state(m, v, ck.step);
}

}  // namespace tt
