#include "apps/train/trainer.h"

#include <algorithm>
#include <functional>

#include "apps/train/graph_step.h"
#include "apps/train/stop_signal.h"
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
  model->set_precision(config.training.dtype);
  if (spec.compute_copies && config.training.dtype == Precision::kBf16)
    model->enable_compute_copies(compute_dtype(config.training.dtype));
  return model;
}

size_t parameter_index(const Optimizer& optimizer, const torch::Tensor& parameter) {
  const auto& params = optimizer.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) return i;
  TORCH_CHECK(false, "checkpoint: a model parameter is not managed by the optimizer");
}

}  // namespace

Trainer::Trainer(const StageSpec& spec, const RunConfig& config, const torch::Device& device,
                 const OptimizerMaker& optimizer)
    : spec_(spec),
      config_(config),
      device_(device),
      model_(build_model(spec, config, device)),
      optimizer_(optimizer ? optimizer(model_, AdamWOptions::from(config.training))
                           : make_optimizer(spec.optimizer, model_, AdamWOptions::from(config.training))),
      eager_(model_, *optimizer_, config.training.grad_accum_steps) {
  set_allow_tf32(config.training.allow_tf32);
  if (spec.step != StepKind::kGraph || !device.is_cuda()) return;
  // A replay repeats the captured kernel arguments: an optimizer that counts steps on the host (for bias
  // correction, or for checkpoints) would freeze its count at the capture.
  TORCH_CHECK(spec.optimizer == OptimizerKind::kOurAdamW, "stage ", spec.name,
              " captures its step as a graph, which needs an optimizer that counts its steps on the device (",
              implementation(OptimizerKind::kOurAdamW).name, "); it chose ", implementation(spec.optimizer).name);
  require_graph_warmup(spec, config.training);
  // The last warm-up step captures, so no measured step contains the capture.
  graphed_ =
      std::make_unique<GraphedStep>(eager_, config.training.warmup_steps - 1, optimizer_->wants_high_priority_step());
}

Trainer::~Trainer() = default;

void require_graph_warmup(const StageSpec& spec, const TrainConfig& training) {
  if (training.warmup_steps < kGraphWarmupSteps)
    throw ConfigError("config: field \"training.warmup_steps\" = " + std::to_string(training.warmup_steps) +
                      " is not allowed for " + spec.name + ", which captures its step as a graph during the " +
                      "warm-up: it needs at least " + std::to_string(kGraphWarmupSteps) + " (or run it with --no-graph)");
}

std::string Trainer::step_description() const {
  std::string out = runner().describe();
  if (spec_.step == StepKind::kGraph && !graphed_) out += " (this run is on the CPU: graphs need a GPU)";
  return out;
}

namespace {

// Weights, optimizer moments and step from a checkpoint into a trainer's model and optimizer.
void restore_training_state(const Checkpoint& ck, Transformer& model, Optimizer& optimizer) {
  restore_weights(ck, model);
  if (ck.exp_avg.empty()) return;
  std::vector<torch::Tensor> m, v;  // on the CPU: a sharded optimizer keeps only its slices on the device
  for (const auto& p : optimizer.parameters()) {
    m.push_back(torch::zeros_like(p, torch::TensorOptions().device(torch::kCPU)));
    v.push_back(torch::zeros_like(p, torch::TensorOptions().device(torch::kCPU)));
  }
  torch::NoGradGuard no_grad;
  for (const auto& slice : model->canonical_layout()) {
    const size_t i = parameter_index(optimizer, slice.parameter);
    auto a = ck.exp_avg.find(slice.name), b = ck.exp_avg_sq.find(slice.name);
    TORCH_CHECK(a != ck.exp_avg.end() && b != ck.exp_avg_sq.end(), "checkpoint: optimizer state for '", slice.name,
                "' is missing");
    slice.of(m[i]).copy_(a->second);
    slice.of(v[i]).copy_(b->second);
  }
  optimizer.load_state(m, v, ck.step);
}

}  // namespace

void Trainer::load_checkpoint(const std::string& path) {
  restore_training_state(read_checkpoint(path), model_, *optimizer_);
}

int64_t first_measured_step(const TrainConfig& training, int64_t first_step, bool graphed) {
  return std::max(training.warmup_steps, first_step + (graphed ? kGraphWarmupSteps : 0));
}

int64_t Trainer::first_measured_step(int64_t first_step) const {
  return tt::first_measured_step(config_.training, first_step, graphed());
}

int64_t Trainer::resume(const Checkpoint& ck) {
  TORCH_CHECK(ck.run_step >= 0 && ck.cpu_rng_state.defined(), "Trainer::resume: the checkpoint has no run state");
  restore_training_state(ck, model_, *optimizer_);
  auto generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(ck.cpu_rng_state);
  // The graph is captured anew: an eager step on the capture stream, then the capture, both unmeasured.
  if (graphed_)
    graphed_ = std::make_unique<GraphedStep>(eager_, first_measured_step(ck.run_step) - ck.run_step - 1,
                                             optimizer_->wants_high_priority_step());
  return ck.run_step;
}

