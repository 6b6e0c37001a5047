#include "apps/train/training_run.h"

#include <algorithm>
#include <cstdlib>
#include <ostream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "apps/train/data_parallel_step.h"
#include "apps/train/evaluation_report.h"
#include "apps/train/run_result.h"
#include "apps/train/sharded_adamw.h"
#include "apps/train/system_info.h"
#include "apps/train/data.h"
#include "apps/results/text.h"
#include "apps/train/loop.h"

namespace tt {

namespace {

// The energy figure (apps/train/energy.h), last: its extra steps, on one new batch, change nothing recorded
// or saved. Data parallel: rank 0 reads its GPU's counter and decides each round's step count, which every
// rank receives by broadcast (0 ends), so that the collectives inside the steps stay matched.
// A stop signal during the extra steps ends them (every rank at the same step: the stop vote is collective):
// thrown from inside finish_energy's rounds, caught below.
struct StoppedDuringExtraSteps {};

void finish_run_energy(Trainer& trainer, Batches& batches, const RunRecord& record, DistributedContext* distributed,
                       const std::function<bool()>& stop_now, nlohmann::json& result, std::ostream& log) {
  const torch::Device& device = trainer.device();
  const bool decides = !distributed || distributed->rank() == 0;
  auto round = [&](int64_t n) {
    if (!distributed) return n;
    auto count = torch::full({1}, n, torch::TensorOptions().dtype(torch::kInt64).device(device));
    distributed->broadcast_from_rank0({count});
    return count.item<int64_t>();
  };
  auto run = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      if (stop_now()) throw StoppedDuringExtraSteps{};
      trainer.step(batches.inputs(), batches.labels());
    }
    synchronize(device);
  };
  batches.next();
  synchronize(device);
  if (!decides) {
    try {
      for (int64_t n = round(0); n > 0; n = round(0)) run(n);
    } catch (const StoppedDuringExtraSteps&) {
    }
    return;
  }
  EnergyMeter meter(device);
  const double seconds_per_step = result["summary"]["step_ms"]["median"].get<double>() / 1e3;
  EnergyReading energy;
  try {
    energy = finish_energy(meter, record.energy_window, static_cast<int64_t>(record.step_ms.size()), seconds_per_step,
                           [&](int64_t n) { run(round(n)); });
  } catch (const StoppedDuringExtraSteps&) {
    // Extra steps run only when the measured window is too short for the counter's resolution, so whatever figure
    // the measured steps gave misses it: none, rather than a figure off by more than the stated 5 %.
    EnergyReading none;
    none.note =
        "energy not measured: a stop signal ended the extra steps the energy figure needed (the measured "
        "steps were shorter than the counter's resolution needs)";
    set_energy_fields(result["summary"], none, static_cast<double>(trainer.config().training.tokens_per_step()));
    return;
  }
  round(0);
  const auto& t = trainer.config().training;
  set_energy_fields(result["summary"], energy, static_cast<double>(t.tokens_per_step()));
  if (energy.extra_steps && energy.joules)
    log << "[" << trainer.spec().name << "] energy: the measured steps were shorter than the counter's resolution "
        << "needs; " << energy.steps << " extra steps (" << strprintf("%.2f", energy.seconds)
        << " s, unrecorded, after the results and checkpoint) give the figure" << std::endl;
}

}  // namespace

