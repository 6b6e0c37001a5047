// The v1_baseline stage: see tt::stages::v1_baseline() in models/stage.cpp for the components it chooses.
#include "apps/cli/stage_cli.h"

int main(int argc, char** argv) { return tt::stage_main(argc, argv, tt::stages::v1_baseline()); }
