#include "apps/train/optimizer.h"

#include "kernels/ops/adamw.h"

namespace tt {
namespace {

// LibTorch's AdamW: a loop over parameters, about 18 elementwise kernels each per step. The schedule
// sets its one param group's learning rate before each step, as a Python LR scheduler does.
class TorchAdamW final : public Optimizer {
 public:
  TorchAdamW(std::vector<torch::Tensor> params, const AdamWOptions& o)
      : Optimizer(params),
        adamw_(params,
               torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay)),
        options_(o) {}

  void zero_grad() override { adamw_.zero_grad(/*set_to_none=*/true); }
  void step() override {
    if (options_.max_grad_norm > 0) clip_grad_norm(params_, options_.max_grad_norm);
    // The step count is host state here (no sync); read before the step that advances it.
    static_cast<torch::optim::AdamWOptions&>(adamw_.param_groups().front().options())
        .lr(options_.lr_at_step(step_count() + 1));
    adamw_.step();
  }

  torch::Tensor exp_avg(size_t i) const override {
    const auto* s = state(i);
    return s ? s->exp_avg() : torch::Tensor();
  }
  torch::Tensor exp_avg_sq(size_t i) const override {
    const auto* s = state(i);
    return s ? s->exp_avg_sq() : torch::Tensor();
  }
  int64_t step_count() const override {
    const auto* s = params_.empty() ? nullptr : state(0);
    return s ? s->step() : 0;
  }
  void load_state(const std::vector<torch::Tensor>& m, const std::vector<torch::Tensor>& v, int64_t step) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->exp_avg(m[i].to(params_[i].options()).clone());
      s->exp_avg_sq(v[i].to(params_[i].options()).clone());
      s->step(step);
      adamw_.state()[key(i)] = std::move(s);
    }
  }

 private:
  // LibTorch keys optimizer state by the parameter's TensorImpl address.
  void* key(size_t i) const { return params_[i].unsafeGetTensorImpl(); }
  const torch::optim::AdamWParamState* state(size_t i) const {
    const auto& states = adamw_.state();
    auto it = states.find(key(i));
    return it == states.end() ? nullptr : static_cast<const torch::optim::AdamWParamState*>(it->second.get());
  }
  torch::optim::AdamW adamw_;
  AdamWOptions options_;
};

// at::_fused_adamw_: one multi-tensor kernel family for all parameters, state and step counters on the
// device, allocated once up front so a step allocates nothing and never syncs with the host.
class FusedAdamW final : public Optimizer {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, const AdamWOptions& o) : Optimizer(std::move(params)), options_(o) {
    for (const auto& p : params_) {
      exp_avgs_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      exp_avg_sqs_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      // _fused_adamw_ reads fp32 step tensors on the parameter's device.
      steps_.push_back(torch::zeros({}, p.options().dtype(torch::kFloat32)));
    }
  }

  void zero_grad() override {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  }

  void step() override {
    if (options_.max_grad_norm > 0) clip_grad_norm(params_, options_.max_grad_norm);
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    grads.reserve(params_.size());
    for (const auto& p : params_) {
      TORCH_CHECK(p.grad().defined(), "FusedAdamW: a parameter has no gradient; every parameter must receive one");
      grads.push_back(p.grad());
    }
    // _fused_adamw_ reads the step counters but does not advance them.
    at::_foreach_add_(steps_, 1.0);
    // The rate comes from the host's step count: this optimizer's stages run eagerly, never under a graph.
    at::_fused_adamw_(params_, grads, exp_avgs_, exp_avg_sqs_, {}, steps_, options_.lr_at_step(host_steps_ + 1),
                      options_.beta1, options_.beta2, options_.weight_decay, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, std::nullopt, std::nullopt);
    ++host_steps_;
  }

  torch::Tensor exp_avg(size_t i) const override { return exp_avgs_[i]; }
  torch::Tensor exp_avg_sq(size_t i) const override { return exp_avg_sqs_[i]; }
  int64_t step_count() const override { return host_steps_; }
  void load_state(const std::vector<torch::Tensor>& m, const std::vector<torch::Tensor>& v, int64_t step) override {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      exp_avgs_[i].copy_(m[i]);
      exp_avg_sqs_[i].copy_(v[i]);
      steps_[i].fill_(static_cast<double>(step));
    }
    host_steps_ = step;
  }

 private:
  AdamWOptions options_;
  std::vector<torch::Tensor> exp_avgs_, exp_avg_sqs_, steps_;
  int64_t host_steps_ = 0;
};