nlohmann::json run_training(Trainer& trainer, const RunExtras& extras, std::ostream& log) {
  if (extras.eval_every < 0)
    throw std::runtime_error("eval every " + std::to_string(extras.eval_every) + " steps is not allowed: must be >= 0");
  const RunConfig& config = trainer.config();
  const TrainConfig& t = config.training;
  const torch::Device& device = trainer.device();
  const int64_t total = t.warmup_steps + t.num_steps;
  const uint64_t data_seed = static_cast<uint64_t>(t.seed) + 1;  // independent of the weight stream
  auto source = t.data.empty() ? make_synthetic_source(config.model.vocab_size, data_seed)
                               : make_text_source(t.data, t.seq_len, data_seed);
  // With gradient accumulation a step's batch holds its micro-batches, in the order they run.
  const int64_t rows_per_step = t.rows_per_step();
  if (extras.distributed)
    source = make_sharded_source(std::move(source), rows_per_step, extras.distributed->rank(),
                                 extras.distributed->world_size());
  Batches batches(std::move(source), rows_per_step, t.seq_len, total - extras.first_step, device);
  batches.skip(extras.first_step);

  log << "[" << trainer.spec().name << "] config " << config.name << " | " << to_string(t.dtype) << " | device "
      << device.str() << " | batch " << t.batch_size << " x seq " << t.seq_len
      << (t.grad_accum_steps > 1 ? " x " + std::to_string(t.grad_accum_steps) + " accumulated" : "") << " | "
      << t.warmup_steps << " warm-up + " << t.num_steps << " measured steps"
      << (t.lr_schedule != "constant" || t.lr_warmup_steps > 0
              ? " | lr " + t.lr_schedule + " " + strprintf("%g", t.learning_rate) + " -> " +
                    strprintf("%g", t.lr_schedule == "constant" ? t.learning_rate : t.min_lr) + ", ramp " +
                    std::to_string(t.lr_warmup_steps)
              : "")
      << " | data: " << batches.source().describe() << std::endl;
  if (extras.first_step > 0)
    log << "[" << trainer.spec().name << "] resumed after step " << extras.first_step << std::endl;
  if (extras.distributed)
    log << "[" << trainer.spec().name << "] data parallel: " << extras.distributed->world_size() << " ranks ("
        << extras.distributed->env().source << ", " << collective_backend_name() << "), global batch "
        << t.batch_size * extras.distributed->world_size() << ", this log and the result are rank 0's" << std::endl;

  std::vector<std::pair<int64_t, EvalResult>> eval_points;  // (run step, result), warm-up steps counted
  // Returns false when a stop signal cut the evaluation short (its partial figure is not recorded).
  auto evaluate_at = [&](int64_t step) {
    trainer.optimizer().gather_weights();  // a sharded optimizer's weights are whole only after it (every rank)
    const EvalResult r = evaluate(trainer.model(), extras.eval_data->tokens, t.seq_len, t.batch_size, device, &log,
                                  kEvalProgressSeconds, extras.stop_requested);
    if (r.stopped) {
      log << "  eval after step " << step << " cut short by a stop signal: not recorded" << std::endl;
      return false;
    }
    log << "  eval after step " << step << "/" << total << " | held-out loss " << strprintf("%.4f", r.loss)
        << " | perplexity " << strprintf("%.3f", r.perplexity) << std::endl;
    eval_points.emplace_back(step, r);
    return true;
  };
  // Rank 0 alone writes checkpoints; the other ranks join each one (a sharded optimizer gathers its state).
  const bool writes_checkpoints = !extras.distributed || extras.distributed->rank() == 0;
  RunCheckpoints checkpoints = extras.checkpoints;
  int64_t checkpointed = extras.first_step;  // the step of the newest checkpoint: none written yet
  const char* checkpointed_kind = "";
  auto checkpoint_at = [&](int64_t step, const char* kind) {
    // The same step again only to record that its file is the run's last or its stop (never pruned).
    if (!checkpoints.enabled() || (step == checkpointed && std::string(kind) == checkpointed_kind)) return;
    if (step == checkpointed && step == extras.first_step) return;  // the resumed file itself
    if (writes_checkpoints)
      log << "  checkpoint " << checkpoints.write(trainer, step, kind) << std::endl;
    else
      trainer.join_checkpoint();
    checkpointed = step;
    checkpointed_kind = kind;
  };
  BetweenSteps between_steps = [&](int64_t done) {
    if (extras.eval_data && extras.eval_every > 0 && done % extras.eval_every == 0) evaluate_at(done);
    // The last step's checkpoint is written after the loop, as the run's last.
    if (checkpoints.policy().every > 0 && done % checkpoints.policy().every == 0 && done < total)
      checkpoint_at(done, kPeriodicCheckpoint);
  };

  LoopControl control;
  control.first_step = extras.first_step;
  control.measure_from = trainer.first_measured_step(extras.first_step);
  control.stop_requested = extras.stop_requested;
  // The schedule's position: the optimizer's step count (a host sync for ours, before anything is timed).
  const int64_t first_optimizer_step = trainer.optimizer().step_count();
  const RunRecord record = train_loop(trainer.runner(), batches, t, device, log, between_steps, control);
  checkpoint_at(record.steps_done, record.interrupted ? kStopCheckpoint : kLastCheckpoint);
  // A stop signal after the last counted step still ends the run early: the final evaluation, the profile's
  // and the energy figure's extra steps are cut short, and the result says "interrupted". Every rank asks
  // at the same points (the stop vote is collective); once stopped, it stays stopped without asking again.
  bool interrupted = record.interrupted;
  const std::function<bool()> stop_now = [&] {
    if (!interrupted && extras.stop_requested && extras.stop_requested()) {
      interrupted = true;
      log << "[" << trainer.spec().name << "] stop requested after the last step: what is left is cut short"
          << std::endl;
    }
    return interrupted;
  };
  if (record.interrupted)
    log << "[" << trainer.spec().name << "] interrupted: stopped after step " << record.steps_done << "/" << total
        << std::endl;
  if (extras.eval_data && !interrupted && (eval_points.empty() || eval_points.back().first != total) &&
      !evaluate_at(total))
    stop_now();
  if (extras.after_last_counted_step) extras.after_last_counted_step(record.steps_done);
  nlohmann::json profile;
  if (extras.profile.steps > 0 && !stop_now()) {
    // After every measurement (profiler overhead must not reach step_ms); all profiled steps train on one
    // new batch, so the window holds the steps and nothing else.
    batches.next();
    auto step = [&] {
      if (!stop_now()) trainer.step(batches.inputs(), batches.labels());
    };
    if (extras.distributed && extras.distributed->rank() != 0)
      for (int64_t i = 0; i < extras.profile.steps; ++i) step();  // in step with rank 0, which records
    else
      profile = record_profile(device, extras.profile, step, log);
    if (interrupted) {
      profile = nullptr;  // fewer steps than it says: not a profile of the step
      log << "[" << trainer.spec().name << "] profile discarded: a stop signal cut its steps short" << std::endl;
    }
  }

  // A run stopped before its first measured step has losses but no timings: its result has no summary, so
  // that validate_result_json (compare, the report) never takes it for a measurement.
  nlohmann::json result = record.step_ms.empty()
                              ? nlohmann::json{{"schema_version", kResultSchemaVersion},
                                               {"stage", {{"name", trainer.spec().name}}},
                                               {"config", to_json(config)},
                                               {"system", to_json(collect_system_info(device))},
                                               {"summary", nullptr},
                                               {"summary_note", "stopped before the first measured step: no timings"},
                                               {"losses", record.losses}}
                              : build_result(trainer, record, batches.source().describe(), collect_system_info(device));
  result["interrupted"] = interrupted;
  result["first_step"] = record.first_step;  // "losses" and "lr" start after this many steps
  result["steps_done"] = record.steps_done;
  nlohmann::json lr = nlohmann::json::array();  // the rate each recorded step's update used
  const AdamWOptions options = AdamWOptions::from(t);
  for (int64_t i = 0; i < record.steps_done - record.first_step; ++i)
    lr.push_back(options.lr_at_step(first_optimizer_step + i + 1));
  result["lr"] = std::move(lr);
  if (extras.eval_data && !eval_points.empty()) {
    nlohmann::json evaluation = to_json(eval_points.back().second, *extras.eval_data, t.seq_len, t.batch_size, t.dtype);
    evaluation["step"] = eval_points.back().first;
    evaluation["every"] = extras.eval_every;
    evaluation["curve"] = nlohmann::json::array();
    for (const auto& [at, point] : eval_points) evaluation["curve"].push_back(curve_point(at, point));
    evaluation["timing"] = "between steps, outside the measured steps' timed regions and memory peaks";
    result["evaluation"] = std::move(evaluation);
  }
  if (!profile.is_null()) result["profile"] = std::move(profile);
  if (extras.distributed && !result["summary"].is_null())
    result["distributed"] = distributed_report(*extras.distributed, trainer, result);
  // A stopped run ends now: no unrecorded steps for the energy figure after a signal asked to stop.
  if (!interrupted && !result["summary"].is_null())
    finish_run_energy(trainer, batches, record, extras.distributed, stop_now, result, log);
  result["interrupted"] = interrupted;
  return result;
}

