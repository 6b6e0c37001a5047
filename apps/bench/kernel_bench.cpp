#include "apps/bench/kernel_bench.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <ostream>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/bench/bench_cases.h"
#include "apps/results/result_file.h"
#include "apps/results/text.h"
#include "apps/train/device.h"
#include "apps/train/system_info.h"

namespace tt::bench {
namespace {

using nlohmann::json;

// ---- timing ---------------------------------------------------------------------------------------

class Timer {
 public:
  Timer(c10::Device device, int64_t warmup, int64_t repeats, int64_t flush_bytes)
      : device_(device),
        warmup_(warmup),
        repeats_(repeats),
        flush_(torch::empty({flush_bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device))) {}

  // Milliseconds per repeat.
  Spread time(const std::function<void()>& work) {
    for (int64_t i = 0; i < warmup_; ++i) work();
    const c10::Stream stream = at::accelerator::getCurrentStream(device_.index());
    std::vector<c10::Event> starts, ends;
    for (int64_t i = 0; i < repeats_; ++i) {
      starts.emplace_back(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
      ends.emplace_back(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
    }
    for (int64_t i = 0; i < repeats_; ++i) {
      flush_.zero_();
      starts[i].record(stream);
      work();
      ends[i].record(stream);
    }
    at::accelerator::synchronizeDevice(device_.index());
    std::vector<double> times;
    for (int64_t i = 0; i < repeats_; ++i) times.push_back(starts[i].elapsedTime(ends[i]));
    return spread(times);
  }

  int64_t flush_bytes() const { return flush_.numel(); }

 private:
  c10::Device device_;
  int64_t warmup_, repeats_;
  torch::Tensor flush_;
};

// Peak DRAM bandwidth from vendor datasheets (GB/s), matched by device-name substring, first match wins.
// MI250X/MI250 report each of their two dies (GCDs) as a device; the figure is per die.
std::optional<double> datasheet_bandwidth(const std::string& name) {
  static const std::vector<std::pair<std::string, double>> kTable = {
      {"H200", 4800},           {"H100 NVL", 3900},       {"H100 PCIe", 2000}, {"H100", 3350},
      {"A100-SXM4-80GB", 2039}, {"A100 80GB PCIe", 1935}, {"A100", 1555},      {"L40S", 864},
      {"RTX 4090", 1008},       {"MI300X", 5300},         {"MI250", 1638},     {"MI210", 1638},
  };
  for (const auto& [fragment, gbps] : kTable)
    if (name.find(fragment) != std::string::npos) return gbps;
  return std::nullopt;
}

// A copy reads and writes every byte once: a practical ceiling for memory-bound kernels.
double measured_copy_gbps(c10::Device device, Timer& timer) {
  const int64_t bytes = std::min<int64_t>(timer.flush_bytes() / 2, int64_t{1} << 30);
  auto src = torch::ones({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  auto dst = torch::empty_like(src);
  return 2.0 * static_cast<double>(bytes) / (timer.time([&] { dst.copy_(src); }).median * 1e6);
}

torch::ScalarType dtype_of(const std::string& name) {
  return name == "bf16" ? torch::kBFloat16 : name == "fp16" ? torch::kFloat16 : torch::kFloat32;
}

bool selected(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

void print_row(std::ostream& out, const std::vector<std::string>& cells) {
  static const std::vector<int> kWidths = {13, 14, 5, 17, 33, 10, 10, 10, 9, 7, 8, 8};
  for (size_t i = 0; i < cells.size(); ++i) {
    std::string cell = cells[i];
    if (i + 1 < cells.size() && cell.size() < static_cast<size_t>(kWidths[i])) cell.resize(kWidths[i], ' ');
    out << cell << (i + 1 < cells.size() ? " " : "\n");
  }
}

}  // namespace

const std::vector<BenchShape>& shapes() {
  static const std::vector<BenchShape> list = {
      {"workshop", 8, 128, 512, 8, 4, 2048, 1000},
      {"medium", 4, 512, 2048, 32, 16, 8192, 32000},
      // Other lengths, for attention: the long-context config; medium's heads (head_dim 64) at 256 (between the
      // workshop's 128 and medium's 512: v4's attention rule), 1024 and 2048 (between medium and long-context's 4096:
      // the Hopper forward's consumer count changes with the length); head_dim 128 at 1024, 2048 and 4096.
      {"long-context", 2, 4096, 512, 8, 4, 2048, 1000},
      {"d64-s256", 8, 256, 2048, 32, 16, 8192, 32000},
      {"d64-s1024", 4, 1024, 2048, 32, 16, 8192, 32000},
      {"d64-s2048", 2, 2048, 2048, 32, 16, 8192, 32000},
      {"d128-s1024", 4, 1024, 2048, 16, 4, 8192, 32000},
      {"d128-s2048", 2, 2048, 2048, 16, 4, 8192, 32000},
      {"d128-s4096", 2, 4096, 2048, 16, 4, 8192, 32000},
  };
  return list;
}

const std::vector<std::string>& families() {
  static const std::vector<std::string> list = [] {
    std::vector<std::string> names;
    for (const auto& [name, builder] : builders()) names.push_back(name);
    return names;
  }();
  return list;
}

const std::vector<std::string>& dtypes() {
  static const std::vector<std::string> list = {"fp32", "bf16", "fp16"};
  return list;
}

int run(const BenchOptions& options, std::ostream& out, std::ostream& err) {
#if !defined(TT_BACKEND_CUDA) && !defined(TT_BACKEND_HIP)
  err << "kernel_bench: this build has no GPU kernels (CMake found neither CUDA nor HIP); nothing to measure.\n";
  return 1;
#endif
  if (!torch::cuda::is_available()) {
    err << "kernel_bench: no GPU found (torch::cuda::is_available() is false); nothing to measure.\n";
    return 1;
  }
  if (options.device_index >= static_cast<int64_t>(torch::cuda::device_count())) {
    err << "kernel_bench: error: --device-index " << options.device_index << " is not allowed: only "
        << torch::cuda::device_count() << " GPU(s) are visible, so it must be in [0, "
        << torch::cuda::device_count() - 1 << "]\n";
    return 2;
  }
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(options.device_index));
  at::accelerator::setDeviceIndex(device.index());
  torch::manual_seed(0);

  Timer timer(device, options.warmup, options.repeats, options.flush_mib << 20);
  const SystemInfo system = collect_system_info(device);
  const double copy_gbps = measured_copy_gbps(device, timer);
  const auto datasheet_gbps = datasheet_bandwidth(system.device_name);
  out << "GPU " << system.device_name << " (" << system.runtime_version << ", " << system.driver_version
      << "), LibTorch " << system.libtorch_version << "\n"
      << "Bandwidth: measured copy " << strprintf("%.0f", copy_gbps) << " GB/s"
      << (datasheet_gbps ? strprintf(", datasheet peak %.0f GB/s", *datasheet_gbps) : "")
      << "\nTimes: GPU event time, median (p10-p90) over " << options.repeats << " repeats after " << options.warmup
      << " warm-up runs, caches flushed (" << options.flush_mib << " MiB) before each.\n"
      << "'copy %' = achieved GB/s / measured copy GB/s; 'speedup' = this row's median / the case's first row's "
         "median (the catalog's most optimised entry, or v2's choice for sdpa_gqa).\n\n";
  print_row(out, {"kernel", "shape", "dtype", "pass", "implementation", "median us", "p10 us", "p90 us", "GB/s",
                  "copy %", "speedup", "TFLOP/s"});

  json results = json::array();
  for (const auto& [family, builder] : builders()) {
    if (!selected(options.families, family)) continue;
    for (const auto& shape : shapes()) {
      if (!selected(options.shapes, shape.name)) continue;
      for (const auto& dtype_name : options.dtypes) {
        for (const auto& bench_case : builder(shape, dtype_of(dtype_name), device)) {
          std::optional<double> first_ms;
          for (const auto& impl : bench_case.implementations) {
            json row = {{"kernel", family},
                        {"shape", {{"name", shape.name}, {"batch", shape.batch}, {"seq", shape.seq},
                                   {"hidden", shape.hidden}, {"heads", shape.heads}, {"kv_heads", shape.kv_heads},
                                   {"ffn", shape.ffn}, {"vocab", shape.vocab}}},
                        {"dtype", dtype_name},
                        {"pass", bench_case.pass},
                        {"implementation", impl.name},
                        {"bytes", bench_case.bytes}};
            Spread stats;
            try {
              stats = timer.time(impl.run);
            } catch (const std::exception& error) {
              // A baseline LibTorch does not support at this dtype is reported, not fatal.
              row["error"] = error.what();
              results.push_back(row);
              print_row(out, {family, shape.name, dtype_name, bench_case.pass, impl.name, "unsupported", "", "", "",
                              "", ""});
              continue;
            }
            const double gbps = static_cast<double>(bench_case.bytes) / (stats.median * 1e6);
            const bool first = &impl == &bench_case.implementations.front();
            if (first) first_ms = stats.median;
            row["median_ms"] = stats.median;
            row["p10_ms"] = stats.p10;
            row["p90_ms"] = stats.p90;
            row["min_ms"] = stats.min;
            row["gbps"] = gbps;
            if (bench_case.flops > 0) row["tflops"] = bench_case.flops / (stats.median * 1e-3) / 1e12;
            row["fraction_of_copy_bandwidth"] = gbps / copy_gbps;
            if (datasheet_gbps) row["fraction_of_datasheet_bandwidth"] = gbps / *datasheet_gbps;
            std::string speedup = "-";
            if (!first && first_ms) {
              row["custom_speedup"] = stats.median / *first_ms;
              speedup = strprintf("%.2fx", stats.median / *first_ms);
            }
            results.push_back(row);
            print_row(out, {family, shape.name, dtype_name, bench_case.pass, impl.name,
                            strprintf("%.1f", stats.median * 1e3), strprintf("%.1f", stats.p10 * 1e3),
                            strprintf("%.1f", stats.p90 * 1e3), strprintf("%.0f", gbps),
                            strprintf("%.0f", 100 * gbps / copy_gbps), speedup,
                            bench_case.flops > 0 ? strprintf("%.1f", bench_case.flops / (stats.median * 1e-3) / 1e12)
                                                 : std::string("-")});
          }
        }
      }
    }
  }

  json device_json = {{"name", system.device_name},
                      {"backend", system.backend},
                      {"runtime_version", system.runtime_version},
                      {"driver_version", system.driver_version},
                      {"measured_copy_gbps", copy_gbps}};
  if (datasheet_gbps) device_json["datasheet_peak_gbps"] = *datasheet_gbps;
  const json report = {
      {"tool", "kernel_bench"},
      {"timestamp", system.timestamp},
      {"git_commit", system.git_commit},
      {"libtorch_version", system.libtorch_version},
      {"system", to_json(system)},
      {"device", device_json},
      {"settings",
       {{"warmup", options.warmup},
        {"repeats", options.repeats},
        {"flush_mib", options.flush_mib},
        {"bytes", "minimum bytes moved: each input read once, each output written once"}}},
      {"results", results},
  };
  try {
    write_json_atomically(options.output, report, /*overwrite=*/true);
  } catch (const std::exception& e) {
    err << "kernel_bench: " << e.what() << "\n";
    return 1;
  }
  out << "\nWrote " << options.output << "\n";
  return 0;
}

}  // namespace tt::bench
