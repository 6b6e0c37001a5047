#include "apps/compare/compare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "apps/results/result_file.h"

namespace tt::compare {
namespace {

namespace fs = std::filesystem;

constexpr const char* kReferenceStage = "v1_baseline";
// Training fields that change neither the work of a step nor the loss curve; the dtype is compared once,
// as training.dtype. The optimizer overlap changes only when the update runs (bitwise the same result), and
// sharding (ZeRO-1) only where the optimizer state lives (the same update, the clipping norm summed in another
// order): comparing runs with and without them is what they are for.
const std::set<std::string> kUncomparedTrainingFields = {"log_every", "device", "dtype", "optimizer_overlap",
                                                         "shard_optimizer"};
const char* const kNoteFields[] = {"system.libtorch_version", "system.runtime_version", "system.driver_version",
                                   "system.backend",          "system.git_commit",      "system.hostname"};

std::string value_text(const nlohmann::json* v) {
  if (!v) return "(missing)";
  return v->is_string() ? "\"" + v->get<std::string>() + "\"" : v->dump();
}

const nlohmann::json* find(const nlohmann::json& root, const std::string& dotted) {
  const nlohmann::json* node = &root;
  std::stringstream parts(dotted);
  std::string key;
  while (std::getline(parts, key, '.')) {
    if (!node->is_object() || !node->contains(key)) return nullptr;
    node = &(*node)[key];
  }
  return node;
}

std::optional<double> number_at(const nlohmann::json& root, const std::string& dotted) {
  const auto* v = find(root, dotted);
  return v && v->is_number() ? std::optional<double>(v->get<double>()) : std::nullopt;
}

void compare_field(const Result& first, const Result& other, const std::string& field, std::vector<Difference>& out) {
  const auto* a = find(first.json, field);
  const auto* b = find(other.json, field);
  if ((a == nullptr) != (b == nullptr) || (a && *a != *b))
    out.push_back({field, first.path, value_text(a), other.path, value_text(b)});
}

std::set<std::string> keys_of(const nlohmann::json* a, const nlohmann::json* b) {
  std::set<std::string> keys;
  for (const auto* obj : {a, b})
    if (obj && obj->is_object())
      for (const auto& [k, v] : obj->items()) keys.insert(k);
  return keys;
}

}  // namespace

void assign_labels(std::vector<Result>& results) {
  std::map<std::string, int> count;
  // A run of the debugging exercise is labelled with its pitfall: "v3_custom [missing-init]".
  const auto stage_of = [](const Result& r) {
    const std::string name = r.json["stage"]["name"];
    const auto* pitfall = find(r.json, "stage.pitfall.name");
    return pitfall && pitfall->is_string() ? name + " [" + pitfall->get<std::string>() + "]" : name;
  };
  for (const auto& r : results) ++count[stage_of(r)];
  for (auto& r : results) {
    const std::string stage = stage_of(r);
    r.label = stage;
    if (count[stage] > 1) {
      const fs::path p(r.path);
      const std::string parent = p.parent_path().filename().string();
      r.label += " (" + (parent.empty() ? "" : parent + "/") + p.stem().string() + ")";
    }
  }
}

std::string Difference::describe() const {
  return field + ": '" + first_path + "' has " + first_value + ", '" + other_path + "' has " + other_value;
}

Result load_result(const std::string& path) {
  if (!fs::exists(path)) throw std::runtime_error("result file '" + path + "' does not exist");
  Result r{path, "", read_json_file(path)};
  try {
    validate_result_json(r.json);
  } catch (const std::exception& e) {
    std::string hint;
    if (path.size() > 11 && path.compare(path.size() - 11, 11, ".trace.json") == 0)
      hint = " (this looks like a --profile trace; pass the result JSON next to it)";
    throw std::runtime_error("'" + path + "' is not a valid result file: " + e.what() + hint);
  }
  return r;
}

std::vector<Result> load_results(const std::vector<std::string>& paths) {
  std::vector<Result> results;
  for (size_t i = 0; i < paths.size(); ++i) {
    // The same file twice would be a row compared with itself.
    std::error_code ec;
    for (size_t j = 0; j < i; ++j)
      if (paths[j] == paths[i] || std::filesystem::equivalent(paths[j], paths[i], ec))
        throw std::runtime_error("'" + paths[i] + "' is given twice (as '" + paths[j] + "'); give each result once");
    results.push_back(load_result(paths[i]));
  }
  assign_labels(results);
  return results;
}

std::vector<Difference> find_mismatches(const std::vector<Result>& results) {
  std::vector<Difference> out;
  for (size_t i = 1; i < results.size(); ++i) {
    const Result& first = results[0];
    const Result& other = results[i];
    compare_field(first, other, "schema_version", out);
    for (const auto& key : keys_of(find(first.json, "config.model"), find(other.json, "config.model")))
      compare_field(first, other, "config.model." + key, out);
    for (const auto& key : keys_of(find(first.json, "config.training"), find(other.json, "config.training")))
      if (!kUncomparedTrainingFields.count(key)) compare_field(first, other, "config.training." + key, out);
    compare_field(first, other, "training.dtype", out);
    compare_field(first, other, "system.device_name", out);
    // Data parallel: config.training.batch_size is per rank, so the global batch (and the losses) change with the
    // ranks. A plain run is one rank, as a 1-rank launch is (their results are equal).
    auto world_size = [](const Result& r) {
      const auto* w = find(r.json, "distributed.world_size");
      return w ? *w : nlohmann::json(1);
    };
    if (world_size(first) != world_size(other))
      out.push_back({"distributed.world_size", first.path, world_size(first).dump(), other.path,
                     world_size(other).dump()});
  }
  return out;
}

std::vector<Difference> find_notes(const std::vector<Result>& results) {
  std::vector<Difference> out;
  for (size_t i = 1; i < results.size(); ++i)
    for (const char* field : kNoteFields) compare_field(results[0], results[i], field, out);
  return out;
}

Comparison build_comparison(const std::vector<Result>& results, std::optional<size_t> reference) {
  if (results.empty()) throw std::invalid_argument("build_comparison: no results");
  Comparison c;
  if (reference) {
    if (*reference >= results.size()) throw std::invalid_argument("build_comparison: reference index out of range");
    c.reference = *reference;
    c.reference_reason = "the --baseline result";
  } else {
    const auto v1 = std::find_if(results.begin(), results.end(),
                                 [](const Result& r) { return r.json["stage"]["name"] == kReferenceStage; });
    const auto shipped = std::find_if(results.begin(), results.end(), [](const Result& r) {
      const auto* pitfall = find(r.json, "stage.pitfall.name");
      return pitfall && *pitfall == "none";
    });
    c.reference = v1 != results.end()        ? static_cast<size_t>(v1 - results.begin())
                  : shipped != results.end() ? static_cast<size_t>(shipped - results.begin())
                                             : 0;
    c.reference_reason = v1 != results.end() ? std::string("the ") + kReferenceStage + " result"
                         : shipped != results.end()
                             ? std::string("v3 as shipped (--pitfall none), the debugging exercise's stage 5")
                             : std::string("the first file (no ") + kReferenceStage + " result given)";
  }
  // Only a step that replayed a graph on a GPU: on the CPU the graph stage runs eagerly, though its step
  // description names graphs ("eager: ... (this run is on the CPU: graphs need a GPU)"), and there is no GPU
  // memory at all.
  for (const auto& r : results) {
    const auto* step = find(r.json, "stage.components.step");
    const auto* device = find(r.json, "system.device");
    const bool on_gpu = device && device->is_string() && device->get<std::string>() != "cpu";
    if (on_gpu && step && step->is_string() && step->get<std::string>().find("graph") != std::string::npos)
      c.memory_field = "peak_reserved_mb";
  }
  const nlohmann::json& ref = results[c.reference].json;
  const double ref_median = ref["summary"]["step_ms"]["median"];
  const double ref_peak = ref["summary"][c.memory_field];
  // A diverged run's loss is NaN or inf, which the file holds as null.
  const auto loss_of = [](const nlohmann::json& summary) {
    return summary["final_loss"].is_number() ? summary["final_loss"].get<double>() : std::nan("");
  };
  const double ref_loss = loss_of(ref["summary"]);
  for (size_t i = 0; i < results.size(); ++i) {
    const nlohmann::json& j = results[i].json;
    const nlohmann::json& s = j["summary"];
    Row row;
    row.label = results[i].label.empty() ? j["stage"]["name"].get<std::string>() : results[i].label;
    row.stage = j["stage"]["name"];
    row.path = results[i].path;
    row.median_ms = s["step_ms"]["median"];
    row.p10_ms = s["step_ms"]["p10"];
    row.p90_ms = s["step_ms"]["p90"];
    row.samples_per_s = s["samples_per_s"];
    row.tokens_per_s = s["tokens_per_s"];
    row.speedup = row.median_ms > 0 ? ref_median / row.median_ms : 0;
    row.peak_mb = s[c.memory_field];
    if (ref_peak > 0) row.peak_reduction = 1.0 - row.peak_mb / ref_peak;
    row.tflops = s["achieved_tflops"];
    row.mfu = number_at(j, "summary.mfu");
    row.kernels_per_step = number_at(j, "profile.kernels_per_step");
    row.final_loss = loss_of(s);
    row.loss_delta = row.final_loss - ref_loss;
    row.reference = i == c.reference;
    row.energy_j_per_step = number_at(j, "summary.energy_j_per_step");
    row.tokens_per_joule = number_at(j, "summary.tokens_per_joule");
    row.average_power_w = energy_window_mean_power_w(s);
    if (const auto* p = find(j, "stage.pitfall"); p && p->is_object()) {
      row.pitfall = p->value("name", "");
      row.lesson = p->value("lesson", "");
    }
    row.first_loss = s["first_loss"].is_number() ? s["first_loss"].get<double>() : std::nan("");
    row.host_clock_step_ms = number_at(j, "summary.host_clock_ms.step_ms.median");
    if (j.contains("profile")) row.profile = j["profile"];
    if (has_gpu_profile(j)) {
      row.breakdown = time_breakdown(j);
      row.gpu_ms_per_step = row.breakdown->gpu_busy_ms;
    }
    c.rows.push_back(std::move(row));
  }
  c.config_name = ref["config"]["name"];
  c.dtype = ref["training"]["dtype"];
  c.device_name = ref["system"]["device_name"];
  c.peak_tflops = number_at(ref, "summary.peak_tflops");
  if (const auto* note = find(ref, "summary.mfu_note"); note && note->is_string()) c.mfu_note = *note;
  c.mismatches = find_mismatches(results);
  c.notes = find_notes(results);
  return c;
}

bool Comparison::has_breakdown() const {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.breakdown.has_value(); });
}

std::vector<const Row*> Comparison::profiled_rows() const {
  std::vector<const Row*> out;
  for (const auto& r : rows)
    if (r.breakdown) out.push_back(&r);
  return out;
}

std::vector<SlowerCheck> check_slower(const Result& baseline, const std::vector<Result>& results, double allowed_pct) {
  const double base = baseline.json["summary"]["step_ms"]["median"];
  std::vector<SlowerCheck> checks;
  for (const auto& r : results) {
    SlowerCheck check;
    check.label = r.label.empty() ? r.json["stage"]["name"].get<std::string>() : r.label;
    check.path = r.path;
    check.median_ms = r.json["summary"]["step_ms"]["median"];
    check.baseline_ms = base;
    check.slower_pct = (check.median_ms / base - 1.0) * 100.0;
    check.too_slow = check.slower_pct > allowed_pct;
    checks.push_back(check);
  }
  return checks;
}

}  // namespace tt::compare
