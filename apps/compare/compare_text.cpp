#include "apps/compare/compare_text.h"

#include <algorithm>
#include <cmath>

#include "apps/compare/exercise.h"
#include "apps/results/text.h"

namespace tt::compare {
namespace {

// "+0.0100", "-0.0100", and "0.0000" for a delta that rounds to zero (not "-0.0000").
std::string signed_delta(double delta) {
  const std::string text = strprintf("%+.4f", delta);
  return text == "+0.0000" || text == "-0.0000" ? "0.0000" : text;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

// Columns of the table, in the order every writer uses.
const std::vector<std::string> kHeaders = {
    "stage", "median ms [p10–p90]", "samples/s",  "tokens/s", "speedup", "peak MB", "mem. reduction", "TFLOP/s",
    "MFU",   "kernels/step",        "final loss", "Δ loss",   "J/step"};

std::vector<std::string> row_cells(const Row& r) {
  return {r.label,
          strprintf("%.2f", r.median_ms) + " [" + strprintf("%.2f", r.p10_ms) + "–" + strprintf("%.2f", r.p90_ms) + "]",
          strprintf("%.1f", r.samples_per_s),
          thousands(r.tokens_per_s),
          strprintf("%.2fx", r.speedup),
          r.peak_mb > 0 ? strprintf("%.0f", r.peak_mb) : "-",
          r.reference ? "ref" : r.peak_reduction ? strprintf("%.1f%%", 100.0 * *r.peak_reduction) : "-",
          strprintf(r.tflops >= 1 ? "%.2f" : "%.3g", r.tflops),  // CPU runs reach only 0.0x
          r.mfu ? percent(*r.mfu) : "-",
          r.kernels_per_step
              ? strprintf(std::fmod(*r.kernels_per_step, 1.0) == 0 ? "%.0f" : "%.1f", *r.kernels_per_step)
              : "-",
          strprintf("%.4f", r.final_loss),
          r.reference ? "ref" : signed_delta(r.loss_delta),
          r.energy_j_per_step ? strprintf("%.3f", *r.energy_j_per_step) : "-"};
}

// Terminal columns: count UTF-8 code points, not bytes ("–" and "Δ" are one column wide).
size_t display_width(const std::string& s) {
  size_t n = 0;
  for (unsigned char ch : s)
    if ((ch & 0xC0) != 0x80) ++n;
  return n;
}

std::string pad(const std::string& s, size_t width, bool left) {
  const std::string fill(width > display_width(s) ? width - display_width(s) : 0, ' ');
  return left ? s + fill : fill + s;
}

// A terminal table: each column as wide as its widest cell, two spaces between columns, the first column
// (the stage) left-aligned and the numbers right-aligned.
std::string aligned_table(const std::vector<std::string>& headers, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(headers.size());
  for (size_t k = 0; k < headers.size(); ++k) {
    width[k] = display_width(headers[k]);
    for (const auto& row : rows) width[k] = std::max(width[k], display_width(row[k]));
  }
  std::string out;
  for (size_t k = 0; k < headers.size(); ++k) out += (k ? "  " : "") + pad(headers[k], width[k], k == 0);
  out += "\n";
  for (const auto& row : rows) {
    for (size_t k = 0; k < row.size(); ++k) out += (k ? "  " : "") + pad(row[k], width[k], k == 0);
    out += "\n";
  }
  return out;
}

// A Markdown table: the first column left-aligned, the numbers right-aligned.
std::string markdown_table(const std::vector<std::string>& headers, const std::vector<std::vector<std::string>>& rows) {
  std::string out = "|";
  for (const auto& h : headers) out += " " + h + " |";
  out += "\n|";
  for (size_t k = 0; k < headers.size(); ++k) out += k == 0 ? "---|" : "---:|";
  out += "\n";
  for (const auto& row : rows) {
    out += "|";
    for (const auto& cell : row) out += " " + cell + " |";
    out += "\n";
  }
  return out;
}

std::string context_line(const Comparison& c) {
  std::string line = "config " + c.config_name + " | dtype " + c.dtype + " | device " + c.device_name;
  if (c.peak_tflops) line += " | peak " + strprintf("%.1f", *c.peak_tflops) + " TFLOP/s";
  return line;
}

std::string reference_line(const Comparison& c) {
  const Row& ref = c.rows[c.reference];
  return "reference: " + ref.label + " (" + ref.path + "), " + c.reference_reason +
         "; speedup, mem. reduction and Δ loss are relative to it";
}

std::string memory_line(const Comparison& c) {
  return "peak MB here is summary." + c.memory_field +
         " for every stage: a result replayed its step as a graph, whose activations live in the graph's pool, "
         "which the allocated figure leaves out";
}

constexpr const char* kColumnNotes =
    "median ms: median step time over the measured steps, [p10–p90] its spread; peak MB: peak allocated GPU memory "
    "(\"-\" on the CPU); MFU: achieved / peak dense FLOP/s; kernels/step: from a --profile run (\"-\" without one); "
    "J/step: the GPU's energy per measured step (\"-\" where it was not measured)";

// --- Where the time goes ---------------------------------------------------------------------------

constexpr const char* kBreakdownNote =
    "GPU ms per step by kernel category from each result's --profile steps (apps/compare/kernel_categories.cpp "
    "names the rule); GPU busy: the union of the kernels' intervals; concurrent: kernel time that ran beside other "
    "kernels on a second stream (the overlapped optimizer) or, launched programmatically (sm_90+, "
    "system.programmatic_launch), "
    "while the kernel before it finished: its interval then includes its wait, so busy and the categories overstate "
    "the kernels' work; the categories add up to GPU busy + concurrent; "
    "host gap: median step time - GPU busy: the time the GPU waited for the host, or, where the measured steps ran "
    "slower than the profiled ones (a GPU at its power limit), partly that difference";
constexpr size_t kOtherKernelsListed = 5;

std::vector<std::string> breakdown_headers() {
  std::vector<std::string> h = {"stage", "step ms", "GPU busy", "concurrent"};
  for (auto cat : kernel_categories()) h.push_back(to_string(cat));
  h.push_back(kHostGap);
  return h;
}

std::vector<std::vector<std::string>> breakdown_rows(const std::vector<const Row*>& rows) {
  std::vector<std::vector<std::string>> out;
  for (const Row* r : rows) {
    const TimeBreakdown& b = *r->breakdown;
    std::vector<std::string> cells = {r->label, strprintf("%.3f", b.step_ms), strprintf("%.3f", b.gpu_busy_ms),
                                      strprintf("%.3f", b.concurrent_ms)};
    for (auto cat : kernel_categories()) cells.push_back(strprintf("%.3f", b.ms_per_step[static_cast<size_t>(cat)]));
    cells.push_back(strprintf("%.3f", b.host_gap_ms));
    out.push_back(std::move(cells));
  }
  return out;
}

// The kernels the category rule left in "other", largest first: one line each under a heading line.
std::string other_kernels_text(const Row& r, bool markdown) {
  const std::string bullet = markdown ? "- " : "", item = markdown ? "  - " : "    ", code = markdown ? "`" : "";
  const auto& others = r.breakdown->other_kernels;
  if (others.empty()) return "";
  std::string out =
      bullet + r.label + ": " + std::to_string(others.size()) +
      (others.size() == 1 ? " kernel name" : " kernel names") + " in \"other\" (" +
      strprintf("%.3f ms per step", r.breakdown->ms_per_step[static_cast<size_t>(KernelCategory::kOther)]) + ")" +
      (others.size() > kOtherKernelsListed ? ", the largest:\n" : ":\n");
  for (size_t i = 0; i < others.size() && i < kOtherKernelsListed; ++i)
    out += item + strprintf("%.3f ms  ", others[i].second) + code + short_kernel_name(others[i].first) + code + "\n";
  return out;
}

}  // namespace

const char* const kHostGap = "host gap";

std::string thousands(double value) {
  std::string digits = strprintf("%.0f", std::fabs(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (value < 0 ? "-" : "") + out;
}

std::string percent(double fraction) { return strprintf(fraction < 0.1 ? "%.2f%%" : "%.1f%%", 100.0 * fraction); }

const std::vector<std::string>& table_headers() { return kHeaders; }

std::vector<std::vector<std::string>> table_text(const Comparison& c) {
  std::vector<std::vector<std::string>> out;
  for (const auto& r : c.rows) out.push_back(row_cells(r));
  return out;
}

std::string format_table(const Comparison& c) {
  std::string out = context_line(c) + "\n" + aligned_table(kHeaders, table_text(c));
  out += reference_line(c) + "\n";
  if (c.memory_field != "peak_allocated_mb") out += memory_line(c) + "\n";
  if (!c.mismatches.empty())
    out += "WARNING: these results are not comparable (" + std::to_string(c.mismatches.size()) +
           " differing fields, see above); the ratios compare different work\n";
  return out;
}

std::string to_markdown(const Comparison& c) {
  std::string out = "## TinyTransformer stage comparison\n\n" + context_line(c) + "\n\n";
  if (!c.mismatches.empty()) {
    out += "> **Warning: these results are not comparable** (compared with `--allow-mismatch`):\n";
    for (const auto& d : c.mismatches) out += "> - " + d.describe() + "\n";
    out += "\n";
  }
  auto rows = table_text(c);
  for (size_t i = 0; i < rows.size(); ++i)
    if (c.rows[i].reference) rows[i][0] = "**" + rows[i][0] + "**";
  out += markdown_table(kHeaders, rows);
  out += "\n" + reference_line(c) + ".\n\n" + std::string(kColumnNotes) + ".\n";
  if (const std::string lessons = format_exercise(c); !lessons.empty()) out += "\n```\n" + lessons + "```\n";
  if (c.memory_field != "peak_allocated_mb") out += memory_line(c) + ".\n";
  if (c.has_breakdown()) out += "\n" + time_breakdown_markdown(c);
  if (!c.mfu_note.empty()) out += "MFU basis: " + c.mfu_note + ".\n";
  if (!c.notes.empty()) {
    out += "\nNotes (differences that do not stop the comparison):\n\n";
    for (const auto& d : c.notes) out += "- " + d.describe() + "\n";
  }
  out += "\nFiles:\n\n";
  for (const auto& r : c.rows) out += "- " + r.label + ": `" + r.path + "`\n";
  return out;
}

std::string to_csv(const Comparison& c) {
  std::string out = "label,stage,file,median_ms,p10_ms,p90_ms,samples_per_s,tokens_per_s,speedup," + c.memory_field +
                    ",peak_reduction,achieved_tflops,mfu,kernels_per_step,final_loss,final_loss_delta,reference,"
                    "energy_j_per_step,tokens_per_joule,average_power_w\n";
  auto opt = [](const std::optional<double>& v) { return v ? strprintf("%.6g", *v) : std::string(); };
  for (const auto& r : c.rows) {
    out += csv_field(r.label) + "," + csv_field(r.stage) + "," + csv_field(r.path) + "," +
           strprintf("%.6g", r.median_ms) + "," + strprintf("%.6g", r.p10_ms) + "," + strprintf("%.6g", r.p90_ms) +
           "," + strprintf("%.6g", r.samples_per_s) + "," + strprintf("%.6g", r.tokens_per_s) + "," +
           strprintf("%.6g", r.speedup) + "," + (r.peak_mb > 0 ? strprintf("%.6g", r.peak_mb) : "") + "," +
           opt(r.peak_reduction) + "," + strprintf("%.6g", r.tflops) + "," + opt(r.mfu) + "," +
           opt(r.kernels_per_step) + "," + strprintf("%.6g", r.final_loss) + "," + strprintf("%.6g", r.loss_delta) +
           "," + (r.reference ? "yes" : "no") + "," + opt(r.energy_j_per_step) + "," + opt(r.tokens_per_joule) + "," +
           opt(r.average_power_w) + "\n";
  }
  return out;
}

std::string format_time_breakdown(const Comparison& c) {
  const auto rows = c.profiled_rows();
  if (rows.empty()) return "";
  std::string out = "where the time goes (ms per step)\n" + aligned_table(breakdown_headers(), breakdown_rows(rows));
  out += std::string(kBreakdownNote) + "\n";
  for (const Row* r : rows) out += other_kernels_text(*r, /*markdown=*/false);
  return out;
}

std::string time_breakdown_markdown(const Comparison& c) {
  const auto rows = c.profiled_rows();
  if (rows.empty()) return "";
  std::string out = "### Where the time goes (ms per step)\n\n" + markdown_table(breakdown_headers(), breakdown_rows(rows));
  out += "\n" + std::string(kBreakdownNote) + ".\n\n";
  for (const Row* r : rows) out += other_kernels_text(*r, /*markdown=*/true);
  return out;
}

}  // namespace tt::compare
