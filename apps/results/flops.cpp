#include "apps/results/flops.h"

#include <vector>

namespace tt {

double training_flops_per_step(const ModelConfig& m, int64_t batch_size, int64_t seq_len) {
  const double h = static_cast<double>(m.hidden_dim);
  const double kv = static_cast<double>(m.n_kv_heads * m.head_dim());
  const double ffn = static_cast<double>(m.intermediate_dim);
  const double layer_weights = 2 * h * h + 2 * h * kv + 3 * h * ffn;
  const double per_token_forward = 2.0 * (static_cast<double>(m.n_layers) * layer_weights + h * m.vocab_size) +
                                   4.0 * static_cast<double>(m.n_layers) * static_cast<double>(seq_len) * h;
  return 3.0 * per_token_forward * static_cast<double>(batch_size * seq_len);
}

namespace {

struct Row {
  const char* match;  // substring of the device name; the first matching row wins
  const char* gpu;
  double bf16, fp32, tf32;  // tf32: dense TF32 tensor-core rate (AMD: its xf32/TF32 rate; fp32's where none)
  const char* source;
};

// Vendor datasheets, dense (no structured sparsity).
const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      {"H100 PCIe", "H100 PCIe", 756.0, 51.2, 378.0, "NVIDIA H100 datasheet"},
      {"H100 NVL", "H100 NVL", 835.0, 60.0, 417.5, "NVIDIA H100 NVL datasheet"},
      {"H100", "H100 SXM", 989.4, 66.9, 494.7, "NVIDIA H100 datasheet (SXM5)"},
      {"H200 NVL", "H200 NVL", 835.0, 60.0, 417.5, "NVIDIA H200 datasheet (NVL)"},
      {"H200", "H200 SXM", 989.4, 66.9, 494.7, "NVIDIA H200 datasheet (SXM)"},
      {"A100", "A100", 312.0, 19.5, 156.0, "NVIDIA A100 datasheet"},
      {"MI325X", "MI325X", 1307.4, 163.4, 653.7, "AMD Instinct MI325X datasheet"},
      {"MI300X", "MI300X", 1307.4, 163.4, 653.7, "AMD Instinct MI300X datasheet"},
      {"MI250X", "MI250X", 383.0, 95.7, 95.7, "AMD Instinct MI250X datasheet"},
  };
  return rows;
}

}  // namespace

std::optional<PeakFlops> peak_flops(const std::string& device_name, Precision precision, bool allow_tf32) {
  for (const auto& row : table()) {
    if (device_name.find(row.match) == std::string::npos) continue;
    return PeakFlops{row.gpu, precision == Precision::kBf16 ? row.bf16 : (allow_tf32 ? row.tf32 : row.fp32),
                     row.source};
  }
  return std::nullopt;
}

std::string known_gpus() {
  std::string out;
  for (const auto& row : table()) out += (out.empty() ? "" : ", ") + std::string(row.gpu);
  return out;
}

}  // namespace tt
