// The roofline report: for the kernels of a profiled step, arithmetic intensity (FLOPs per DRAM byte) and
// achieved FLOP/s against the GPU's compute roofs (the peak table MFU uses, apps/results/flops.h) and its
// memory roof (measured bandwidth), as a table and an SVG chart. The counters come from Nsight Compute
// (scripts/profile_roofline.sh writes them with `ncu --csv --page raw --print-units base`).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tt::roofline {

// The ncu metrics the report reads: time, DRAM traffic, and the FLOP counters of the FMA pipes (fp32 and
// half precision: add and mul count one FLOP per thread instruction, fma two) and of the tensor cores
// (math ops as ncu counts them on the tensor path). A metric ncu does not know on a GPU is left out of the
// profile, and the report says so.
const std::vector<std::string>& ncu_metrics();

struct Kernel {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;  // GPU time, all calls
  double flops = 0;    // all calls
  double bytes = 0;    // DRAM bytes read + written, all calls
  double tensor_flops = 0;  // the part of `flops` done on the tensor cores
  double share = 0;    // of the profiled GPU time
  // FLOPs per byte; none when no bytes were counted (everything served from cache).
  std::optional<double> intensity() const { return bytes > 0 ? std::optional<double>(flops / bytes) : std::nullopt; }
  double flops_per_s() const { return seconds > 0 ? flops / seconds : 0; }
  double bytes_per_s() const { return seconds > 0 ? bytes / seconds : 0; }
};

struct Roof {
  std::string label;  // "bf16 tensor cores (H100 SXM, NVIDIA H100 datasheet (SXM5))"
  double flops_per_s = 0;
};

struct Report {
  std::string title;
  std::vector<Kernel> kernels;  // by GPU time, largest first; all of them
  double total_seconds = 0;
  int64_t launches = 0;
  std::vector<Roof> compute_roofs;           // highest first; empty for a GPU outside the peak table
  std::optional<double> bandwidth;           // bytes/s: the memory roof
  std::string bandwidth_source;              // how it was obtained
  std::optional<double> ncu_peak_bandwidth;  // ncu's own DRAM peak, when the counters carry it
  std::vector<std::string> missing_metrics;  // asked-for metrics absent from the counter file
  std::vector<std::string> notes;
};

// Reads ncu's raw CSV page (a header row, a units row, one row per kernel launch), adds up the launches of
// each kernel name and sorts by GPU time. Throws std::runtime_error naming the file, row and problem.
Report read_ncu_csv(const std::string& path);
Report parse_ncu_csv(const std::string& text, const std::string& source);

// Compute roofs for a GPU from the peak table (fp32 on the FMA units, tf32 and bf16 on the tensor cores);
// none for a GPU outside it.
std::vector<Roof> roofs_for(const std::string& device_name);

// Attainable FLOP/s at this intensity under the highest compute roof and the memory roof; none without both.
std::optional<double> attainable(const Report& report, double intensity);
// The roof a kernel is held to: the tensor cores' (the highest) where most of its FLOPs ran on them, the fp32
// roof (the lowest) otherwise: an fp32 SIMT GEMM is compute-bound well below the tensor cores' ridge.
const Roof* compute_roof(const Report& report, const Kernel& kernel);
std::optional<double> attainable(const Report& report, const Kernel& kernel);

std::string to_markdown(const Report& report, size_t top);
std::string to_svg(const Report& report, size_t top);
nlohmann::json to_json(const Report& report, size_t top);

}  // namespace tt::roofline
