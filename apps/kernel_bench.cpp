// kernel_bench: times each custom kernel (forward, and forward + backward) against the LibTorch code it
// replaces, at the workshop and medium model shapes, in fp32 and bf16.
//
// Method (llm.c dev/cuda style):
//  * GPU time between two events recorded on the current stream, per repeat; warm-up runs excluded;
//    median with p10/p90 over the repeats.
//  * Before every repeat a large buffer is written to evict the previous repeat's data from L2 (and
//    AMD's Infinity Cache), so every repeat reads its inputs from DRAM, as in a training step. The flush
//    also keeps the GPU busy while the host enqueues the measured work, so host launch overhead stays
//    out of the measurement unless the host is slower than the flush.
//  * Achieved bandwidth = the minimum bytes the operation must move (each input read once, each output
//    written once) / median time, the same byte count for every implementation, so GB/s ratios are
//    speedups. It is compared with a measured device-to-device copy and, for known GPUs, the
//    datasheet's peak.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>

#if defined(TT_BACKEND_CUDA)
#include <ATen/cuda/CUDAContext.h>
#elif defined(TT_BACKEND_HIP)
#include <ATen/hip/HIPContext.h>
#endif

#include "kernels/ops/cross_entropy.h"
#include "kernels/ops/rms_norm.h"
#include "kernels/ops/rope.h"
#include "kernels/ops/swiglu.h"
#include "models/reference.h"

namespace {

using nlohmann::json;

// ---- shapes ---------------------------------------------------------------------------------------

struct BenchShape {
  std::string name;
  int64_t batch, seq, hidden, heads, kv_heads, ffn, vocab;
  int64_t tokens() const { return batch * seq; }
  int64_t head_dim() const { return hidden / heads; }
};

const std::vector<BenchShape> kShapes = {
    {"workshop", 8, 128, 512, 8, 4, 2048, 1000},
    {"medium", 4, 512, 2048, 32, 16, 8192, 32000},
};

json to_json(const BenchShape& s) {
  return {{"name", s.name},   {"batch", s.batch},       {"seq", s.seq}, {"hidden", s.hidden},
          {"heads", s.heads}, {"kv_heads", s.kv_heads}, {"ffn", s.ffn}, {"vocab", s.vocab}};
}

// ---- timing ---------------------------------------------------------------------------------------

struct Stats {
  double median_ms = 0, p10_ms = 0, p90_ms = 0, min_ms = 0;
};

double percentile(std::vector<double> sorted, double q) {
  const double position = q * static_cast<double>(sorted.size() - 1);
  const auto lower = static_cast<size_t>(position);
  const size_t upper = std::min(lower + 1, sorted.size() - 1);
  return sorted[lower] + (position - static_cast<double>(lower)) * (sorted[upper] - sorted[lower]);
}

class Timer {
 public:
  Timer(c10::Device device, int64_t warmup, int64_t repeats, int64_t flush_bytes)
      : device_(device),
        warmup_(warmup),
        repeats_(repeats),
        flush_(torch::empty({flush_bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device))) {}

  Stats time(const std::function<void()>& work) {
    for (int64_t i = 0; i < warmup_; ++i) work();
    const c10::Stream stream = at::accelerator::getCurrentStream(device_.index());
    std::vector<c10::Event> starts;
    std::vector<c10::Event> ends;
    starts.reserve(repeats_);
    ends.reserve(repeats_);
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
    std::sort(times.begin(), times.end());
    return {percentile(times, 0.5), percentile(times, 0.1), percentile(times, 0.9), times.front()};
  }

  int64_t flush_bytes() const { return flush_.numel(); }

