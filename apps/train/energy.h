// The GPU's energy per training step. On NVIDIA, NVML's total-energy counter (millijoules since the
// driver loaded), with NVML loaded at run time (dlopen of libnvidia-ml.so.1, which the driver installs):
// the build needs no NVML, and a machine without it still runs, with a note instead of a figure. AMD's
// counter (amd-smi's energy count) is not read yet: AMD runs get the note.
//
// The driver refreshes the counter periodically, not at every read (on an H200, a 75 ms window of v4's
// workshop steps read no change at all), so reading it at both ends of a window is off by up to one
// refresh's energy. finish_energy() states a resolution and holds to it: the window must last at least
// kEnergyMinRefreshes refresh periods (the error is then under 1/kEnergyMinRefreshes). Where the measured
// steps are shorter, it keeps training for extra steps, unrecorded, in a window of their own after the
// run's results and checkpoint (apps/train/training_run.cpp), and the figure is J/step over that window.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace tt {

// Refresh periods a window must span: the figure is then within 1/20 = 5 % of the energy used.
constexpr int kEnergyMinRefreshes = 20;
// How long finish_energy waits for the counter to change while it measures the refresh period, and how long
// its extra steps may run at most (a counter that stopped would otherwise keep the run going).
constexpr double kEnergyProbeTimeoutS = 5;
constexpr double kEnergyMaxExtraS = 60;

struct EnergyReading {
  std::optional<double> joules;  // none when the counter could not be read
  std::string source;            // "NVML nvmlDeviceGetTotalEnergyConsumption (<GPU>)" when read
  std::string note;              // why there is no figure; empty when there is one
  int64_t steps = 0;             // the training steps the joules were spent on
  double seconds = 0;            // how long that window lasted
  bool extra_steps = false;      // the window is extra steps after the run, not the measured steps
  std::optional<double> refresh_s;  // the counter's refresh period, where finish_energy measured it
};

// What finish_energy reads: the counter and a clock. EnergyMeter reads NVML and the steady clock; the tests
// use a fake counter that advances in coarse steps.
class EnergyCounter {
 public:
  virtual ~EnergyCounter() = default;
  virtual bool available() const = 0;
  virtual const std::string& note() const = 0;  // why it is unavailable
  virtual std::string source() const = 0;       // what is read, for the result file
  virtual std::optional<unsigned long long> read_mj() = 0;
  virtual double now_s() = 0;
  virtual void sleep_s(double seconds) = 0;
};

// One window's two reads, each taken with the device synchronised.
struct EnergyWindow {
  std::optional<unsigned long long> start_mj, end_mj;
  double start_s = 0, end_s = 0;
};

// Runs n more training steps (n >= 1) and waits for the device; unrecorded.
using ExtraSteps = std::function<void(int64_t n)>;

// The energy figure of a run whose measured window (`steps` steps, `seconds_per_step` each by the median) is
// `measured`. Measures the counter's refresh period; when the measured window spans kEnergyMinRefreshes
// periods, the figure is the measured window's; otherwise it calls extra_steps in rounds, sized from
// seconds_per_step, until a window of its own spans them (at most kEnergyMaxExtraS), and the figure is that
// window's. The caller's device is idle when this is called. Null joules, with the reason in note, only where
// the counter does not exist or does not advance.
EnergyReading finish_energy(EnergyCounter& counter, const EnergyWindow& measured, int64_t steps,
                            double seconds_per_step, const ExtraSteps& extra_steps);

class EnergyMeter final : public EnergyCounter {
 public:
  // Never throws: a missing library, a device without the counter or a CPU run leave the meter
  // unavailable, with the reason in note(). `library` is the NVML shared object to load.
  explicit EnergyMeter(const torch::Device& device, const std::string& library = "libnvidia-ml.so.1");
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  bool available() const override { return nvml_ != nullptr; }
  const std::string& note() const override { return note_; }
  std::string source() const override;
  std::optional<unsigned long long> read_mj() override;
  double now_s() override;
  void sleep_s(double seconds) override;
  // Reads the counter at the start and at the end of a window; the caller synchronises the device first,
  // so that the window holds exactly the work it measures. stop() gives the window's figure (or why there
  // is none) and keeps the reads for finish_energy (window()).
  void start();
  EnergyReading stop();
  const EnergyWindow& window() const { return window_; }

 private:
  struct Nvml;
  std::unique_ptr<Nvml> nvml_;
  std::string note_;
  EnergyWindow window_;
};

}  // namespace tt
