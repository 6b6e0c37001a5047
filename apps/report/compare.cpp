#include "apps/report/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "apps/report/exercise.h"
#include "apps/report/results.h"
#include "apps/train/format.h"

namespace tt::compare {
namespace {

namespace fs = std::filesystem;

constexpr const char* kReferenceStage = "v1_baseline";
// Training fields that change neither the work of a step nor the loss curve; the dtype is compared once,
// as training.dtype.
const std::set<std::string> kUncomparedTrainingFields = {"log_every", "device", "dtype"};
const char* const kNoteFields[] = {"system.libtorch_version", "system.runtime_version", "system.driver_version",
                                   "system.backend",          "system.git_commit",      "system.hostname"};

// 1234567.8 -> "1,234,568"
std::string thousands(double value) {
  std::string digits = strprintf("%.0f", std::fabs(value));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (value < 0 ? "-" : "") + out;
}

// Utilisation as a percentage; below 10 % with two decimals, or small models' stages all read "0.2%".
std::string percent(double fraction) { return strprintf(fraction < 0.1 ? "%.2f%%" : "%.1f%%", 100.0 * fraction); }

// "+0.0100", "-0.0100", and "0.0000" for a delta that rounds to zero (not "-0.0000").
std::string signed_delta(double delta) {
  const std::string text = strprintf("%+.4f", delta);
  return text == "+0.0000" || text == "-0.0000" ? "0.0000" : text;
}

std::string value_text(const nlohmann::json* v) {
  if (!v) return "(missing)";
  return v->is_string() ? "\"" + v->get<std::string>() + "\"" : v->dump();
}

const nlohmann::json* find(const nlohmann::json& root, const std::string& dotted) {
  const nlohmann::json* node = &root;
  std::stringstream parts(dotted);
  std::string key;
  while (std::getline(parts, key, '.')) {
    if (!node->is_object() || !node->contains(key)) return nullptr;
    node = &(*node)[key];
  }
  return node;
}

std::optional<double> number_at(const nlohmann::json& root, const std::string& dotted) {
  const auto* v = find(root, dotted);
  return v && v->is_number() ? std::optional<double>(v->get<double>()) : std::nullopt;
}

void compare_field(const Result& first, const Result& other, const std::string& field, std::vector<Difference>& out) {
  const auto* a = find(first.json, field);
  const auto* b = find(other.json, field);
  if ((a == nullptr) != (b == nullptr) || (a && *a != *b))
    out.push_back({field, first.path, value_text(a), other.path, value_text(b)});
}

std::set<std::string> keys_of(const nlohmann::json* a, const nlohmann::json* b) {
  std::set<std::string> keys;
  for (const auto* obj : {a, b})
    if (obj && obj->is_object())
      for (const auto& [k, v] : obj->items()) keys.insert(k);
  return keys;
}

// Stage labels in the SVG get about 210 px left of the bars; longer ones ("v2_fused (run_.../v2_fused)") are cut,
// and the bar's tooltip keeps the full label.
std::string fit_label(const std::string& label) {
  constexpr size_t kMaxChars = 26;
  return label.size() <= kMaxChars ? label : label.substr(0, kMaxChars - 1) + "…";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

// Columns of the table, in the order every writer uses.
struct Cell {
  std::string text;
  bool left = false;
};
const std::vector<std::string> kHeaders = {
    "stage", "median ms [p10–p90]", "samples/s",  "tokens/s", "speedup", "peak MB", "mem. reduction", "TFLOP/s",
    "MFU",   "kernels/step",        "final loss", "Δ loss",   "J/step"};

std::vector<std::vector<Cell>> table_cells(const Comparison& c) {
  std::vector<std::vector<Cell>> rows;
  for (const auto& r : c.rows) {
    std::vector<Cell> cells;
    cells.push_back({r.label, true});
    cells.push_back({strprintf("%.2f", r.median_ms) + " [" + strprintf("%.2f", r.p10_ms) + "–" +
                     strprintf("%.2f", r.p90_ms) + "]"});
    cells.push_back({strprintf("%.1f", r.samples_per_s)});
    cells.push_back({thousands(r.tokens_per_s)});
    cells.push_back({strprintf("%.2fx", r.speedup)});
    cells.push_back({r.peak_mb > 0 ? strprintf("%.0f", r.peak_mb) : "-"});
    cells.push_back({r.reference ? "ref" : r.peak_reduction ? strprintf("%.1f%%", 100.0 * *r.peak_reduction) : "-"});
    cells.push_back({strprintf(r.tflops >= 1 ? "%.2f" : "%.3g", r.tflops)});  // CPU runs reach only 0.0x
    cells.push_back({r.mfu ? percent(*r.mfu) : "-"});
    cells.push_back({r.kernels_per_step
                         ? strprintf(std::fmod(*r.kernels_per_step, 1.0) == 0 ? "%.0f" : "%.1f", *r.kernels_per_step)
                         : "-"});
    cells.push_back({strprintf("%.4f", r.final_loss)});
    cells.push_back({r.reference ? "ref" : signed_delta(r.loss_delta)});
    cells.push_back({r.energy_j_per_step ? strprintf("%.3f", *r.energy_j_per_step) : "-"});
    rows.push_back(std::move(cells));
  }
  return rows;
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

}  // namespace

void assign_labels(std::vector<Result>& results) {
  std::map<std::string, int> count;
  // A run of the debugging exercise is labelled with its pitfall: "v3_custom [missing-init]".
  const auto stage_of = [](const Result& r) {
    const std::string name = r.json["stage"]["name"];
    const auto* pitfall = find(r.json, "stage.pitfall.name");
    return pitfall && pitfall->is_string() ? name + " [" + pitfall->get<std::string>() + "]" : name;
  };
  for (const auto& r : results) ++count[stage_of(r)];
  for (auto& r : results) {
    const std::string stage = stage_of(r);
    r.label = stage;
    if (count[stage] > 1) {
      const fs::path p(r.path);
      const std::string parent = p.parent_path().filename().string();
      r.label += " (" + (parent.empty() ? "" : parent + "/") + p.stem().string() + ")";
    }
  }
}

std::string Difference::describe() const {
  return field + ": '" + first_path + "' has " + first_value + ", '" + other_path + "' has " + other_value;
}

Result load_result(const std::string& path) {
  if (!fs::exists(path)) throw std::runtime_error("result file '" + path + "' does not exist");
  Result r{path, "", read_json_file(path)};
  try {
    validate_result_json(r.json);
  } catch (const std::exception& e) {
    std::string hint;
    if (path.size() > 11 && path.compare(path.size() - 11, 11, ".trace.json") == 0)
      hint = " (this looks like a --profile trace; pass the result JSON next to it)";
    throw std::runtime_error("'" + path + "' is not a valid result file: " + e.what() + hint);
  }
  return r;
}

std::vector<Result> load_results(const std::vector<std::string>& paths) {
  std::vector<Result> results;
  for (size_t i = 0; i < paths.size(); ++i) {
    // The same file twice would be a row compared with itself.
    std::error_code ec;
    for (size_t j = 0; j < i; ++j)
      if (paths[j] == paths[i] || std::filesystem::equivalent(paths[j], paths[i], ec))
        throw std::runtime_error("'" + paths[i] + "' is given twice (as '" + paths[j] + "'); give each result once");
    results.push_back(load_result(paths[i]));
  }
  assign_labels(results);
  return results;
}

std::vector<Difference> find_mismatches(const std::vector<Result>& results) {
  std::vector<Difference> out;
  for (size_t i = 1; i < results.size(); ++i) {
    const Result& first = results[0];
    const Result& other = results[i];
    compare_field(first, other, "schema_version", out);
    for (const auto& key : keys_of(find(first.json, "config.model"), find(other.json, "config.model")))
      compare_field(first, other, "config.model." + key, out);
    for (const auto& key : keys_of(find(first.json, "config.training"), find(other.json, "config.training")))
      if (!kUncomparedTrainingFields.count(key)) compare_field(first, other, "config.training." + key, out);
    compare_field(first, other, "training.dtype", out);
    compare_field(first, other, "system.device_name", out);
    // Data parallel: config.training.batch_size is per rank, so the global batch (and the losses) change with the
    // ranks. A plain run is one rank, as a 1-rank launch is (their results are equal).
    auto world_size = [](const Result& r) {
      const auto* w = find(r.json, "distributed.world_size");
      return w ? *w : nlohmann::json(1);
    };
    if (world_size(first) != world_size(other))
      out.push_back({"distributed.world_size", first.path, world_size(first).dump(), other.path,
                     world_size(other).dump()});
  }
  return out;
}

std::vector<Difference> find_notes(const std::vector<Result>& results) {
  std::vector<Difference> out;
  for (size_t i = 1; i < results.size(); ++i)
    for (const char* field : kNoteFields) compare_field(results[0], results[i], field, out);
  return out;
}

Comparison build_comparison(const std::vector<Result>& results, std::optional<size_t> reference) {
  if (results.empty()) throw std::invalid_argument("build_comparison: no results");
  Comparison c;
  if (reference) {
    if (*reference >= results.size()) throw std::invalid_argument("build_comparison: reference index out of range");
    c.reference = *reference;
    c.reference_reason = "the --baseline result";
  } else {
    const auto v1 = std::find_if(results.begin(), results.end(),
                                 [](const Result& r) { return r.json["stage"]["name"] == kReferenceStage; });
    const auto shipped = std::find_if(results.begin(), results.end(), [](const Result& r) {
      const auto* pitfall = find(r.json, "stage.pitfall.name");
      return pitfall && *pitfall == "none";
    });
    c.reference = v1 != results.end()        ? static_cast<size_t>(v1 - results.begin())
                  : shipped != results.end() ? static_cast<size_t>(shipped - results.begin())
                                             : 0;
    c.reference_reason = v1 != results.end() ? std::string("the ") + kReferenceStage + " result"
                         : shipped != results.end()
                             ? std::string("v3 as shipped (--pitfall none), the debugging exercise's stage 5")
                             : std::string("the first file (no ") + kReferenceStage + " result given)";
  }
  // Only a step that replayed a graph on a GPU: on the CPU the graph stage runs eagerly, though its step
  // description names graphs ("eager: ... (this run is on the CPU: graphs need a GPU)"), and there is no GPU
  // memory at all.
  for (const auto& r : results) {
    const auto* step = find(r.json, "stage.components.step");
    const auto* device = find(r.json, "system.device");
    const bool on_gpu = device && device->is_string() && device->get<std::string>() != "cpu";
    if (on_gpu && step && step->is_string() && step->get<std::string>().find("graph") != std::string::npos)
      c.memory_field = "peak_reserved_mb";
  }
  const nlohmann::json& ref = results[c.reference].json;
  const double ref_median = ref["summary"]["step_ms"]["median"];
  const double ref_peak = ref["summary"][c.memory_field];
  // A diverged run's loss is NaN or inf, which the file holds as null.
  const auto loss_of = [](const nlohmann::json& summary) {
    return summary["final_loss"].is_number() ? summary["final_loss"].get<double>() : std::nan("");
  };
  const double ref_loss = loss_of(ref["summary"]);
  for (size_t i = 0; i < results.size(); ++i) {
    const nlohmann::json& j = results[i].json;
    const nlohmann::json& s = j["summary"];
    Row row;
    row.label = results[i].label.empty() ? j["stage"]["name"].get<std::string>() : results[i].label;
    row.stage = j["stage"]["name"];
    row.path = results[i].path;
    row.median_ms = s["step_ms"]["median"];
    row.p10_ms = s["step_ms"]["p10"];
    row.p90_ms = s["step_ms"]["p90"];
    row.samples_per_s = s["samples_per_s"];
    row.tokens_per_s = s["tokens_per_s"];
    row.speedup = row.median_ms > 0 ? ref_median / row.median_ms : 0;
    row.peak_mb = s[c.memory_field];
    if (ref_peak > 0) row.peak_reduction = 1.0 - row.peak_mb / ref_peak;
    row.tflops = s["achieved_tflops"];
    row.mfu = number_at(j, "summary.mfu");
    row.kernels_per_step = number_at(j, "profile.kernels_per_step");
    row.final_loss = loss_of(s);
    row.loss_delta = row.final_loss - ref_loss;
    row.reference = i == c.reference;
    row.energy_j_per_step = number_at(j, "summary.energy_j_per_step");
    row.tokens_per_joule = number_at(j, "summary.tokens_per_joule");
    if (const auto* p = find(j, "stage.pitfall"); p && p->is_object()) {
      row.pitfall = p->value("name", "");
      row.lesson = p->value("lesson", "");
    }
    row.first_loss = s["first_loss"].is_number() ? s["first_loss"].get<double>() : std::nan("");
    row.host_clock_step_ms = number_at(j, "summary.host_clock_ms.step_ms.median");
    if (j.contains("profile")) row.profile = j["profile"];
    if (has_gpu_profile(j)) {
      row.breakdown = time_breakdown(j);
      row.gpu_ms_per_step = row.breakdown->gpu_busy_ms;
    }
    c.rows.push_back(std::move(row));
  }
  c.config_name = ref["config"]["name"];
  c.dtype = ref["training"]["dtype"];
  c.device_name = ref["system"]["device_name"];
  c.peak_tflops = number_at(ref, "summary.peak_tflops");
  if (const auto* note = find(ref, "summary.mfu_note"); note && note->is_string()) c.mfu_note = *note;
  c.mismatches = find_mismatches(results);
  c.notes = find_notes(results);
  return c;
}

std::string format_table(const Comparison& c) {
  const auto rows = table_cells(c);
  std::vector<size_t> width(kHeaders.size());
  for (size_t k = 0; k < kHeaders.size(); ++k) {
    width[k] = display_width(kHeaders[k]);
    for (const auto& row : rows) width[k] = std::max(width[k], display_width(row[k].text));
  }
  std::string out = context_line(c) + "\n";
  for (size_t k = 0; k < kHeaders.size(); ++k) out += (k ? "  " : "") + pad(kHeaders[k], width[k], k == 0);
  out += "\n";
  for (const auto& row : rows) {
    for (size_t k = 0; k < row.size(); ++k) out += (k ? "  " : "") + pad(row[k].text, width[k], row[k].left);
    out += "\n";
  }
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
  out += "|";
  for (const auto& h : kHeaders) out += " " + h + " |";
  out += "\n|";
  for (size_t k = 0; k < kHeaders.size(); ++k) out += k == 0 ? "---|" : "---:|";
  out += "\n";
  const auto rows = table_cells(c);
  for (size_t i = 0; i < rows.size(); ++i) {
    out += "|";
    for (size_t k = 0; k < rows[i].size(); ++k) {
      const std::string text = k == 0 && c.rows[i].reference ? "**" + rows[i][k].text + "**" : rows[i][k].text;
      out += " " + text + " |";
    }
    out += "\n";
  }
  out += "\n" + reference_line(c) + ".\n\n" + std::string(kColumnNotes) + ".\n";
  if (const std::string lessons = format_lessons(c); !lessons.empty()) out += "\n```\n" + lessons + "```\n";
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
                    "energy_j_per_step,tokens_per_joule\n";
  auto opt = [](const std::optional<double>& v) { return v ? strprintf("%.6g", *v) : std::string(); };
  for (const auto& r : c.rows) {
    out += csv_field(r.label) + "," + csv_field(r.stage) + "," + csv_field(r.path) + "," +
           strprintf("%.6g", r.median_ms) + "," + strprintf("%.6g", r.p10_ms) + "," + strprintf("%.6g", r.p90_ms) +
           "," + strprintf("%.6g", r.samples_per_s) + "," + strprintf("%.6g", r.tokens_per_s) + "," +
           strprintf("%.6g", r.speedup) + "," + (r.peak_mb > 0 ? strprintf("%.6g", r.peak_mb) : "") + "," +
           opt(r.peak_reduction) + "," + strprintf("%.6g", r.tflops) + "," + opt(r.mfu) + "," +
           opt(r.kernels_per_step) + "," + strprintf("%.6g", r.final_loss) + "," + strprintf("%.6g", r.loss_delta) +
           "," + (r.reference ? "yes" : "no") + "," + opt(r.energy_j_per_step) + "," + opt(r.tokens_per_joule) + "\n";
  }
  return out;
}

// --- Where the time goes ---------------------------------------------------------------------------
namespace {

constexpr const char* kHostGap = "host gap";
constexpr const char* kBreakdownNote =
    "GPU ms per step by kernel category from each result's --profile steps (apps/report/kernel_categories.cpp "
    "names the rule); host gap: median step time - GPU busy, the time the GPU waited for the host";
// One colour per category in kernel_categories() order, then the host gap's.
const char* const kCategoryColours[kKernelCategoryCount] = {"#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2",
                                                            "#B279A2", "#9D755D", "#EECA3B", "#FF9DA6", "#BAB0AC"};
constexpr const char* kHostGapColour = "#F2F2F2";
constexpr size_t kOtherKernelsListed = 5;

std::vector<const Row*> profiled_rows(const Comparison& c) {
  std::vector<const Row*> rows;
  for (const auto& r : c.rows)
    if (r.breakdown) rows.push_back(&r);
  return rows;
}

std::vector<std::string> breakdown_headers() {
  std::vector<std::string> h = {"stage", "step ms", "GPU busy"};
  for (auto cat : kernel_categories()) h.push_back(to_string(cat));
  h.push_back(kHostGap);
  return h;
}

std::vector<std::string> breakdown_cells(const Row& r) {
  const TimeBreakdown& b = *r.breakdown;
  std::vector<std::string> cells = {r.label, strprintf("%.3f", b.step_ms), strprintf("%.3f", b.gpu_busy_ms)};
  for (auto cat : kernel_categories()) cells.push_back(strprintf("%.3f", b.ms_per_step[static_cast<size_t>(cat)]));
  cells.push_back(strprintf("%.3f", b.host_gap_ms));
  return cells;
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

// The stacked bars, drawn at vertical offset y into svg; returns the height used.
double draw_breakdown(std::ostringstream& svg, const Comparison& c, double y) {
  // The bars end at 770 px of the 1000: the label after the longest bar ("31.14 ms (GPU busy 17%)") fits.
  constexpr double kLabelRight = 232, kBarLeft = 242, kBarRight = 770, kBarHeight = 22, kRowGap = 10;
  const auto rows = profiled_rows(c);
  if (rows.empty()) return 0;
  auto num = [](double v) { return strprintf("%.1f", v); };
  auto text = [&](double x, double ty, const std::string& s, const std::string& attrs) {
    svg << "<text x=\"" << num(x) << "\" y=\"" << num(ty) << "\" " << attrs << ">" << xml_escape(s) << "</text>\n";
  };
  text(20, y + 20, "Where the time goes (GPU ms per step by kernel category, and the host gap)",
       "font-size=\"15\" font-weight=\"bold\" fill=\"#222\"");
  text(20, y + 37,
       "from --profile; above, one scale for every stage (the bar is the median step); below, each step as 100%; "
       "host gap = step time - GPU busy",
       "font-size=\"12\" fill=\"#666\"");
  // Legend: the categories and the host gap, in bar order.
  double lx = 20, ly = y + 56;
  auto legend = [&](const char* colour, const std::string& name) {
    const double w = 16 + 7.0 * static_cast<double>(name.size()) + 14;
    if (lx + w > 960) {
      lx = 20;
      ly += 18;
    }
    svg << "<rect x=\"" << num(lx) << "\" y=\"" << num(ly - 10) << "\" width=\"12\" height=\"12\" fill=\"" << colour
        << "\" stroke=\"#999\" stroke-width=\"0.5\"></rect>\n";
    text(lx + 16, ly, name, "font-size=\"12\" fill=\"#222\"");
    lx += w;
  };
  for (auto cat : kernel_categories()) legend(kCategoryColours[static_cast<size_t>(cat)], to_string(cat));
  legend(kHostGapColour, kHostGap);
  double max_ms = 0;
  for (const Row* r : rows) max_ms = std::max({max_ms, r->breakdown->step_ms, r->breakdown->gpu_busy_ms});
  double row_y = ly + 16;
  // One set of bars: `scale` maps a row's milliseconds to pixels; `note` labels the bar's end.
  auto bars = [&](const std::string& subtitle, const std::function<double(const TimeBreakdown&)>& scale,
                  const std::function<std::string(const TimeBreakdown&)>& note) {
    text(kLabelRight, row_y + 4, subtitle, "font-size=\"12\" text-anchor=\"end\" font-style=\"italic\" fill=\"#555\"");
    row_y += 12;
    for (const Row* r : rows) {
      const TimeBreakdown& b = *r->breakdown;
      text(kLabelRight, row_y + kBarHeight * 0.7, fit_label(r->label),
           "font-size=\"13\" text-anchor=\"end\" fill=\"#222\"");
      const double px_per_ms = scale(b);
      double x = kBarLeft;
      auto segment = [&](double ms, const char* colour, const std::string& name) {
        if (ms <= 0) return;
        svg << "<rect x=\"" << num(x) << "\" y=\"" << num(row_y) << "\" width=\"" << strprintf("%.2f", ms * px_per_ms)
            << "\" height=\"" << num(kBarHeight) << "\" fill=\"" << colour
            << "\" stroke=\"#fff\" stroke-width=\"0.5\"><title>"
            << xml_escape(
                   r->label + ": " + name + " " +
                   strprintf("%.3f ms per step (%.0f%% of the step)", ms, b.step_ms > 0 ? 100.0 * ms / b.step_ms : 0.0))
            << "</title></rect>\n";
        x += ms * px_per_ms;
      };
      for (auto cat : kernel_categories())
        segment(b.ms_per_step[static_cast<size_t>(cat)], kCategoryColours[static_cast<size_t>(cat)], to_string(cat));
      segment(b.host_gap_ms, kHostGapColour, kHostGap);
      svg << "<rect x=\"" << num(kBarLeft) << "\" y=\"" << num(row_y) << "\" width=\""
          << strprintf("%.2f", x - kBarLeft) << "\" height=\"" << num(kBarHeight)
          << "\" fill=\"none\" stroke=\"#888\"></rect>\n";
      text(x + 6, row_y + kBarHeight * 0.7, note(b), "font-size=\"12\" fill=\"#222\"");
      row_y += kBarHeight + kRowGap;
    }
    row_y += 8;
  };
  const double width = kBarRight - kBarLeft;
  bars(
      "ms per step", [&](const TimeBreakdown&) { return max_ms > 0 ? width / max_ms : 0; },
      [](const TimeBreakdown& b) {
        return strprintf("%.2f ms (GPU busy %.0f%%)", b.step_ms,
                         b.step_ms > 0 ? 100.0 * b.gpu_busy_ms / b.step_ms : 0.0);
      });
  bars(
      "share of the step",
      [&](const TimeBreakdown& b) {
        const double total = std::max(b.step_ms, b.gpu_busy_ms);
        return total > 0 ? width / total : 0;
      },
      [](const TimeBreakdown& b) {
        const double total = std::max(b.step_ms, b.gpu_busy_ms);
        return strprintf("GEMM %.0f%%, host gap %.0f%%",
                         total > 0 ? 100.0 * b.ms_per_step[static_cast<size_t>(KernelCategory::kGemm)] / total : 0.0,
                         total > 0 ? 100.0 * b.host_gap_ms / total : 0.0);
      });
  return row_y - y + 10;
}

}  // namespace

bool Comparison::has_breakdown() const {
  return std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.breakdown.has_value(); });
}

std::string format_time_breakdown(const Comparison& c) {
  const auto rows = profiled_rows(c);
  if (rows.empty()) return "";
  const auto headers = breakdown_headers();
  std::vector<std::vector<std::string>> cells;
  for (const Row* r : rows) cells.push_back(breakdown_cells(*r));
  std::vector<size_t> width(headers.size());
  for (size_t k = 0; k < headers.size(); ++k) {
    width[k] = display_width(headers[k]);
    for (const auto& row : cells) width[k] = std::max(width[k], display_width(row[k]));
  }
  std::string out = "where the time goes (ms per step)\n";
  for (size_t k = 0; k < headers.size(); ++k) out += (k ? "  " : "") + pad(headers[k], width[k], k == 0);
  out += "\n";
  for (const auto& row : cells) {
    for (size_t k = 0; k < row.size(); ++k) out += (k ? "  " : "") + pad(row[k], width[k], k == 0);
    out += "\n";
  }
  out += std::string(kBreakdownNote) + "\n";
  for (const Row* r : rows) out += other_kernels_text(*r, /*markdown=*/false);
  return out;
}

std::string time_breakdown_markdown(const Comparison& c) {
  const auto rows = profiled_rows(c);
  if (rows.empty()) return "";
  std::string out = "### Where the time goes (ms per step)\n\n|";
  const auto headers = breakdown_headers();
  for (const auto& h : headers) out += " " + h + " |";
  out += "\n|";
  for (size_t k = 0; k < headers.size(); ++k) out += k == 0 ? "---|" : "---:|";
  out += "\n";
  for (const Row* r : rows) {
    out += "|";
    for (const auto& cell : breakdown_cells(*r)) out += " " + cell + " |";
    out += "\n";
  }
  out += "\n" + std::string(kBreakdownNote) + ".\n\n";
  for (const Row* r : rows) out += other_kernels_text(*r, /*markdown=*/true);
  return out;
}

std::string time_breakdown_svg(const Comparison& c) {
  std::ostringstream body;
  const double height = draw_breakdown(body, c, 0);
  if (height == 0) return "";
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"" + strprintf("%.1f", height) +
         "\" viewBox=\"0 0 1000 " + strprintf("%.1f", height) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<rect width=\"100%\" height=\"100%\" "
         "fill=\"white\"/>\n" +
         body.str() + "</svg>\n";
}

std::string to_svg(const Comparison& c, bool with_breakdown) {
  static const char* const kPalette[] = {"#4C78A8", "#F58518", "#54A24B", "#E45756",
                                         "#72B7B2", "#B279A2", "#9D755D", "#EECA3B"};
  constexpr double kWidth = 1000, kLabelRight = 232, kBarLeft = 242, kBarRight = 742;
  constexpr double kBarHeight = 22, kRowGap = 10, kPanelTitle = 44, kAxis = 30, kPanelGap = 26;
  const size_t n = c.rows.size();
  const double panel_height = kPanelTitle + static_cast<double>(n) * (kBarHeight + kRowGap) + kAxis;
  // A fourth panel, energy per step, when a result measured it.
  const bool energy = std::any_of(c.rows.begin(), c.rows.end(), [](const Row& r) { return r.energy_j_per_step; });
  const double panels_end = 84 + (energy ? 4 : 3) * (panel_height + kPanelGap);
  // The last panel, where the time goes, when a result has a GPU profile.
  std::ostringstream breakdown;
  const double breakdown_height = with_breakdown ? draw_breakdown(breakdown, c, panels_end) : 0;
  const double height = panels_end + breakdown_height + 36;
  std::ostringstream svg;
  auto num = [](double v) { return strprintf("%.1f", v); };
  auto text = [&](double x, double y, const std::string& s, const std::string& attrs = "") {
    svg << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" " << attrs << ">" << xml_escape(s) << "</text>\n";
  };
  auto color = [&](size_t i) { return kPalette[i % (sizeof kPalette / sizeof kPalette[0])]; };

  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << num(height)
      << "\" viewBox=\"0 0 " << kWidth << " " << num(height)
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  text(20, 32, "TinyTransformer stages: " + c.config_name + ", " + c.dtype + ", " + c.device_name,
       "font-size=\"20\" font-weight=\"bold\" fill=\"#222\"");
  text(20, 56,
       "Speedup, memory and loss relative to " + c.rows[c.reference].label +
           ". Median step time over the measured steps.",
       "font-size=\"13\" fill=\"#555\"");
  if (!c.mismatches.empty())
    text(20, 74, "Warning: results are not comparable (" + std::to_string(c.mismatches.size()) + " differing fields)",
         "font-size=\"13\" fill=\"#C0392B\" font-weight=\"bold\"");

  double y = 84;
  // One panel of horizontal bars. `position` maps a value to an x coordinate; labels[i] goes after bar i.
  auto bars = [&](const std::string& title, const std::string& subtitle, const std::vector<double>& values,
                  const std::vector<std::string>& labels, const std::function<double(double)>& position) {
    text(20, y + 20, title, "font-size=\"15\" font-weight=\"bold\" fill=\"#222\"");
    text(20, y + 37, subtitle, "font-size=\"12\" fill=\"#666\"");
    double row_y = y + kPanelTitle;
    for (size_t i = 0; i < n; ++i) {
      const double end = std::max(kBarLeft + 1, position(values[i]));
      text(kLabelRight, row_y + kBarHeight * 0.7, fit_label(c.rows[i].label),
           std::string("font-size=\"13\" text-anchor=\"end\" fill=\"#222\"") +
               (c.rows[i].reference ? " font-weight=\"bold\"" : ""));
      svg << "<rect x=\"" << num(kBarLeft) << "\" y=\"" << num(row_y) << "\" width=\"" << num(end - kBarLeft)
          << "\" height=\"" << num(kBarHeight) << "\" fill=\"" << color(i) << "\"><title>"
          << xml_escape(c.rows[i].label + ": " + labels[i]) << "</title></rect>\n";
      text(end + 6, row_y + kBarHeight * 0.7, labels[i], "font-size=\"12\" fill=\"#222\"");
      row_y += kBarHeight + kRowGap;
    }
    svg << "<line x1=\"" << num(kBarLeft) << "\" y1=\"" << num(y + kPanelTitle - 4) << "\" x2=\"" << num(kBarLeft)
        << "\" y2=\"" << num(row_y) << "\" stroke=\"#888\"/>\n";
    return row_y;
  };
  auto linear = [&](double max) {
    return [=](double v) { return kBarLeft + (max > 0 ? v / max : 0) * (kBarRight - kBarLeft); };
  };

  // Throughput.
  std::vector<double> tokens;
  std::vector<std::string> token_labels;
  for (const auto& r : c.rows) {
    tokens.push_back(r.tokens_per_s);
    token_labels.push_back(thousands(r.tokens_per_s) + " tokens/s  (" + strprintf("%.2fx", r.speedup) + ")");
  }
  bars("Throughput (tokens/s, higher is better)", "bar label: tokens/s and speedup over the reference", tokens,
       token_labels, linear(*std::max_element(tokens.begin(), tokens.end())));
  y += panel_height + kPanelGap;

  // Peak memory.
  std::vector<double> peaks;
  std::vector<std::string> peak_labels;
  for (const auto& r : c.rows) {
    peaks.push_back(r.peak_mb);
    std::string label = r.peak_mb > 0 ? strprintf("%.0f MB", r.peak_mb) : "not measured (CPU)";
    if (!r.reference && r.peak_reduction)
      label += "  (" + strprintf("%.1f%%", 100.0 * std::fabs(*r.peak_reduction)) +
               (*r.peak_reduction >= 0 ? " less)" : " more)");
    peak_labels.push_back(label);
  }
  bars(c.memory_field == "peak_allocated_mb" ? "Peak allocated GPU memory (MB, lower is better)"
                                             : "Peak reserved GPU memory (MB, lower is better)",
       "caching-allocator peak over the measured steps", peaks, peak_labels,
       linear(*std::max_element(peaks.begin(), peaks.end())));
  y += panel_height + kPanelGap;

  // Achieved TFLOP/s against the GPU's peak: a log axis, as in a roofline plot, with the peak as ceiling.
  std::vector<double> flops;
  std::vector<std::string> flop_labels;
  for (const auto& r : c.rows) {
    flops.push_back(r.tflops);
    flop_labels.push_back(strprintf("%.3g TFLOP/s", r.tflops) + (r.mfu ? "  (MFU " + percent(*r.mfu) + ")" : ""));
  }
  const double top = y + kPanelTitle - 4;
  const double bottom = y + kPanelTitle + static_cast<double>(n) * (kBarHeight + kRowGap);
  if (c.peak_tflops && *c.peak_tflops > 0) {
    double smallest = *c.peak_tflops;
    for (double f : flops)
      if (f > 0) smallest = std::min(smallest, f);
    const double lo = std::pow(10.0, std::floor(std::log10(smallest)));
    const double hi = std::pow(10.0, std::ceil(std::log10(*c.peak_tflops * 1.0001)));
    auto position = [=](double v) {
      const double t = (std::log10(std::max(v, lo)) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
      return kBarLeft + t * (kBarRight - kBarLeft);
    };
    for (double d = lo; d <= hi * 1.0001; d *= 10) {
      const double x = position(d);
      svg << "<line x1=\"" << num(x) << "\" y1=\"" << num(top) << "\" x2=\"" << num(x) << "\" y2=\"" << num(bottom)
          << "\" stroke=\"#ddd\"/>\n";
      text(x, bottom + 16, strprintf("%g", d), "font-size=\"11\" text-anchor=\"middle\" fill=\"#666\"");
    }
    text(kBarRight + 40, bottom + 16, "TFLOP/s (log scale)", "font-size=\"11\" fill=\"#666\"");
    bars("Achieved TFLOP/s against the GPU's peak (higher is better)",
         "model FLOPs per step / median step time; red line: peak dense " + c.dtype + " TFLOP/s of the GPU", flops,
         flop_labels, position);
    const double px = position(*c.peak_tflops);
    svg << "<line x1=\"" << num(px) << "\" y1=\"" << num(top) << "\" x2=\"" << num(px) << "\" y2=\"" << num(bottom)
        << "\" stroke=\"#C0392B\" stroke-width=\"2\" stroke-dasharray=\"6,4\"/>\n";
    text(px - 4, top + 10, strprintf("peak %.1f", *c.peak_tflops),
         "font-size=\"11\" text-anchor=\"end\" fill=\"#C0392B\"");
  } else {
    bars("Achieved TFLOP/s (higher is better)",
         "no peak FLOP/s known for '" + c.device_name + "': no ceiling and no MFU", flops, flop_labels,
         linear(*std::max_element(flops.begin(), flops.end())));
  }
  y += panel_height + kPanelGap;
  if (energy) {
    std::vector<double> joules;
    std::vector<std::string> joule_labels;
    for (const auto& r : c.rows) {
      joules.push_back(r.energy_j_per_step.value_or(0));
      joule_labels.push_back(r.energy_j_per_step
                                 ? strprintf("%.3f J/step", *r.energy_j_per_step) +
                                       (r.tokens_per_joule ? "  (" + thousands(*r.tokens_per_joule) + " tokens/J)" : "")
                                 : "not measured");
    }
    bars("GPU energy per step (J, lower is better)", "the GPU's energy counter over the measured steps", joules,
         joule_labels, linear(*std::max_element(joules.begin(), joules.end())));
    y += panel_height + kPanelGap;
  }
  svg << breakdown.str();
  y += breakdown_height;
  text(20, y + 4,
       "Generated by compare from " + std::to_string(n) + " result files; see comparison.md for the full table.",
       "font-size=\"11\" fill=\"#888\"");
  svg << "</svg>\n";
  return svg.str();
}

const std::vector<std::string>& table_headers() { return kHeaders; }

std::vector<std::vector<std::string>> table_text(const Comparison& c) {
  std::vector<std::vector<std::string>> out;
  for (const auto& row : table_cells(c)) {
    out.emplace_back();
    for (const auto& cell : row) out.back().push_back(cell.text);
  }
  return out;
}

std::string format_lessons(const Comparison& c) { return format_exercise(c); }

std::vector<SlowerCheck> check_slower(const Result& baseline, const std::vector<Result>& results, double allowed_pct) {
  const double base = baseline.json["summary"]["step_ms"]["median"];
  std::vector<SlowerCheck> checks;
  for (const auto& r : results) {
    SlowerCheck check;
    check.label = r.label.empty() ? r.json["stage"]["name"].get<std::string>() : r.label;
    check.path = r.path;
    check.median_ms = r.json["summary"]["step_ms"]["median"];
    check.baseline_ms = base;
    check.slower_pct = (check.median_ms / base - 1.0) * 100.0;
    check.too_slow = check.slower_pct > allowed_pct;
    checks.push_back(check);
  }
  return checks;
}

}  // namespace tt::compare
