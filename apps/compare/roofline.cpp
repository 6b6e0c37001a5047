#include "apps/compare/roofline.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "apps/results/flops.h"
#include "apps/results/text.h"

namespace tt::roofline {
namespace {

constexpr const char* kTime = "gpu__time_duration.sum";
constexpr const char* kBytesRead = "dram__bytes_read.sum";
constexpr const char* kBytesWrite = "dram__bytes_write.sum";
constexpr const char* kPeakBytesPerCycle = "dram__bytes.sum.peak_sustained";
constexpr const char* kDramCyclesPerSecond = "dram__cycles_elapsed.avg.per_second";

// FLOP counters and the FLOPs each count stands for.
const std::vector<std::pair<std::string, double>>& flop_counters() {
  static const std::vector<std::pair<std::string, double>> list = {
      {"sm__sass_thread_inst_executed_op_fadd_pred_on.sum", 1},
      {"sm__sass_thread_inst_executed_op_fmul_pred_on.sum", 1},
      {"sm__sass_thread_inst_executed_op_ffma_pred_on.sum", 2},
      {"sm__sass_thread_inst_executed_op_hadd_pred_on.sum", 1},
      {"sm__sass_thread_inst_executed_op_hmul_pred_on.sum", 1},
      {"sm__sass_thread_inst_executed_op_hfma_pred_on.sum", 2},
      {"sm__ops_path_tensor_src_bf16_dst_fp32.sum", 1},
      {"sm__ops_path_tensor_src_fp16_dst_fp32.sum", 1},
      {"sm__ops_path_tensor_src_fp16_dst_fp16.sum", 1},
      {"sm__ops_path_tensor_src_tf32_dst_fp32.sum", 1},
  };
  return list;
}

// One CSV record; quoted fields may hold commas and doubled quotes.
std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        fields.back() += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      fields.emplace_back();
    } else if (ch != '\r') {
      fields.back() += ch;
    }
  }
  return fields;
}

// Factor from a unit ncu printed to seconds, bytes or per-second; 1 for counts. Throws for a unit it does
// not know, so that a number is never silently off by 1000.
double unit_factor(const std::string& unit, const std::string& column) {
  // Every spelling seen: older ncu writes "nsecond", "byte", "cycle/second"; Nsight Compute 2025.3 writes
  // "ns" and "hz" (lower case) even with --print-units base.
  static const std::map<std::string, double> factors = {
      {"", 1},           {"inst", 1},          {"cycle", 1},          {"nsecond", 1e-9},   {"ns", 1e-9},
      {"usecond", 1e-6}, {"us", 1e-6},         {"msecond", 1e-3},     {"ms", 1e-3},        {"second", 1},
      {"s", 1},          {"byte", 1},          {"B", 1},              {"Kbyte", 1e3},      {"KB", 1e3},
      {"Mbyte", 1e6},    {"MB", 1e6},          {"Gbyte", 1e9},        {"GB", 1e9},         {"Tbyte", 1e12},
      {"TB", 1e12},      {"byte/cycle", 1},    {"B/cycle", 1},        {"cycle/second", 1}, {"cycle/s", 1},
      {"Hz", 1},         {"cycle/usecond", 1e6}, {"cycle/us", 1e6},   {"MHz", 1e6},        {"cycle/nsecond", 1e9},
      {"cycle/ns", 1e9}, {"GHz", 1e9},         {"cycle/msecond", 1e3}, {"cycle/ms", 1e3},  {"KHz", 1e3},
      {"hz", 1},         {"khz", 1e3},         {"mhz", 1e6},          {"ghz", 1e9}};
  const auto it = factors.find(unit);
  if (it == factors.end())
    throw std::runtime_error("column \"" + column + "\" has the unit \"" + unit +
                             "\", which the roofline report does not convert (export with --print-units base)");
  return it->second;
}

// ncu writes large numbers with thousands separators ("1,234,567"); "n/a" where a counter does not apply.
std::optional<double> parse_number(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  if (text.empty() || text == "n/a") return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string short_name(const std::string& name) {
  std::string s = name.substr(0, name.find('('));
  if (s.rfind("void ", 0) == 0) s = s.substr(5);
  constexpr size_t kMax = 64;
  return s.size() <= kMax ? s : s.substr(0, kMax - 1) + "…";
}

std::string si(double v, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P"};
  int p = 0;
  while (std::abs(v) >= 1000 && p < 5) {
    v /= 1000;
    ++p;
  }
  return strprintf(v >= 100 ? "%.0f " : v >= 10 ? "%.1f " : "%.2f ", v) + prefixes[p] + unit;
}

std::string bound_of(const Report& r, const Kernel& k) {
  const auto ai = k.intensity();
  if (k.flops == 0) return "memory (no FLOPs)";
  const Roof* roof = compute_roof(r, k);
  if (!ai || !roof || !r.bandwidth) return "-";
  return *ai < roof->flops_per_s / *r.bandwidth ? "memory" : "compute";
}

}  // namespace

