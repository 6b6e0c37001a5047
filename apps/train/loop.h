// The one training loop every stage runs, and the recorder that measures it. The loop draws each batch
// into the fixed device buffers, asks the StepRunner for the step and hands the loss to the recorder; it
// knows nothing about how a step runs. The recorder takes device-event timings, caching-allocator peaks
// and the loss of every step, and prints the progress lines. What comes out is a RunRecord: numbers only;
// turning them into a result file is the reporting layer's job (apps/report/).
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "apps/train/data.h"
#include "apps/train/device.h"
#include "apps/train/energy.h"
#include "apps/train/step.h"
#include "models/config.h"

namespace tt {

// What one run measured.
struct RunRecord {
  std::vector<double> losses;  // every step, warm-up included (NaN/inf kept as they are)
  // Per measured step, milliseconds. The phase lists stay empty when the runner cannot time phases.
  std::vector<double> step_ms, forward_ms, backward_ms, optimizer_ms;
  // The same marks by the host clock, without a device sync (StepTimer::host_elapsed_ms): what a timer
  // around asynchronous launches sees. Equal to the lists above on the CPU.
  std::vector<double> host_step_ms, host_forward_ms, host_backward_ms, host_optimizer_ms;
  EnergyReading energy;  // the GPU's energy over the measured steps, or a note why there is none
  EnergyWindow energy_window;  // its counter reads, for finish_energy (energy.h) after the run
  std::vector<double> peak_allocated_mb, peak_reserved_mb;  // per measured step; zeros on the CPU
  double device_used_mb = 0;  // the driver's figure after the measured steps (total - free); 0 on the CPU
  int64_t first_step = 0;     // steps done before this run (a resume); losses start at this step
  int64_t steps_done = 0;     // steps done when the loop ended, first_step included
  bool interrupted = false;   // a stop was requested (a signal) and the loop ended after steps_done
};

// Timings, memory and progress lines of one run.
class Recorder {
 public:
  // Steps first_step .. warmup + num_steps - 1 run; those from measure_from on are measured.
  Recorder(const TrainConfig& training, const torch::Device& device, bool phases, std::ostream& log,
           int64_t first_step = 0, int64_t measure_from = -1);
  // Before step `index` (0-based, warm-up included): resets the memory peak; returns the timer the runner
  // marks for a measured step, nullptr for a warm-up step. Before the first measured step it waits for the
  // device (the warm-up's work must not count) and reads the energy counter.
  StepTimer* begin_step(int64_t index);
  // After the step: keeps the loss on the device, reads the memory peak, prints the progress line when
  // one is due (its loss read is the loop's only host sync).
  void end_step(int64_t index, const torch::Tensor& loss);
  // Waits for the device and reads every timer and the losses of steps first_step .. steps_done - 1.
  RunRecord finish(int64_t steps_done);

 private:
  const TrainConfig& training_;
  torch::Device device_;
  bool phases_;
  std::ostream& log_;
  int64_t total_, first_, measure_from_;
  int64_t tokens_per_step_;  // batch_size x seq_len x grad_accum_steps
  torch::Tensor losses_;  // [total] on the device
  std::vector<StepTimer> timers_;
  EnergyMeter energy_;
  RunRecord record_;
};

// Called between steps with the number of steps done (warm-up included), after the step's timer marks,
// memory reading and progress line and before the next step starts: work here stays outside every
// measurement (held-out evaluation, say).
using BetweenSteps = std::function<void(int64_t steps_done)>;

// Where a run starts and what may end it early.
struct LoopControl {
  int64_t first_step = 0;     // steps done before (a resume): the loop continues with this step
  int64_t measure_from = -1;  // first measured step; -1: training.warmup_steps
  // Asked after each step, after between_steps: true ends the loop there (a signal; data parallel: every
  // rank's answer must be the same at the same step).
  std::function<bool()> stop_requested;
};

// Runs warm-up plus measured steps on `batches`, recording with a Recorder, and returns the record.
RunRecord train_loop(StepRunner& runner, Batches& batches, const TrainConfig& training, const torch::Device& device,
                     std::ostream& log, const BetweenSteps& between_steps = {}, const LoopControl& control = {});

}  // namespace tt
