// The compare tool on hand-made result fixtures (tests/fixtures/compare/): arithmetic, comparability,
// bad input, the regression gate and the written files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "apps/cli/compare_cli.h"
#include "apps/cli/roofline_cli.h"
#include "apps/compare/compare.h"
#include "apps/compare/compare_svg.h"
#include "apps/compare/compare_text.h"
#include "apps/compare/exercise.h"
#include "apps/compare/html_report.h"
#include "apps/results/result_file.h"
#include "tests/helpers.h"

namespace tt::compare {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(TT_SOURCE_DIR) + "/tests/fixtures/compare/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Outcome {
  int code;
  std::string out, err;
};
Outcome compare(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = tt::compare_main(args, out, err);
  return {code, out.str(), err.str()};
}

// A copy of a fixture with one field changed, written to a temporary file.
std::string modified_fixture(const std::string& name, const std::function<void(nlohmann::json&)>& change,
                             const std::string& dir) {
  nlohmann::json j = read_json_file(fixture(name));
  change(j);
  const std::string path = dir + "/modified_" + name;
  write_json_atomically(path, j, true);
  return path;
}

const Row& row_of(const Comparison& c, const std::string& stage) {
  for (const auto& r : c.rows)
    if (r.stage == stage) return r;
  throw std::runtime_error("no row for " + stage);
}

TEST(Compare, SpeedupMemoryAndLossAreRelativeToV1) {
  // v1 is not the first file: it is still the reference.
  const auto results = load_results({fixture("v2_fused.json"), fixture("v1_baseline.json"), fixture("v3_custom.json")});
  const Comparison c = build_comparison(results);
  ASSERT_EQ(c.rows.size(), 3u);
  EXPECT_EQ(c.reference, 1u);
  EXPECT_NE(c.reference_reason.find("v1_baseline"), std::string::npos);
  EXPECT_TRUE(c.mismatches.empty());

  const Row& v1 = row_of(c, "v1_baseline");
  const Row& v2 = row_of(c, "v2_fused");
  const Row& v3 = row_of(c, "v3_custom");
  EXPECT_TRUE(v1.reference);
  EXPECT_DOUBLE_EQ(v1.speedup, 1.0);
  EXPECT_DOUBLE_EQ(v2.speedup, 2.0);           // 100 ms / 50 ms
  EXPECT_DOUBLE_EQ(v3.speedup, 2.5);           // 100 ms / 40 ms
  EXPECT_DOUBLE_EQ(*v2.peak_reduction, 0.25);  // 1 - 1500 / 2000
  EXPECT_DOUBLE_EQ(*v3.peak_reduction, 0.5);
  EXPECT_NEAR(v2.loss_delta, 0.01, 1e-12);
  EXPECT_NEAR(v3.loss_delta, -0.01, 1e-12);
  EXPECT_DOUBLE_EQ(v2.median_ms, 50.0);
  EXPECT_DOUBLE_EQ(v2.p10_ms, 48.0);
  EXPECT_DOUBLE_EQ(v2.p90_ms, 55.0);
  EXPECT_DOUBLE_EQ(v2.tokens_per_s, 8 * 128 * 1000.0 / 50.0);
  EXPECT_FALSE(v1.kernels_per_step.has_value());  // not profiled
  EXPECT_DOUBLE_EQ(*v2.kernels_per_step, 412.0);
  ASSERT_TRUE(v2.mfu.has_value());
  EXPECT_NEAR(*v2.mfu, v2.tflops / 989.4, 1e-12);
  EXPECT_DOUBLE_EQ(*c.peak_tflops, 989.4);
  EXPECT_EQ(c.dtype, "bf16");
  EXPECT_EQ(c.config_name, "workshop");

  const std::string table = format_table(c);
  EXPECT_NE(table.find("median ms [p10–p90]"), std::string::npos) << table;
  EXPECT_NE(table.find("50.00 [48.00–55.00]"), std::string::npos) << table;
  EXPECT_NE(table.find("2.50x"), std::string::npos) << table;
  EXPECT_NE(table.find("25.0%"), std::string::npos) << table;
  EXPECT_NE(table.find("+0.0100"), std::string::npos) << table;
  EXPECT_NE(table.find("412"), std::string::npos) << table;
}

