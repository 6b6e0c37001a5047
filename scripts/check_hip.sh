#!/usr/bin/env bash
# Compiles every kernel source (kernels/*.cu) on its own, as HIP for AMD (gfx90a = MI200, gfx940 = MI300
# family) and, when nvcc is installed, as CUDA for sm_90a. Proves that each kernel builds for both vendors
# without LibTorch and without a GPU; nothing is run. Exits non-zero if any compilation fails, or if ptxas
# serialises a kernel's wgmma products (its performance warning C7514: each product then waits for the one before;
# it happened to a weight-gradient GEMM whose epilogue converted accumulator registers one value at a time; built
# that way it measured 1.70-1.94x slower than cuBLAS, how much of it from the serialisation not yet known). The
# check reads what ptxas prints; it measures nothing.
#
# hipcc comes from the Debian packages hipcc and libamdhip64-dev (installed with apt-get when missing).
# Environment overrides: HIPCC, NVCC, HIP_ARCHS (default "gfx90a gfx940"), CUDA_ARCH (default sm_90a).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hip_archs="${HIP_ARCHS:-gfx90a gfx940}"
cuda_arch="${CUDA_ARCH:-sm_90a}"

find_hipcc() {
  if [[ -n "${HIPCC:-}" ]]; then echo "${HIPCC}"; return; fi
  if command -v hipcc >/dev/null 2>&1; then command -v hipcc; return; fi
  if [[ -x /opt/rocm/bin/hipcc ]]; then echo /opt/rocm/bin/hipcc; return; fi
}

hipcc_bin="$(find_hipcc)"
if [[ -z "${hipcc_bin}" ]]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "hipcc not found; installing the Debian packages hipcc and libamdhip64-dev" >&2
    sudo_cmd=()
    if [[ "$(id -u)" -ne 0 ]]; then sudo_cmd=(sudo); fi
    "${sudo_cmd[@]}" apt-get update
    "${sudo_cmd[@]}" apt-get install -y --no-install-recommends hipcc libamdhip64-dev
    hipcc_bin="$(find_hipcc)"
  fi
fi
if [[ -z "${hipcc_bin}" ]]; then
  echo "error: hipcc not found and apt-get is not available to install it." >&2
  echo "Install ROCm's hipcc (or Debian's hipcc + libamdhip64-dev), or set HIPCC=/path/to/hipcc." >&2
  exit 1
fi

nvcc_bin="${NVCC:-}"
if [[ -z "${nvcc_bin}" ]]; then
  if command -v nvcc >/dev/null 2>&1; then
    nvcc_bin="$(command -v nvcc)"
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc_bin=/usr/local/cuda/bin/nvcc
  fi
fi

out_dir="$(mktemp -d)"
trap 'rm -rf "${out_dir}"' EXIT

offload_flags=()
for arch in ${hip_archs}; do offload_flags+=("--offload-arch=${arch}"); done

shopt -s nullglob
sources=("${repo_root}"/kernels/*.cu)
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "error: no kernel sources found under ${repo_root}/kernels" >&2
  exit 1
fi

failures=0
for source in "${sources[@]}"; do
  name="$(basename "${source}" .cu)"
  if "${hipcc_bin}" -std=c++17 -x hip "${offload_flags[@]}" -Wall -Wextra -c "${source}" \
      -o "${out_dir}/${name}.hip.o"; then
    echo "ok    hip  (${hip_archs}) ${name}.cu"
  else
    echo "FAIL  hip  (${hip_archs}) ${name}.cu" >&2
    failures=$((failures + 1))
  fi
  if [[ -n "${nvcc_bin}" ]]; then
    log="${out_dir}/${name}.cuda.log"
    if "${nvcc_bin}" -std=c++17 -arch="${cuda_arch}" -Xcompiler=-Wall,-Wextra -c "${source}" \
        -o "${out_dir}/${name}.cuda.o" > "${log}" 2>&1; then
      cat "${log}"
      if grep -q "C7514" "${log}"; then
        echo "FAIL  cuda (${cuda_arch}) ${name}.cu: ptxas serialised wgmma products (C7514, above)" >&2
        failures=$((failures + 1))
      else
        echo "ok    cuda (${cuda_arch}) ${name}.cu"
      fi
    else
      cat "${log}" >&2
      echo "FAIL  cuda (${cuda_arch}) ${name}.cu" >&2
      failures=$((failures + 1))
    fi
  fi
done

if [[ -z "${nvcc_bin}" ]]; then
  echo "note: nvcc not found; the CUDA compile check was skipped (set NVCC=/path/to/nvcc)." >&2
fi
if [[ ${failures} -ne 0 ]]; then
  echo "${failures} kernel compilation(s) failed" >&2
  exit 1
fi
echo "all kernels compile"
