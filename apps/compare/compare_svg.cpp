#include "apps/compare/compare_svg.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "apps/compare/compare_text.h"
#include "apps/results/text.h"

namespace tt::compare {
namespace {

// Geometry of the bar panels, in px of the 1000 px wide chart: stage labels end at kLabelRight, bars run from
// kBarLeft to kBarRight, and the label after a bar fits in the rest.
constexpr double kWidth = 1000, kLabelRight = 232, kBarLeft = 242, kBarRight = 742;
constexpr double kBarHeight = 22, kRowGap = 10, kPanelTitle = 44, kAxis = 30, kPanelGap = 26;
// The breakdown's bars end at 770 px: the label after the longest bar ("31.14 ms (GPU busy 17%)") fits.
constexpr double kBreakdownBarRight = 770;

const char* const kPalette[] = {"#4C78A8", "#F58518", "#54A24B", "#E45756",
                                "#72B7B2", "#B279A2", "#9D755D", "#EECA3B"};
// One colour per category in kernel_categories() order, then the host gap's.
const char* const kCategoryColours[kKernelCategoryCount] = {"#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2",
                                                            "#B279A2", "#9D755D", "#EECA3B", "#FF9DA6", "#BAB0AC"};
constexpr const char* kHostGapColour = "#F2F2F2";

std::string num(double v) { return strprintf("%.1f", v); }

// Stage labels get about 210 px left of the bars; longer ones ("v2_fused (run_.../v2_fused)") are cut, and the
// bar's tooltip keeps the full label.
std::string fit_label(const std::string& label) {
  constexpr size_t kMaxChars = 26;
  return label.size() <= kMaxChars ? label : label.substr(0, kMaxChars - 1) + "…";
}

// The opening of a chart `height` px high, white behind.
std::string svg_header(double height) {
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + strprintf("%g", kWidth) + "\" height=\"" + num(height) +
         "\" viewBox=\"0 0 " + strprintf("%g", kWidth) + " " + num(height) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" "
         "fill=\"white\"/>\n";
}

// The chart's body being written: the three elements every panel draws, text escaped.
class Svg {
 public:
  std::string str() const { return out_.str(); }
  void text(double x, double y, const std::string& s, const std::string& attrs) {
    out_ << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" " << attrs << ">" << xml_escape(s) << "</text>\n";
  }
  void line(double x1, double y1, double x2, double y2, const std::string& attrs) {
    out_ << "<line x1=\"" << num(x1) << "\" y1=\"" << num(y1) << "\" x2=\"" << num(x2) << "\" y2=\"" << num(y2)
         << "\" " << attrs << "/>\n";
  }
  // width and height as the caller formats them; a tooltip when title is not empty.
  void rect(double x, double y, const std::string& width, const std::string& height, const std::string& attrs,
            const std::string& title = "") {
    out_ << "<rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << width << "\" height=\"" << height
         << "\" " << attrs << ">" << (title.empty() ? "" : "<title>" + xml_escape(title) + "</title>") << "</rect>\n";
  }
  void append(const Svg& other) { out_ << other.out_.str(); }

