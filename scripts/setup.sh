#!/usr/bin/env bash
# Makes sure this machine has what the build needs, installing only what is missing:
#   - cmake, ninja, a C++17 compiler, and the cxxopts / nlohmann_json / GoogleTest headers (Debian/Ubuntu
#     packages; looked for in /usr, /usr/local and every CMAKE_PREFIX_PATH entry first);
#   - LibTorch: Torch_DIR, a CMAKE_PREFIX_PATH entry, the project's .venv, or a python3 that imports torch.
#     Only when none is found: `pip install torch==2.11.0` into the project-local .venv (never the system
#     Python), which later runs reuse. Without nvcc the CPU wheel is installed (a CUDA LibTorch needs the
#     CUDA toolkit to configure).
# Prints progress on stderr and, on stdout, the LibTorch CMake prefix ("" when it comes from the environment).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch_version=2.11.0
say() { echo "[setup] $*" >&2; }

prefixes() { echo /usr /usr/local ${CMAKE_PREFIX_PATH:+${CMAKE_PREFIX_PATH//:/ }}; }
have_file() { local d; for d in $(prefixes); do [ -e "$d/$1" ] && return 0; done; return 1; }

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v c++ >/dev/null || missing+=(g++)
have_file include/cxxopts.hpp || missing+=(libcxxopts-dev)
have_file include/nlohmann/json.hpp || missing+=(nlohmann-json3-dev)
have_file include/gtest/gtest.h || missing+=(libgtest-dev)
have_file include/gmock/gmock.h || missing+=(libgmock-dev)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing missing system packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo="sudo"
  if ! command -v apt-get >/dev/null; then
    say "error: apt-get not found; install these yourself: ${missing[*]}"; exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >&2 && $sudo apt-get install -y -qq "${missing[@]}" >&2 || {
    say "error: could not install ${missing[*]} (no network or no permission?); install them and re-run"; exit 1; }
fi

torch_prefix_of() { "$1" -c 'import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path)' 2>/dev/null; }
if [ -n "${Torch_DIR:-}" ] || have_file Torch/TorchConfig.cmake || have_file share/cmake/Torch/TorchConfig.cmake; then
  say "LibTorch: from Torch_DIR / CMAKE_PREFIX_PATH"
  echo ""
  exit 0
fi
for py in "$root/.venv/bin/python" python3; do
  if command -v "$py" >/dev/null && prefix=$(torch_prefix_of "$py") && [ -n "$prefix" ]; then
    say "LibTorch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null) from $py"
    echo "$prefix"
    exit 0
  fi
done

say "LibTorch not found: installing torch==$torch_version into $root/.venv (about 4 GB for the CUDA build; once)"
command -v python3 >/dev/null || { say "error: python3 is needed to install LibTorch"; exit 1; }
python3 -m venv "$root/.venv" >&2 || { say "error: python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
index_args=()
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  say "no nvcc: installing the CPU-only wheel (kernels need nvcc or a ROCm LibTorch + hipcc)"
  index_args=(--index-url https://download.pytorch.org/whl/cpu)
fi
"$root/.venv/bin/pip" install -q "${index_args[@]}" "torch==$torch_version" >&2
torch_prefix_of "$root/.venv/bin/python"
echo
