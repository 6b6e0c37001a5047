#include "apps/runtime/results.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "apps/runtime/evaluate.h"

namespace tt {
namespace {

double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

enum class Kind { kNumber, kNumberOrNull, kString, kObject, kArray, kInteger, kBool };

void expect(const nlohmann::json& root, const std::string& path, Kind kind) {
  const nlohmann::json* node = &root;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!node->is_object() || !node->contains(key)) throw std::runtime_error("result JSON: field \"" + path + "\" is missing");
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  bool ok = false;
  switch (kind) {
    case Kind::kNumber: ok = node->is_number(); break;
    case Kind::kNumberOrNull: ok = node->is_number() || node->is_null(); break;
    case Kind::kString: ok = node->is_string(); break;
    case Kind::kObject: ok = node->is_object(); break;
    case Kind::kArray: ok = node->is_array(); break;
    case Kind::kInteger: ok = node->is_number_integer(); break;
    case Kind::kBool: ok = node->is_boolean(); break;
  }
  if (!ok) throw std::runtime_error("result JSON: field \"" + path + "\" has the wrong type: " + node->dump());
}

}  // namespace

Spread spread(std::vector<double> values) {
  if (values.empty()) throw std::runtime_error("spread of an empty sample");
  std::sort(values.begin(), values.end());
  return {percentile(values, 0.5), percentile(values, 0.1), percentile(values, 0.9), values.front(), values.back()};
}

nlohmann::json to_json(const Spread& s) {
  return {{"median", s.median}, {"p10", s.p10}, {"p90", s.p90}, {"min", s.min}, {"max", s.max}};
}

void validate_result_json(const nlohmann::json& r) {
  expect(r, "schema_version", Kind::kInteger);
  if (r["schema_version"] != kResultSchemaVersion)
    throw std::runtime_error("result JSON: schema_version " + r["schema_version"].dump() + " is not supported (expected " +
                             std::to_string(kResultSchemaVersion) + ")");
  for (const char* p : {"stage.name", "config.name", "system.backend", "system.device", "system.device_name",
                        "system.libtorch_version", "system.git_commit", "system.timestamp", "training.dtype"})
    expect(r, p, Kind::kString);
  for (const char* p : {"stage.components", "config.model", "config.training", "training", "system", "summary"})
    expect(r, p, Kind::kObject);
  for (const char* p : {"training.batch_size", "training.seq_len", "training.measured_steps", "training.warmup_steps",
                        "training.tokens_per_step"})
    expect(r, p, Kind::kInteger);
  for (const char* phase : {"step_ms", "forward_ms", "backward_ms", "optimizer_ms"})
    for (const char* stat : {"median", "p10", "p90"}) expect(r, std::string("summary.") + phase + "." + stat, Kind::kNumber);
  for (const char* p : {"summary.samples_per_s", "summary.tokens_per_s", "summary.model_tflop_per_step",
                        "summary.achieved_tflops", "summary.peak_allocated_mb", "summary.peak_reserved_mb",
                        "summary.first_loss", "summary.final_loss"})
    expect(r, p, Kind::kNumber);
  expect(r, "summary.mfu", Kind::kNumberOrNull);
  expect(r, "summary.peak_tflops", Kind::kNumberOrNull);
  expect(r, "losses", Kind::kArray);
  expect(r, "step_ms", Kind::kArray);
  for (const auto& v : r["losses"])
    if (!v.is_number() && !v.is_null()) throw std::runtime_error("result JSON: \"losses\" holds a non-number: " + v.dump());
  if (r.contains("evaluation")) validate_evaluation_json(r["evaluation"]);
}

void write_json_atomically(const std::string& path, const nlohmann::json& value, bool overwrite) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (!overwrite && fs::exists(target))
    throw std::runtime_error("output file '" + path + "' exists; pass --overwrite to replace it or choose another --output");
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error("cannot write '" + tmp + "'");
    out << value.dump(2) << "\n";
    if (!out) throw std::runtime_error("writing '" + tmp + "' failed");
  }
  fs::rename(tmp, target);
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open '" + path + "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error("'" + path + "' is not valid JSON: " + e.what());
  }
}

}  // namespace tt
