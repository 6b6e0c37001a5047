#include "apps/compare/html_report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "apps/compare/compare_svg.h"
#include "apps/compare/compare_text.h"
#include "apps/compare/exercise.h"
#include "apps/results/result_file.h"
#include "apps/results/text.h"

namespace tt::compare {
namespace {

namespace fs = std::filesystem;

std::string text_of(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  if (v.is_number_float()) return strprintf("%.6g", v.get<double>());
  return v.dump();
}

// A two-column table of an object's scalar fields (nested objects as compact JSON).
std::string fields_table(const nlohmann::json& object) {
  std::string out = "<table class=\"kv\">";
  for (const auto& [key, value] : object.items())
    out += "<tr><th>" + xml_escape(key) + "</th><td>" +
           xml_escape(value.is_object() || value.is_array() ? value.dump() : text_of(value)) + "</td></tr>";
  return out + "</table>\n";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string median_of(const nlohmann::json& summary, const char* field) {
  const auto& v = summary.contains(field) ? summary[field] : nlohmann::json();
  return v.is_object() ? strprintf("%.3f", v["median"].get<double>()) : "-";
}

// A number field, or nothing where it is missing or null (a CPU profile has no GPU time or kernels).
std::optional<double> number(const nlohmann::json& object, const char* key) {
  return object.contains(key) && object[key].is_number() ? std::optional<double>(object[key].get<double>())
                                                         : std::nullopt;
}

std::string hotspots_table(const nlohmann::json& profile, size_t top) {
  const auto gpu_ms = number(profile, "gpu_time_per_step_ms");
  const auto kernels = number(profile, "kernels_per_step");
  std::string out = "<p>" +
                    xml_escape(strprintf("%.0f profiled steps", number(profile, "steps").value_or(0)) +
                               (gpu_ms ? strprintf(", GPU time %.3f ms per step", *gpu_ms) : std::string()) +
                               (kernels ? strprintf(", %.1f kernels per step", *kernels) : std::string()) +
                               (profile.value("basis", std::string()) == "cpu_self_time"
                                    ? " (a CPU run: ATen ops by self time, no GPU kernels)"
                                    : "")) +
                    "</p>\n<table><tr><th>share</th><th>total ms</th><th>calls</th><th>mean µs</th><th>kind</th>"
                    "<th>kernel / op</th></tr>\n";
  size_t n = 0;
  for (const auto& h : profile.value("hotspots", nlohmann::json::array())) {
    if (n++ == top) break;
    out += strprintf("<tr><td>%.1f%%</td><td>%.3f</td><td>%.0f</td><td>%.2f</td>", 100 * number(h, "share").value_or(0),
                     number(h, "total_us").value_or(0) / 1e3, number(h, "calls").value_or(0),
                     number(h, "mean_us").value_or(0)) +
           "<td>" + xml_escape(h.value("kind", "")) + "</td><td class=\"name\">" + xml_escape(h.value("name", "")) +
           "</td></tr>\n";
  }
  return out + "</table>\n";
}

std::string result_section(const Row& row, const Result& result) {
  const auto& j = result.json;
  const auto& s = j["summary"];
  std::string out =
      "<section><h3>" + xml_escape(row.label) + "</h3>\n<p class=\"path\">" + xml_escape(result.path) + "</p>\n";
  if (j["stage"].contains("pitfall"))
    out += "<p><b>Pitfall " + xml_escape(j["stage"]["pitfall"].value("name", "")) +
           "</b>: " + xml_escape(j["stage"]["pitfall"].value("lesson", "")) + "</p>\n";
  out +=
      "<h4>Timing (median ms)</h4><table><tr><th>timer</th><th>forward</th><th>backward</th><th>optimizer</th>"
      "<th>step</th></tr><tr><td>device events</td><td>" +
      median_of(s, "forward_ms") + "</td><td>" + median_of(s, "backward_ms") + "</td><td>" +
      median_of(s, "optimizer_ms") + "</td><td>" + median_of(s, "step_ms") + "</td></tr>";
  if (s.contains("host_clock_ms")) {
    const auto& h = s["host_clock_ms"];
    out += "<tr><td>host clock, no sync</td><td>" + median_of(h, "forward_ms") + "</td><td>" +
           median_of(h, "backward_ms") + "</td><td>" + median_of(h, "optimizer_ms") + "</td><td>" +
           median_of(h, "step_ms") + "</td></tr>";
  }
  out += "</table>\n";
  if (s.contains("host_clock_ms"))
    out += "<p class=\"note\">" + xml_escape(s["host_clock_ms"].value("note", "")) + "</p>\n";
  out += "<h4>Energy</h4><p>";
  out += s.contains("energy_j_per_step") && s["energy_j_per_step"].is_number()
             ? xml_escape(strprintf("%.3f J per step, ", s["energy_j_per_step"].get<double>()) +
                          (s["tokens_per_joule"].is_number()
                               ? strprintf("%.0f tokens per joule", s["tokens_per_joule"].get<double>())
                               : std::string("tokens per joule -")) +
                          (row.average_power_w ? strprintf(", %.0f W on average over the window", *row.average_power_w)
                                               : std::string()))
             : std::string("not measured");
  out += "</p><p class=\"note\">" + xml_escape(s.value("energy_note", std::string("no energy fields in this result"))) +
         "</p>\n";
  if (j.contains("profile")) out += "<h4>Top kernels (--profile)</h4>\n" + hotspots_table(j["profile"], 10);
  out += "<details><summary>System, config and components</summary>\n<h4>System</h4>\n" + fields_table(j["system"]) +
         "<h4>Stage components</h4>\n" + fields_table(j["stage"]["components"]) + "<h4>Model</h4>\n" +
         fields_table(j["config"]["model"]) + "<h4>Training</h4>\n" + fields_table(j["config"]["training"]) +
         "</details>\n</section>\n";
  return out;
}

// The stacked bars, then their numbers and the kernels the category rule left in "other".
std::string time_breakdown_section(const Comparison& c) {
  std::string out = "<h2>Where the time goes</h2>\n" + time_breakdown_svg(c) +
                    "<table><tr><th>stage</th><th>step ms</th><th>GPU busy ms</th><th>concurrent ms</th>";
  for (auto cat : kernel_categories()) out += "<th>" + xml_escape(to_string(cat)) + "</th>";
  out += "<th>host gap</th></tr>\n";
  for (const auto& r : c.rows) {
    if (!r.breakdown) continue;
    const TimeBreakdown& b = *r.breakdown;
    out +=
        "<tr><td>" + xml_escape(r.label) + "</td>" + strprintf("<td>%.3f</td><td>%.3f</td><td>%.3f</td>", b.step_ms, b.gpu_busy_ms, b.concurrent_ms);
    for (auto cat : kernel_categories()) out += strprintf("<td>%.3f</td>", b.ms_per_step[static_cast<size_t>(cat)]);
    out += strprintf("<td>%.3f</td></tr>\n", b.host_gap_ms);
  }
  out +=
      "</table>\n<p class=\"note\">ms per step. GPU busy: the time the GPU had any activity (kernels, copies, "
      "fills) during the --profile steps, the union of their intervals; the categories split the activities' own "
      "times by the kernel's name (apps/compare/kernel_categories.cpp) and add up to GPU busy + concurrent, where "
      "concurrent is the time kernels ran beside others on a second stream (our optimizer overlapped with the "
      "backward) or, launched programmatically (sm_90+, system.programmatic_launch), beside the kernel before them, "
      "whose end they wait for inside their own interval (busy and the categories then overstate the work); host gap: "
      "the median step time minus GPU busy: the time the GPU waited for the host, or, where the measured steps ran "
      "slower than the profiled ones (a GPU at its power limit), partly that difference.</p>\n";
  for (const auto& r : c.rows) {
    if (!r.breakdown || r.breakdown->other_kernels.empty()) continue;
    out += "<details><summary>" + xml_escape(r.label) + ": " + std::to_string(r.breakdown->other_kernels.size()) +
           " kernel names in \"other\"</summary><table><tr><th>ms per step</th><th>kernel</th></tr>\n";
    for (const auto& [name, ms] : r.breakdown->other_kernels)
      out += strprintf("<tr><td>%.3f</td>", ms) + "<td class=\"name\">" + xml_escape(name) + "</td></tr>\n";
    out += "</table></details>\n";
  }
  return out;
}

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:24px auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td.name,td:first-child,table.kv td,table.kv th{text-align:left}
td.name{font-family:monospace;font-size:12px;max-width:640px;overflow-wrap:anywhere}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}.note,.path{color:#666;font-size:12px}
section{border-top:2px solid #ddd;margin-top:20px}svg{max-width:100%;height:auto})";

}  // namespace

std::string to_html(const Comparison& c, const std::vector<Result>& results, const std::string& folder) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>TinyTransformer report: " +
                    xml_escape(c.config_name) + "</title>\n<style>" + kStyle + "</style></head><body>\n";
  out += "<h1>TinyTransformer run report</h1>\n<p>config <b>" + xml_escape(c.config_name) + "</b> | dtype <b>" +
         xml_escape(c.dtype) + "</b> | device <b>" + xml_escape(c.device_name) + "</b>" +
         (c.peak_tflops ? xml_escape(strprintf(" | peak %.1f TFLOP/s", *c.peak_tflops)) : std::string()) + "</p>\n";
  if (!c.mismatches.empty()) {
    out += "<p><b>Warning: these results are not comparable</b>:</p><ul>";
    for (const auto& d : c.mismatches) out += "<li>" + xml_escape(d.describe()) + "</li>";
    out += "</ul>\n";
  }
  out += "<h2>Comparison</h2>\n<table><tr>";
  for (const auto& h : table_headers()) out += "<th>" + xml_escape(h) + "</th>";
  out += "</tr>\n";
  for (const auto& row : table_text(c)) {
    out += "<tr>";
    for (const auto& cell : row) out += "<td>" + xml_escape(cell) + "</td>";
    out += "</tr>\n";
  }
  out += "</table>\n<p class=\"note\">reference: " + xml_escape(c.rows[c.reference].label) + ", " +
         xml_escape(c.reference_reason) + "</p>\n";
  if (const std::string lessons = format_exercise(c); !lessons.empty())
    out += "<h2>Debugging exercise</h2>\n<pre>" + xml_escape(lessons) + "</pre>\n";
  if (c.has_breakdown()) out += time_breakdown_section(c);
  out += "<h2>Chart</h2>\n" + to_svg(c, /*with_breakdown=*/false);

  std::vector<fs::path> rooflines;
  std::error_code ec;
  if (fs::is_directory(folder.empty() ? "." : folder, ec))
    for (const auto& entry : fs::directory_iterator(folder.empty() ? "." : folder, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.size() >= 13 && name.compare(name.size() - 13, 13, "roofline.json") == 0)
        rooflines.push_back(entry.path());
    }
  std::sort(rooflines.begin(), rooflines.end());
  out += "<h2>Roofline</h2>\n";
  if (rooflines.empty())
    out +=
        "<p class=\"note\">No roofline report in this folder (scripts/profile_roofline.sh writes one; "
        "docs/roofline-energy.md, \"The roofline report\").</p>\n";
  for (const auto& json_path : rooflines) {
    fs::path svg = json_path;
    svg.replace_extension(".svg");
    nlohmann::json data;
    try {
      data = read_json_file(json_path.string());
    } catch (const std::exception& e) {
      out += "<p class=\"note\">" + xml_escape(json_path.string()) + ": " + xml_escape(e.what()) + "</p>\n";
      continue;
    }
    out += "<h3>" + xml_escape(data.value("title", json_path.filename().string())) + "</h3>\n";
    if (fs::exists(svg)) out += read_text(svg);
    out +=
        "<table><tr><th>#</th><th>kernel</th><th>calls</th><th>GPU ms</th><th>share</th><th>FLOP/byte</th>"
        "<th>TFLOP/s</th><th>GB/s</th><th>bound</th></tr>\n";
    size_t rank = 0;
    for (const auto& k : data.value("kernels", nlohmann::json::array()))
      out += strprintf("<tr><td>%zu</td>", ++rank) + "<td class=\"name\">" + xml_escape(k.value("name", "")) + "</td>" +
             strprintf("<td>%lld</td><td>%.3f</td><td>%.1f%%</td>", static_cast<long long>(k.value("calls", 0)),
                       k.value("gpu_ms", 0.0), 100 * k.value("share", 0.0)) +
             "<td>" + (k["flop_per_byte"].is_number() ? strprintf("%.3g", k["flop_per_byte"].get<double>()) : "-") +
             "</td>" +
             strprintf("<td>%.3f</td><td>%.1f</td>", k.value("achieved_flops_per_s", 0.0) / 1e12,
                       k.value("dram_bytes_per_s", 0.0) / 1e9) +
             "<td>" + xml_escape(k.value("bound", "")) + "</td></tr>\n";
    out += "</table>\n";
  }
  out += "<h2>Results</h2>\n";
  for (size_t i = 0; i < results.size() && i < c.rows.size(); ++i) out += result_section(c.rows[i], results[i]);
  return out + "</body></html>\n";
}

}  // namespace tt::compare