 private:
  c10::Device device_;
  int64_t warmup_;
  int64_t repeats_;
  torch::Tensor flush_;
};

// ---- device information ---------------------------------------------------------------------------

struct DeviceInfo {
  std::string name = "unknown";
  std::string backend = "none";
  std::string runtime_version;
  std::string driver_version;
  double copy_gbps = 0;                  // measured device-to-device copy
  std::optional<double> datasheet_gbps;  // vendor's peak DRAM bandwidth, for the GPUs we know
};

// Peak DRAM bandwidth from vendor datasheets (GB/s), matched by device-name substring, first match wins.
// MI250X/MI250 report each of their two dies (GCDs) as a device; the figure is per die.
std::optional<double> datasheet_bandwidth(const std::string& name) {
  static const std::vector<std::pair<std::string, double>> kTable = {
      {"H200", 4800},           {"H100 NVL", 3900},       {"H100 PCIe", 2000}, {"H100", 3350},
      {"A100-SXM4-80GB", 2039}, {"A100 80GB PCIe", 1935}, {"A100", 1555},      {"L40S", 864},
      {"RTX 4090", 1008},       {"MI300X", 5300},         {"MI250", 1638},     {"MI210", 1638},
  };
  for (const auto& [fragment, gbps] : kTable) {
    if (name.find(fragment) != std::string::npos) return gbps;
  }
  return std::nullopt;
}

DeviceInfo describe_device(c10::Device device, Timer& timer) {
  DeviceInfo info;
#if defined(TT_BACKEND_CUDA) || defined(TT_BACKEND_HIP)
  info.name = at::cuda::getDeviceProperties(device.index())->name;
  int runtime = 0;
  int driver = 0;
#if defined(TT_BACKEND_CUDA)
  info.backend = "cuda";
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
#else
  info.backend = "hip";
  hipRuntimeGetVersion(&runtime);
  hipDriverGetVersion(&driver);
#endif
  info.runtime_version = std::to_string(runtime);
  info.driver_version = std::to_string(driver);
#endif
  // A copy reads and writes every byte once: a practical ceiling for memory-bound kernels.
  const int64_t bytes = std::min<int64_t>(timer.flush_bytes() / 2, int64_t{1} << 30);
  auto src = torch::ones({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  auto dst = torch::empty_like(src);
  const Stats copy = timer.time([&] { dst.copy_(src); });
  info.copy_gbps = 2.0 * static_cast<double>(bytes) / (copy.median_ms * 1e6);
  info.datasheet_gbps = datasheet_bandwidth(info.name);
  return info;
}

std::string git_commit() {
#ifdef TT_SOURCE_DIR
  const std::string command = std::string("git -C \"") + TT_SOURCE_DIR + "\" rev-parse HEAD 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (pipe) {
    char buffer[64] = {};
    if (std::fgets(buffer, sizeof(buffer), pipe.get()) != nullptr) {
      std::string commit(buffer);
      commit.erase(commit.find_last_not_of(" \n\r") + 1);
      return commit;
    }
  }
#endif
  return "unknown";
}

std::string utc_timestamp() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

// ---- benchmark cases ------------------------------------------------------------------------------

// One implementation of one operation. `run` does the measured work; inputs are built beforehand.
struct Implementation {
  std::string name;  // the first of a case is the one the others are compared with: "custom" (ours), or v2's choice
  std::function<void()> run;
};

// One operation at one shape, dtype and pass, timed for each implementation.
struct Case {
  std::string kernel;
  std::string pass;  // "forward" or "forward+backward"
  int64_t bytes;     // minimum bytes moved, see the file comment
  std::vector<Implementation> implementations;
};

int64_t element_size(torch::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

// Runs forward and backward with autograd; torch::autograd::grad does not accumulate into .grad,
// so repeats do not add an accumulation kernel.
void forward_backward(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& inputs,
                      const std::vector<torch::Tensor>& grad_outputs) {
  torch::autograd::grad(outputs, inputs, grad_outputs);
}

torch::Tensor leaf(const torch::Tensor& t) { return t.detach().clone().requires_grad_(true); }

// The incoming gradient in the dtype `forward` produces (LibTorch ops may promote bf16 activations
// times an fp32 weight to fp32), so the timed backward contains no cast. If `forward` throws, the
// timing reports the implementation as unsupported; the gradient is then never used.
torch::Tensor gradient_for(const std::function<torch::Tensor()>& forward, const torch::Tensor& grad) {
  try {
    torch::NoGradGuard no_grad;
    return grad.to(forward().scalar_type());
  } catch (const std::exception&) {
    return grad;
  }
}

constexpr double kNormEps = 1e-6;

std::vector<Case> rms_norm_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t rows = shape.tokens(), hidden = shape.hidden, es = element_size(dtype);
  auto options = torch::TensorOptions().device(device);
  // bf16 activations with an fp32 weight, as under autocast.
  auto x = torch::randn({rows, hidden}, options).to(dtype);
  auto weight = torch::ones({hidden}, options);
  auto grad = torch::randn({rows, hidden}, options).to(dtype);
  auto xg = leaf(x);
  auto wg = leaf(weight);
  Case forward{"rms_norm", "forward", 2 * rows * hidden * es + hidden * 4, {}};
  forward.implementations = {
      {"custom", [=] { tt::ops::rms_norm(x, weight, kNormEps); }},
      {"reference", [=] { tt::reference::rms_norm(x, weight, kNormEps); }},
      {"at::rms_norm", [=] { at::rms_norm(x, {hidden}, weight, kNormEps); }},
  };
  // Backward reads x, grad_y, weight and writes grad_x, grad_weight.
  Case both{"rms_norm", "forward+backward", forward.bytes + 3 * rows * hidden * es + 2 * hidden * 4, {}};
  auto grad_reference = gradient_for([=] { return tt::reference::rms_norm(x, weight, kNormEps); }, grad);
  auto grad_fused = gradient_for([=] { return at::rms_norm(x, {hidden}, weight, kNormEps); }, grad);
  both.implementations = {
      {"custom",
       [=] {
         forward_backward({tt::ops::rms_norm(xg, wg, kNormEps)}, {xg, wg}, {grad});
       }},
      {"reference",
       [=] {
         forward_backward({tt::reference::rms_norm(xg, wg, kNormEps)}, {xg, wg}, {grad_reference});
       }},
      {"at::rms_norm",
       [=] {
         forward_backward({at::rms_norm(xg, {hidden}, wg, kNormEps)}, {xg, wg}, {grad_fused});
       }},
  };
  return {forward, both};
}

std::vector<Case> rope_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t es = element_size(dtype), head_dim = shape.head_dim();
  auto options = torch::TensorOptions().device(device);
  auto q = torch::randn({shape.batch, shape.seq, shape.heads, head_dim}, options).to(dtype);
  auto k = torch::randn({shape.batch, shape.seq, shape.kv_heads, head_dim}, options).to(dtype);
  auto [cos, sin] = tt::reference::rope_tables(shape.seq, head_dim, 10000.0, 0, device);
  auto grad_q = torch::randn_like(q);
  auto grad_k = torch::randn_like(k);
  auto qg = leaf(q);
  auto kg = leaf(k);
  const int64_t qk_bytes = (q.numel() + k.numel()) * es;
  const int64_t table_bytes = 2 * cos.numel() * 4;
  Case forward{"rope", "forward", 2 * qk_bytes + table_bytes, {}};
  forward.implementations = {
      {"custom", [=] { tt::ops::rope(q, k, cos, sin); }},
      {"reference",
       [=] {
         tt::reference::apply_rope(q, cos, sin);
         tt::reference::apply_rope(k, cos, sin);
       }},
  };
  Case both{"rope", "forward+backward", 2 * forward.bytes, {}};
  both.implementations = {
      {"custom",
       [=] {
         auto [q_out, k_out] = tt::ops::rope(qg, kg, cos, sin);
         forward_backward({q_out, k_out}, {qg, kg}, {grad_q, grad_k});
       }},
      {"reference",
       [=] {
         forward_backward({tt::reference::apply_rope(qg, cos, sin), tt::reference::apply_rope(kg, cos, sin)}, {qg, kg},
                          {grad_q, grad_k});
       }},
  };
  return {forward, both};
}

std::vector<Case> swiglu_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t rows = shape.tokens(), ffn = shape.ffn, es = element_size(dtype);
  auto options = torch::TensorOptions().device(device);
  auto gate_up = torch::randn({rows, 2 * ffn}, options).to(dtype);
  auto grad = torch::randn({rows, ffn}, options).to(dtype);
  auto gate_up_g = leaf(gate_up);
  auto reference = [](const torch::Tensor& input) {
    auto halves = input.chunk(2, -1);
    return tt::reference::swiglu(halves[0], halves[1]);
  };
  Case forward{"swiglu", "forward", 3 * rows * ffn * es, {}};
  forward.implementations = {
      {"custom", [=] { tt::ops::swiglu(gate_up); }},
      {"reference", [=] { reference(gate_up); }},
  };
  // Backward reads grad_out and gate_up and writes grad_gate_up.
  Case both{"swiglu", "forward+backward", forward.bytes + 5 * rows * ffn * es, {}};
  both.implementations = {
      {"custom", [=] { forward_backward({tt::ops::swiglu(gate_up_g)}, {gate_up_g}, {grad}); }},
      {"reference", [=] { forward_backward({reference(gate_up_g)}, {gate_up_g}, {grad}); }},
  };
  return {forward, both};
}

