#include "apps/train/trainer.h"

#include "models/checkpoint.h"

namespace tt {
namespace {

Transformer build_model(const StageSpec& spec, const RunConfig& config, const torch::Device& device) {
  validate(config);
  Transformer model(config.model, spec);
  model->init_weights(static_cast<uint64_t>(config.training.seed));
  model->to(device);
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
      optimizer_(make_optimizer(spec.optimizer, model_->parameters(), AdamWOptions::from(config.training))),
      eager_(model_, *optimizer_, config.training.dtype, config.training.grad_clip),
      runner_(&eager_) {}

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