const std::vector<std::string>& ncu_metrics() {
  static const std::vector<std::string> list = [] {
    std::vector<std::string> m = {kTime, kBytesRead, kBytesWrite};
    for (const auto& [name, weight] : flop_counters()) m.push_back(name);
    m.push_back(kPeakBytesPerCycle);
    m.push_back(kDramCyclesPerSecond);
    return m;
  }();
  return list;
}

Report parse_ncu_csv(const std::string& text, const std::string& source) {
  std::istringstream in(text);
  std::string line;
  std::vector<std::vector<std::string>> records;
  while (std::getline(in, line)) {
    // ncu prefixes its own messages with "==PROF==" or "==WARNING=="; they are not records.
    if (line.empty() || line.rfind("==", 0) == 0) continue;
    records.push_back(split_csv_line(line));
  }
  if (records.size() < 2)
    throw std::runtime_error("'" + source + "' is not ncu's raw CSV page: it needs a header row and a units row");
  const auto& header = records[0];
  const auto& units = records[1];
  std::map<std::string, size_t> column;
  for (size_t i = 0; i < header.size(); ++i) column.emplace(header[i], i);
  for (const char* required : {"Kernel Name", kTime})
    if (!column.count(required))
      throw std::runtime_error("'" + source + "' has no column \"" + required +
                               "\" (export it with: ncu --import REPORT --csv --page raw --print-units base)");
  if (units.size() != header.size())
    throw std::runtime_error("'" + source + "': the second row (units) has " + std::to_string(units.size()) +
                             " fields, the header " + std::to_string(header.size()));
  Report report;
  for (const auto& metric : ncu_metrics())
    if (!column.count(metric)) report.missing_metrics.push_back(metric);

  auto value = [&](const std::vector<std::string>& row, size_t r, const std::string& name) -> std::optional<double> {
    const auto it = column.find(name);
    if (it == column.end()) return std::nullopt;
    if (it->second >= row.size())
      throw std::runtime_error("'" + source + "' row " + std::to_string(r + 1) + " has " + std::to_string(row.size()) +
                               " fields, fewer than the header's " + std::to_string(header.size()));
    const auto v = parse_number(row[it->second]);
    return v ? std::optional<double>(*v * unit_factor(units[it->second], name)) : std::nullopt;
  };
  std::map<std::string, Kernel> by_name;
  double peak_bytes_per_cycle = 0, cycles_per_second = 0;
  for (size_t r = 2; r < records.size(); ++r) {
    const auto& row = records[r];
    const auto seconds = value(row, r, kTime);
    if (!seconds)
      throw std::runtime_error("'" + source + "' row " + std::to_string(r + 1) + ": no number in \"" + kTime + "\"");
    // A kernel takes time: zero or less is a broken file, and would put the kernel at infinite FLOP/s.
    if (!(*seconds > 0))
      throw std::runtime_error("'" + source + "' row " + std::to_string(r + 1) + ": \"" + kTime + "\" is " +
                               strprintf("%g", *seconds) + " s; a kernel's duration must be > 0");
    Kernel& k = by_name[row.at(column["Kernel Name"])];
    k.name = row.at(column["Kernel Name"]);
    ++k.calls;
    k.seconds += *seconds;
    k.bytes += value(row, r, kBytesRead).value_or(0) + value(row, r, kBytesWrite).value_or(0);
    for (const auto& [name, weight] : flop_counters()) {
      const double flops = weight * value(row, r, name).value_or(0);
      k.flops += flops;
      if (name.rfind("sm__ops_path_tensor", 0) == 0) k.tensor_flops += flops;
    }
    peak_bytes_per_cycle = std::max(peak_bytes_per_cycle, value(row, r, kPeakBytesPerCycle).value_or(0));
    cycles_per_second = std::max(cycles_per_second, value(row, r, kDramCyclesPerSecond).value_or(0));
    ++report.launches;
  }
  if (report.launches == 0) throw std::runtime_error("'" + source + "' holds no kernel rows");
  for (auto& [name, k] : by_name) {
    report.total_seconds += k.seconds;
    report.kernels.push_back(k);
  }
  for (auto& k : report.kernels) k.share = report.total_seconds > 0 ? k.seconds / report.total_seconds : 0;
  std::sort(report.kernels.begin(), report.kernels.end(),
            [](const Kernel& a, const Kernel& b) { return a.seconds > b.seconds; });
  if (peak_bytes_per_cycle > 0 && cycles_per_second > 0)
    report.ncu_peak_bandwidth = peak_bytes_per_cycle * cycles_per_second;
  if (!report.missing_metrics.empty())
    report.notes.push_back(std::to_string(report.missing_metrics.size()) +
                           " metrics were not in the counter file and count as zero (ncu does not know them on this "
                           "GPU, or they were not collected)");
  return report;
}

