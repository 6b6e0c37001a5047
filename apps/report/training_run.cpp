#include "apps/report/training_run.h"

#include <ostream>
#include <stdexcept>
#include <utility>
#include <vector>

#include "apps/report/evaluation_report.h"
#include "apps/report/results.h"
#include "apps/report/system_info.h"
#include "apps/train/data.h"
#include "apps/train/format.h"
#include "apps/train/loop.h"

namespace tt {

namespace {

// The energy figure (apps/train/energy.h), last: its extra steps, on one new batch, change nothing recorded
// or saved. Data parallel: rank 0 reads its GPU's counter and decides each round's step count, which every
// rank receives by broadcast (0 ends), so that the collectives inside the steps stay matched.
void finish_run_energy(Trainer& trainer, Batches& batches, const RunRecord& record, DistributedContext* distributed,
                       nlohmann::json& result, std::ostream& log) {
  const torch::Device& device = trainer.device();
  const bool decides = !distributed || distributed->rank() == 0;
  auto round = [&](int64_t n) {
    if (!distributed) return n;
    auto count = torch::full({1}, n, torch::TensorOptions().dtype(torch::kInt64).device(device));
    distributed->broadcast_from_rank0({count});
    return count.item<int64_t>();
  };
  auto run = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) trainer.step(batches.inputs(), batches.labels());
    synchronize(device);
  };
  batches.next();
  synchronize(device);
  if (!decides) {
    for (int64_t n = round(0); n > 0; n = round(0)) run(n);
    return;
  }
  EnergyMeter meter(device);
  const double seconds_per_step = result["summary"]["step_ms"]["median"].get<double>() / 1e3;
  const EnergyReading energy =
      finish_energy(meter, record.energy_window, static_cast<int64_t>(record.step_ms.size()), seconds_per_step,
                    [&](int64_t n) { run(round(n)); });
  round(0);
  const auto& t = trainer.config().training;
  set_energy_fields(result["summary"], energy, static_cast<double>(t.batch_size * t.seq_len));
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
  if (extras.distributed)
    source = make_sharded_source(std::move(source), t.batch_size, extras.distributed->rank(),
                                 extras.distributed->world_size());
  Batches batches(std::move(source), t.batch_size, t.seq_len, total, device);

  log << "[" << trainer.spec().name << "] config " << config.name << " | " << to_string(t.dtype) << " | device "
      << device.str() << " | batch " << t.batch_size << " x seq " << t.seq_len << " | " << t.warmup_steps
      << " warm-up + " << t.num_steps << " measured steps | data: " << batches.source().describe() << std::endl;
  if (extras.distributed)
    log << "[" << trainer.spec().name << "] data parallel: " << extras.distributed->world_size() << " ranks ("
        << extras.distributed->env().source << ", " << collective_backend_name() << "), global batch "
        << t.batch_size * extras.distributed->world_size() << ", this log and the result are rank 0's" << std::endl;

  std::vector<std::pair<int64_t, EvalResult>> eval_points;  // (run step, result), warm-up steps counted
  auto evaluate_at = [&](int64_t step) {
    const EvalResult r = evaluate(trainer.model(), extras.eval_data->tokens, t.seq_len, t.batch_size, device, t.dtype);
    log << "  eval after step " << step << "/" << total << " | held-out loss " << strprintf("%.4f", r.loss)
        << " | perplexity " << strprintf("%.3f", r.perplexity) << std::endl;
    eval_points.emplace_back(step, r);
  };
  BetweenSteps between_steps;
  if (extras.eval_data && extras.eval_every > 0)
    between_steps = [&](int64_t done) {
      if (done % extras.eval_every == 0) evaluate_at(done);
    };

