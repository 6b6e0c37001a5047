// The GPU's energy over the measured steps. On NVIDIA, NVML's total-energy counter (millijoules since the
// driver loaded), with NVML loaded at run time (dlopen of libnvidia-ml.so.1, which the driver installs):
// the build needs no NVML, and a machine without it still runs, with a note instead of a figure. AMD's
// counter (amd-smi's energy count) is not read yet: AMD runs get the note.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

namespace tt {

struct EnergyReading {
  std::optional<double> joules;  // none when the counter could not be read
  std::string source;            // "NVML nvmlDeviceGetTotalEnergyConsumption (<GPU>)" when read
  std::string note;              // why there is no figure; empty when there is one
};

class EnergyMeter {
 public:
  // Never throws: a missing library, a device without the counter or a CPU run leave the meter
  // unavailable, with the reason in note(). `library` is the NVML shared object to load.
  explicit EnergyMeter(const torch::Device& device, const std::string& library = "libnvidia-ml.so.1");
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  bool available() const { return nvml_ != nullptr; }
  const std::string& note() const { return note_; }
  // Reads the counter at the start and at the end of a window; the caller synchronises the device first,
  // so that the window holds exactly the work it measures.
  void start();
  EnergyReading stop();

 private:
  struct Nvml;
  std::unique_ptr<Nvml> nvml_;
  std::string note_;
  std::optional<unsigned long long> start_mj_;
};

}  // namespace tt
