// A stage ready to train: its model (built on the CPU, initialised from the seed so that every stage
// starts from identical weights, then moved to the device, with bf16 compute copies when the stage keeps
// them), its optimizer and the StepRunner that runs its steps (eager, or a CUDA/HIP graph for stages that
// capture one on a GPU). Checkpoints go through here because only this layer knows both the model's
// canonical names and the optimizer's state.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "apps/train/optimizer.h"
#include "apps/train/step.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/stage.h"
#include "models/transformer.h"

namespace tt {

class Trainer {
 public:
  // Throws ConfigError for a graphed stage on a GPU with fewer than kGraphWarmupSteps warm-up steps (the
  // capture happens during the warm-up, so that no measured step contains it).
  // `optimizer`: builds the optimizer instead of the stage's own choice (data parallel's sharded one).
  Trainer(const StageSpec& spec, const RunConfig& config, const torch::Device& device,
          const OptimizerMaker& optimizer = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;  // the runner refers to the model and optimizer held here
  Trainer& operator=(const Trainer&) = delete;

  // One optimisation step through the stage's runner (see StepRunner::step).
  torch::Tensor step(const torch::Tensor& inputs, const torch::Tensor& labels, StepTimer* timer = nullptr) {
    return runner().step(inputs, labels, timer);
  }
  // Forward and backward only, eagerly; gradients stay on the parameters (for the equivalence harness).
  torch::Tensor forward_backward(const torch::Tensor& inputs, const torch::Tensor& labels) {
    return eager_.forward_backward(inputs, labels);
  }

  // Restores weights, optimizer moments and step from a checkpoint; a differing model config throws.
  void load_checkpoint(const std::string& path);
  // Writes weights, optimizer state and step; with run_step >= 0 also what --resume needs: the run's step
  // run_step (its data position) and the CPU generator's state. Refuses an existing file unless overwrite.
  // `origin`: the run id and kind recorded in the file (apps/train/checkpointing.h).
  struct Origin {
    std::string run_id, kind;
  };
  void save_checkpoint(const std::string& path, bool overwrite, int64_t run_step = -1, const Origin& origin = {});
  // What save_checkpoint writes. With a sharded optimizer a collective (the weights and moments are gathered):
  // every rank calls it, or join_checkpoint(), at the same point of the run.
  Checkpoint checkpoint(int64_t run_step = -1, const Origin& origin = {});
  // A rank that writes no checkpoint: takes part in checkpoint()'s collectives, if any, and keeps nothing.
  void join_checkpoint();
  // Continues the run a checkpoint was taken from (check_resumable passed): weights, optimizer state and
  // step (the schedule's position), the CPU generator; a graphed step captures anew after the resume.
  // Returns the run's step to continue with.
  int64_t resume(const Checkpoint& checkpoint);
  // The first step whose timings count when the loop starts at first_step: after the warm-up steps, and
  // for a graphed step after its own eager step and capture (kGraphWarmupSteps), which a resume repeats.
  int64_t first_measured_step(int64_t first_step) const;

  Transformer& model() { return model_; }
  const Transformer& model() const { return model_; }
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  StepRunner& runner() { return replaced_ ? *replaced_ : graphed_ ? static_cast<StepRunner&>(*graphed_) : eager_; }
  const StepRunner& runner() const {
    return replaced_ ? *replaced_ : graphed_ ? static_cast<const StepRunner&>(*graphed_) : eager_;
  }
  // Steps run through `runner` from now on (data parallel: apps/train/distributed.h), built on this
  // trainer's model and optimizer.
  void use_runner(std::unique_ptr<StepRunner> runner) { replaced_ = std::move(runner); }
  // How this trainer's steps run, for result files (the stage's choice, and why it was not taken).
  std::string step_description() const;
  // Whether this trainer's steps are captured as a graph (the stage's own, or the runner's that replaced it).
  bool graphed() const { return runner().captures_graph(); }
  const StageSpec& spec() const { return spec_; }
  const RunConfig& config() const { return config_; }
  const torch::Device& device() const { return device_; }
  Precision precision() const { return config_.training.dtype; }

 private:
  StageSpec spec_;
  RunConfig config_;
  torch::Device device_;
  Transformer model_{nullptr};
  std::unique_ptr<Optimizer> optimizer_;
  EagerStep eager_;
  std::unique_ptr<StepRunner> graphed_;  // null: steps run eagerly
  std::unique_ptr<StepRunner> replaced_;  // set by use_runner
};

// Warm-up steps a graphed run needs: at least one eager step on the capture stream, then the capture.
constexpr int64_t kGraphWarmupSteps = 2;
// Throws ConfigError when a run whose step is captured as a graph has fewer warm-up steps than the capture
// needs (it happens during the warm-up, so that no measured step contains it). The one place this is decided.
void require_graph_warmup(const StageSpec& spec, const TrainConfig& training);

// The first step whose timings count in a run that starts at first_step (see Trainer::first_measured_step).
int64_t first_measured_step(const TrainConfig& training, int64_t first_step, bool graphed);

// The training fields a resume may change: they end or report the run, not what each step computes.
// (Output paths and logging flags are not config fields; they may change too.)
const std::vector<std::string>& resumable_changes();

// Throws ConfigError, naming the file and every field that differs, unless the checkpoint at `path` can
// continue this run: written with run state (by a run of this version), by stage `stage`, with the same
// model and training config except resumable_changes(), and with steps left (at least one measured: a
// graphed step needs kGraphWarmupSteps more). `graphed` says whether this run's step will be a graph.
void check_resumable(const Checkpoint& checkpoint, const std::string& path, const std::string& stage,
                     const RunConfig& config, bool graphed);

}  // namespace tt