std::vector<Case> cross_entropy_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t rows = shape.tokens(), vocab = shape.vocab, es = element_size(dtype);
  auto options = torch::TensorOptions().device(device);
  auto logits = torch::randn({rows, vocab}, options).to(dtype);
  auto labels = torch::randint(vocab, {rows}, options.dtype(torch::kInt64));
  auto logits_g = leaf(logits);
  const auto ignore = tt::reference::kIgnoreIndex;
  Case forward{"cross_entropy", "forward", rows * vocab * es + rows * 8, {}};
  forward.implementations = {
      {"custom", [=] { tt::ops::cross_entropy(logits, labels, ignore); }},
      {"torch cross_entropy", [=] { tt::reference::cross_entropy(logits, labels, ignore); }},
  };
  // Backward reads the logits again and writes their gradient.
  Case both{"cross_entropy", "forward+backward", forward.bytes + 2 * rows * vocab * es, {}};
  auto one = torch::ones({}, options);
  auto grad_custom = gradient_for([=] { return tt::ops::cross_entropy(logits, labels, ignore); }, one);
  auto grad_torch = gradient_for([=] { return tt::reference::cross_entropy(logits, labels, ignore); }, one);
  both.implementations = {
      {"custom",
       [=] { forward_backward({tt::ops::cross_entropy(logits_g, labels, ignore)}, {logits_g}, {grad_custom}); }},
      {"torch cross_entropy",
       [=] { forward_backward({tt::reference::cross_entropy(logits_g, labels, ignore)}, {logits_g}, {grad_torch}); }},
  };
  return {forward, both};
}