 private:
  std::ostringstream out_;
};

// --- The bar panels ---------------------------------------------------------------------------------

// One panel of horizontal bars, a bar per row of the comparison; labels[i] goes after bar i.
struct Panel {
  std::string title, subtitle;
  std::vector<double> values;
  std::vector<std::string> labels;
};
// Where a value's bar ends (x in px).
using Scale = std::function<double(double)>;

Scale linear_scale(const std::vector<double>& values) {
  const double max = *std::max_element(values.begin(), values.end());
  return [=](double v) { return kBarLeft + (max > 0 ? v / max : 0) * (kBarRight - kBarLeft); };
}

double panel_height(const Comparison& c) {
  return kPanelTitle + static_cast<double>(c.rows.size()) * (kBarHeight + kRowGap) + kAxis;
}

void draw_bars(Svg& svg, const Comparison& c, double y, const Panel& p, const Scale& position) {
  svg.text(20, y + 20, p.title, "font-size=\"15\" font-weight=\"bold\" fill=\"#222\"");
  svg.text(20, y + 37, p.subtitle, "font-size=\"12\" fill=\"#666\"");
  double row_y = y + kPanelTitle;
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const Row& row = c.rows[i];
    const double end = std::max(kBarLeft + 1, position(p.values[i]));
    svg.text(kLabelRight, row_y + kBarHeight * 0.7, fit_label(row.label),
             std::string("font-size=\"13\" text-anchor=\"end\" fill=\"#222\"") +
                 (row.reference ? " font-weight=\"bold\"" : ""));
    svg.rect(kBarLeft, row_y, num(end - kBarLeft), num(kBarHeight),
             std::string("fill=\"") + kPalette[i % (sizeof kPalette / sizeof kPalette[0])] + "\"",
             row.label + ": " + p.labels[i]);
    svg.text(end + 6, row_y + kBarHeight * 0.7, p.labels[i], "font-size=\"12\" fill=\"#222\"");
    row_y += kBarHeight + kRowGap;
  }
  svg.line(kBarLeft, y + kPanelTitle - 4, kBarLeft, row_y, "stroke=\"#888\"");
}

Panel throughput_panel(const Comparison& c) {
  Panel p{"Throughput (tokens/s, higher is better)", "bar label: tokens/s and speedup over the reference", {}, {}};
  for (const auto& r : c.rows) {
    p.values.push_back(r.tokens_per_s);
    p.labels.push_back(thousands(r.tokens_per_s) + " tokens/s  (" + strprintf("%.2fx", r.speedup) + ")");
  }
  return p;
}

Panel memory_panel(const Comparison& c) {
  Panel p{c.memory_field == "peak_allocated_mb" ? "Peak allocated GPU memory (MB, lower is better)"
                                                : "Peak reserved GPU memory (MB, lower is better)",
          "caching-allocator peak over the measured steps",
          {},
          {}};
  for (const auto& r : c.rows) {
    p.values.push_back(r.peak_mb);
    std::string label = r.peak_mb > 0 ? strprintf("%.0f MB", r.peak_mb) : "not measured (CPU)";
    if (!r.reference && r.peak_reduction)
      label += "  (" + strprintf("%.1f%%", 100.0 * std::fabs(*r.peak_reduction)) +
               (*r.peak_reduction >= 0 ? " less)" : " more)");
    p.labels.push_back(label);
  }
  return p;
}

// "  (1,526 tokens/J, 516 W)", or as much of it as the result has.
std::string energy_details(const Row& r) {
  std::string details;
  if (r.tokens_per_joule) details = thousands(*r.tokens_per_joule) + " tokens/J";
  if (r.average_power_w) details += (details.empty() ? "" : ", ") + strprintf("%.0f W", *r.average_power_w);
  return details.empty() ? details : "  (" + details + ")";
}

Panel energy_panel(const Comparison& c) {
  Panel p{"GPU energy per step (J, lower is better)",
          "the GPU's energy counter over the measured steps (or extra ones); W: the mean draw over that window",
          {},
          {}};
  for (const auto& r : c.rows) {
    p.values.push_back(r.energy_j_per_step.value_or(0));
    p.labels.push_back(r.energy_j_per_step ? strprintf("%.3f J/step", *r.energy_j_per_step) + energy_details(r)
                                           : "not measured");
  }
  return p;
}

// Achieved TFLOP/s against the GPU's peak: a log axis, as in a roofline plot, with the peak as the ceiling; a
// linear axis and no ceiling when the GPU's peak is unknown.
void draw_flops(Svg& svg, const Comparison& c, double y) {
  Panel p;
  for (const auto& r : c.rows) {
    p.values.push_back(r.tflops);
    p.labels.push_back(strprintf("%.3g TFLOP/s", r.tflops) + (r.mfu ? "  (MFU " + percent(*r.mfu) + ")" : ""));
  }
  if (!(c.peak_tflops && *c.peak_tflops > 0)) {
    p.title = "Achieved TFLOP/s (higher is better)";
    p.subtitle = "no peak FLOP/s known for '" + c.device_name + "': no ceiling and no MFU";
    draw_bars(svg, c, y, p, linear_scale(p.values));
    return;
  }
  const double peak = *c.peak_tflops;
  const double top = y + kPanelTitle - 4;
  const double bottom = y + kPanelTitle + static_cast<double>(c.rows.size()) * (kBarHeight + kRowGap);
  double smallest = peak;
  for (double f : p.values)
    if (f > 0) smallest = std::min(smallest, f);
  const double lo = std::pow(10.0, std::floor(std::log10(smallest)));
  const double hi = std::pow(10.0, std::ceil(std::log10(peak * 1.0001)));
  const Scale position = [=](double v) {
    const double t = (std::log10(std::max(v, lo)) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return kBarLeft + t * (kBarRight - kBarLeft);
  };
  for (double d = lo; d <= hi * 1.0001; d *= 10) {
    const double x = position(d);
    svg.line(x, top, x, bottom, "stroke=\"#ddd\"");
    svg.text(x, bottom + 16, strprintf("%g", d), "font-size=\"11\" text-anchor=\"middle\" fill=\"#666\"");
  }
  svg.text(kBarRight + 40, bottom + 16, "TFLOP/s (log scale)", "font-size=\"11\" fill=\"#666\"");
  p.title = "Achieved TFLOP/s against the GPU's peak (higher is better)";
  p.subtitle = "model FLOPs per step / median step time; red line: peak dense " + c.dtype + " TFLOP/s of the GPU";
  draw_bars(svg, c, y, p, position);
  const double px = position(peak);
  svg.line(px, top, px, bottom, "stroke=\"#C0392B\" stroke-width=\"2\" stroke-dasharray=\"6,4\"");
  svg.text(px - 4, top + 10, strprintf("peak %.1f", peak), "font-size=\"11\" text-anchor=\"end\" fill=\"#C0392B\"");
}

// --- Where the time goes ----------------------------------------------------------------------------

// The categories and the host gap, in bar order, wrapped at 960 px from baseline ly; returns the last line's.
double draw_legend(Svg& svg, double ly) {
  double lx = 20;
  auto entry = [&](const char* colour, const std::string& name) {
    const double w = 16 + 7.0 * static_cast<double>(name.size()) + 14;
    if (lx + w > 960) {
      lx = 20;
      ly += 18;
    }
    svg.rect(lx, ly - 10, "12", "12", std::string("fill=\"") + colour + "\" stroke=\"#999\" stroke-width=\"0.5\"");
    svg.text(lx + 16, ly, name, "font-size=\"12\" fill=\"#222\"");
    lx += w;
  };
  for (auto cat : kernel_categories()) entry(kCategoryColours[static_cast<size_t>(cat)], to_string(cat));
  entry(kHostGapColour, kHostGap);
  return ly;
}

// One block of stacked bars under `subtitle`, a bar per profiled row from row_y: `px_per_ms` scales a row's
// bar, `note` labels its end. Returns the y below the block.
double draw_stacked(Svg& svg, const std::vector<const Row*>& rows, double row_y, const std::string& subtitle,
                    const std::function<double(const TimeBreakdown&)>& px_per_ms,
                    const std::function<std::string(const TimeBreakdown&)>& note) {
  svg.text(kLabelRight, row_y + 4, subtitle, "font-size=\"12\" text-anchor=\"end\" font-style=\"italic\" fill=\"#555\"");
  row_y += 12;
  for (const Row* r : rows) {
    const TimeBreakdown& b = *r->breakdown;
    svg.text(kLabelRight, row_y + kBarHeight * 0.7, fit_label(r->label),
             "font-size=\"13\" text-anchor=\"end\" fill=\"#222\"");
    const double scale = px_per_ms(b);
    double x = kBarLeft;
    auto segment = [&](double ms, const char* colour, const std::string& name) {
      if (ms <= 0) return;
      svg.rect(x, row_y, strprintf("%.2f", ms * scale), num(kBarHeight),
               std::string("fill=\"") + colour + "\" stroke=\"#fff\" stroke-width=\"0.5\"",
               r->label + ": " + name + " " +
                   strprintf("%.3f ms per step (%.0f%% of the step)", ms, b.step_ms > 0 ? 100.0 * ms / b.step_ms : 0.0));
      x += ms * scale;
    };
    for (auto cat : kernel_categories())
      segment(b.ms_per_step[static_cast<size_t>(cat)], kCategoryColours[static_cast<size_t>(cat)], to_string(cat));
    segment(b.host_gap_ms, kHostGapColour, kHostGap);
    svg.rect(kBarLeft, row_y, strprintf("%.2f", x - kBarLeft), num(kBarHeight), "fill=\"none\" stroke=\"#888\"");
    svg.text(x + 6, row_y + kBarHeight * 0.7, note(b), "font-size=\"12\" fill=\"#222\"");
    row_y += kBarHeight + kRowGap;
  }
  return row_y + 8;
}

// Where the time goes at vertical offset y: on one scale for every stage, then each step as 100%. Returns the
// height used; 0 (nothing drawn) when no row has a GPU profile.
double draw_breakdown(Svg& svg, const Comparison& c, double y) {
  const auto rows = c.profiled_rows();
  if (rows.empty()) return 0;
  svg.text(20, y + 20, "Where the time goes (GPU ms per step by kernel category, and the host gap)",
           "font-size=\"15\" font-weight=\"bold\" fill=\"#222\"");
  const bool concurrent =
      std::any_of(rows.begin(), rows.end(), [](const Row* r) { return r->breakdown->concurrent_ms >= 0.005; });
  svg.text(20, y + 37,
           "from --profile; above, one scale for every stage (the bar is the median step); below, each step as 100%; "
           "host gap = step time - GPU busy",
           "font-size=\"12\" fill=\"#666\"");
  double row_y = draw_legend(svg, y + 56) + 16;
  double max_ms = 0;
  // A bar stacks the categories (busy + concurrent) and the host gap.
  auto bar_ms = [](const TimeBreakdown& b) {
    return std::max(b.step_ms, b.gpu_busy_ms + b.concurrent_ms + b.host_gap_ms);
  };
  for (const Row* r : rows) max_ms = std::max(max_ms, bar_ms(*r->breakdown));
  const double width = kBreakdownBarRight - kBarLeft;
  row_y = draw_stacked(
      svg, rows, row_y, "ms per step", [&](const TimeBreakdown&) { return max_ms > 0 ? width / max_ms : 0; },
      [](const TimeBreakdown& b) {
        return strprintf("%.2f ms (GPU busy %.0f%%)", b.step_ms, b.step_ms > 0 ? 100.0 * b.gpu_busy_ms / b.step_ms : 0.0) +
               (b.concurrent_ms >= 0.005 ? "*" : "");
      });
  row_y = draw_stacked(
      svg, rows, row_y, "share of the step",
      [&](const TimeBreakdown& b) {
        const double total = bar_ms(b);
        return total > 0 ? width / total : 0;
      },
      [&](const TimeBreakdown& b) {
        const double total = bar_ms(b);
        return strprintf("GEMM %.0f%%, host gap %.0f%%",
                         total > 0 ? 100.0 * b.ms_per_step[static_cast<size_t>(KernelCategory::kGemm)] / total : 0.0,
                         total > 0 ? 100.0 * b.host_gap_ms / total : 0.0);
      });
  if (concurrent) {
    svg.text(20, row_y + 4,
             "* kernels ran at once (on two streams, or launched programmatically on sm_90+): the categories add up "
             "to more than GPU busy",
             "font-size=\"12\" fill=\"#666\"");
    row_y += 18;
  }
  return row_y - y + 10;
}

// The chart's title, what it is relative to, and a warning when the results are not comparable.
void draw_title(Svg& svg, const Comparison& c) {
  svg.text(20, 32, "TinyTransformer stages: " + c.config_name + ", " + c.dtype + ", " + c.device_name,
           "font-size=\"20\" font-weight=\"bold\" fill=\"#222\"");
  svg.text(20, 56,
           "Speedup, memory and loss relative to " + c.rows[c.reference].label +
               ". Median step time over the measured steps.",
           "font-size=\"13\" fill=\"#555\"");
  if (!c.mismatches.empty())
    svg.text(20, 74,
             "Warning: results are not comparable (" + std::to_string(c.mismatches.size()) + " differing fields)",
             "font-size=\"13\" fill=\"#C0392B\" font-weight=\"bold\"");
}

}  // namespace

std::string to_svg(const Comparison& c, bool with_breakdown) {
  constexpr double kPanelsTop = 84;
  const double step = panel_height(c) + kPanelGap;
  // A fourth panel, energy per step, when a result measured it.
  const bool energy = std::any_of(c.rows.begin(), c.rows.end(), [](const Row& r) { return r.energy_j_per_step; });
  const double panels_end = kPanelsTop + (energy ? 4 : 3) * step;
  // The last panel, where the time goes, when a result has a GPU profile.
  Svg breakdown;
  const double breakdown_height = with_breakdown ? draw_breakdown(breakdown, c, panels_end) : 0;

  Svg svg;
  draw_title(svg, c);
  double y = kPanelsTop;
  const Panel throughput = throughput_panel(c);
  draw_bars(svg, c, y, throughput, linear_scale(throughput.values));
  y += step;
  const Panel memory = memory_panel(c);
  draw_bars(svg, c, y, memory, linear_scale(memory.values));
  y += step;
  draw_flops(svg, c, y);
  y += step;
  if (energy) {
    const Panel joules = energy_panel(c);
    draw_bars(svg, c, y, joules, linear_scale(joules.values));
    y += step;
  }
  svg.append(breakdown);
  y += breakdown_height;
  svg.text(20, y + 4,
           "Generated by compare from " + std::to_string(c.rows.size()) +
               " result files; see comparison.md for the full table.",
           "font-size=\"11\" fill=\"#888\"");
  return svg_header(panels_end + breakdown_height + 36) + svg.str() + "</svg>\n";
}

std::string time_breakdown_svg(const Comparison& c) {
  Svg body;
  const double height = draw_breakdown(body, c, 0);
  if (height == 0) return "";
  return svg_header(height) + body.str() + "</svg>\n";
}

}  // namespace tt::compare