TEST(Compare, AGraphedResultSwitchesTheMemoryColumnToReservedForEveryRow) {
  auto results = load_results({fixture("v1_baseline.json"), fixture("v3_custom.json")});
  EXPECT_EQ(build_comparison(results).memory_field, "peak_allocated_mb");
  results[1].json["stage"]["components"]["step"] = "one CUDA/HIP graph: captured once, replayed every step";
  const Comparison c = build_comparison(results);
  EXPECT_EQ(c.memory_field, "peak_reserved_mb");
  EXPECT_DOUBLE_EQ(row_of(c, "v1_baseline").peak_mb, 2500.0);
  EXPECT_DOUBLE_EQ(*row_of(c, "v3_custom").peak_reduction, 0.5);  // 1 - 1250 / 2500
  EXPECT_NE(format_table(c).find("summary.peak_reserved_mb for every stage"), std::string::npos);
  EXPECT_NE(to_csv(c).find(",peak_reserved_mb,"), std::string::npos);
}

TEST(Compare, FirstFileIsTheReferenceWithoutV1) {
  const Comparison c = build_comparison(load_results({fixture("v2_fused.json"), fixture("v3_custom.json")}));
  EXPECT_EQ(c.reference, 0u);
  EXPECT_NE(c.reference_reason.find("first file"), std::string::npos);
  EXPECT_DOUBLE_EQ(c.rows[1].speedup, 1.25);  // 50 ms / 40 ms
  EXPECT_NEAR(*c.rows[1].peak_reduction, 1.0 - 1000.0 / 1500.0, 1e-12);
}

TEST(Compare, DuplicateStagesGetDistinctLabels) {
  const std::string copy = tt::testing::fresh_dir("tt_compare_second_run").string() + "/v2_fused.json";
  std::filesystem::copy_file(fixture("v2_fused.json"), copy);
  const auto results = load_results({fixture("v2_fused.json"), copy});
  EXPECT_EQ(results[0].label, "v2_fused (compare/v2_fused)");
  EXPECT_NE(results[0].label, results[1].label);
  EXPECT_EQ(results[1].label.rfind("v2_fused (", 0), 0u) << results[1].label;
}

