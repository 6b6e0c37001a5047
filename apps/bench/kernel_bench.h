// The kernel benchmark: every implementation in the catalog (models/stage.h) of each component family,
// timed side by side at the workshop and medium model shapes (and, asked for, long sequences), forward and
// forward + backward, in fp32 and bf16. A new catalog entry is benchmarked without touching this file.
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
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tt::bench {

struct BenchShape {
  std::string name;
  int64_t batch, seq, hidden, heads, kv_heads, ffn, vocab;
  int64_t tokens() const { return batch * seq; }
  int64_t head_dim() const { return hidden / heads; }
};
// workshop, medium (the default), and other lengths for attention: long-context, d64-s256, d64-s1024, d64-s2048,
// d128-s1024, d128-s2048, d128-s4096.
const std::vector<BenchShape>& shapes();
// The benchmarked families, in order, named after the ops: embedding, rms_norm, rope, attention, swiglu and
// cross_entropy (one per catalog component), rope_qkv (RoPE's fused-QKV forms), attention_rope (RoPE and
// attention from the fused QKV output, as v4 needs them), plus sdpa_gqa (the measurement behind the SDPA entry's fp32
// GQA rule) and adamw (the optimizer step over one layer's and the embedding's parameters).
const std::vector<std::string>& families();
const std::vector<std::string>& dtypes();  // fp32, bf16, fp16

struct BenchOptions {
  std::vector<std::string> families, shapes, dtypes;
  int64_t warmup = 10, repeats = 100, flush_mib = 512, device_index = 0;
  std::string output = "results/kernel_bench.json";
};

// Runs the benchmark on the GPU, prints the table on `out` and writes the JSON report. Returns the exit
// code: 0, or 1 when there is no GPU or the report cannot be written. Errors go to `err`.
int run(const BenchOptions& options, std::ostream& out, std::ostream& err);

}  // namespace tt::bench