const std::vector<std::string>& resumable_changes() {
  // The overlap changes when the update runs, not what it computes (bitwise): a resume may switch it.
  // Sharding (ZeRO-1) changes where the optimizer state lives; checkpoints hold it whole either way.
  static const std::vector<std::string> fields = {"training.num_steps", "training.log_every",
                                                  "training.optimizer_overlap", "training.shard_optimizer"};
  return fields;
}

void check_resumable(const Checkpoint& ck, const std::string& path, const std::string& stage, const RunConfig& config,
                     bool graphed) {
  const std::string file = "--resume: checkpoint '" + path + "'";
  if (ck.run_step < 0 || !ck.cpu_rng_state.defined())
    throw ConfigError(file + " has no run state (\"" + kRunStepKey + "\", \"" + kCpuRngKey +
                      "\"): it was written before resume existed; continue from its weights with --load-checkpoint");
  std::string diff;
  if (ck.stage != stage) diff += "\n  stage: checkpoint has \"" + ck.stage + "\", this run is \"" + stage + "\"";
  auto compare = [&](const std::string& section, const nlohmann::json& theirs, const nlohmann::json& mine) {
    for (const auto& [key, value] : mine.items()) {
      const std::string field = section + "." + key;
      const auto& other = theirs.contains(key) ? theirs.at(key) : nlohmann::json(nullptr);
      const auto& allowed = resumable_changes();
      if (other != value && std::find(allowed.begin(), allowed.end(), field) == allowed.end())
        diff += "\n  " + field + ": checkpoint has " + other.dump() + ", this run has " + value.dump();
    }
  };
  compare("model", to_json(ck.config.model), to_json(config.model));
  compare("training", to_json(ck.config.training), to_json(config.training));
  if (!diff.empty()) {
    std::string allowed;
    for (const auto& f : resumable_changes()) allowed += (allowed.empty() ? "" : ", ") + f;
    throw ConfigError(file + " is of another run; these fields differ:" + diff + "\nA resume may change only " +
                      allowed + " (and output paths and logging flags)");
  }
  const TrainConfig& t = config.training;
  const int64_t total = t.warmup_steps + t.num_steps;
  const int64_t measure_from = first_measured_step(t, ck.run_step, graphed);
  if (measure_from >= total)
    throw ConfigError(file + " is at step " + std::to_string(ck.run_step) + " of a run of " + std::to_string(total) +
                      " steps (training.warmup_steps " + std::to_string(t.warmup_steps) + " + num_steps " +
                      std::to_string(t.num_steps) + "): nothing is left to measure" +
                      (graphed ? " (a graphed step first runs " + std::to_string(kGraphWarmupSteps) +
                                     " unmeasured steps to capture again)"
                               : "") +
                      "; raise --num-steps to continue training");
}

namespace {
// Each parameter's moments, whole, handed to `use` one parameter at a time in the optimizer's order (a sharded
// optimizer gathers them: one parameter's at a time, so that a checkpoint never holds all of them on the GPU).
void for_each_moment(const Optimizer& optimizer,
                     const std::function<void(size_t, const torch::Tensor&, const torch::Tensor&)>& use) {
  for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
    const torch::Tensor m = optimizer.exp_avg(i);  // in this order on every rank: each may be a collective
    const torch::Tensor v = optimizer.exp_avg_sq(i);
    use(i, m, v);
  }
}
}  // namespace

Checkpoint Trainer::checkpoint(int64_t run_step, const Origin& origin) {
  Checkpoint ck;
  ck.run_id = origin.run_id;
  ck.kind = origin.kind;
  ck.config = config_;
  ck.stage = spec_.name;
  ck.step = optimizer_->step_count();
  ck.run_step = run_step;
  if (run_step >= 0) ck.cpu_rng_state = at::detail::getDefaultCPUGenerator().get_state();
  optimizer_->gather_weights();
  ck.weights = model_->canonical_state();
  const auto layout = model_->canonical_layout();
  std::vector<size_t> index;  // per slice of the layout: its parameter's in the optimizer
  for (const auto& slice : layout) index.push_back(parameter_index(*optimizer_, slice.parameter));
  for_each_moment(*optimizer_, [&](size_t i, const torch::Tensor& m, const torch::Tensor& v) {
    if (!m.defined()) return;
    for (size_t s = 0; s < layout.size(); ++s) {
      if (index[s] != i) continue;
      ck.exp_avg[layout[s].name] = layout[s].of(m).detach().to(torch::kCPU).clone();
      ck.exp_avg_sq[layout[s].name] = layout[s].of(v).detach().to(torch::kCPU).clone();
    }
  });
  return ck;
}

void Trainer::join_checkpoint() {
  if (!optimizer_->sharded()) return;  // no collectives to join
  optimizer_->gather_weights();
  for_each_moment(*optimizer_, [](size_t, const torch::Tensor&, const torch::Tensor&) {});
}

void Trainer::save_checkpoint(const std::string& path, bool overwrite, int64_t run_step, const Origin& origin) {
  const Checkpoint ck = checkpoint(run_step, origin);
  // A second signal during the write ends the process at once: it removes the temporary file first.
  const PendingFile pending(checkpoint_temp_path(path));
  write_checkpoint(path, ck, overwrite);
}

}  // namespace tt