// Not a kernel of ours: the measurement behind v2's fp32 attention choice (models/components.cpp). With
// grouped K/V heads in fp32, SDPA's flash and memory-efficient kernels refuse enable_gqa and LibTorch falls
// back to its math path; v2 instead repeats K/V to all heads and keeps the memory-efficient kernel.
std::vector<Case> sdpa_gqa_cases(const BenchShape& shape, torch::ScalarType dtype, c10::Device device) {
  const int64_t es = element_size(dtype), head_dim = shape.head_dim(), n_rep = shape.heads / shape.kv_heads;
  auto options = torch::TensorOptions().device(device);
  auto q = torch::randn({shape.batch, shape.heads, shape.seq, head_dim}, options).to(dtype);
  auto k = torch::randn({shape.batch, shape.kv_heads, shape.seq, head_dim}, options).to(dtype);
  auto v = torch::randn_like(k);
  auto grad = torch::randn_like(q);
  auto qg = leaf(q), kg = leaf(k), vg = leaf(v);
  auto expanded = [n_rep](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return at::scaled_dot_product_attention(q, k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1), {}, 0.0,
                                            true);
  };
  auto native = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, /*enable_gqa=*/true);
  };
  Case forward{"sdpa_gqa", "forward", 2 * q.numel() * es + 2 * k.numel() * es, {}};
  forward.implementations = {
      {"expanded K/V (v2)", [=] { expanded(q, k, v); }},
      {"enable_gqa", [=] { native(q, k, v); }},
  };
  Case both{"sdpa_gqa", "forward+backward", 3 * forward.bytes, {}};
  both.implementations = {
      {"expanded K/V (v2)", [=] { forward_backward({expanded(qg, kg, vg)}, {qg, kg, vg}, {grad}); }},
      {"enable_gqa", [=] { forward_backward({native(qg, kg, vg)}, {qg, kg, vg}, {grad}); }},
  };
  return {forward, both};
}

