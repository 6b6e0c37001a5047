#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh), configures and builds into ${TT_BUILD_DIR:-build}.
# Extra arguments go to CMake's configure step (e.g. -DTORCH_CUDA_ARCH_LIST=9.0a).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}
prefix=$("$root/scripts/setup.sh")
args=(-S "$root" -B "$build" -G Ninja)
[ -n "$prefix" ] && args+=("-DCMAKE_PREFIX_PATH=$prefix${CMAKE_PREFIX_PATH:+;${CMAKE_PREFIX_PATH//:/;}}")
if [ ! -f "$build/build.ninja" ] || [ $# -gt 0 ]; then
  echo "[build] configuring $build" >&2
  cmake "${args[@]}" "$@" >&2
fi
echo "[build] building (this takes several minutes the first time: LibTorch headers are heavy)" >&2
cmake --build "$build" --parallel "${TT_BUILD_JOBS:-$(nproc)}" >&2
