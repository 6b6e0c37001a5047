// The generate app: continues a prompt with a trained checkpoint. See apps/cli/generate_cli.h.
#include <iostream>
#include <string>
#include <vector>

#include "apps/cli/generate_cli.h"

int main(int argc, char** argv) {
  return tt::generate_main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
