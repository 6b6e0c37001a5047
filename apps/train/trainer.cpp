#include "apps/train/trainer.h"

#include "apps/train/graph_step.h"
#include "models/checkpoint.h"

namespace tt {
namespace {

Transformer build_model(const StageSpec& spec, const RunConfig& config, const torch::Device& device) {
  validate(config);
  const auto seed = static_cast<uint64_t>(config.training.seed);
  // The missing-init pitfall keeps the weights LibTorch's modules draw when they are built (embedding
  // N(0, 1), linears Kaiming-uniform), from the global generator seeded here so that the run repeats.
  if (spec.pitfall == Pitfall::kMissingInit) torch::manual_seed(seed);
  Transformer model(config.model, spec);
  if (spec.pitfall != Pitfall::kMissingInit) model->init_weights(seed);
  model->to(device);
  if (spec.compute_copies && config.training.dtype == Precision::kBf16) model->enable_compute_copies(torch::kBFloat16);
  return model;
}

size_t parameter_index(const Optimizer& optimizer, const torch::Tensor& parameter) {
  const auto& params = optimizer.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) return i;
  TORCH_CHECK(false, "checkpoint: a model parameter is not managed by the optimizer");
}

}  // namespace

Trainer::Trainer(const StageSpec& spec, const RunConfig& config, const torch::Device& device)
    : spec_(spec),
      config_(config),
      device_(device),
      model_(build_model(spec, config, device)),
      optimizer_(make_optimizer(spec.optimizer, model_, AdamWOptions::from(config.training))),
      eager_(model_, *optimizer_, config.training.dtype) {
  set_allow_tf32(config.training.allow_tf32);
  if (spec.step != StepKind::kGraph || !device.is_cuda()) return;
  // A replay repeats the captured kernel arguments: an optimizer that counts steps on the host (for bias
  // correction, or for checkpoints) would freeze its count at the capture.
  TORCH_CHECK(spec.optimizer == OptimizerKind::kOurAdamW, "stage ", spec.name,
              " captures its step as a graph, which needs an optimizer that counts its steps on the device (",
              implementation(OptimizerKind::kOurAdamW).name, "); it chose ", implementation(spec.optimizer).name);
  if (config.training.warmup_steps < kGraphWarmupSteps)
    throw ConfigError("config: field \"training.warmup_steps\" = " + std::to_string(config.training.warmup_steps) +
                      " is not allowed for " + spec.name + ", which captures its step as a graph during the " +
                      "warm-up: it needs at least " + std::to_string(kGraphWarmupSteps) + " (or run it with --no-graph)");
  // The last warm-up step captures, so no measured step contains the capture.
  graphed_ = std::make_unique<GraphedStep>(eager_, config.training.warmup_steps - 1);
}

Trainer::~Trainer() = default;

std::string Trainer::step_description() const {
  std::string out = runner().describe();
  if (spec_.step == StepKind::kGraph && !graphed_) out += " (this run is on the CPU: graphs need a GPU)";
  return out;
}

void Trainer::load_checkpoint(const std::string& path) {
  const Checkpoint ck = read_checkpoint(path);
  restore_weights(ck, model_);
  if (ck.exp_avg.empty()) return;
  std::vector<torch::Tensor> m, v;
  for (const auto& p : optimizer_->parameters()) {
    m.push_back(torch::zeros_like(p));
    v.push_back(torch::zeros_like(p));
  }
  torch::NoGradGuard no_grad;
  for (const auto& slice : model_->canonical_layout()) {
    const size_t i = parameter_index(*optimizer_, slice.parameter);
    auto a = ck.exp_avg.find(slice.name), b = ck.exp_avg_sq.find(slice.name);
    TORCH_CHECK(a != ck.exp_avg.end() && b != ck.exp_avg_sq.end(), "checkpoint: optimizer state for '", slice.name,
                "' is missing");
    slice.of(m[i]).copy_(a->second);
    slice.of(v[i]).copy_(b->second);
  }
  optimizer_->load_state(m, v, ck.step);
}

void Trainer::save_checkpoint(const std::string& path, bool overwrite) const {
  Checkpoint ck;
  ck.config = config_;
  ck.stage = spec_.name;
  ck.step = optimizer_->step_count();
  ck.weights = model_->canonical_state();
  for (const auto& slice : model_->canonical_layout()) {
    const size_t i = parameter_index(*optimizer_, slice.parameter);
    if (!optimizer_->exp_avg(i).defined()) continue;
    ck.exp_avg[slice.name] = slice.of(optimizer_->exp_avg(i)).detach().to(torch::kCPU).clone();
    ck.exp_avg_sq[slice.name] = slice.of(optimizer_->exp_avg_sq(i)).detach().to(torch::kCPU).clone();
  }
  write_checkpoint(path, ck, overwrite);
}

}  // namespace tt
