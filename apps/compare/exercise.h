// The debugging exercise's summary (scripts/debugging_stages.sh, docs/debugging.md): each pitfall's runs
// against v3 as shipped (--pitfall none), with a noise band stated from the repeats, so that a difference
// inside the band reads "no speed effect (within noise)" instead of a speedup, and each pitfall's own figure
// (first loss, SwiGLU kernels' GPU time, host clock against device events, the naive kernels' share).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tt::compare {

struct Comparison;

// The spread of repeated runs of one stage relative to their mean: (max - min) / mean; 0 for one run.
double relative_spread(const std::vector<double>& runs);

// The noise band from the repeats: the largest relative_spread over the stages run at least twice; none
// when no stage was.
std::optional<double> noise_band(const std::vector<std::vector<double>>& runs_per_stage);

// The wall-time band: noise_band(wall_runs), widened to the spread of all runs of the stages whose mean GPU time
// per step is within gpu_band of the reference's (stages[reference]). Those runs give the GPU the same work, so
// their wall times differ by host noise only; two repeats of one stage alone understate it (H100, fp32
// workshop: repeats within 10%, while three stages with the same GPU time differed by 21% in wall time). With
// no GPU band (no profile) it is noise_band(wall_runs).
std::optional<double> wall_band_for(const std::vector<std::vector<double>>& wall_runs,
                                    const std::vector<std::vector<double>>& gpu_runs, size_t reference,
                                    std::optional<double> gpu_band);

// A pitfall's time per step against the reference's (both means over their runs): "no speed effect (within
// noise)" when |time / reference - 1| <= band, else "1.32x slower" / "1.10x faster", with "(noise unknown:
// one run each)" when there is no band.
std::string speed_verdict(double time_ms, double reference_ms, std::optional<double> band);

// The summary, one block per pitfall; empty when no result records a pitfall.
std::string format_exercise(const Comparison& comparison);

}  // namespace tt::compare
