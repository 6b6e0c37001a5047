#include "apps/runtime/trainer.h"

#include <cstdio>
#include <ostream>

#include "apps/runtime/data.h"
#include "apps/runtime/flops.h"
#include "apps/runtime/results.h"
#include "apps/runtime/system_info.h"
#include "models/checkpoint.h"

namespace tt {
namespace {

enum Mark : size_t { kStart, kForward, kBackward, kOptimizer, kMarks };

std::string format(const char* fmt, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, value);
  return buf;
}

const char* sdp_backend_name(int64_t choice) {
  switch (choice) {
    case 0: return "math";
    case 1: return "flash_attention";
    case 2: return "efficient_attention";
    case 3: return "cudnn_attention";
    case 4: return "overrideable";
    default: return "error (no backend accepts these inputs)";
  }
}

}  // namespace

Trainer::Trainer(const StageSpec& spec, const RunConfig& config, const torch::Device& device)
    : spec_(spec), config_(config), device_(device) {
  validate(config_);
  model_ = Transformer(config_.model, spec_);
  model_->init_weights(static_cast<uint64_t>(config_.training.seed));
  model_->to(device_);
  optimizer_ = make_optimizer(spec_.optimizer, model_->parameters(), AdamWOptions::from(config_.training));
}

torch::Tensor Trainer::forward_backward(const torch::Tensor& inputs, const torch::Tensor& labels) {
  torch::Tensor loss;
  {
    ScopedRange range("forward");
    AutocastScope autocast(device_, mixed_precision());
    loss = model_->loss(inputs, labels);
  }
  ScopedRange range("backward");
  loss.backward();
  return loss.detach();
}

torch::Tensor Trainer::step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer) {
  if (timer) timer->mark(kStart);
  torch::Tensor loss;
  {
    ScopedRange range("forward");
    AutocastScope autocast(device_, mixed_precision());
    loss = model_->loss(inputs, labels);
  }
  if (timer) timer->mark(kForward);
  {
    ScopedRange range("backward");
    loss.backward();
  }
  if (timer) timer->mark(kBackward);
  {
    ScopedRange range("optimizer");
    if (config_.training.grad_clip > 0) clip_grad_norm(optimizer_->parameters(), config_.training.grad_clip);
    optimizer_->step();
    optimizer_->zero_grad();
  }
  if (timer) timer->mark(kOptimizer);
  return loss.detach();
}

void Trainer::load_checkpoint(const std::string& path) {
  restore_checkpoint(read_checkpoint(path), model_, optimizer_.get());
}

void Trainer::save_checkpoint(const std::string& path) const {
  tt::save_checkpoint(path, model_, *optimizer_, optimizer_->step_count(), config_);
}

void Trainer::set_eval_data(EvalData data, int64_t every) {
  if (every < 0)
    throw std::runtime_error("eval every " + std::to_string(every) + " steps is not allowed: must be >= 0");
  eval_data_ = std::move(data);
  eval_every_ = every;
}

EvalResult Trainer::evaluate_held_out(std::ostream& log, int64_t step, int64_t total) {
  const TrainConfig& t = config_.training;
  const EvalResult r = evaluate(model_, eval_data_->tokens, t.seq_len, t.batch_size, device_, mixed_precision());
  log << "  eval after step " << step << "/" << total << " | held-out loss " << format("%.4f", r.loss)
      << " | perplexity " << format("%.3f", r.perplexity) << std::endl;
  return r;
}

nlohmann::json Trainer::stage_details() const {
  nlohmann::json details = to_json(spec_);
  if (spec_.attention != AttentionKind::kSdpa) return details;
  // Which SDPA kernel LibTorch picks for this run's shapes and dtype, asked the same way attend() calls it.
  const auto& c = config_.model;
  const auto dtype = mixed_precision() ? torch::kBFloat16 : torch::kFloat32;
  auto options = torch::TensorOptions().dtype(dtype).device(device_);
  const int64_t b = config_.training.batch_size, s = config_.training.seq_len;
  auto q = torch::empty({b, c.n_heads, s, c.head_dim()}, options);
  const bool expand = dtype == torch::kFloat32 && c.n_heads != c.n_kv_heads && device_.is_cuda();
  const int64_t kv_heads = expand ? c.n_heads : c.n_kv_heads;
  auto k = torch::empty({b, kv_heads, s, c.head_dim()}, options);
  const int64_t choice = device_.is_cuda()
                             ? at::_fused_sdp_choice(q, k, k, {}, 0.0, true, std::nullopt, kv_heads != c.n_heads)
                             : 0;
  details["sdpa_backend"] = sdp_backend_name(choice);
  details["sdpa_gqa"] = expand ? "K/V expanded to all heads (fp32)" : (kv_heads != c.n_heads ? "native enable_gqa" : "no GQA");
  return details;
}

