// The roofline tool: see apps/cli/roofline_cli.h, or `roofline --help`.
#include <iostream>
#include <string>
#include <vector>

#include "apps/cli/roofline_cli.h"

int main(int argc, char** argv) {
  return tt::roofline_main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