TEST(Compare, DetectsEachFieldThatMakesResultsIncomparable) {
  const auto base = load_results({fixture("v1_baseline.json"), fixture("v2_fused.json")});
  struct Case {
    std::string field;
    std::function<void(nlohmann::json&)> change;
    std::string first_value, other_value;
  };
  const std::vector<Case> cases = {
      {"config.model.hidden_dim", [](nlohmann::json& j) { j["config"]["model"]["hidden_dim"] = 256; }, "512", "256"},
      {"config.model.n_layers", [](nlohmann::json& j) { j["config"]["model"]["n_layers"] = 4; }, "8", "4"},
      {"config.training.batch_size", [](nlohmann::json& j) { j["config"]["training"]["batch_size"] = 16; }, "8", "16"},
      {"config.training.seq_len", [](nlohmann::json& j) { j["config"]["training"]["seq_len"] = 256; }, "128", "256"},
      {"training.dtype", [](nlohmann::json& j) { j["training"]["dtype"] = "fp32"; }, "\"bf16\"", "\"fp32\""},
      {"system.device_name", [](nlohmann::json& j) { j["system"]["device_name"] = "AMD Instinct MI300X"; },
       "\"NVIDIA H100 80GB HBM3\"", "\"AMD Instinct MI300X\""},
      {"schema_version", [](nlohmann::json& j) { j["schema_version"] = 2; }, "1", "2"},
      {"distributed.world_size", [](nlohmann::json& j) { j["distributed"] = {{"world_size", 2}}; }, "1", "2"},
  };
  for (const auto& c : cases) {
    auto results = base;
    c.change(results[1].json);
    const auto diffs = find_mismatches(results);
    ASSERT_EQ(diffs.size(), 1u) << c.field;
    EXPECT_EQ(diffs[0].field, c.field);
    EXPECT_EQ(diffs[0].first_value, c.first_value) << c.field;
    EXPECT_EQ(diffs[0].other_value, c.other_value) << c.field;
    const std::string text = diffs[0].describe();
    EXPECT_NE(text.find(c.field), std::string::npos) << text;
    EXPECT_NE(text.find("v2_fused.json"), std::string::npos) << text;
  }
  // A field only one of them has counts as a difference too.
  auto results = base;
  results[1].json["config"]["model"]["new_field"] = 1;
  ASSERT_EQ(find_mismatches(results).size(), 1u);
  EXPECT_EQ(find_mismatches(results)[0].first_value, "(missing)");

  // Progress printing and the requested device do not change the work: no mismatch.
  results = base;
  results[1].json["config"]["training"]["log_every"] = 1;
  results[1].json["config"]["training"]["device"] = "cuda";
  EXPECT_TRUE(find_mismatches(results).empty());
  // A one-rank data-parallel run is the plain run.
  results[1].json["distributed"] = {{"world_size", 1}};
  EXPECT_TRUE(find_mismatches(results).empty());
  // Sharded (ZeRO-1) or not, and the optimizer overlap, are what a comparison shows, not a reason to refuse it.
  results[1].json["config"]["training"]["shard_optimizer"] = true;
  results[1].json["config"]["training"]["optimizer_overlap"] = true;
  EXPECT_TRUE(find_mismatches(results).empty());
  // A different commit is a note, not a refusal.
  results[1].json["system"]["git_commit"] = "abc123";
  EXPECT_TRUE(find_mismatches(results).empty());
  ASSERT_EQ(find_notes(results).size(), 1u);
  EXPECT_EQ(find_notes(results)[0].field, "system.git_commit");
}

TEST(Compare, RefusesIncomparableResultsUnlessAllowed) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_mismatch").string();
  const std::string fp32 = modified_fixture(
      "v2_fused.json",
      [](nlohmann::json& j) {
        j["training"]["dtype"] = "fp32";
        j["config"]["training"]["dtype"] = "fp32";
      },
      dir);
  Outcome run = compare({fixture("v1_baseline.json"), fp32, "--output-dir", dir});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("not comparable"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("training.dtype: '"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("has \"bf16\""), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("has \"fp32\""), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("--allow-mismatch"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(dir + "/comparison.md"));

  run = compare({fixture("v1_baseline.json"), fp32, "--output-dir", dir, "--allow-mismatch"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.err.find("warning"), std::string::npos) << run.err;
  EXPECT_NE(run.out.find("not comparable"), std::string::npos) << run.out;
  EXPECT_NE(read_file(dir + "/comparison.md").find("not comparable"), std::string::npos);
  EXPECT_NE(read_file(dir + "/comparison.svg").find("not comparable"), std::string::npos);
}

TEST(Compare, BadFilesFailWithTheFileAndTheProblem) {
  Outcome run = compare({fixture("v1_baseline.json"), fixture("malformed.json")});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("malformed.json' is not valid JSON"), std::string::npos) << run.err;

  run = compare({fixture("v1_baseline.json"), fixture("missing_field.json")});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("missing_field.json' is not a valid result file"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("summary.tokens_per_s"), std::string::npos) << run.err;

  run = compare({fixture("v1_baseline.json"), fixture("does_not_exist.json")});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("does_not_exist.json' does not exist"), std::string::npos) << run.err;

  const std::string dir = tt::testing::fresh_dir("tt_compare_trace").string();
  std::ofstream(dir + "/v1.trace.json") << R"({"traceEvents": []})";
  run = compare({dir + "/v1.trace.json"});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("--profile trace"), std::string::npos) << run.err;

  run = compare({});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("no result files given"), std::string::npos) << run.err;

  // The same file twice would be a row compared with itself.
  run = compare({fixture("v1_baseline.json"), fixture("v2_fused.json"), fixture("v1_baseline.json")});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("v1_baseline.json' is given twice"), std::string::npos) << run.err;

  // An eval result and a run stopped before its first measured step say what they are.
  const std::string eval = dir + "/eval.json";
  std::ofstream(eval) << R"({"schema_version": 1, "kind": "evaluation"})";
  run = compare({fixture("v1_baseline.json"), eval});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("this is an evaluation result (--eval-only writes it"), std::string::npos) << run.err;
  const std::string stopped = dir + "/stopped.json";
  std::ofstream(stopped) << R"({"schema_version": 1, "summary": null, "summary_note": "stopped at step 2 of 5"})";
  run = compare({fixture("v1_baseline.json"), stopped});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("this run has no measured steps (summary is null: \"stopped at step 2 of 5\")"),
            std::string::npos)
      << run.err;

  run = compare({fixture("v1_baseline.json"), "--no-such-flag"});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("no-such-flag"), std::string::npos) << run.err;
}

