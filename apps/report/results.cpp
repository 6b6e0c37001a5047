#include "apps/report/results.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "apps/report/evaluation_report.h"
#include "apps/report/flops.h"
#include "apps/report/json_check.h"
#include "apps/train/format.h"

namespace tt {
namespace {

double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

// A spread, or null for a phase the step runner could not time separately.
nlohmann::json spread_or_null(const std::vector<double>& values) {
  return values.empty() ? nlohmann::json(nullptr) : to_json(spread(values));
}

nlohmann::json stage_details(const Trainer& trainer) {
  nlohmann::json details = to_json(trainer.spec());
  const auto& m = trainer.config().model;
  const auto& t = trainer.config().training;
  const AttentionShape shape{t.batch_size, t.seq_len, m.n_heads, m.n_kv_heads, m.head_dim()};
  if (rope_in_our_attention(trainer.spec().rope, t.seq_len)) {
    details["attention_kernel"] = "tt::ops::flash_attention_rope (RoPE in the load)";
  } else {
    details.update(implementation(trainer.spec().attention).backend(shape, t.dtype, trainer.device()));
  }
  details["components"]["step"] = trainer.step_description();
  return details;
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

nlohmann::json build_result(const Trainer& trainer, const RunRecord& record, const std::string& data,
                            const SystemInfo& system) {
  const RunConfig& config = trainer.config();
  const TrainConfig& t = config.training;
  const torch::Device& device = trainer.device();
  const Spread step = spread(record.step_ms);
  // An optimizer step: all grad_accum_steps micro-batches' rows, every one of them forward and backward.
  const int64_t rows_per_step = t.rows_per_step();
  const double tokens_per_step = static_cast<double>(t.tokens_per_step());
  const double flops = training_flops_per_step(config.model, rows_per_step, t.seq_len);
  const double achieved_tflops = flops / (step.median * 1e-3) / 1e12;
  const auto peak = device.is_cuda() ? peak_flops(system.device_name, t.dtype, t.allow_tf32) : std::nullopt;
  // TF32 is a GPU mode: a CPU run (training.device "auto" on a machine without a GPU) computes in fp32.
  const bool tf32 = t.dtype == Precision::kFp32 && t.allow_tf32 && device.is_cuda();
  nlohmann::json losses = record.losses;  // NaN and inf become null

  nlohmann::json summary = {
      {"step_ms", to_json(step)},
      {"forward_ms", spread_or_null(record.forward_ms)},
      {"backward_ms", spread_or_null(record.backward_ms)},
      {"optimizer_ms", spread_or_null(record.optimizer_ms)},
      {"samples_per_s", 1000.0 * static_cast<double>(rows_per_step) / step.median},
      {"tokens_per_s", 1000.0 * tokens_per_step / step.median},
      {"model_tflop_per_step", flops / 1e12},
      {"achieved_tflops", achieved_tflops},
      {"peak_tflops", peak ? nlohmann::json(peak->tflops) : nlohmann::json(nullptr)},
      {"mfu", peak ? nlohmann::json(achieved_tflops / peak->tflops) : nlohmann::json(nullptr)},
      {"mfu_note", peak ? strprintf("peak %.1f TFLOP/s dense %s for ", peak->tflops, tf32 ? "tf32" : to_string(t.dtype)) +
                              peak->gpu +
                              " (" + peak->source + ")"
                        : "MFU not computed: no peak FLOP/s known for '" + system.device_name + "'"},
      {"peak_allocated_mb", spread(record.peak_allocated_mb).max},
      {"peak_reserved_mb", spread(record.peak_reserved_mb).max},
      {"device_used_mb", device.is_cuda() ? nlohmann::json(record.device_used_mb) : nlohmann::json(nullptr)},
      {"memory_note", trainer.graphed()
                          ? "peak_allocated_mb counts tensors alive through a step; a replayed graph allocates "
                            "nothing, and its activations live in the graph's private pool, which "
                            "peak_reserved_mb includes. device_used_mb: the GPU's memory in use after the measured "
                            "steps (the driver's figure: LibTorch's pools, CUDA/HIP context, library workspaces)"
                          : "peak_allocated_mb and peak_reserved_mb: LibTorch's caching allocator, largest over "
                            "the measured steps. device_used_mb: the GPU's memory in use after the measured "
                            "steps (the driver's figure: LibTorch's pools, CUDA/HIP context, library workspaces)"},
      {"first_loss", losses.front()},
      {"final_loss", losses.back()},
  };
  EnergyReading energy = record.energy;  // the measured window's; run_training may replace it (finish_energy)
  energy.steps = static_cast<int64_t>(record.step_ms.size());
  set_energy_fields(summary, energy, tokens_per_step);
  if (trainer.spec().pitfall == Pitfall::kNoSyncTiming)
    summary["host_clock_ms"] = {
        {"step_ms", spread_or_null(record.host_step_ms)},
        {"forward_ms", spread_or_null(record.host_forward_ms)},
        {"backward_ms", spread_or_null(record.host_backward_ms)},
        {"optimizer_ms", spread_or_null(record.host_optimizer_ms)},
        {"note", device.is_cuda()
                     ? "the host's steady clock at the same marks as the device events, with no device sync: how "
                       "long the host took to queue each phase's launches, not how long the GPU worked on it"
                     : "the host's steady clock; on the CPU the work is synchronous, so it equals step_ms"}};
  int64_t parameters = 0;
  for (const auto& p : trainer.model()->parameters()) parameters += p.numel();
  nlohmann::json training = {
      {"dtype", to_string(t.dtype)},
      {"precision", t.dtype == Precision::kFp32
                        ? (tf32 ? "fp32, matmuls on TF32 tensor cores (--allow-tf32)"
                                : t.allow_tf32 ? "fp32 (--allow-tf32 given, but TF32 exists on the GPU only)"
                                               : "fp32 (TF32 off)")
                        : (trainer.model()->compute_copies().empty()
                               ? "bf16 autocast, fp32 master weights"
                               : "bf16 autocast, fp32 master weights, bf16 weight copies written by the optimizer")},
      {"batch_size", t.batch_size},
      {"seq_len", t.seq_len},
      {"grad_accum_steps", t.grad_accum_steps},
      {"warmup_steps", t.warmup_steps},
      {"measured_steps", static_cast<int64_t>(record.step_ms.size())},
      {"tokens_per_step", rows_per_step * t.seq_len},
      {"optimizer", {{"name", "AdamW"}, {"lr", t.learning_rate}, {"betas", {t.beta1, t.beta2}}, {"eps", t.adam_eps},
                     {"weight_decay", t.weight_decay}, {"grad_clip", t.grad_clip},
                     {"lr_schedule", {{"kind", t.lr_schedule}, {"peak_lr", t.learning_rate}, {"min_lr", t.min_lr},
                                      {"lr_warmup_steps", t.lr_warmup_steps},
                                      {"total_steps", t.warmup_steps + t.num_steps}}}}},
      {"parameters", parameters},
      {"data", data},
      {"timing", device.is_cuda() ? "device events on the current stream" : "steady clock (CPU)"},
  };
  return {{"schema_version", kResultSchemaVersion},
          {"stage", stage_details(trainer)},
          {"config", to_json(config)},
          {"training", training},
          {"system", to_json(system)},
          {"summary", summary},
          {"losses", losses},
          {"step_ms", record.step_ms}};
}

void set_energy_fields(nlohmann::json& summary, const EnergyReading& energy, double tokens_per_step) {
  const bool figure = energy.joules && energy.steps > 0;
  const double steps = static_cast<double>(energy.steps);
  summary["energy_j_per_step"] = figure ? nlohmann::json(*energy.joules / steps) : nlohmann::json(nullptr);
  summary["tokens_per_joule"] = figure && *energy.joules > 0 ? nlohmann::json(tokens_per_step * steps / *energy.joules)
                                                             : nlohmann::json(nullptr);
  summary["energy_note"] = figure ? energy.source : energy.note;
  if (!figure) {
    summary["energy_window"] = nullptr;
    return;
  }
  summary["energy_window"] = {
      {"steps", energy.steps},
      {"seconds", energy.seconds},
      {"extra_steps", energy.extra_steps},
      {"counter_refresh_ms", energy.refresh_s ? nlohmann::json(*energy.refresh_s * 1e3) : nlohmann::json(nullptr)}};
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
