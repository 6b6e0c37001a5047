#include "apps/train/energy.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <thread>

#if defined(TT_BACKEND_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "apps/train/device.h"

namespace tt {

// The few NVML entry points used, declared here with NVML's C types (nvml.h is not needed to build).
struct EnergyMeter::Nvml {
  using Return = int;    // nvmlReturn_t; 0 = NVML_SUCCESS
  using Device = void*;  // nvmlDevice_t
  void* library = nullptr;
  Return (*init)() = nullptr;
  Return (*shutdown)() = nullptr;
  Return (*by_pci_bus_id)(const char*, Device*) = nullptr;
  Return (*count)(unsigned*) = nullptr;             // optional: the one-GPU fallback below
  Return (*by_index)(unsigned, Device*) = nullptr;  // optional
  Return (*total_energy)(Device, unsigned long long*) = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Device device = nullptr;
  std::string name;

  std::string error(Return r) const { return error_string ? error_string(r) : "NVML error " + std::to_string(r); }
  ~Nvml() {
    if (shutdown) shutdown();
    if (library) dlclose(library);
  }
};

namespace {

template <class Fn>
bool load_symbol(void* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  return fn != nullptr;
}

}  // namespace

EnergyMeter::EnergyMeter(const torch::Device& device, const std::string& library) {
  if (!device.is_cuda()) {
    note_ = "energy not measured: the run is on the CPU (the counter is the GPU's)";
    return;
  }
#if defined(TT_BACKEND_HIP)
  (void)library;
  note_ = "energy not measured: reading AMD's energy counter (amd-smi) is not implemented yet";
#else
  auto nvml = std::make_unique<Nvml>();
  nvml->library = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!nvml->library) {
    const char* why = dlerror();
    note_ = "energy not measured: NVML could not be loaded (" + library + ": " + (why ? why : "not found") + ")";
    return;
  }
  Nvml::Return (*get_name)(Nvml::Device, char*, unsigned) = nullptr;
  if (!load_symbol(nvml->library, "nvmlInit_v2", nvml->init) ||
      !load_symbol(nvml->library, "nvmlShutdown", nvml->shutdown) ||
      !load_symbol(nvml->library, "nvmlDeviceGetHandleByPciBusId_v2", nvml->by_pci_bus_id) ||
      !load_symbol(nvml->library, "nvmlDeviceGetTotalEnergyConsumption", nvml->total_energy) ||
      !load_symbol(nvml->library, "nvmlDeviceGetName", get_name)) {
    nvml->shutdown = nullptr;
    note_ = "energy not measured: " + library + " lacks an NVML entry point this reader needs";
    return;
  }
  load_symbol(nvml->library, "nvmlErrorString", nvml->error_string);
  load_symbol(nvml->library, "nvmlDeviceGetCount_v2", nvml->count);
  load_symbol(nvml->library, "nvmlDeviceGetHandleByIndex_v2", nvml->by_index);
  if (const auto r = nvml->init(); r != 0) {
    nvml->shutdown = nullptr;
    note_ = "energy not measured: nvmlInit failed: " + nvml->error(r);
    return;
  }
#if defined(TT_BACKEND_CUDA)
  // The PCI bus id names the same GPU for CUDA and NVML, whatever CUDA_VISIBLE_DEVICES and the device
  // order do to the indices.
  std::array<char, 32> bus_id{};
  if (cudaDeviceGetPCIBusId(bus_id.data(), static_cast<int>(bus_id.size()), index_of(device)) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the next kernel launch's check
    note_ = "energy not measured: the CUDA runtime did not give the GPU's PCI bus id";
    return;
  }
  if (const auto r = nvml->by_pci_bus_id(bus_id.data(), &nvml->device); r != 0) {
    // Where NVML sees exactly one GPU, it is this one, whatever it makes of the bus id.
    unsigned gpus = 0;
    if (!nvml->count || !nvml->by_index || nvml->count(&gpus) != 0 || gpus != 1 ||
        nvml->by_index(0, &nvml->device) != 0) {
      note_ = "energy not measured: NVML does not know the GPU at PCI bus id " + std::string(bus_id.data()) + ": " +
              nvml->error(r);
      return;
    }
  }
#else
  note_ = "energy not measured: this build has no GPU backend to name the GPU to NVML";
  return;
#endif
  std::array<char, 96> name{};
  if (get_name(nvml->device, name.data(), static_cast<unsigned>(name.size())) == 0) nvml->name = name.data();
  unsigned long long probe = 0;
  if (const auto r = nvml->total_energy(nvml->device, &probe); r != 0) {
    note_ = "energy not measured: the GPU's total-energy counter cannot be read (" + nvml->error(r) +
            "; it needs a Volta or newer GPU, and a GPU partition (MIG) has none of its own)";
    return;
  }
  nvml_ = std::move(nvml);
#endif
}

EnergyMeter::~EnergyMeter() = default;

std::string EnergyMeter::source() const {
  return nvml_ ? "NVML nvmlDeviceGetTotalEnergyConsumption (" + nvml_->name + ")" : std::string();
}

std::optional<unsigned long long> EnergyMeter::read_mj() {
  unsigned long long mj = 0;
  if (!nvml_ || nvml_->total_energy(nvml_->device, &mj) != 0) return std::nullopt;
  return mj;
}