TEST(Compare, FailIfSlowerGatesOnTheBaselineMedian) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_slower").string();
  // Baseline v2 (50 ms); v3 (40 ms) is faster, v1 (100 ms) is 100 % slower.
  Outcome run = compare({"--baseline", fixture("v2_fused.json"), "--fail-if-slower", "5", "--output-dir", dir,
                         fixture("v3_custom.json"), fixture("v1_baseline.json")});
  EXPECT_EQ(run.code, 1) << run.out << run.err;
  EXPECT_NE(run.out.find("FAIL v1_baseline: 100.000 ms vs 50.000 ms (+100.0%)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("ok   v3_custom: 40.000 ms vs 50.000 ms (-20.0%)"), std::string::npos) << run.out;
  // The baseline is the reference of the table, even with a v1 result present.
  EXPECT_NE(run.out.find("reference: v2_fused"), std::string::npos) << run.out;

  run = compare({"--baseline", fixture("v2_fused.json"), "--fail-if-slower", "5", "--output-dir", dir,
                 fixture("v3_custom.json"), fixture("v2_fused.json")});
  EXPECT_EQ(run.code, 0) << run.out << run.err;  // equal time is 0 % slower

  const std::string slower = modified_fixture(
      "v2_fused.json",
      [](nlohmann::json& j) {
        j["summary"]["step_ms"]["median"] = 52.6;  // 5.2 % slower
      },
      dir);
  run = compare({"--baseline", fixture("v2_fused.json"), "--fail-if-slower", "5", "--output-dir", dir, slower});
  EXPECT_EQ(run.code, 1);
  run = compare({"--baseline", fixture("v2_fused.json"), "--fail-if-slower", "6", "--output-dir", dir, slower});
  EXPECT_EQ(run.code, 0);

  run = compare({"--fail-if-slower", "5", fixture("v2_fused.json")});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("--fail-if-slower needs --baseline"), std::string::npos) << run.err;
  run = compare({"--baseline", fixture("v2_fused.json"), "--fail-if-slower", "-1", fixture("v3_custom.json")});
  EXPECT_EQ(run.code, 2);
  EXPECT_NE(run.err.find("must be a percentage >= 0"), std::string::npos) << run.err;

  const auto checks =
      check_slower(load_result(fixture("v2_fused.json")), load_results({fixture("v1_baseline.json")}), 99.0);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_DOUBLE_EQ(checks[0].slower_pct, 100.0);
  EXPECT_TRUE(checks[0].too_slow);
}