  const RunRecord record = train_loop(trainer.runner(), batches, t, device, log, between_steps);
  if (extras.eval_data && (eval_points.empty() || eval_points.back().first != total)) evaluate_at(total);
  if (extras.after_last_counted_step) extras.after_last_counted_step();
  nlohmann::json profile;
  if (extras.profile.steps > 0) {
    // After every measurement (profiler overhead must not reach step_ms); all profiled steps train on one
    // new batch, so the window holds the steps and nothing else.
    batches.next();
    auto step = [&] { trainer.step(batches.inputs(), batches.labels()); };
    if (extras.distributed && extras.distributed->rank() != 0)
      for (int64_t i = 0; i < extras.profile.steps; ++i) step();  // in step with rank 0, which records
    else
      profile = record_profile(device, extras.profile, step, log);
  }

  nlohmann::json result = build_result(trainer, record, batches.source().describe(), collect_system_info(device));
  if (extras.eval_data) {
    nlohmann::json evaluation = to_json(eval_points.back().second, *extras.eval_data, t.seq_len, t.batch_size, t.dtype);
    evaluation["step"] = total;
    evaluation["every"] = extras.eval_every;
    evaluation["curve"] = nlohmann::json::array();
    for (const auto& [at, point] : eval_points) evaluation["curve"].push_back(curve_point(at, point));
    evaluation["timing"] = "between steps, outside the measured steps' timed regions and memory peaks";
    result["evaluation"] = std::move(evaluation);
  }
  if (!profile.is_null()) result["profile"] = std::move(profile);
  if (extras.distributed) result["distributed"] = distributed_report(*extras.distributed, trainer, result);
  finish_run_energy(trainer, batches, record, extras.distributed, result, log);
  return result;
}

nlohmann::json distributed_report(DistributedContext& context, Trainer& trainer, const nlohmann::json& result) {
  const auto* runner = dynamic_cast<const DataParallelStep*>(&trainer.runner());
  if (!runner) throw std::runtime_error("distributed_report: the trainer's steps do not run data parallel");
  constexpr int kAllreduceRepeats = 20;
  const double allreduce_ms = context.time_allreduce_ms(runner->gradient_bytes(), kAllreduceRepeats);
  const double weight_spread = context.max_difference_across_ranks(trainer.model()->parameters());
  double gradient_bytes = 0;
  for (const auto& [dtype, bytes] : runner->gradient_bytes()) gradient_bytes += static_cast<double>(bytes);
  const auto& summary = result.at("summary");
  const int world = context.world_size();
  const int64_t batch = trainer.config().training.batch_size;
  nlohmann::json out;
  out["world_size"] = world;
  out["backend"] = collective_backend_name();
  out["launcher"] = context.env().source;
  out["per_gpu_batch_size"] = batch;
  out["global_batch_size"] = batch * world;
  out["per_gpu_tokens_per_s"] = summary.at("tokens_per_s");
  out["total_tokens_per_s"] = summary.at("tokens_per_s").get<double>() * world;
  out["per_gpu_samples_per_s"] = summary.at("samples_per_s");
  out["total_samples_per_s"] = summary.at("samples_per_s").get<double>() * world;
  out["gradient_mb_per_step"] = gradient_bytes / (1 << 20);
  out["allreduce_ms_per_step"] = allreduce_ms;
  out["allreduce_timing"] =
      "median of " + std::to_string(kAllreduceRepeats) +
      " all-reduces of one step's gradients (one buffer per dtype), run alone after training with device events "
      "on rank 0; inside a step the Reducer's buckets overlap the backward, so a step waits for less than this";
  out["loss_definition"] = "mean over ranks of each rank's shard loss: the global batch's loss";
  out["weights_max_diff_across_ranks"] = weight_spread;
  out["scaling_efficiency"] = nullptr;
  out["scaling_efficiency_how"] =
      "total_tokens_per_s / (world_size x tokens_per_s of a 1-GPU run with the same per-GPU batch); "
      "pass --scaling-baseline <that run's result JSON> to fill it in";
  return out;
}

}  // namespace tt