Report read_ncu_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open the counter file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  return parse_ncu_csv(text.str(), path);
}

std::vector<Roof> roofs_for(const std::string& device_name) {
  std::vector<Roof> roofs;
  const struct {
    Precision precision;
    bool tf32;
    const char* what;
  } kinds[] = {{Precision::kBf16, false, "bf16 tensor cores"},
               {Precision::kFp32, true, "tf32 tensor cores"},
               {Precision::kFp32, false, "fp32"}};
  for (const auto& kind : kinds) {
    const auto peak = peak_flops(device_name, kind.precision, kind.tf32);
    if (!peak) continue;
    const std::string label = std::string(kind.what) + " (" + peak->gpu + ", " + peak->source + ")";
    if (std::none_of(roofs.begin(), roofs.end(), [&](const Roof& r) { return r.flops_per_s == peak->tflops * 1e12; }))
      roofs.push_back({label, peak->tflops * 1e12});
  }
  std::sort(roofs.begin(), roofs.end(), [](const Roof& a, const Roof& b) { return a.flops_per_s > b.flops_per_s; });
  return roofs;
}

std::optional<double> attainable(const Report& r, double intensity) {
  if (r.compute_roofs.empty() || !r.bandwidth) return std::nullopt;
  return std::min(r.compute_roofs.front().flops_per_s, *r.bandwidth * intensity);
}

const Roof* compute_roof(const Report& r, const Kernel& k) {
  if (r.compute_roofs.empty()) return nullptr;
  return 2 * k.tensor_flops >= k.flops ? &r.compute_roofs.front() : &r.compute_roofs.back();
}

std::optional<double> attainable(const Report& r, const Kernel& k) {
  const Roof* roof = compute_roof(r, k);
  const auto ai = k.intensity();
  if (!roof || !r.bandwidth || !ai) return std::nullopt;
  return std::min(roof->flops_per_s, *r.bandwidth * *ai);
}

std::string to_markdown(const Report& r, size_t top) {
  std::string out = "## Roofline: " + r.title + "\n\n";
  out += strprintf("%lld kernel launches, %.3f ms of GPU time, %zu distinct kernels; the top %zu by GPU time:\n\n",
                   static_cast<long long>(r.launches), r.total_seconds * 1e3, r.kernels.size(),
                   std::min(top, r.kernels.size()));
  out +=
      "| # | kernel | calls | GPU ms | share | GFLOP | DRAM MB | FLOP/byte | achieved FLOP/s | DRAM bytes/s | bound | "
      "of attainable |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
  for (size_t i = 0; i < std::min(top, r.kernels.size()); ++i) {
    const Kernel& k = r.kernels[i];
    const auto ai = k.intensity();
    const auto roof = ai && k.flops > 0 ? attainable(r, k) : std::nullopt;
    out += strprintf("| %zu | `%s` | %lld | %.3f | %.1f%% | %.3f | %.2f | %s | %s | %s | %s | %s |\n", i + 1,
                     short_name(k.name).c_str(), static_cast<long long>(k.calls), k.seconds * 1e3, 100 * k.share,
                     k.flops / 1e9, k.bytes / 1e6, ai ? strprintf("%.3g", *ai).c_str() : "-",
                     si(k.flops_per_s(), "FLOP/s").c_str(), si(k.bytes_per_s(), "B/s").c_str(), bound_of(r, k).c_str(),
                     roof ? strprintf("%.1f%%", 100 * k.flops_per_s() / *roof).c_str() : "-");
  }
  out += "\nRoofs: ";
  if (r.compute_roofs.empty()) out += "no compute roof (the GPU is not in the peak table)";
  for (size_t i = 0; i < r.compute_roofs.size(); ++i)
    out += (i ? "; " : "") + si(r.compute_roofs[i].flops_per_s, "FLOP/s") + " " + r.compute_roofs[i].label;
  out += r.bandwidth ? "; memory " + si(*r.bandwidth, "B/s") + " (" + r.bandwidth_source + ")" : "; no memory roof";
  if (r.ncu_peak_bandwidth) out += "; ncu's DRAM peak " + si(*r.ncu_peak_bandwidth, "B/s");
  out +=
      ".\n\nFLOPs: fp32 and half-precision add, mul (1) and fma (2) thread instructions on the FMA pipes plus the "
      "tensor cores' math ops, as ncu counts them; bytes: DRAM reads + writes. \"bound\": which roof a kernel sits "
      "under at its intensity, against its compute roof: the tensor cores' (the highest) where most of its FLOPs ran "
      "on them, fp32 otherwise; \"of attainable\": achieved FLOP/s / min(that roof, bandwidth x intensity).\n";
  for (const auto& note : r.notes) out += "\nNote: " + note + ".\n";
  if (!r.missing_metrics.empty()) {
    out += "\nMissing metrics:";
    for (const auto& m : r.missing_metrics) out += " `" + m + "`";
    out += "\n";
  }
  return out;
}

