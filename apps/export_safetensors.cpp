// The export_safetensors app: a checkpoint's weights as a Hugging Face LLaMA safetensors file. See
// apps/cli/export_cli.h.
#include <iostream>
#include <string>
#include <vector>

#include "apps/cli/export_cli.h"

int main(int argc, char** argv) {
  return tt::export_main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