// tt::ops::adamw_step: our multi-tensor kernel. Moments and the step counter live on the device, so a
// captured graph replays the whole update, clipping included; in bf16 stages with compute copies the same
// pass writes the copies the next forward reads, and the copies' gradients join their masters'.
class OurAdamW final : public Optimizer {
 public:
  OurAdamW(const Transformer& model, const AdamWOptions& o)
      : Optimizer(model->parameters()),
        copies_(model->compute_copies()),
        hyper_{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.max_grad_norm, o.schedule},
        state_(ops::adamw_state(params_.empty() ? torch::Device(torch::kCPU) : params_.front().device())) {
    for (const auto& p : params_) {
      exp_avgs_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
      exp_avg_sqs_.push_back(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
      torch::Tensor copy;
      for (const auto& c : copies_)
        if (c.master.is_same(p)) copy = c.copy;
      copy_of_.push_back(copy);
    }
  }

  void zero_grad() override {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
    for (auto& c : copies_) c.copy.mutable_grad() = torch::Tensor();
  }

  void step() override {
    std::vector<ops::AdamWParam> list;
    list.reserve(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& copy = copy_of_[i];
      list.push_back({params_[i], params_[i].grad(), copy, copy.defined() ? copy.grad() : torch::Tensor(),
                      exp_avgs_[i], exp_avg_sqs_[i]});
    }
    torch::NoGradGuard no_grad;
    ops::adamw_step(list, state_, hyper_);
  }

  torch::Tensor exp_avg(size_t i) const override { return exp_avgs_[i]; }
  torch::Tensor exp_avg_sq(size_t i) const override { return exp_avg_sqs_[i]; }
  // A host sync: the counter lives on the device, advanced by every step (and every graph replay).
  int64_t step_count() const override { return static_cast<int64_t>(state_[ops::kAdamWStep].item<float>()); }
  void load_state(const std::vector<torch::Tensor>& m, const std::vector<torch::Tensor>& v, int64_t step) override {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      exp_avgs_[i].copy_(m[i]);
      exp_avg_sqs_[i].copy_(v[i]);
    }
    state_[ops::kAdamWStep].fill_(static_cast<double>(step));
  }

 private:
  std::vector<TransformerImpl::ComputeCopy> copies_;
  std::vector<torch::Tensor> copy_of_;  // per parameter: its compute copy, or undefined
  ops::AdamWHyperparameters hyper_;
  torch::Tensor state_;
  std::vector<torch::Tensor> exp_avgs_, exp_avg_sqs_;
};

}  // namespace

LrSchedule lr_schedule_of(const TrainConfig& t) {
  LrSchedule s;
  s.kind = t.lr_schedule == "cosine"   ? LrScheduleKind::kCosine
           : t.lr_schedule == "linear" ? LrScheduleKind::kLinear
                                       : LrScheduleKind::kConstant;
  s.peak_lr = t.learning_rate;
  s.min_lr = t.min_lr;
  s.warmup_steps = t.lr_warmup_steps;
  s.total_steps = t.warmup_steps + t.num_steps;
  return s;
}

std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, const Transformer& model, const AdamWOptions& options) {
  TORCH_CHECK(model->compute_copies().empty() || kind == OptimizerKind::kOurAdamW,
              "the model has compute copies, which only ", implementation(OptimizerKind::kOurAdamW).name,
              " writes; the stage chose ", implementation(kind).name);
  switch (kind) {
    case OptimizerKind::kTorchAdamW: return std::make_unique<TorchAdamW>(model->parameters(), options);
    case OptimizerKind::kAtenFusedAdamW: return std::make_unique<FusedAdamW>(model->parameters(), options);
    case OptimizerKind::kOurAdamW: return std::make_unique<OurAdamW>(model, options);
  }
  TORCH_CHECK(false, "unknown optimizer kind ", static_cast<int>(kind));
}

void clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  auto norms = at::_foreach_norm(grads, 2);
  auto total = torch::linalg_vector_norm(torch::stack(norms).to(torch::kFloat32), 2, std::nullopt, false, std::nullopt);
  auto scale = (max_norm / (total + 1e-6)).clamp_max(1.0);
  at::_foreach_mul_(grads, scale);
}

}  // namespace tt