std::string to_svg(const Report& r, size_t top) {
  constexpr double kWidth = 980, kHeight = 560, kLeft = 80, kRight = 600, kTop = 50, kBottom = 490;
  std::vector<std::pair<size_t, const Kernel*>> points;
  for (size_t i = 0; i < std::min(top, r.kernels.size()); ++i)
    if (r.kernels[i].flops > 0 && r.kernels[i].bytes > 0) points.emplace_back(i + 1, &r.kernels[i]);
  // Axes in whole decades around the points and the roofs' ridge points.
  double x_lo = 1e-2, x_hi = 1e3, y_hi = 1e12, y_lo = 1e12;
  for (const auto& [rank, k] : points) {
    x_lo = std::min(x_lo, *k->intensity());
    x_hi = std::max(x_hi, *k->intensity());
    y_lo = std::min(y_lo, k->flops_per_s());
    y_hi = std::max(y_hi, k->flops_per_s());
  }
  for (const auto& roof : r.compute_roofs) {
    y_hi = std::max(y_hi, roof.flops_per_s);
    if (r.bandwidth) x_hi = std::max(x_hi, 10 * roof.flops_per_s / *r.bandwidth);
  }
  const double lx0 = std::floor(std::log10(x_lo)), lx1 = std::ceil(std::log10(x_hi));
  const double ly0 = std::floor(std::log10(y_lo)) - 1, ly1 = std::ceil(std::log10(y_hi)) + 0.3;
  auto px = [&](double x) { return kLeft + (std::log10(x) - lx0) / (lx1 - lx0) * (kRight - kLeft); };
  auto py = [&](double y) { return kBottom - (std::log10(y) - ly0) / (ly1 - ly0) * (kBottom - kTop); };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << kLeft << "\" y=\"24\" font-size=\"15\" font-weight=\"bold\">Roofline: " << xml_escape(r.title)
    << "</text>\n";
  for (double d = lx0; d <= lx1; ++d) {
    const double x = kLeft + (d - lx0) / (lx1 - lx0) * (kRight - kLeft);
    s << strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", x, kTop, x, kBottom)
      << strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">1e%.0f</text>\n", x, kBottom + 16, d);
  }
  for (double d = std::ceil(ly0); d <= std::floor(ly1); ++d) {
    const double y = py(std::pow(10.0, d));
    s << strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>", kLeft, y, kRight, y)
      << strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", kLeft - 6, y + 4,
                   si(std::pow(10.0, d), "").c_str());
  }
  s << strprintf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", kLeft,
                 kTop, kRight - kLeft, kBottom - kTop)
    << strprintf(
           "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">arithmetic intensity (FLOP per DRAM byte)</text>\n",
           (kLeft + kRight) / 2, kBottom + 36)
    << strprintf("<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">achieved FLOP/s</text>\n",
                 (kTop + kBottom) / 2);
  const char* roof_colours[] = {"#c0392b", "#e67e22", "#8e44ad"};
  for (size_t i = 0; i < r.compute_roofs.size(); ++i) {
    const double peak = r.compute_roofs[i].flops_per_s;
    const double ridge = r.bandwidth ? peak / *r.bandwidth : std::pow(10.0, lx0);
    const double x0 = std::max(ridge, std::pow(10.0, lx0));
    s << strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>", px(x0),
                   py(peak), kRight, py(peak), roof_colours[i % 3])
      << strprintf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%s %s</text>\n", kRight - 4,
                   py(peak) - 5, roof_colours[i % 3], si(peak, "FLOP/s").c_str(),
                   xml_escape(r.compute_roofs[i].label.substr(0, r.compute_roofs[i].label.find(" ("))).c_str());
  }
  if (r.bandwidth) {
    const double top_roof = r.compute_roofs.empty() ? std::pow(10.0, ly1) : r.compute_roofs.front().flops_per_s;
    const double x0 = std::pow(10.0, lx0);
    const double x1 = std::min(top_roof / *r.bandwidth, std::pow(10.0, lx1));
    const double y0 = std::max(*r.bandwidth * x0, std::pow(10.0, ly0));
    const double x0c = y0 / *r.bandwidth;
    s << strprintf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#2c3e50\" stroke-width=\"2\"/>",
                   px(x0c), py(y0), px(x1), py(*r.bandwidth * x1))
      << strprintf("<text x=\"%.1f\" y=\"%.1f\" fill=\"#2c3e50\">memory %s</text>\n", px(x0c) + 6, py(y0) - 8,
                   si(*r.bandwidth, "B/s").c_str());
  }
  for (const auto& [rank, k] : points) {
    const double x = px(*k->intensity()), y = py(k->flops_per_s());
    s << strprintf(
             "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"#4C78A8\" fill-opacity=\"0.75\" stroke=\"#1f3b57\">", x,
             y, 4 + 10 * std::sqrt(k->share))
      << "<title>" << xml_escape(k->name) << "</title></circle>"
      << strprintf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" font-weight=\"bold\">%zu</text>\n", x + 7, y - 6,
                   rank);
  }
  // The legend: every top kernel, plotted or not.
  double ly = kTop + 4;
  s << strprintf("<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">top kernels by GPU time (share)</text>\n",
                 kRight + 20, ly);
  for (size_t i = 0; i < std::min(top, r.kernels.size()); ++i) {
    ly += 17;
    const Kernel& k = r.kernels[i];
    const bool plotted = k.flops > 0 && k.bytes > 0;
    std::string name = short_name(k.name);
    if (name.size() > 40) name = name.substr(0, 39) + "…";
    s << strprintf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\"%s>%zu. %s (%.1f%%)%s</text>\n", kRight + 20, ly,
                   plotted ? "" : " fill=\"#888\"", i + 1, xml_escape(name).c_str(), 100 * k.share,
                   plotted        ? ""
                   : k.flops == 0 ? " no FLOPs"
                                  : " no DRAM bytes");
  }
  s << "</svg>\n";
  return s.str();
}

