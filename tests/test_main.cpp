#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>

#include "tests/helpers.h"

namespace {

// ctest runs each test in its own process, several at once (-j). Tests name their scratch files
// ("eval_repetitive.txt", "ck_v1_baseline.pt"), so two processes writing the same name under /tmp would read
// each other's half-written files. Each process therefore gets its own folder: ::testing::TempDir() reads
// TEST_TMPDIR, std::filesystem::temp_directory_path() and child processes read TMPDIR.
class ProcessTempDir {
 public:
  ProcessTempDir() {
    namespace fs = std::filesystem;
    const char* parent = std::getenv("TMPDIR");
    const fs::path base(parent != nullptr && parent[0] != '\0' ? parent : "/tmp");
    dir_ = base / ("tt_tests_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ::setenv("TEST_TMPDIR", dir_.c_str(), 1);
    ::setenv("TMPDIR", dir_.c_str(), 1);
  }
  ~ProcessTempDir() {
    // TT_KEEP_TEST_FILES=1 keeps the folder for a look at what a failing test wrote.
    const char* keep = std::getenv("TT_KEEP_TEST_FILES");
    if (keep != nullptr && std::string(keep) == "1") return;
    tt::testing::remove_tree(dir_);  // not fs::remove_all: remove_tree says why
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace

int main(int argc, char** argv) {
  const ProcessTempDir temp_dir;
  ::testing::InitGoogleTest(&argc, argv);
  // CI machines have two cores; more intra-op threads than cores only adds contention.
  torch::set_num_threads(std::max(1, std::min(4, static_cast<int>(std::thread::hardware_concurrency()))));
  return RUN_ALL_TESTS();
}
