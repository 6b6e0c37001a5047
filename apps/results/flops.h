// Analytic model FLOPs and the peak dense FLOP/s table that turns step times into utilisation.
#pragma once

#include <optional>
#include <string>

#include "models/config.h"

namespace tt {

// FLOPs of one training step (forward + backward = 3x forward), counting matmuls and attention:
// per token and layer 2 * (q, k, v, o, gate, up, down weights) + 4 * seq_len * hidden for QK^T and AV,
// plus 2 * hidden * vocab for the output head. Attention is counted without causal halving (the usual
// MFU convention, PaLM appendix B), so every stage is measured against the same work.
double training_flops_per_step(const ModelConfig& model, int64_t batch_size, int64_t seq_len);

struct PeakFlops {
  std::string gpu;     // the table row that matched
  double tflops = 0;   // dense, no sparsity
  std::string source;  // where the figure comes from
};

// Looks the device name up (e.g. "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"). Precision::kFp32 means
// fp32 matmuls without TF32 on NVIDIA (LibTorch's default), the matrix-core fp32 rate on AMD CDNA.
// Unknown GPUs (and the CPU) give nullopt: no guessed MFU.
// allow_tf32: fp32 matmuls on TF32 tensor cores, against the TF32 peak (fp32's where a GPU has no TF32).
std::optional<PeakFlops> peak_flops(const std::string& device_name, Precision precision, bool allow_tf32 = false);

// The GPUs the peak table knows ("H100 SXM, H100 PCIe, ..."), for messages about one it does not.
std::string known_gpus();

}  // namespace tt