using CaseBuilder = std::function<std::vector<Case>(const BenchShape&, torch::ScalarType, c10::Device)>;

const std::map<std::string, CaseBuilder>& case_builders() {
  static const std::map<std::string, CaseBuilder> kBuilders = {
      {"rms_norm", rms_norm_cases},
      {"rope", rope_cases},
      {"swiglu", swiglu_cases},
      {"cross_entropy", cross_entropy_cases},
      {"sdpa_gqa", sdpa_gqa_cases},
  };
  return kBuilders;
}

const std::vector<std::string> kKernelOrder = {"rms_norm", "rope", "swiglu", "cross_entropy", "sdpa_gqa"};
const std::map<std::string, torch::ScalarType> kDtypes = {{"fp32", torch::kFloat32}, {"bf16", torch::kBFloat16}};

// ---- command line ---------------------------------------------------------------------------------

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    const auto first = item.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    items.push_back(item.substr(first, item.find_last_not_of(' ') - first + 1));
  }
  return items;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// Throws std::invalid_argument naming the option, the bad value and the allowed ones.
std::vector<std::string> parse_choices(const std::string& option, const std::string& text,
                                       const std::vector<std::string>& allowed) {
  auto items = split_list(text);
  if (items.empty()) throw std::invalid_argument("--" + option + " is empty; allowed: " + join(allowed));
  for (const auto& item : items) {
    if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
      throw std::invalid_argument("--" + option + " has unknown value '" + item + "'; allowed: " + join(allowed));
    }
  }
  return items;
}

struct Options {
  std::vector<std::string> kernels, shapes, dtypes;
  int64_t warmup = 10, repeats = 100, flush_mib = 512, device_index = 0;
  std::string output;
};

