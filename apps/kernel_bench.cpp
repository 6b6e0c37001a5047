// The kernel benchmark: see apps/bench/kernel_bench.h, or `kernel_bench --help`.
#include <iostream>
#include <string>
#include <vector>

#include "apps/cli/kernel_bench_cli.h"

int main(int argc, char** argv) {
  return tt::kernel_bench_main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
