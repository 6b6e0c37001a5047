// The roofline report on a fixed ncu counter file (tests/fixtures/roofline/ncu_raw.csv, numbers made up so
// that every figure below can be worked out by hand): parsing and adding up launches, units and thousands
// separators, intensity and bound, the written files, and clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/cli/roofline_cli.h"
#include "apps/compare/roofline.h"

namespace tt::roofline {
namespace {

namespace fs = std::filesystem;

const std::string kFixture = std::string(TT_SOURCE_DIR) + "/tests/fixtures/roofline/ncu_raw.csv";
const std::string kH100 = "NVIDIA H100 80GB HBM3";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

Report fixture_report() {
  Report r = read_ncu_csv(kFixture);
  r.compute_roofs = roofs_for(kH100);
  r.bandwidth = 3e12;
  r.bandwidth_source = "test";
  return r;
}

TEST(Roofline, AddsUpLaunchesPerKernelAndSortsByGpuTime) {
  const Report r = read_ncu_csv(kFixture);
  EXPECT_EQ(r.launches, 5);
  ASSERT_EQ(r.kernels.size(), 4u);
  EXPECT_EQ(r.kernels[0].name, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64");
  const Kernel& gemm = r.kernels[1];
  EXPECT_EQ(gemm.name, "void gemm_kernel<float, 128>(GemmParams)");
  EXPECT_EQ(gemm.calls, 2);
  EXPECT_DOUBLE_EQ(gemm.seconds, 2e-4);  // 2 x "100,000" nsecond
  EXPECT_DOUBLE_EQ(gemm.flops, 2e8);     // 2 x 50 M ffma x 2
  EXPECT_DOUBLE_EQ(gemm.bytes, 1e7);     // 2 x (4 M read + 1 M written)
  EXPECT_DOUBLE_EQ(*gemm.intensity(), 20.0);
  EXPECT_DOUBLE_EQ(r.kernels[0].flops, 2e10);  // tensor-path ops
  EXPECT_DOUBLE_EQ(r.kernels[2].flops, 2e6);   // rms_norm: 1 M fadd + 1 M fmul
  EXPECT_DOUBLE_EQ(r.kernels[3].flops, 0.0);   // the fill kernel ("n/a" counts as nothing)
  EXPECT_NEAR(r.total_seconds, 5.1e-4, 1e-15);
  double shares = 0;
  for (const auto& k : r.kernels) shares += k.share;
  EXPECT_NEAR(shares, 1.0, 1e-12);
  ASSERT_TRUE(r.ncu_peak_bandwidth.has_value());
  EXPECT_DOUBLE_EQ(*r.ncu_peak_bandwidth, 2100 * 1.6e9);
  EXPECT_EQ(r.missing_metrics.size(), 3u);
  EXPECT_NE(std::find(r.missing_metrics.begin(), r.missing_metrics.end(), "sm__ops_path_tensor_src_tf32_dst_fp32.sum"),
            r.missing_metrics.end());
}

TEST(Roofline, RoofsComeFromThePeakTableAndBoundFromTheRidge) {
  const Report r = fixture_report();
  ASSERT_EQ(r.compute_roofs.size(), 3u);  // bf16 and tf32 tensor cores, fp32
  EXPECT_DOUBLE_EQ(r.compute_roofs[0].flops_per_s, 989.4e12);
  EXPECT_DOUBLE_EQ(r.compute_roofs[2].flops_per_s, 66.9e12);
  EXPECT_TRUE(roofs_for("Some Unknown GPU").empty());
  // Attainable: bandwidth x intensity below the ridge (989.4e12 / 3e12 = 329.8 FLOP/byte), the roof above.
  EXPECT_DOUBLE_EQ(*attainable(r, 0.125), 3e12 * 0.125);
  EXPECT_DOUBLE_EQ(*attainable(r, 2000), 989.4e12);
  const auto json = to_json(r, 10);
  ASSERT_EQ(json["kernels"].size(), 4u);
  EXPECT_EQ(json["kernels"][0]["bound"], "compute");            // 2000 FLOP/byte
  EXPECT_EQ(json["kernels"][1]["bound"], "memory");             // 20 FLOP/byte
  EXPECT_EQ(json["kernels"][3]["bound"], "memory (no FLOPs)");  // the fill
  EXPECT_DOUBLE_EQ(json["kernels"][0]["achieved_flops_per_s"].get<double>(), 2e10 / 2.5e-4);
  // A kernel's roof: the tensor cores' for the tensor-path GEMM, fp32 for the SIMT one (ffma only), whose
  // ridge is 66.9e12 / 3e12 = 22.3 FLOP/byte: at 100 FLOP/byte it is compute-bound, though below the
  // tensor cores' ridge.
  EXPECT_EQ(compute_roof(r, r.kernels[0]), &r.compute_roofs.front());
  EXPECT_EQ(compute_roof(r, r.kernels[1]), &r.compute_roofs.back());
  Report simt = r;
  simt.kernels[1].flops = 100 * simt.kernels[1].bytes;
  EXPECT_EQ(to_json(simt, 10)["kernels"][1]["bound"], "compute");
  EXPECT_DOUBLE_EQ(*attainable(simt, simt.kernels[1]), 66.9e12);
  EXPECT_DOUBLE_EQ(*attainable(r, r.kernels[1]), 3e12 * 20);
}

TEST(Roofline, TableAndChartShowTheTopKernels) {
  const Report r = fixture_report();
  const std::string md = to_markdown(r, 3);
  EXPECT_NE(md.find("| 1 | `sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64` | 1 | 0.250 | 49.0% |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 2 | `gemm_kernel<float, 128>` | 2 | 0.200 |"), std::string::npos) << md;
  EXPECT_EQ(md.find("FillFunctor"), std::string::npos) << "only the top 3";
  // rms_norm: 2e6 FLOP in 50 us = 40 GFLOP/s against 3e12 x 0.125 = 375 GFLOP/s attainable.
  EXPECT_NE(md.find("| 10.7% |"), std::string::npos) << md;
  const std::string svg = to_svg(r, 10);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(count_of(svg, "<circle"), 3u) << "the kernel without FLOPs has no point on a log axis";
  EXPECT_NE(svg.find("4. at::native::vectorized_elementwise_ker"), std::string::npos) << "but it is in the legend";
  EXPECT_NE(svg.find("no FLOPs"), std::string::npos);
  EXPECT_EQ(count_of(svg, "<text"), count_of(svg, "</text>"));
  EXPECT_NE(svg.find("memory 3.00 TB/s"), std::string::npos) << svg;
}

// Nsight Compute 2025.3 abbreviates units ("ns", "hz", as its CSV from an H200 had them, even with
// --print-units base): the fixture with its units row abbreviated gives the same report.
TEST(Roofline, AbbreviatedUnitsGiveTheSameReport) {
  std::ifstream in(kFixture);
  std::stringstream text;
  text << in.rdbuf();
  std::string csv = text.str();
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"nsecond\"", "\"ns\""}, {"\"byte/cycle\"", "\"B/cycle\""}, {"\"byte\"", "\"B\""}, {"\"cycle/second\"", "\"hz\""}}) {
    ASSERT_NE(csv.find(from), std::string::npos) << from;
    for (size_t at = csv.find(from); at != std::string::npos; at = csv.find(from, at + to.size())) csv.replace(at, from.size(), to);
  }
  const Report a = read_ncu_csv(kFixture), b = parse_ncu_csv(csv, "abbreviated.csv");
  ASSERT_EQ(a.kernels.size(), b.kernels.size());
  for (size_t i = 0; i < a.kernels.size(); ++i) {
    EXPECT_DOUBLE_EQ(a.kernels[i].seconds, b.kernels[i].seconds) << a.kernels[i].name;
    EXPECT_DOUBLE_EQ(a.kernels[i].bytes, b.kernels[i].bytes) << a.kernels[i].name;
  }
  EXPECT_EQ(a.ncu_peak_bandwidth, b.ncu_peak_bandwidth);
}