std::optional<Options> parse_options(int argc, char** argv) {
  cxxopts::Options spec("kernel_bench",
                        "Times the custom kernels (forward, forward+backward) against the LibTorch ops they replace.");
  std::vector<std::string> shape_names;
  for (const auto& s : kShapes) shape_names.push_back(s.name);
  std::vector<std::string> dtype_names;
  for (const auto& [name, dtype] : kDtypes) dtype_names.push_back(name);
  // clang-format off: one option per line reads better than the formatter's packing of this chain.
  spec.add_options()("kernels", "Comma-separated kernels: " + join(kKernelOrder),
                     cxxopts::value<std::string>()->default_value(join(kKernelOrder)))(
      "shapes", "Comma-separated shapes: " + join(shape_names),
      cxxopts::value<std::string>()->default_value("workshop,medium"))(
      "dtypes", "Comma-separated activation dtypes: " + join(dtype_names),
      cxxopts::value<std::string>()->default_value("fp32,bf16"))("warmup", "Untimed runs before each measurement",
                                                                 cxxopts::value<int64_t>()->default_value("10"))(
      "repeats", "Timed runs per measurement", cxxopts::value<int64_t>()->default_value("100"))(
      "flush-mib", "Size of the buffer written before each timed run to flush the caches (MiB)",
      cxxopts::value<int64_t>()->default_value("512"))("device-index", "Which GPU to use",
                                                       cxxopts::value<int64_t>()->default_value("0"))(
      "output", "Where to write the JSON results",
      cxxopts::value<std::string>()->default_value("results/kernel_bench.json"))("help", "Print this help");
  // clang-format on
  const auto parsed = spec.parse(argc, argv);
  if (parsed.count("help")) {
    std::cout << spec.help() << std::endl;
    return std::nullopt;
  }
  Options options;
  options.kernels = parse_choices("kernels", parsed["kernels"].as<std::string>(), kKernelOrder);
  options.shapes = parse_choices("shapes", parsed["shapes"].as<std::string>(), shape_names);
  options.dtypes = parse_choices("dtypes", parsed["dtypes"].as<std::string>(), dtype_names);
  options.warmup = parsed["warmup"].as<int64_t>();
  options.repeats = parsed["repeats"].as<int64_t>();
  options.flush_mib = parsed["flush-mib"].as<int64_t>();
  options.device_index = parsed["device-index"].as<int64_t>();
  options.output = parsed["output"].as<std::string>();
  if (options.warmup < 0) throw std::invalid_argument("--warmup must be >= 0, got " + std::to_string(options.warmup));
  if (options.repeats < 1)
    throw std::invalid_argument("--repeats must be >= 1, got " + std::to_string(options.repeats));
  if (options.flush_mib < 1) {
    throw std::invalid_argument("--flush-mib must be >= 1, got " + std::to_string(options.flush_mib));
  }
  return options;
}

// ---- report -----------------------------------------------------------------------------------------

std::string format_fixed(double value, int precision) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(precision) << value;
  return out.str();
}