nlohmann::json distributed_report(DistributedContext& context, Trainer& trainer, const nlohmann::json& result) {
  const auto* runner = dynamic_cast<const DataParallelStep*>(&trainer.runner());
  if (!runner) throw std::runtime_error("distributed_report: the trainer's steps do not run data parallel");
  constexpr int kAllreduceRepeats = 20;
  const double allreduce_ms = context.time_allreduce_ms(runner->gradient_bytes(), kAllreduceRepeats);
  // The weights the forward reads (the gradient leaves: the compute copies where the model has them) and the
  // masters, which a sharded optimizer gathers first (between steps they are current only in each rank's slices).
  Optimizer& optimizer = trainer.optimizer();
  optimizer.gather_weights();
  const double weight_spread = std::max(context.max_difference_across_ranks(runner->leaves()),
                                        context.max_difference_across_ranks(trainer.model()->parameters()));
  const bool sharded = optimizer.sharded();
  double gradient_bytes = 0;
  for (const auto& [dtype, bytes] : runner->gradient_bytes()) gradient_bytes += static_cast<double>(bytes);
  const auto& summary = result.at("summary");
  const int world = context.world_size();
  const int64_t batch = trainer.config().training.batch_size;
  nlohmann::json out;
  out["world_size"] = world;
  out["backend"] = collective_backend_name();
  out["launcher"] = context.env().source;
  out["gradient_sync"] = to_string(runner->sync());
  out["step"] = runner->describe();
  out["per_gpu_batch_size"] = batch;
  out["global_batch_size"] = batch * world;
  out["per_gpu_tokens_per_s"] = summary.at("tokens_per_s");
  out["total_tokens_per_s"] = summary.at("tokens_per_s").get<double>() * world;
  out["per_gpu_samples_per_s"] = summary.at("samples_per_s");
  out["total_samples_per_s"] = summary.at("samples_per_s").get<double>() * world;
  out["gradient_mb_per_step"] = gradient_bytes / (1 << 20);
  out["embedding_gradient"] = runner->exchanges_embedding_rows() ? "rows" : "dense";
  if (runner->exchanges_embedding_rows()) {
    // Every token of the rank's step (all micro-batches) sends its row and id, repeats included.
    const int64_t tokens = trainer.config().training.tokens_per_step();
    out["embedding_rows_mb_per_step"] = static_cast<double>(tokens * runner->embedding_row_bytes()) / (1 << 20);
  }
  out["allreduce_ms_per_step"] = allreduce_ms;
  out["allreduce_timing"] =
      "median of " + std::to_string(kAllreduceRepeats) +
      " all-reduces of one step's gradients (one buffer per dtype), run alone after training with device events "
      "on rank 0; inside a step the all-reduces (the Reducer's buckets, or one per layer) overlap the backward, so a "
      "step waits for less than this" +
      std::string(runner->exchanges_embedding_rows()
                      ? ". The embedding's gradient is not in it: it travels as rows (embedding_rows_mb_per_step per "
                        "rank, all-gathered)"
                      : "") +
      std::string(sharded ? ". A sharded run does no such all-reduce: it reduce-scatters the same bytes and "
                            "all-gathers the weights, so this is a reference for its communication, not a part of it"
                          : "");
  out["optimizer_sharded"] = sharded;
  if (const auto* zero = dynamic_cast<const ShardedAdamW*>(&optimizer)) {
    out["zero_gather"] = to_string(zero->gather());
    const auto queues = hardware_queues();  // what kForward's overlap depends on (null: CUDA's default, 8)
    out["cuda_device_max_connections"] = queues ? nlohmann::json(*queues) : nlohmann::json(nullptr);
  }
  const char* mixing = std::getenv("NCCL_GRAPH_MIXING_SUPPORT");  // null: unset, NCCL's default (1, on)
  out["nccl_graph_mixing_support"] = mixing ? nlohmann::json(mixing) : nlohmann::json(nullptr);
  out["collectives_outside_graph_wait_for_gpu"] = context.waits_for_graphs();
  out["optimizer_state_mb_per_gpu"] = static_cast<double>(optimizer.state_bytes()) / (1 << 20);
  out["optimizer_state_what"] =
      sharded ? "this rank's slices of AdamW's moments m and v (ZeRO-1; every rank holds one slice of each parameter); "
                "the fp32 master weights keep their whole memory on every rank (in bf16 runs only this rank's slices "
                "are current between gathers)"
              : "AdamW's moments m and v, whole on every rank; the fp32 master weights besides";
  out["loss_definition"] = "mean over ranks of each rank's shard loss: the global batch's loss";
  out["weights_max_diff_across_ranks"] = weight_spread;
  out["scaling_efficiency"] = nullptr;
  out["scaling_efficiency_how"] =
      "total_tokens_per_s / (world_size x tokens_per_s of a 1-GPU run with the same per-GPU batch); "
      "pass --scaling-baseline <that run's result JSON> to fill it in";
  return out;
}

}  // namespace tt