TEST(Compare, WritesMarkdownCsvAndSvg) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_files").string();
  const Outcome run =
      compare({fixture("v1_baseline.json"), fixture("v2_fused.json"), fixture("v3_custom.json"), "--output-dir", dir});
  ASSERT_EQ(run.code, 0) << run.err;
  EXPECT_NE(run.out.find(dir + "/comparison.svg"), std::string::npos) << run.out;

  const std::string md = read_file(dir + "/comparison.md");
  EXPECT_NE(md.find("| **v1_baseline** |"), std::string::npos) << md;
  EXPECT_NE(md.find("| v3_custom | 40.00 [39.00–42.00] |"), std::string::npos) << md;
  EXPECT_NE(md.find("|---|---:|"), std::string::npos) << md;

  std::istringstream csv(read_file(dir + "/comparison.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].substr(0, 31), "label,stage,file,median_ms,p10_");
  EXPECT_NE(lines[2].find(",2,"), std::string::npos) << lines[2];   // v2 speedup
  EXPECT_NE(lines[1].find(",yes"), std::string::npos) << lines[1];  // v1 is the reference

  const std::string svg = read_file(dir + "/comparison.svg");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  for (const char* stage : {"v1_baseline", "v2_fused", "v3_custom"}) EXPECT_NE(svg.find(stage), std::string::npos);
  EXPECT_NE(svg.find("peak 989.4"), std::string::npos);  // the roofline ceiling
  auto count = [&](const std::string& s) {
    size_t n = 0;
    for (size_t pos = svg.find(s); pos != std::string::npos; pos = svg.find(s, pos + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<text"), count("</text>"));
  EXPECT_EQ(count("<rect x="), count("</rect>"));
}

// The energy window's mean power reaches the chart's label, the CSV and the report. A result written before that
// field gets the same figure from its energy fields; one without energy shows none and leaves its CSV cell empty;
// a stored figure that disagrees with the energy fields, or is not a number, is refused.
TEST(Compare, MeanPowerOfTheEnergyWindowIsShownWhereTheResultHasIt) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_power").string();
  auto with_energy = [&](const std::string& name, double j_per_step, int64_t steps, double seconds,
                         const nlohmann::json& average_power_w) {
    nlohmann::json j = read_json_file(fixture("v3_custom.json"));
    j["summary"]["energy_j_per_step"] = j_per_step;
    j["summary"]["tokens_per_joule"] = j["training"]["tokens_per_step"].get<double>() / j_per_step;
    j["summary"]["energy_window"] = {
        {"steps", steps}, {"seconds", seconds}, {"extra_steps", false}, {"counter_refresh_ms", 100.0}};
    if (!average_power_w.is_null()) j["summary"]["energy_window"]["average_power_w"] = average_power_w;
    const std::string path = dir + "/" + name;
    write_json_atomically(path, j, true);
    return path;
  };
  const std::string with_field = with_energy("new.json", 0.5, 100, 0.1, 500.0);
  const std::string before_field = with_energy("old.json", 0.25, 100, 0.1, nullptr);  // 250 W from its fields
  const auto results = load_results({fixture("v1_baseline.json"), with_field, before_field});
  const Comparison c = build_comparison(results);
  EXPECT_FALSE(c.rows[0].average_power_w.has_value()) << "a result without an energy figure has no mean power";
  ASSERT_TRUE(c.rows[1].average_power_w.has_value());
  EXPECT_DOUBLE_EQ(*c.rows[1].average_power_w, 500.0);
  ASSERT_TRUE(c.rows[2].average_power_w.has_value()) << "derived from the fields of a result written before it";
  EXPECT_DOUBLE_EQ(*c.rows[2].average_power_w, 250.0);
  const std::string svg = to_svg(c);
  EXPECT_NE(svg.find(" tokens/J, 500 W)"), std::string::npos);
  EXPECT_NE(svg.find(" tokens/J, 250 W)"), std::string::npos);
  const std::string csv = to_csv(c);
  EXPECT_NE(csv.find(",tokens_per_joule,average_power_w\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",500\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",250\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find(",yes,,,\n"), std::string::npos) << "the reference, without energy: three empty cells\n" << csv;
  EXPECT_NE(to_html(c, results, dir).find("500 W on average over the window"), std::string::npos);
  EXPECT_THROW(load_results({with_energy("wrong.json", 0.5, 100, 0.1, 400.0)}), std::runtime_error)
      << "0.5 J x 100 steps / 0.1 s is 500 W, not 400";
  EXPECT_THROW(load_results({with_energy("text.json", 0.5, 100, 0.1, "500")}), std::runtime_error)
      << "a mean power that is not a number is refused";
}

// The debugging exercise: pitfall runs get labels with their pitfall, v3 as shipped (--pitfall none) is the
// reference, and the summary names what each teaches.
TEST(Compare, DebuggingExerciseRowsAreLabelledAndMeasuredAgainstStageFive) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_exercise").string();
  auto with_pitfall = [&](const std::string& pitfall, double median_ms, const std::string& out_name) {
    nlohmann::json j = read_json_file(fixture("v3_custom.json"));
    j["stage"]["pitfall"] = {{"name", pitfall}, {"lesson", "lesson of " + pitfall}};
    j["summary"]["step_ms"]["median"] = median_ms;
    j["summary"]["energy_j_per_step"] = median_ms / 100;
    const std::string path = dir + "/" + out_name;
    write_json_atomically(path, j, true);
    return path;
  };
  const auto results = load_results({with_pitfall("missing-init", 40, "stage1.json"),
                                     with_pitfall("naive-swiglu", 80, "stage4.json"), with_pitfall("none", 40, "stage5.json")});
  const Comparison c = build_comparison(results);
  EXPECT_EQ(c.reference, 2u) << "v3 as shipped is the reference";
  EXPECT_EQ(c.rows[0].label, "v3_custom [missing-init]");
  EXPECT_DOUBLE_EQ(c.rows[1].speedup, 0.5);
  ASSERT_TRUE(c.rows[1].energy_j_per_step.has_value());
  EXPECT_DOUBLE_EQ(*c.rows[1].energy_j_per_step, 0.8);
  const std::string svg = to_svg(c);
  EXPECT_NE(svg.find("GPU energy per step"), std::string::npos) << "an energy panel when results carry energy";
  EXPECT_NE(svg.find("0.800 J/step"), std::string::npos);
  EXPECT_EQ(to_svg(build_comparison(load_results({fixture("v1_baseline.json")}))).find("GPU energy per step"),
            std::string::npos);
  const std::string lessons = format_exercise(c);
  EXPECT_NE(lessons.find("naive-swiglu"), std::string::npos) << lessons;
  EXPECT_NE(lessons.find("0.50x"), std::string::npos) << lessons;
  EXPECT_NE(lessons.find("lesson of naive-swiglu"), std::string::npos) << lessons;
  EXPECT_EQ(format_exercise(build_comparison(load_results({fixture("v1_baseline.json")}))), "");
}

TEST(Compare, WritesOneSelfContainedHtmlReportWithTheFoldersRoofline) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_html").string();
  std::ostringstream roof_out, roof_err;
  ASSERT_EQ(roofline_main({"--counters", std::string(TT_SOURCE_DIR) + "/tests/fixtures/roofline/ncu_raw.csv", "--gpu",
                           "NVIDIA H100 80GB HBM3", "--bandwidth-gbs", "3000", "--output-dir", dir},
                          roof_out, roof_err),
            0)
      << roof_err.str();
  // A CPU run's profile: no GPU time or kernel count (null), ATen ops by self time.
  const std::string cpu_profile = modified_fixture(
      "v3_custom.json",
      [](nlohmann::json& j) {
        j["profile"]["basis"] = "cpu_self_time";
        j["profile"]["gpu_time_per_step_ms"] = nullptr;
        j["profile"]["kernels_per_step"] = nullptr;
      },
      dir);
  const Outcome run = compare({fixture("v1_baseline.json"), cpu_profile, "--output-dir", dir});
  ASSERT_EQ(run.code, 0) << run.err;
  const std::string html = read_file(dir + "/report.html");
  EXPECT_NE(html.find("(a CPU run: ATen ops by self time, no GPU kernels)"), std::string::npos);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<th>median ms [p10–p90]</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>v3_custom</td>"), std::string::npos);
  EXPECT_NE(html.find("Roofline: "), std::string::npos) << "the folder's roofline chart is inlined";
  EXPECT_NE(html.find("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), std::string::npos);
  EXPECT_NE(html.find("System, config and components"), std::string::npos);
  for (const char* outside : {"<script", "<link", "src=", "https://"})
    EXPECT_EQ(html.find(outside), std::string::npos) << "the report must not load anything: found " << outside;
  EXPECT_EQ(html.find("<svg"), html.find("<svg xmlns=\"http://www.w3.org/2000/svg\""));
}

}  // namespace
}  // namespace tt::compare

namespace tt::compare {
namespace {

std::string profiled(const std::string& stage) {
  return std::string(TT_SOURCE_DIR) + "/tests/fixtures/compare/profiled/" + stage + ".json";
}

// Where the time goes: v1..v4 with real-looking profiles get the category table, the stacked bars in the chart
// and in report.html, and the kernels left in "other" listed.
TEST(Compare, ProfiledResultsShowWhereTheTimeGoes) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_breakdown").string();
  const auto r = compare({profiled("v1_baseline"), profiled("v2_fused"), profiled("v3_custom"), profiled("v4_ultra"),
                          "--output-dir", dir});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("where the time goes (ms per step)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kernel names in \"other\""), std::string::npos) << r.out;
  const Comparison c = build_comparison(
      load_results({profiled("v1_baseline"), profiled("v2_fused"), profiled("v3_custom"), profiled("v4_ultra")}));
  const Row& v4 = row_of(c, "v4_ultra");
  ASSERT_TRUE(v4.breakdown.has_value());
  EXPECT_NEAR(v4.breakdown->ms_per_step[static_cast<size_t>(KernelCategory::kGemm)], 0.612, 1e-9);
  EXPECT_NEAR(v4.breakdown->ms_per_step[static_cast<size_t>(KernelCategory::kOptimizer)], 0.247, 1e-9);
  EXPECT_NEAR(v4.breakdown->host_gap_ms, 1.51 - 1.411, 1e-9);
  const std::string html = read_file(dir + "/report.html");
  const size_t section = html.find("<h2>Where the time goes</h2>");
  ASSERT_NE(section, std::string::npos);
  EXPECT_LT(section, html.find("<h2>Chart</h2>")) << "the bars come before the chart";
  for (auto cat : kernel_categories()) EXPECT_NE(html.find(std::string(">") + to_string(cat) + "</text>"), std::string::npos) << to_string(cat);
  EXPECT_NE(html.find(">host gap</text>"), std::string::npos);
  EXPECT_NE(html.find("v4_ultra: GEMM 0.612 ms per step"), std::string::npos) << "a segment's tooltip";
  EXPECT_NE(html.find("kernel names in \"other\""), std::string::npos);
  EXPECT_NE(read_file(dir + "/comparison.svg").find("Where the time goes"), std::string::npos);
  EXPECT_NE(read_file(dir + "/comparison.md").find("### Where the time goes"), std::string::npos);
  // Without a GPU profile there is nothing to split.
  EXPECT_EQ(format_time_breakdown(build_comparison(load_results({fixture("v1_baseline.json")}))), "");
}

// The graph pool's memory note belongs to a graph replayed on a GPU; a graph stage run on the CPU ran eagerly.
TEST(Compare, GraphPoolMemoryNoteOnlyForAGraphReplayedOnAGpu) {
  const std::string dir = tt::testing::fresh_dir("tt_compare_cpu_graph").string();
  const std::string cpu_v4 = modified_fixture(
      "v3_custom.json",
      [](nlohmann::json& j) {
        j["stage"]["name"] = "v4_ultra";
        j["stage"]["components"]["step"] =
            "eager: op by op through LibTorch's autograd (this run is on the CPU: graphs need a GPU)";
        j["system"]["device"] = "cpu";
        j.erase("profile");
      },
      dir);
  const Comparison cpu = build_comparison(load_results({fixture("v1_baseline.json"), cpu_v4}));
  EXPECT_EQ(cpu.memory_field, "peak_allocated_mb");
  EXPECT_EQ(format_table(cpu).find("graph"), std::string::npos) << format_table(cpu);
  const Comparison gpu = build_comparison(load_results({fixture("v1_baseline.json"), profiled("v4_ultra")}));
  EXPECT_EQ(gpu.memory_field, "peak_reserved_mb");
  EXPECT_NE(format_table(gpu).find("replayed its step as a graph"), std::string::npos);
}

}  // namespace
}  // namespace tt::compare