TEST(Roofline, BadCounterFilesFailWithTheProblem) {
  auto message = [](const std::string& text) {
    try {
      parse_ncu_csv(text, "x.csv");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message("\"Kernel Name\",\"other\"\n\"\",\"\"\n\"k\",\"1\"\n").find("has no column \"gpu__time_duration.sum\""),
      std::string::npos);
  EXPECT_NE(message("\"Kernel Name\",\"gpu__time_duration.sum\"\n\"\",\"fortnight\"\n\"k\",\"1\"\n")
                .find("has the unit \"fortnight\""),
            std::string::npos);
  EXPECT_NE(message("\"Kernel Name\",\"gpu__time_duration.sum\"\n\"\",\"nsecond\"\n").find("holds no kernel rows"),
            std::string::npos);
  EXPECT_NE(message("just text\n").find("is not ncu's raw CSV page"), std::string::npos);
  EXPECT_NE(message("\"Kernel Name\",\"gpu__time_duration.sum\"\n\"\",\"nsecond\"\n\"k\",\"0\"\n")
                .find("row 3: \"gpu__time_duration.sum\" is 0 s; a kernel's duration must be > 0"),
            std::string::npos);
}

TEST(Roofline, CommandLineWritesTheFilesAndRefusesBadArguments) {
  const fs::path dir = fs::path(::testing::TempDir()) / "tt_roofline_cli";
  fs::create_directories(dir);
  std::ostringstream out, err;
  const int code = roofline_main(
      {"--counters", kFixture, "--gpu", kH100, "--bandwidth-gbs", "3000", "--top", "5", "--output-dir", dir.string()},
      out, err);
  ASSERT_EQ(code, 0) << err.str();
  for (const char* name : {"roofline.md", "roofline.svg", "roofline.json"}) EXPECT_TRUE(fs::exists(dir / name)) << name;
  EXPECT_NE(read_file((dir / "roofline.json").string()).find("\"bandwidth_source\": \"given with --bandwidth-gbs\""),
            std::string::npos);
  std::ostringstream o2, e2;
  EXPECT_EQ(roofline_main({"--gpu", kH100}, o2, e2), 2);
  EXPECT_NE(e2.str().find("--counters FILE is required"), std::string::npos) << e2.str();
  std::ostringstream o3, e3;
  EXPECT_EQ(roofline_main({"--counters", kFixture, "--top", "0"}, o3, e3), 2);
  EXPECT_NE(e3.str().find("--top 0 is not allowed"), std::string::npos) << e3.str();
  std::ostringstream o4, e4;
  EXPECT_EQ(roofline_main({"--counters", "/no/such/file.csv"}, o4, e4), 2);
  EXPECT_NE(e4.str().find("cannot open the counter file '/no/such/file.csv'"), std::string::npos) << e4.str();
  std::ostringstream o5, e5;
  EXPECT_EQ(roofline_main({"--list-metrics"}, o5, e5), 0);
  EXPECT_NE(o5.str().find("gpu__time_duration.sum\n"), std::string::npos);
  std::ostringstream o6, e6;
  EXPECT_EQ(roofline_main({"--list-metrics", "--top", "3"}, o6, e6), 2) << "other flags would be ignored";
  EXPECT_NE(e6.str().find("--list-metrics prints the metrics and exits: give it alone"), std::string::npos);
  // A GPU the peak table lacks: the note lists the ones it has.
  std::ostringstream o7, e7;
  ASSERT_EQ(roofline_main({"--counters", kFixture, "--gpu", "Bogus GPU", "--output-dir", dir.string()}, o7, e7), 0);
  EXPECT_NE(o7.str().find("'Bogus GPU' is not in the peak table (it knows H100 PCIe, H100 NVL, H100 SXM"),
            std::string::npos)
      << o7.str();
}

}  // namespace
}  // namespace tt::roofline
