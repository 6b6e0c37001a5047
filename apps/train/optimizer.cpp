#include "apps/train/optimizer.h"

#include <ATen/Context.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstdlib>
#include <optional>

#include "apps/train/gradient_ready.h"
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
//
// With options.overlap the update runs during the backward. The parameters split into ranges: one per
// transformer layer, and the rest (embedding, final norm, output head) between them. Before the backward that
// gives the step's gradients, a hook goes on the gradient accumulator of every leaf the forward used (the
// master, or in bf16 runs its compute copy); when the last leaf of a layer has its gradient, the hook starts
// that layer's pass on a second stream, after everything the backward has queued so far, so that it runs
// beside the earlier layers' backward GEMMs. step() joins the second stream and runs what is left.
// Without clipping the pass is the whole update: the step's scalars (adamw_prepare) do not depend on the
// gradients and are prepared on the second stream first. With clipping every update needs the global norm,
// known only after the whole backward: the layers' squared-norm partial sums overlap, and the updates all
// follow the norm, as without overlap. Either way the arithmetic is adamw_step's, bit for bit (the passes of
// kernels/ops/adamw.h). On the CPU there is no second stream: a layer's pass runs inside its hook. Under data
// parallel a layer's pass first waits, on the second stream, for that layer's all-reduce (wait_for_averaging).
class OurAdamW final : public Optimizer {
 public:
  OurAdamW(const Transformer& model, const AdamWOptions& o)
      : Optimizer(model->parameters()),
        copies_(model->compute_copies()),
        hyper_{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.max_grad_norm, o.schedule},
        state_(ops::adamw_state(params_.empty() ? torch::Device(torch::kCPU) : params_.front().device())),
        overlap_(o.overlap) {
    for (const auto& p : params_) {
      const auto moments = p.options().dtype(o.state_dtype);
      exp_avgs_.push_back(torch::zeros_like(p, moments, torch::MemoryFormat::Contiguous));
      exp_avg_sqs_.push_back(torch::zeros_like(p, moments, torch::MemoryFormat::Contiguous));
      torch::Tensor copy;
      for (const auto& c : copies_)
        if (c.master.is_same(p)) copy = c.copy;
      copy_of_.push_back(copy);
    }
    if (overlap_) plan_overlap(model);
  }

  void zero_grad() override {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
    for (auto& c : copies_) c.copy.mutable_grad() = torch::Tensor();
  }

  void before_last_backward() override {
    if (!overlap_) return;
    disarm();
    armed_ = true;
    done_.assign(ranges_.size(), false);
    if (!clipping()) {
      on_side([&] { ops::adamw_prepare(partials_, state_, hyper_); });
      set_carveout(true);
    }
    // One group per layer range (the others run in step()): its masters, and their compute copies.
    std::vector<std::vector<torch::Tensor>> groups(ranges_.size());
    for (size_t r = 0; r < ranges_.size(); ++r) {
      if (!ranges_[r].layer) continue;
      for (size_t i = ranges_[r].begin; i < ranges_[r].end; ++i) {
        groups[r].push_back(params_[i]);
        groups[r].push_back(copy_of_[i]);  // undefined without one: skipped
      }
    }
    ready_.arm(groups, [this, groups](size_t r) {
      on_side([&] {
        if (averaged_) averaged_(groups[r]);  // data parallel: the layer's all-reduce, before the pass reads it
        run_pass(r);
      });
    });
  }

  void step() override {
    torch::NoGradGuard no_grad;
    if (!armed_) {
      ops::adamw_step(param_list(), state_, hyper_);
      return;
    }
    join_side();
    for (size_t r = 0; r < ranges_.size(); ++r)
      if (!done_[r]) run_pass(r);
    if (clipping()) {
      ops::adamw_prepare(partials_, state_, hyper_);
      ops::adamw_update(param_list(), 0, params_.size(), state_, hyper_);
    }
    disarm();
  }

