// kernel_bench's command line without a GPU: every bad flag is refused before any measurement (exit 2),
// the output path included, so that a long benchmark never ends on an unwritable file.
#include <gtest/gtest.h>

#include <sstream>

#include "apps/cli/kernel_bench_cli.h"

namespace tt {
namespace {

struct Outcome {
  int code;
  std::string err;
};

Outcome bench(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = kernel_bench_main(args, out, err);
  return {code, err.str()};
}

TEST(KernelBenchCli, BadFlagsAreRefusedBeforeAnyMeasurement) {
  for (const auto& [args, phrase] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--kernels", "nope"}, "nope"},
           {{"--repeats", "0"}, "--repeats must be >= 1, got 0"},
           {{"--flush-mib", "0"}, "--flush-mib must be in [1, 65536], got 0"},
           {{"--flush-mib", "999999"}, "--flush-mib must be in [1, 65536], got 999999"},
           {{"--device-index", "-1"}, "--device-index must be >= 0, got -1"},
           {{"--output", ::testing::TempDir()}, "is a folder; give a file path"},
           {{"--output", "/proc/tt_no_such_folder/bench.json"}, "'/proc' is not writable"},
           {{"--repeats", "3", "--repeats", "5"}, "--repeats is given more than once"}}) {
    const Outcome o = bench(args);
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_NE(o.err.find("kernel_bench: error: "), std::string::npos) << o.err;
    EXPECT_NE(o.err.find(phrase), std::string::npos) << o.err;
  }
}

}  // namespace
}  // namespace tt