nlohmann::json Trainer::run(std::ostream& log) {
  const TrainConfig& t = config_.training;
  const int64_t total = t.warmup_steps + t.num_steps;
  const uint64_t data_seed = static_cast<uint64_t>(t.seed) + 1;  // independent of the weight stream
  auto source = t.data.empty() ? make_synthetic_source(config_.model.vocab_size, data_seed)
                               : make_text_source(t.data, t.seq_len, data_seed);
  Batches batches(std::move(source), t.batch_size, t.seq_len, total, device_);
  auto losses = torch::zeros({total}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
  std::vector<StepTimer> timers;
  timers.reserve(static_cast<size_t>(t.num_steps));
  std::vector<double> peak_alloc_mb, peak_reserved_mb;
  const double tokens_per_step = static_cast<double>(t.batch_size * t.seq_len);
  std::vector<std::pair<int64_t, EvalResult>> eval_points;  // (run step, result), warm-up steps counted

  log << "[" << spec_.name << "] config " << config_.name << " | " << t.dtype << " | device " << device_.str()
      << " | batch " << t.batch_size << " x seq " << t.seq_len << " | " << t.warmup_steps << " warm-up + "
      << t.num_steps << " measured steps | data: " << batches.source().describe() << std::endl;

  for (int64_t i = 0; i < total; ++i) {
    const bool measured = i >= t.warmup_steps;
    batches.next();
    reset_peak_memory(device_);
    StepTimer* timer = nullptr;
    if (measured) {
      timers.emplace_back(device_, kMarks);
      timer = &timers.back();
    }
    auto loss = step(batches.inputs(), batches.labels(), timer);
    losses[i].copy_(loss, /*non_blocking=*/true);
    if (measured) {
      const auto mem = peak_memory(device_);
      peak_alloc_mb.push_back(static_cast<double>(mem.peak_allocated_bytes) / (1 << 20));
      peak_reserved_mb.push_back(static_cast<double>(mem.peak_reserved_bytes) / (1 << 20));
    }
    const bool last = i + 1 == total;
    if (t.log_every > 0 && ((i + 1) % t.log_every == 0 || last)) {
      // The loop's only host sync: the progress line needs the loss.
      const double loss_value = loss.item<double>();
      std::string timing = "warm-up";
      if (measured) {
        const double ms = timer->elapsed_ms(kStart, kOptimizer);
        timing = format("%.2f ms", ms) + " | " + format("%.1f samples/s", 1000.0 * t.batch_size / ms) + " | " +
                 format("%.0f tokens/s", 1000.0 * tokens_per_step / ms) +
                 (device_.is_cuda() ? " | peak " + format("%.0f MB", peak_alloc_mb.back()) : "");
      }
      log << "  step " << (i + 1) << "/" << total << " | loss " << format("%.4f", loss_value) << " | " << timing
          << std::endl;
    }
    // After the step's last timer mark and memory reading: evaluation stays out of every measurement.
    if (eval_data_ && eval_every_ > 0 && (i + 1) % eval_every_ == 0)
      eval_points.emplace_back(i + 1, evaluate_held_out(log, i + 1, total));
  }
  synchronize(device_);
  if (eval_data_ && (eval_points.empty() || eval_points.back().first != total))
    eval_points.emplace_back(total, evaluate_held_out(log, total, total));
  nlohmann::json profile;
  if (profile_.steps > 0) {
    // After every measurement (profiler overhead must not reach step_ms); all profiled steps train on one
    // new batch, so the window holds the steps and nothing else.
    batches.next();
    profile = record_profile(device_, profile_, [&] { step(batches.inputs(), batches.labels()); }, log);
  }

  std::vector<double> step_ms, forward_ms, backward_ms, optimizer_ms;
  for (auto& timer : timers) {
    step_ms.push_back(timer.elapsed_ms(kStart, kOptimizer));
    forward_ms.push_back(timer.elapsed_ms(kStart, kForward));
    backward_ms.push_back(timer.elapsed_ms(kForward, kBackward));
    optimizer_ms.push_back(timer.elapsed_ms(kBackward, kOptimizer));
  }
  auto loss_values = losses.cpu();
  nlohmann::json loss_list = nlohmann::json::array();
  for (int64_t i = 0; i < total; ++i) loss_list.push_back(loss_values[i].item<double>());

  const SystemInfo system = collect_system_info(device_);
  const Spread step = spread(step_ms);
  const double flops = training_flops_per_step(config_.model, t.batch_size, t.seq_len);
  const double achieved_tflops = flops / (step.median * 1e-3) / 1e12;
  const auto peak = device_.is_cuda() ? peak_flops(system.device_name, t.dtype) : std::nullopt;

  nlohmann::json summary = {
      {"step_ms", to_json(step)},
      {"forward_ms", to_json(spread(forward_ms))},
      {"backward_ms", to_json(spread(backward_ms))},
      {"optimizer_ms", to_json(spread(optimizer_ms))},
      {"samples_per_s", 1000.0 * static_cast<double>(t.batch_size) / step.median},
      {"tokens_per_s", 1000.0 * tokens_per_step / step.median},
      {"model_tflop_per_step", flops / 1e12},
      {"achieved_tflops", achieved_tflops},
      {"peak_tflops", peak ? nlohmann::json(peak->tflops) : nlohmann::json(nullptr)},
      {"mfu", peak ? nlohmann::json(achieved_tflops / peak->tflops) : nlohmann::json(nullptr)},
      {"mfu_note", peak ? "peak " + format("%.1f", peak->tflops) + " TFLOP/s dense " + t.dtype + " for " + peak->gpu +
                              " (" + peak->source + ")"
                        : "MFU not computed: no peak FLOP/s known for '" + system.device_name + "'"},
      {"peak_allocated_mb", spread(peak_alloc_mb).max},
      {"peak_reserved_mb", spread(peak_reserved_mb).max},
      {"first_loss", loss_list.front()},
      {"final_loss", loss_list.back()},
  };
  nlohmann::json training = {
      {"dtype", t.dtype},
      {"precision", mixed_precision() ? "bf16 autocast, fp32 master weights" : "fp32 (TF32 off)"},
      {"batch_size", t.batch_size},
      {"seq_len", t.seq_len},
      {"warmup_steps", t.warmup_steps},
      {"measured_steps", t.num_steps},
      {"tokens_per_step", t.batch_size * t.seq_len},
      {"optimizer", {{"name", "AdamW"}, {"lr", t.learning_rate}, {"betas", {t.beta1, t.beta2}}, {"eps", t.adam_eps},
                     {"weight_decay", t.weight_decay}, {"grad_clip", t.grad_clip}}},
      {"parameters", [&] {
         int64_t n = 0;
         for (const auto& p : model_->parameters()) n += p.numel();
         return n;
       }()},
      {"data", batches.source().describe()},
      {"timing", device_.is_cuda() ? "device events on the current stream" : "steady clock (CPU)"},
  };
  nlohmann::json result = {{"schema_version", kResultSchemaVersion},
                          {"stage", stage_details()},
                          {"config", to_json(config_)},
                          {"training", training},
                          {"system", to_json(system)},
                          {"summary", summary},
                          {"losses", loss_list},
                          {"step_ms", step_ms}};
  if (eval_data_) {
    nlohmann::json evaluation = to_json(eval_points.back().second, *eval_data_, t.seq_len, t.batch_size, t.dtype);
    evaluation["step"] = total;
    evaluation["every"] = eval_every_;
    evaluation["curve"] = nlohmann::json::array();
    for (const auto& [at, point] : eval_points) evaluation["curve"].push_back(curve_point(at, point));
    evaluation["timing"] = "between steps, outside the measured steps' timed regions and memory peaks";
    result["evaluation"] = std::move(evaluation);
  }
  if (!profile.is_null()) result["profile"] = std::move(profile);
  return result;
}

}  // namespace tt
