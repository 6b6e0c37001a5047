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
  Batches batches(std::move(source), t.batch_size, t.seq_len, total, device);

  log << "[" << trainer.spec().name << "] config " << config.name << " | " << to_string(t.dtype) << " | device "
      << device.str() << " | batch " << t.batch_size << " x seq " << t.seq_len << " | " << t.warmup_steps
      << " warm-up + " << t.num_steps << " measured steps | data: " << batches.source().describe() << std::endl;

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
  nlohmann::json profile;
  if (extras.profile.steps > 0) {
    // After every measurement (profiler overhead must not reach step_ms); all profiled steps train on one
    // new batch, so the window holds the steps and nothing else.
    batches.next();
    profile = record_profile(device, extras.profile, [&] { trainer.step(batches.inputs(), batches.labels()); }, log);
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
  return result;
}

}  // namespace tt
