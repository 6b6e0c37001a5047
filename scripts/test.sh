#!/usr/bin/env bash
# The test command: sets up what is missing, builds, runs the whole suite with ctest.
# Without a GPU the tests labelled `gpu` are reported as skipped. Extra arguments go to ctest
# (e.g. -L gpu, -R Equivalence).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure --parallel "${TT_TEST_JOBS:-$(nproc)}" "$@"