void print_row(const std::vector<std::string>& cells) {
  static const std::vector<int> kWidths = {14, 9, 5, 17, 20, 10, 10, 10, 9, 8, 9};
  for (size_t i = 0; i < cells.size(); ++i) {
    std::cout << std::left << std::setw(kWidths[i]) << cells[i] << (i + 1 < cells.size() ? " " : "\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Options> parsed;
  try {
    parsed = parse_options(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "kernel_bench: " << error.what() << " (see --help)\n";
    return 2;
  }
  if (!parsed) return 0;
  const Options& options = *parsed;

#if !defined(TT_BACKEND_CUDA) && !defined(TT_BACKEND_HIP)
  std::cerr << "kernel_bench: this build has no GPU kernels (CMake found neither CUDA nor HIP); nothing to measure.\n";
  return 1;
#endif
  if (!torch::cuda::is_available()) {
    std::cerr << "kernel_bench: no GPU found (torch::cuda::is_available() is false); nothing to measure.\n";
    return 1;
  }
  if (options.device_index >= static_cast<int64_t>(torch::cuda::device_count())) {
    std::cerr << "kernel_bench: --device-index " << options.device_index << " but only " << torch::cuda::device_count()
              << " GPU(s) are visible.\n";
    return 2;
  }
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(options.device_index));
  at::accelerator::setDeviceIndex(device.index());
  torch::manual_seed(0);

  Timer timer(device, options.warmup, options.repeats, options.flush_mib << 20);
  const DeviceInfo info = describe_device(device, timer);
  std::cout << "GPU " << info.name << " (" << info.backend << " runtime " << info.runtime_version << ", driver "
            << info.driver_version << "), LibTorch " << TORCH_VERSION << "\n"
            << "Bandwidth: measured copy " << format_fixed(info.copy_gbps, 0) << " GB/s"
            << (info.datasheet_gbps ? ", datasheet peak " + format_fixed(*info.datasheet_gbps, 0) + " GB/s" : "")
            << "\nTimes: GPU event time, median (p10-p90) over " << options.repeats << " repeats after "
            << options.warmup << " warm-up runs, caches flushed (" << options.flush_mib << " MiB) before each.\n"
            << "'copy %' = achieved GB/s / measured copy GB/s; 'speedup' = this row's median / the case's first row's median (custom, or v2's choice).\n\n";
  print_row({"kernel", "shape", "dtype", "pass", "implementation", "median us", "p10 us", "p90 us", "GB/s", "copy %",
             "speedup"});

  json results = json::array();
  for (const auto& kernel : kKernelOrder) {
    if (std::find(options.kernels.begin(), options.kernels.end(), kernel) == options.kernels.end()) continue;
    for (const auto& shape : kShapes) {
      if (std::find(options.shapes.begin(), options.shapes.end(), shape.name) == options.shapes.end()) continue;
      for (const auto& dtype_name : options.dtypes) {
        const auto dtype = kDtypes.at(dtype_name);
        for (const auto& bench_case : case_builders().at(kernel)(shape, dtype, device)) {
          // Speedups are relative to the case's first implementation: ours ("custom"), or v2's choice.
          std::optional<double> custom_ms;
          for (const auto& impl : bench_case.implementations) {
            json row = {{"kernel", kernel},        {"shape", to_json(shape)},     {"dtype", dtype_name},
                        {"pass", bench_case.pass}, {"implementation", impl.name}, {"bytes", bench_case.bytes}};
            Stats stats;
            try {
              stats = timer.time(impl.run);
            } catch (const std::exception& error) {
              // A baseline LibTorch does not support at this dtype is reported, not fatal.
              row["error"] = error.what();
              results.push_back(row);
              print_row(
                  {kernel, shape.name, dtype_name, bench_case.pass, impl.name, "unsupported", "", "", "", "", ""});
              continue;
            }
            const double gbps = static_cast<double>(bench_case.bytes) / (stats.median_ms * 1e6);
            const bool first = &impl == &bench_case.implementations.front();
            if (first) custom_ms = stats.median_ms;
            row["median_ms"] = stats.median_ms;
            row["p10_ms"] = stats.p10_ms;
            row["p90_ms"] = stats.p90_ms;
            row["min_ms"] = stats.min_ms;
            row["gbps"] = gbps;
            row["fraction_of_copy_bandwidth"] = gbps / info.copy_gbps;
            if (info.datasheet_gbps) row["fraction_of_datasheet_bandwidth"] = gbps / *info.datasheet_gbps;
            std::string speedup = "-";
            if (!first && custom_ms) {
              row["custom_speedup"] = stats.median_ms / *custom_ms;
              speedup = format_fixed(stats.median_ms / *custom_ms, 2) + "x";
            }
            results.push_back(row);
            print_row({kernel, shape.name, dtype_name, bench_case.pass, impl.name,
                       format_fixed(stats.median_ms * 1e3, 1), format_fixed(stats.p10_ms * 1e3, 1),
                       format_fixed(stats.p90_ms * 1e3, 1), format_fixed(gbps, 0),
                       format_fixed(100 * gbps / info.copy_gbps, 0), speedup});
          }
        }
      }
    }
  }

  json device_json = {{"name", info.name},
                      {"backend", info.backend},
                      {"runtime_version", info.runtime_version},
                      {"driver_version", info.driver_version},
                      {"measured_copy_gbps", info.copy_gbps}};
  if (info.datasheet_gbps) device_json["datasheet_peak_gbps"] = *info.datasheet_gbps;
  const json report = {
      {"tool", "kernel_bench"},
      {"timestamp", utc_timestamp()},
      {"git_commit", git_commit()},
      {"libtorch_version", TORCH_VERSION},
      {"device", device_json},
      {"settings",
       {{"warmup", options.warmup},
        {"repeats", options.repeats},
        {"flush_mib", options.flush_mib},
        {"bytes", "minimum bytes moved: each input read once, each output written once"}}},
      {"results", results},
  };
  const std::filesystem::path output(options.output);
  if (output.has_parent_path()) std::filesystem::create_directories(output.parent_path());
  std::ofstream file(output);
  if (!file) {
    std::cerr << "kernel_bench: cannot write " << output << "\n";
    return 1;
  }
  file << report.dump(2) << "\n";
  std::cout << "\nWrote " << output.string() << "\n";
  return 0;
}
