#include "apps/train/energy.h"

#include <dlfcn.h>

#include <array>

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

void EnergyMeter::start() {
  start_mj_.reset();
  unsigned long long mj = 0;
  if (nvml_ && nvml_->total_energy(nvml_->device, &mj) == 0) start_mj_ = mj;
}

EnergyReading EnergyMeter::stop() {
  if (!nvml_) return {std::nullopt, "", note_};
  unsigned long long mj = 0;
  if (const auto r = nvml_->total_energy(nvml_->device, &mj); r != 0 || !start_mj_)
    return {std::nullopt, "",
            "energy not measured: reading NVML's total-energy counter failed" +
                (r != 0 ? ": " + nvml_->error(r) : std::string(" at the start of the window"))};
  // The driver refreshes the counter periodically, not at every read: a window shorter than that can read
  // no change at all, which is no measurement (0 J/step and infinite tokens per joule would be wrong).
  if (mj <= *start_mj_)
    return {std::nullopt, "",
            "energy not measured: NVML's total-energy counter did not advance over the measured steps (a window "
            "shorter than the driver's refresh: measure more steps)"};
  return {static_cast<double>(mj - *start_mj_) / 1000.0,
          "NVML nvmlDeviceGetTotalEnergyConsumption (" + nvml_->name +
              "), read before the first and after the last "
              "measured step with the device synchronised",
          ""};
}

}  // namespace tt