double EnergyMeter::now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void EnergyMeter::sleep_s(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

void EnergyMeter::start() {
  window_ = {};
  window_.start_mj = read_mj();
  window_.start_s = now_s();
}

namespace {

EnergyReading no_figure(std::string note) {
  EnergyReading r;
  r.note = std::move(note);
  return r;
}

}  // namespace

EnergyReading EnergyMeter::stop() {
  if (!nvml_) return no_figure(note_);
  window_.end_mj = read_mj();
  window_.end_s = now_s();
  if (!window_.end_mj || !window_.start_mj)
    return no_figure(std::string("energy not measured: reading NVML's total-energy counter failed ") +
                     (window_.start_mj ? "at the end of the window" : "at the start of the window"));
  // A window shorter than the driver's refresh can read no change at all, which is no measurement (0 J/step
  // and infinite tokens per joule would be wrong); finish_energy extends such a window.
  if (*window_.end_mj <= *window_.start_mj)
    return no_figure(
        "energy not measured: NVML's total-energy counter did not advance over the measured steps (a window "
        "shorter than the driver's refresh)");
  EnergyReading r;
  r.joules = static_cast<double>(*window_.end_mj - *window_.start_mj) / 1000.0;
  r.source = source() + ", read before the first and after the last measured step with the device synchronised";
  r.seconds = window_.end_s - window_.start_s;
  return r;
}

namespace {

// The counter's refresh period: poll it until it has changed three times and take the mean of the two
// intervals between the changes (the first change only marks a refresh to start from). None when it does
// not change within kEnergyProbeTimeoutS.
std::optional<double> refresh_period_s(EnergyCounter& counter) {
  constexpr double kPoll = 0.001;
  const double give_up = counter.now_s() + kEnergyProbeTimeoutS;
  std::optional<unsigned long long> last = counter.read_mj();
  std::vector<double> changes;
  while (changes.size() < 3 && counter.now_s() < give_up) {
    counter.sleep_s(kPoll);
    const auto mj = counter.read_mj();
    if (!mj) return std::nullopt;
    if (last && *mj != *last) changes.push_back(counter.now_s());
    last = mj;
  }
  if (changes.size() < 3) return std::nullopt;
  return (changes[2] - changes[0]) / 2;
}

}  // namespace

EnergyReading finish_energy(EnergyCounter& counter, const EnergyWindow& measured, int64_t steps,
                            double seconds_per_step, const ExtraSteps& extra_steps) {
  EnergyReading r;
  if (!counter.available()) {
    r.note = counter.note();
    return r;
  }
  const std::optional<double> period = refresh_period_s(counter);
  if (!period) {
    r.note = "energy not measured: NVML's total-energy counter did not change three times in " +
             std::to_string(static_cast<int>(kEnergyProbeTimeoutS)) + " s, so its refresh period is unknown";
    return r;
  }
  r.refresh_s = period;
  const double needed_s = kEnergyMinRefreshes * *period;
  const std::string resolution = "the window spans at least " + std::to_string(kEnergyMinRefreshes) +
                                 " refreshes of the counter (one every " + std::to_string(std::lround(*period * 1e3)) +
                                 " ms, measured), so reading it at the window's ends is off by under " +
                                 std::to_string(100 / kEnergyMinRefreshes) + " %";
  if (measured.start_mj && measured.end_mj && *measured.end_mj > *measured.start_mj &&
      measured.end_s - measured.start_s >= needed_s) {
    r.joules = static_cast<double>(*measured.end_mj - *measured.start_mj) / 1000.0;
    r.steps = steps;
    r.seconds = measured.end_s - measured.start_s;
    r.source = counter.source() + " over the measured steps, read with the device synchronised; " + resolution;
    return r;
  }
  // Extra steps, in rounds sized from the measured step time (10 % more, since a round's end is only
  // checked after it), until their own window is long enough.
  const auto start_mj = counter.read_mj();
  const double start_s = counter.now_s();
  if (!start_mj) {
    r.note = "energy not measured: reading NVML's total-energy counter failed before the extra steps";
    return r;
  }
  int64_t done = 0;
  std::optional<unsigned long long> end_mj = start_mj;
  double elapsed = 0;
  while ((elapsed < needed_s || !end_mj || *end_mj <= *start_mj) && elapsed < kEnergyMaxExtraS) {
    const double left = std::max(needed_s - elapsed, *period);
    const double per_step = done > 0 ? elapsed / static_cast<double>(done) : std::max(seconds_per_step, 1e-6);
    const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(1.1 * left / per_step)));
    extra_steps(n);
    done += n;
    end_mj = counter.read_mj();
    elapsed = counter.now_s() - start_s;
  }
  r.steps = done;
  r.seconds = elapsed;
  r.extra_steps = true;
  if (!end_mj || *end_mj <= *start_mj || elapsed < needed_s) {
    r.note = "energy not measured: NVML's total-energy counter did not advance enough over " + std::to_string(done) +
             " extra steps in " + std::to_string(static_cast<int>(elapsed)) + " s";
    return r;
  }
  r.joules = static_cast<double>(*end_mj - *start_mj) / 1000.0;
  r.source = counter.source() + " over " + std::to_string(done) +
             " extra training steps after the run (the measured steps were shorter than the counter's resolution "
             "needs; the extra steps are in no other figure, the result's losses or the checkpoint), read with the "
             "device synchronised; " + resolution;
  return r;
}

}  // namespace tt
