#include <gtest/gtest.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // CI machines have two cores; more intra-op threads than cores only adds contention.
  torch::set_num_threads(std::max(1, std::min(4, static_cast<int>(std::thread::hardware_concurrency()))));
  return RUN_ALL_TESTS();
}
