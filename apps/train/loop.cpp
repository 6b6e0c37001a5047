#include "apps/train/loop.h"

#include <algorithm>
#include <ostream>

#include "apps/results/text.h"

namespace tt {

Recorder::Recorder(const TrainConfig& training, const torch::Device& device, bool phases, std::ostream& log,
                   int64_t first_step, int64_t measure_from)
    : training_(training),
      device_(device),
      phases_(phases),
      log_(log),
      total_(training.warmup_steps + training.num_steps),
      first_(first_step),
      measure_from_(measure_from < 0 ? training.warmup_steps : measure_from),
      tokens_per_step_(training.tokens_per_step()),
      losses_(torch::zeros({total_}, torch::TensorOptions().dtype(torch::kFloat32).device(device))),
      energy_(device) {
  // Timers are kept by pointer while their step runs: no reallocation.
  timers_.reserve(static_cast<size_t>(std::max<int64_t>(0, total_ - measure_from_)));
}

StepTimer* Recorder::begin_step(int64_t index) {
  reset_peak_memory(device_);
  if (index < measure_from_) return nullptr;
  if (index == measure_from_ && energy_.available()) {
    synchronize(device_);
    energy_.start();
  }
  timers_.emplace_back(device_, kStepMarks);
  return &timers_.back();
}

void Recorder::end_step(int64_t index, const torch::Tensor& loss) {
  const bool measured = index >= measure_from_;
  losses_[index].copy_(loss, /*non_blocking=*/true);
  if (measured) {
    const auto mem = peak_memory(device_);
    record_.peak_allocated_mb.push_back(static_cast<double>(mem.peak_allocated_bytes) / (1 << 20));
    record_.peak_reserved_mb.push_back(static_cast<double>(mem.peak_reserved_bytes) / (1 << 20));
  }
  const bool last = index + 1 == total_;
  if (training_.log_every <= 0 || ((index + 1) % training_.log_every != 0 && !last)) return;
  // The loop's only host sync: the progress line needs the loss.
  const double loss_value = loss.item<double>();
  std::string timing = "warm-up";
  if (measured) {
    const double ms = timers_.back().elapsed_ms(kStepStart, kStepEnd);
    const double tokens = static_cast<double>(tokens_per_step_);
    const double samples = static_cast<double>(training_.rows_per_step());
    timing = strprintf("%.2f ms | %.1f samples/s | %.0f tokens/s", ms, 1000.0 * samples / ms, 1000.0 * tokens / ms) +
             (device_.is_cuda() ? strprintf(" | peak %.0f MB", record_.peak_allocated_mb.back()) : "");
  }
  log_ << "  step " << (index + 1) << "/" << total_ << " | loss " << strprintf("%.4f", loss_value) << " | " << timing
       << std::endl;
}

RunRecord Recorder::finish(int64_t steps_done) {
  synchronize(device_);
  record_.first_step = first_;
  record_.steps_done = steps_done;
  record_.energy = energy_.stop();
  record_.energy_window = energy_.window();
  for (auto& timer : timers_) {
    record_.step_ms.push_back(timer.elapsed_ms(kStepStart, kStepEnd));
    record_.host_step_ms.push_back(timer.host_elapsed_ms(kStepStart, kStepEnd));
    if (!phases_) continue;
    record_.forward_ms.push_back(timer.elapsed_ms(kStepStart, kAfterForward));
    record_.backward_ms.push_back(timer.elapsed_ms(kAfterForward, kAfterBackward));
    record_.optimizer_ms.push_back(timer.elapsed_ms(kAfterBackward, kStepEnd));
    record_.host_forward_ms.push_back(timer.host_elapsed_ms(kStepStart, kAfterForward));
    record_.host_backward_ms.push_back(timer.host_elapsed_ms(kAfterForward, kAfterBackward));
    record_.host_optimizer_ms.push_back(timer.host_elapsed_ms(kAfterBackward, kStepEnd));
  }
  record_.device_used_mb = static_cast<double>(device_memory_in_use(device_)) / (1 << 20);
  auto losses = losses_.narrow(0, first_, steps_done - first_).to(torch::kCPU, torch::kFloat64).contiguous();
  record_.losses.assign(losses.data_ptr<double>(), losses.data_ptr<double>() + losses.numel());
  return record_;
}

RunRecord train_loop(StepRunner& runner, Batches& batches, const TrainConfig& training, const torch::Device& device,
                     std::ostream& log, const BetweenSteps& between_steps, const LoopControl& control) {
  Recorder recorder(training, device, runner.times_phases(), log, control.first_step, control.measure_from);
  const int64_t total = training.warmup_steps + training.num_steps;
  int64_t done = control.first_step;
  bool stopped = false;
  while (done < total && !stopped) {
    batches.next();
    StepTimer* timer = recorder.begin_step(done);
    recorder.end_step(done, runner.step(batches.inputs(), batches.labels(), timer));
    ++done;
    if (between_steps) between_steps(done);
    // Also after the last step, so that every rank of a data-parallel run takes part in the same votes.
    stopped = control.stop_requested && control.stop_requested();
  }
  RunRecord record = recorder.finish(done);
  record.interrupted = stopped && done < total;  // a stop asked during the last step ends nothing early
  return record;
}

}  // namespace tt
