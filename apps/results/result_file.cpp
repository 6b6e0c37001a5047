#include "apps/results/result_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "apps/results/json_check.h"
#include "apps/results/text.h"

namespace tt {
namespace {

double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
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
  if (r.is_object() && r.contains("kind") && r["kind"] == "evaluation")
    throw std::runtime_error("result JSON: this is an evaluation result (--eval-only writes it: kind \"evaluation\"), "
                             "not a training run's result");
  if (r.is_object() && r.contains("summary") && r["summary"].is_null() && r.contains("summary_note"))
    throw std::runtime_error("result JSON: this run has no measured steps (summary is null: " +
                             r["summary_note"].dump() + ")");
  expect_field(r, "schema_version", JsonKind::kInteger);
  if (r["schema_version"] != kResultSchemaVersion)
    throw std::runtime_error("result JSON: schema_version " + r["schema_version"].dump() + " is not supported (expected " +
                             std::to_string(kResultSchemaVersion) + ")");
  for (const char* p : {"stage.name", "config.name", "system.backend", "system.device", "system.device_name",
                        "system.libtorch_version", "system.git_commit", "system.timestamp", "training.dtype"})
    expect_field(r, p, JsonKind::kString);
  for (const char* p : {"stage.components", "config.model", "config.training", "training", "system", "summary"})
    expect_field(r, p, JsonKind::kObject);
  for (const char* p : {"training.batch_size", "training.seq_len", "training.measured_steps", "training.warmup_steps",
                        "training.tokens_per_step"})
    expect_field(r, p, JsonKind::kInteger);
  for (const char* stat : {"median", "p10", "p90"}) expect_field(r, std::string("summary.step_ms.") + stat, JsonKind::kNumber);
  // A step runner that cannot time its phases separately (one replayed graph) writes null for them.
  for (const char* phase : {"forward_ms", "backward_ms", "optimizer_ms"}) {
    const std::string path = std::string("summary.") + phase;
    if (r["summary"].contains(phase) && r["summary"][phase].is_null()) continue;
    for (const char* stat : {"median", "p10", "p90"}) expect_field(r, path + "." + stat, JsonKind::kNumber);
  }
  for (const char* p : {"summary.samples_per_s", "summary.tokens_per_s", "summary.model_tflop_per_step",
                        "summary.achieved_tflops", "summary.peak_allocated_mb", "summary.peak_reserved_mb"})
    expect_field(r, p, JsonKind::kNumber);
  // A diverged run's loss is NaN or inf, which JSON writes as null.
  for (const char* p : {"summary.first_loss", "summary.final_loss"}) expect_field(r, p, JsonKind::kNumberOrNull);
  expect_field(r, "summary.mfu", JsonKind::kNumberOrNull);
  // Energy arrived after schema version 1's first files: older results lack it, which compare shows as "-".
  for (const char* field : {"energy_j_per_step", "tokens_per_joule"})
    if (r["summary"].contains(field)) expect_field(r, std::string("summary.") + field, JsonKind::kNumberOrNull);
  expect_field(r, "summary.peak_tflops", JsonKind::kNumberOrNull);
  expect_field(r, "losses", JsonKind::kArray);
  expect_field(r, "step_ms", JsonKind::kArray);
  for (const auto& v : r["losses"])
    if (!v.is_number() && !v.is_null()) throw std::runtime_error("result JSON: \"losses\" holds a non-number: " + v.dump());
  // The trainer's fields (schedule, rates, stop and resume) and the energy window arrived after schema version 1's
  // first files: checked where present.
  if (r.contains("lr")) {
    expect_field(r, "lr", JsonKind::kArray);
    if (r["lr"].size() != r["losses"].size())
      throw std::runtime_error("result JSON: \"lr\" has " + std::to_string(r["lr"].size()) + " entries but \"losses\" has " +
                               std::to_string(r["losses"].size()) + " (one rate per recorded step)");
    for (const auto& v : r["lr"])
      if (!v.is_number()) throw std::runtime_error("result JSON: \"lr\" holds a non-number: " + v.dump());
  }
  if (r["training"].contains("optimizer") && r["training"]["optimizer"].contains("lr_schedule"))
    expect_field(r, "training.optimizer.lr_schedule.kind", JsonKind::kString);
  if (r.contains("interrupted")) expect_field(r, "interrupted", JsonKind::kBool);
  for (const char* p : {"first_step", "steps_done"})
    if (r.contains(p)) expect_field(r, p, JsonKind::kInteger);
  if (r["summary"].contains("energy_window") && !r["summary"]["energy_window"].is_null()) {
    expect_field(r, "summary.energy_window.steps", JsonKind::kInteger);
    expect_field(r, "summary.energy_window.seconds", JsonKind::kNumber);
    expect_field(r, "summary.energy_window.extra_steps", JsonKind::kBool);
    const auto& window = r["summary"]["energy_window"];
    if (window.contains("average_power_w") && !window["average_power_w"].is_null()) {
      expect_field(r, "summary.energy_window.average_power_w", JsonKind::kNumber);
      if (const auto implied = energy_window_mean_power_w(r["summary"])) {
        const double stored = window["average_power_w"].get<double>();
        if (std::abs(stored - *implied) > 1e-6 * std::abs(*implied))
          throw std::runtime_error("result JSON: summary.energy_window.average_power_w is " +
                                   strprintf("%.6g", stored) +
                                   " W, but energy_j_per_step x energy_window.steps / energy_window.seconds is " +
                                   strprintf("%.6g", *implied) + " W");
      }
    }
  }
  // The per-step figures describe one optimizer step, all its micro-batches: tokens per joule times joules per
  // step is the step's tokens (an energy figure that counted one micro-batch would be grad_accum_steps too small).
  const auto& summary = r["summary"];
  if (summary.contains("tokens_per_joule") && summary["tokens_per_joule"].is_number() &&
      summary.contains("energy_j_per_step") && summary["energy_j_per_step"].is_number()) {
    const double tokens = r["training"]["tokens_per_step"].get<double>();
    const double implied = summary["tokens_per_joule"].get<double>() * summary["energy_j_per_step"].get<double>();
    if (std::abs(implied - tokens) > 1e-6 * tokens)
      throw std::runtime_error("result JSON: summary.tokens_per_joule x summary.energy_j_per_step = " +
                               strprintf("%.6g", implied) + " tokens, but training.tokens_per_step is " +
                               strprintf("%.6g", tokens) + " (both must describe one optimizer step)");
  }
  if (r.contains("evaluation")) validate_evaluation_json(r["evaluation"]);
}

std::optional<double> energy_window_mean_power_w(const nlohmann::json& summary) {
  if (!summary.is_object() || !summary.contains("energy_window")) return std::nullopt;
  const auto& w = summary["energy_window"];
  const auto j = summary.find("energy_j_per_step");
  if (!w.is_object() || j == summary.end() || !j->is_number() || !w.value("steps", nlohmann::json()).is_number() ||
      !w.value("seconds", nlohmann::json()).is_number())
    return std::nullopt;
  const double seconds = w["seconds"].get<double>();
  if (seconds <= 0) return std::nullopt;
  return j->get<double>() * w["steps"].get<double>() / seconds;
}

void validate_evaluation_json(const nlohmann::json& e) {
  if (!e.is_object()) throw std::runtime_error("result JSON: field \"evaluation\" must be an object, got " + e.dump());
  for (const char* key : {"data", "dtype", "definition"}) expect_field(e, key, JsonKind::kString, "result JSON", "evaluation");
  for (const char* key : {"bytes", "seq_len", "batch_size", "windows", "tokens", "dropped_bytes"})
    expect_field(e, key, JsonKind::kInteger, "result JSON", "evaluation");
  // A diverged model's loss is inf or NaN, which JSON writes as null.
  for (const char* key : {"loss", "perplexity"}) expect_field(e, key, JsonKind::kNumberOrNull, "result JSON", "evaluation");
  if (!e.contains("curve")) return;
  expect_field(e, "curve", JsonKind::kArray, "result JSON", "evaluation");
  for (size_t i = 0; i < e["curve"].size(); ++i) {
    const std::string parent = "evaluation.curve[" + std::to_string(i) + "]";
    expect_field(e["curve"][i], "step", JsonKind::kInteger, "result JSON", parent);
    expect_field(e["curve"][i], "loss", JsonKind::kNumberOrNull, "result JSON", parent);
    expect_field(e["curve"][i], "perplexity", JsonKind::kNumberOrNull, "result JSON", parent);
  }
}

void validate_eval_result_json(const nlohmann::json& r) {
  const std::string what = "eval result JSON";
  expect_field(r, "schema_version", JsonKind::kInteger, what);
  if (r["schema_version"] != kEvalResultSchemaVersion)
    throw std::runtime_error(what + ": schema_version " + r["schema_version"].dump() + " is not supported (expected " +
                             std::to_string(kEvalResultSchemaVersion) + ")");
  expect_field(r, "kind", JsonKind::kString, what);
  if (r["kind"] != "evaluation")
    throw std::runtime_error(what + ": field \"kind\" is " + r["kind"].dump() + ", expected \"evaluation\"");
  for (const char* key : {"stage", "config", "checkpoint", "system"}) expect_field(r, key, JsonKind::kObject, what);
  for (const char* path : {"stage.name", "checkpoint.path", "checkpoint.stage"}) expect_field(r, path, JsonKind::kString, what);
  expect_field(r, "checkpoint.step", JsonKind::kInteger, what);
  for (const char* key : {"device", "device_name", "libtorch_version", "git_commit", "timestamp"})
    expect_field(r, std::string("system.") + key, JsonKind::kString, what);
  if (!r.contains("evaluation")) throw std::runtime_error(what + ": field \"evaluation\" is missing");
  validate_evaluation_json(r["evaluation"]);
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
