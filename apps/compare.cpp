// The compare tool: see apps/cli/compare_cli.h, or `compare --help`.
#include <iostream>
#include <string>
#include <vector>

#include "apps/cli/compare_cli.h"

int main(int argc, char** argv) {
  return tt::compare_main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
