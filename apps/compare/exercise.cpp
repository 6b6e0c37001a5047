#include "apps/compare/exercise.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>

#include "apps/compare/compare.h"
#include "apps/results/text.h"

namespace tt::compare {
namespace {

constexpr const char* kReferencePitfall = "none";

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// GPU ms per step of the profiled kernels whose name contains `part` (case-insensitive); none without a GPU profile.
std::optional<double> kernels_ms(const Row& row, const std::string& part) {
  if (!row.gpu_ms_per_step) return std::nullopt;
  const double steps = row.profile.value("steps", 0.0);
  if (steps <= 0) return std::nullopt;
  double us = 0;
  for (const auto& h : row.profile.value("hotspots", nlohmann::json::array()))
    if (lower(h.value("name", std::string())).find(part) != std::string::npos) us += h.value("total_us", 0.0);
  return us / 1e3 / steps;
}

// The runs of one pitfall, in file order.
struct Stage {
  std::string pitfall, lesson;
  std::vector<const Row*> runs;
  std::vector<double> wall_ms() const {
    std::vector<double> v;
    for (const Row* r : runs) v.push_back(r->median_ms);
    return v;
  }
  // Every run's GPU time per step, or empty when a run has no GPU profile (then the GPU column is "-").
  std::vector<double> gpu_ms() const {
    std::vector<double> v;
    for (const Row* r : runs) {
      if (!r->gpu_ms_per_step) return {};
      v.push_back(*r->gpu_ms_per_step);
    }
    return v;
  }
  template <class F>
  std::optional<double> mean_of(F figure) const {
    std::vector<double> v;
    for (const Row* r : runs)
      if (const std::optional<double> x = figure(*r)) v.push_back(*x);
    return v.empty() ? std::nullopt : std::optional<double>(mean(v));
  }
};

bool within_band(double time_ms, double reference_ms, std::optional<double> band) {
  return band && std::fabs(time_ms / reference_ms - 1.0) <= *band;
}

// The table's speed cell: "ref" for the reference, "noise" inside the band, else reference / this time.
std::string speed_cell(double time_ms, double reference_ms, std::optional<double> band, bool reference) {
  if (reference) return "ref";
  if (std::isnan(time_ms) || std::isnan(reference_ms)) return "-";
  return within_band(time_ms, reference_ms, band) ? "noise" : strprintf("%.2fx", reference_ms / time_ms);
}

std::string ms_or_dash(const std::optional<double>& v) { return v ? strprintf("%.3f", *v) : std::string("-"); }

std::string band_text(const std::optional<double>& band) {
  return band ? strprintf("±%.1f%%", 100.0 * *band) : std::string("unknown (one run each)");
}

// The figure that shows each pitfall's own effect, against v3 as shipped.
std::string own_figure(const Stage& s, const Stage* reference) {
  auto against = [&](const std::optional<double>& mine, const std::optional<double>& theirs, const char* unit) {
    return ms_or_dash(mine) + unit + " against " + ms_or_dash(theirs) + unit + " without the pitfall";
  };
  if (s.pitfall == "missing-init") {
    const auto first = s.mean_of([](const Row& r) { return std::optional<double>(r.first_loss); });
    const auto ref =
        reference ? reference->mean_of([](const Row& r) { return std::optional<double>(r.first_loss); }) : std::nullopt;
    return "first loss " + strprintf("%.2f", first.value_or(NAN)) +
           (ref ? " against " + strprintf("%.2f", *ref) + " with the weights initialised" : std::string());
  }
  if (s.pitfall == "non-contiguous") {
    auto swiglu = [](const Row& r) { return kernels_ms(r, "swiglu"); };
    if (!s.mean_of(swiglu)) return "SwiGLU kernels' GPU time: needs --profile on a GPU";
    return "SwiGLU kernels' GPU time " +
           against(s.mean_of(swiglu), reference ? reference->mean_of(swiglu) : std::nullopt, " ms/step") +
           " (v3 adds one .contiguous() copy instead, which its GPU time per step counts)";
  }
  if (s.pitfall == "no-sync-timing") {
    const auto host = s.mean_of([](const Row& r) { return r.host_clock_step_ms; });
    if (!host) return "host clock: not in these results";
    const bool gpu = !s.gpu_ms().empty();
    return "step by the host clock without a sync " + strprintf("%.3f ms", *host) + " against " +
           strprintf("%.3f ms", mean(s.wall_ms())) + " by device events" +
           (gpu ? " (the host clock measures the launches, not the GPU's work)"
                : " (a CPU run: the work is synchronous, so the two agree)");
  }
  if (s.pitfall == "naive-swiglu") {
    const auto share = s.mean_of([](const Row& r) -> std::optional<double> {
      const auto naive = kernels_ms(r, "naive_");
      return naive && *r.gpu_ms_per_step > 0 ? std::optional<double>(*naive / *r.gpu_ms_per_step) : std::nullopt;
    });
    if (!share) return "naive kernels' share of GPU time: needs --profile on a GPU";
    return "the naive kernels take " + strprintf("%.1f%%", 100.0 * *share) + " of the GPU time per step";
  }
  return "";
}

}  // namespace

double relative_spread(const std::vector<double>& runs) {
  if (runs.size() < 2) return 0;
  const auto [lo, hi] = std::minmax_element(runs.begin(), runs.end());
  const double m = mean(runs);
  return m > 0 ? (*hi - *lo) / m : 0;
}

std::optional<double> noise_band(const std::vector<std::vector<double>>& runs_per_stage) {
  std::optional<double> band;
  for (const auto& runs : runs_per_stage)
    if (runs.size() >= 2) band = std::max(band.value_or(0.0), relative_spread(runs));
  return band;
}

std::optional<double> wall_band_for(const std::vector<std::vector<double>>& wall_runs,
                                    const std::vector<std::vector<double>>& gpu_runs, size_t reference,
                                    std::optional<double> gpu_band) {
  std::optional<double> band = noise_band(wall_runs);
  if (!gpu_band || reference >= gpu_runs.size() || gpu_runs[reference].empty()) return band;
  const double ref_gpu = mean(gpu_runs[reference]);
  std::vector<double> same_work;
  for (size_t i = 0; i < wall_runs.size(); ++i) {
    if (gpu_runs[i].empty() || !within_band(mean(gpu_runs[i]), ref_gpu, gpu_band)) continue;
    same_work.insert(same_work.end(), wall_runs[i].begin(), wall_runs[i].end());
  }
  if (same_work.size() >= 2) band = std::max(band.value_or(0.0), relative_spread(same_work));
  return band;
}

std::string speed_verdict(double time_ms, double reference_ms, std::optional<double> band) {
  const double ratio = time_ms / reference_ms;
  if (within_band(time_ms, reference_ms, band)) return "no speed effect (within noise)";
  const std::string effect = ratio >= 1 ? strprintf("%.2fx slower", ratio) : strprintf("%.2fx faster", 1.0 / ratio);
  return band ? effect : effect + " (noise unknown: one run each)";
}

std::string format_exercise(const Comparison& c) {
  std::vector<Stage> stages;
  for (const auto& r : c.rows) {
    if (r.pitfall.empty()) continue;
    auto it = std::find_if(stages.begin(), stages.end(), [&](const Stage& s) { return s.pitfall == r.pitfall; });
    if (it == stages.end()) it = stages.insert(stages.end(), Stage{r.pitfall, r.lesson, {}});
    it->runs.push_back(&r);
  }
  if (stages.empty()) return "";
  const auto ref_it =
      std::find_if(stages.begin(), stages.end(), [](const Stage& s) { return s.pitfall == kReferencePitfall; });
  const Stage* reference = ref_it == stages.end() ? nullptr : &*ref_it;

  std::vector<std::vector<double>> wall_runs, gpu_runs;
  bool gpu_everywhere = true;
  size_t most_runs = 0;
  for (const auto& s : stages) {
    wall_runs.push_back(s.wall_ms());
    gpu_runs.push_back(s.gpu_ms());
    gpu_everywhere = gpu_everywhere && !gpu_runs.back().empty();
    most_runs = std::max(most_runs, s.runs.size());
  }
  const std::optional<double> gpu_band = gpu_everywhere ? noise_band(gpu_runs) : std::nullopt;
  const size_t reference_index = reference ? static_cast<size_t>(reference - stages.data()) : stages.size();
  const std::optional<double> wall_band = wall_band_for(wall_runs, gpu_runs, reference_index, gpu_band);

  std::string out = "debugging exercise: " + std::to_string(most_runs) + (most_runs == 1 ? " run" : " runs") +
                    " of each stage; speed and verdict against " +
                    (reference ? std::string("none (v3 as shipped)") : std::string("nothing: no --pitfall none run")) +
                    "\n";
  out += "noise band (the largest spread between runs of one stage; for wall time also between all runs with the "
         "reference's GPU time per step): GPU time " +
         (gpu_everywhere ? band_text(gpu_band) : std::string("- (needs --profile on a GPU)")) + ", wall time " +
         band_text(wall_band) + "\n";
  out += strprintf("%-16s %4s %10s %10s %11s %6s %12s %6s %8s\n", "pitfall", "runs", "first loss", "final loss",
                   "GPU ms/step", "speed", "wall ms/step", "speed", "J/step");
  const double ref_wall = reference ? mean(reference->wall_ms()) : NAN;
  const std::vector<double> ref_gpu_runs = reference ? reference->gpu_ms() : std::vector<double>{};
  const double ref_gpu = ref_gpu_runs.empty() ? NAN : mean(ref_gpu_runs);
  for (const auto& s : stages) {
    const double wall = mean(s.wall_ms());
    const std::vector<double> gpu_v = s.gpu_ms();
    const double gpu = gpu_v.empty() ? NAN : mean(gpu_v);  // NaN: no GPU profile
    const auto energy = s.mean_of([](const Row& r) { return r.energy_j_per_step; });
    const bool is_reference = &s == reference;
    out += strprintf("%-16s %4zu %10.4f %10.4f %11s %6s %12.3f %6s %8s\n", s.pitfall.c_str(), s.runs.size(),
                     s.mean_of([](const Row& r) { return std::optional<double>(r.first_loss); }).value_or(NAN),
                     s.mean_of([](const Row& r) { return std::optional<double>(r.final_loss); }).value_or(NAN),
                     std::isnan(gpu) ? "-" : strprintf("%.3f", gpu).c_str(),
                     speed_cell(gpu, ref_gpu, gpu_band, is_reference).c_str(), wall,
                     speed_cell(wall, ref_wall, wall_band, is_reference).c_str(),
                     energy ? strprintf("%.3f", *energy).c_str() : "-");
  }
  out +=
      "speed: the reference's time per step / this one's (means over the runs), \"noise\" inside the noise band; "
      "GPU ms/step: the kernels' time per step from --profile, which launch gaps on the host do not change\n";
  for (const auto& s : stages) {
    if (&s == reference) continue;
    out += "  " + s.pitfall + ": ";
    if (reference) {
      const std::vector<double> gpu_v = s.gpu_ms();
      out += "GPU time: " +
             (gpu_v.empty() || std::isnan(ref_gpu) ? std::string("-") : speed_verdict(mean(gpu_v), ref_gpu, gpu_band)) +
             "; wall time: " + speed_verdict(mean(s.wall_ms()), ref_wall, wall_band) + "\n";
    } else {
      out += "no verdict (no --pitfall none run to compare with)\n";
    }
    if (const std::string figure = own_figure(s, reference); !figure.empty())
      out += "    its own figure: " + figure + "\n";
    out += "    what it teaches: " + s.lesson + "\n";
  }
  return out;
}

}  // namespace tt::compare
