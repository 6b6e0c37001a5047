// The compare tool: see tt::compare::run_compare in apps/runtime/compare.cpp, or `compare --help`.
#include <iostream>
#include <string>
#include <vector>

#include "apps/runtime/compare.h"

int main(int argc, char** argv) {
  return tt::compare::run_compare(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
