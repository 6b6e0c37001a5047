#include "apps/train/evaluation_report.h"

#include <ostream>
#include <stdexcept>

#include "apps/train/system_info.h"
#include "apps/results/text.h"
#include "apps/train/device.h"
#include "models/checkpoint.h"

namespace tt {
namespace {

constexpr const char* kDefinition =
    "sum of -log softmax(logits)[next byte] over every predicted token / number of predicted tokens; "
    "consecutive non-overlapping windows of seq_len + 1 bytes from the start of the file, the trailing "
    "partial window dropped; log-softmax in fp32, sum in fp64";

}  // namespace

nlohmann::json to_json(const EvalResult& r, const EvalData& data, int64_t seq_len, int64_t batch_size,
                       Precision precision) {
  return {{"data", data.path},        {"bytes", data.tokens.numel()},
          {"seq_len", seq_len},       {"batch_size", batch_size},
          {"dtype", to_string(precision)}, {"windows", r.windows},
          {"tokens", r.tokens},       {"dropped_bytes", r.dropped_bytes},
          {"loss", r.loss},           {"perplexity", r.perplexity},
          {"definition", kDefinition}};
}

nlohmann::json curve_point(int64_t step, const EvalResult& r) {
  return {{"step", step}, {"loss", r.loss}, {"perplexity", r.perplexity}};
}

nlohmann::json evaluate_checkpoint(const StageSpec& spec, const RunConfig& config, const std::string& checkpoint,
                                   const EvalData& data, const torch::Device& device, std::ostream& log) {
  const Checkpoint ck = read_checkpoint(checkpoint);
  Transformer model(config.model, spec);
  try {
    restore_weights(ck, model);
  } catch (const c10::Error& e) {
    if (ck.config.model == config.model) throw;
    throw std::runtime_error(
        std::string(e.what_without_backtrace()) +
        "\n--eval-only builds the model from this run's config: pass the config the checkpoint was "
        "trained with (its name: \"" +
        ck.config.name + "\")");
  }
  model->to(device);
  const TrainConfig& t = config.training;
  model->set_precision(t.dtype);
  set_allow_tf32(t.allow_tf32);
  const EvalResult r = evaluate(model, data.tokens, t.seq_len, t.batch_size, device, &log);
  log << "[" << spec.name << "] eval of '" << checkpoint << "' (" << ck.stage << ", step " << ck.step << ") on '"
      << data.path << "' | " << to_string(t.dtype) << " | device " << device.str() << " | " << r.windows
      << " windows x " << t.seq_len << " = " << r.tokens << " tokens (" << r.dropped_bytes
      << " trailing bytes dropped) | loss " << strprintf("%.4f", r.loss) << " | perplexity "
      << strprintf("%.3f", r.perplexity) << std::endl;
  return {{"schema_version", kEvalResultSchemaVersion},
          {"kind", "evaluation"},
          {"stage", to_json(spec)},
          {"config", to_json(config)},
          {"checkpoint", {{"path", checkpoint}, {"stage", ck.stage}, {"step", ck.step}}},
          {"system", to_json(collect_system_info(device))},
          {"evaluation", to_json(r, data, t.seq_len, t.batch_size, t.dtype)}};
}

}  // namespace tt
