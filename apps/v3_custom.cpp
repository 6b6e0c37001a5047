// The v3_custom stage: see tt::stages::v3_custom() in models/stage.cpp for the components it chooses.
#include "apps/cli/stage_cli.h"

int main(int argc, char** argv) { return tt::stage_main(argc, argv, tt::stages::v3_custom()); }