nlohmann::json to_json(const Report& r, size_t top) {
  nlohmann::json kernels = nlohmann::json::array();
  for (size_t i = 0; i < std::min(top, r.kernels.size()); ++i) {
    const Kernel& k = r.kernels[i];
    const auto ai = k.intensity();
    kernels.push_back({{"name", k.name},
                       {"calls", k.calls},
                       {"gpu_ms", k.seconds * 1e3},
                       {"share", k.share},
                       {"flops", k.flops},
                       {"dram_bytes", k.bytes},
                       {"flop_per_byte", ai ? nlohmann::json(*ai) : nlohmann::json(nullptr)},
                       {"achieved_flops_per_s", k.flops_per_s()},
                       {"dram_bytes_per_s", k.bytes_per_s()},
                       {"bound", bound_of(r, k)}});
  }
  nlohmann::json roofs = nlohmann::json::array();
  for (const auto& roof : r.compute_roofs) roofs.push_back({{"label", roof.label}, {"flops_per_s", roof.flops_per_s}});
  return {{"title", r.title},
          {"launches", r.launches},
          {"gpu_ms", r.total_seconds * 1e3},
          {"compute_roofs", roofs},
          {"bandwidth_bytes_per_s", r.bandwidth ? nlohmann::json(*r.bandwidth) : nlohmann::json(nullptr)},
          {"bandwidth_source", r.bandwidth_source},
          {"ncu_peak_bandwidth_bytes_per_s",
           r.ncu_peak_bandwidth ? nlohmann::json(*r.ncu_peak_bandwidth) : nlohmann::json(nullptr)},
          {"missing_metrics", r.missing_metrics},
          {"notes", r.notes},
          {"kernels", kernels}};
}

}  // namespace tt::roofline
