#include "apps/train/run_result.h"

#include "apps/results/flops.h"
#include "apps/results/text.h"

namespace tt {
namespace {

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
                     {"state_dtype", to_string(t.optimizer_state_dtype)},
                     {"overlap", t.optimizer_overlap ? (t.grad_clip > 0 ? "each layer's gradient-norm pass during "
                                                                          "the backward, the updates after it"
                                                                        : "each layer updated during the backward")
                                                     : "none: the update follows the backward"},
                     {"sharded", t.shard_optimizer ? "ZeRO-1: each rank keeps and updates its slice of the moments"
                                                   : "no: every rank keeps the whole state"},
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
  // The GPU's mean draw over the window, to set beside its power limit (docs/roofline-energy.md#energy-per-step): the
  // one formula compare and the validator use too.
  const std::optional<double> watts = energy_window_mean_power_w(summary);
  summary["energy_window"]["average_power_w"] = watts ? nlohmann::json(*watts) : nlohmann::json(nullptr);
}

}  // namespace tt
