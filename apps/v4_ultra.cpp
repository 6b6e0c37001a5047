// The v4_ultra stage: see tt::stages::v4_ultra() in models/stage.cpp for the components it chooses.
#include "apps/cli/stage_cli.h"

int main(int argc, char** argv) { return tt::stage_main(argc, argv, tt::stages::v4_ultra()); }