  bool wants_high_priority_step() const override { return side_.has_value() && priority_; }
  bool overlaps_backward() const override { return overlap_; }
  void wait_for_averaging(AveragingWait wait) override {
    TORCH_CHECK(overlap_,
                "OurAdamW: waiting for averaged gradients is the overlap's; this optimizer updates after "
                "the backward");
    averaged_ = std::move(wait);
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
  bool clipping() const { return hyper_.max_grad_norm > 0; }

  // The list adamw_step takes, with the gradients as they are now.
  std::vector<ops::AdamWParam> param_list() const {
    std::vector<ops::AdamWParam> list;
    list.reserve(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& copy = copy_of_[i];
      list.push_back({params_[i], params_[i].grad(), copy, copy.defined() ? copy.grad() : torch::Tensor(),
                      exp_avgs_[i], exp_avg_sqs_[i]});
    }
    return list;
  }

  void plan_overlap(const Transformer& model) {
    std::vector<std::string> names;
    for (const auto& named : model->named_parameters(/*recurse=*/true)) names.push_back(named.key());
    TORCH_CHECK(names.size() == params_.size(), "OurAdamW: the model's parameter list changed");
    ranges_ = layer_ranges(names);
    done_.assign(ranges_.size(), false);
    partials_ = ops::adamw_partials(param_list(), state_);
    if (params_.empty() || params_.front().is_cpu()) return;
    const c10::impl::VirtualGuardImpl impl(params_.front().device().type());
    side_ = impl.getStreamFromGlobalPool(params_.front().device(), /*isHighPriority=*/false);
    sm_carveout_ = knob("TT_ADAMW_OVERLAP_SMS");
    max_blocks_ = knob("TT_ADAMW_OVERLAP_BLOCKS");
    priority_ = knob("TT_ADAMW_OVERLAP_PRIORITY") != 0;
  }

  // Range r's pass on the current stream: its norm partials with clipping, its update without.
  void run_pass(size_t r) {
    torch::NoGradGuard no_grad;
    const auto list = param_list();
    if (clipping()) {
      ops::adamw_norm(list, ranges_[r].begin, ranges_[r].end, partials_);
    } else {
      ops::adamw_update(list, ranges_[r].begin, ranges_[r].end, state_, hyper_, max_blocks_);
    }
    done_[r] = true;
  }

  // fn's kernels on the second stream, after everything queued on the current one (inline on the CPU).
  template <class Fn>
  void on_side(Fn&& fn) {
    if (!side_) return fn();
    const c10::impl::VirtualGuardImpl impl(side_->device_type());
    c10::Event ready(side_->device_type());
    ready.record(impl.getStream(side_->device()));
    ready.block(*side_);
    const c10::StreamGuard on(*side_);
    fn();
  }

  // The current stream waits for everything queued on the second one.
  void join_side() {
    if (!side_) return;
    const c10::impl::VirtualGuardImpl impl(side_->device_type());
    c10::Event done(side_->device_type());
    done.record(*side_);
    done.block(impl.getStream(side_->device()));
  }

  void disarm() {
    set_carveout(false);  // also after a backward that threw
    ready_.disarm();
    armed_ = false;
  }

  // Measurement knobs (docs/training.md), read once: TT_ADAMW_OVERLAP_SMS=N keeps the backward's cuBLAS
  // GEMMs off N SMs while the update runs beside them; TT_ADAMW_OVERLAP_BLOCKS=M caps each overlapped update
  // kernel at M blocks (0 or unset: one block per chunk); TT_ADAMW_OVERLAP_PRIORITY=1 runs a graphed step on a
  // high-priority stream, above the update's (wants_high_priority_step).
  static int64_t knob(const char* name) {
    const char* value = std::getenv(name);
    if (!value || !*value) return 0;
    char* end = nullptr;
    const long long n = std::strtoll(value, &end, 10);
    TORCH_CHECK(*end == '\0' && n >= 0, name, "='", value, "' is not allowed: must be a whole number >= 0");
    return n;
  }

  // The backward's GEMMs leave sm_carveout_ SMs to the update (ATen's cuBLAS SM-count target); disarm()
  // gives them back, after the step or after a backward that threw.
  void set_carveout(bool on) {
    if (sm_carveout_ == 0) return;
    if (on) {
      saved_carveout_ = at::globalContext()._SMCarveout_EXPERIMENTAL();
      at::globalContext()._setSMCarveout_EXPERIMENTAL(static_cast<int32_t>(sm_carveout_));
      carveout_set_ = true;
    } else if (carveout_set_) {
      at::globalContext()._setSMCarveout_EXPERIMENTAL(saved_carveout_);
      carveout_set_ = false;
    }
  }

  std::vector<TransformerImpl::ComputeCopy> copies_;
  std::vector<torch::Tensor> copy_of_;  // per parameter: its compute copy, or undefined
  ops::AdamWHyperparameters hyper_;
  torch::Tensor state_;
  std::vector<torch::Tensor> exp_avgs_, exp_avg_sqs_;
  // Overlap (options.overlap).
  bool overlap_;
  std::vector<ParameterRange> ranges_;  // one per layer, and the runs between layers
  std::vector<bool> done_;               // per range: this step's pass has been launched
  GradientReadyHooks ready_;             // starts a layer's pass when its gradients are final
  AveragingWait averaged_;               // data parallel: waits for a layer's averaged gradients
  torch::Tensor partials_;  // the norm pass's partial sums, written range by range
  std::optional<c10::Stream> side_;
  int64_t max_blocks_ = 0;
  int64_t sm_carveout_ = 0;
  bool priority_ = false;
  std::optional<int32_t> saved_carveout_;
  bool carveout_set_ = false;
  bool armed_ = false;
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
  TORCH_CHECK(!options.overlap || kind == OptimizerKind::kOurAdamW, "the optimizer overlap is ",
              implementation(OptimizerKind::kOurAdamW).name, "'s; the stage chose ", implementation(kind).name,
              ", which updates after the backward");
  TORCH_CHECK(options.state_dtype == torch::kFloat32 || kind == OptimizerKind::kOurAdamW,
              "optimizer moments in ", options.state_dtype, " need ", implementation(OptimizerKind::kOurAdamW).name,
              "; the stage chose ", implementation(kind).name, ", which keeps them in fp32");
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

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    for (const auto& moment : {exp_avg(i), exp_avg_sq(i)})
      if (moment.defined()) bytes += moment.numel() * static_cast<int64_t>(moment.element_size());
  return bytes;
}

void clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  auto norms = at::_foreach_norm(grads, 2);
  auto total = torch::linalg_vector_norm(torch::stack(norms).to(torch::kFloat32), 2, std::nullopt, false, std::nullopt);
  at::_foreach_mul_(grads, clip_factor(total, max_norm));
}

torch::Tensor clip_factor(const torch::Tensor& norm, double max_norm) {
  return (max_norm / (norm + 1e-6)).clamp_max(1.0);
}

}  // namespace tt
