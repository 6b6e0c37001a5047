#!/usr/bin/env bash
# On a machine with a GPU: build, run the whole test suite (the `gpu` label included), run every kernel
# test under compute-sanitizer (memcheck and racecheck; NVIDIA only), then compare the stages side by
# side on the workshop config (fp32 and bf16, profiled) and the medium config (bf16), and run the kernel
# benchmark. Logs and results go to ${VALIDATE_DIR:-results/validate_<UTC time>}.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}
out=${VALIDATE_DIR:-$root/results/validate_$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
say() { echo "[gpu_validate] $*" >&2; }
status=0

TT_BUILD_DIR="$build" "$root/scripts/build.sh" 2>&1 | tail -n 3
say "test suite (ctest, all labels)"
(cd "$build" && ctest --output-on-failure --parallel 8 > "$out/ctest.log" 2>&1) || status=1
grep -E "tests passed|tests failed" "$out/ctest.log" >&2 || true

if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    say "compute-sanitizer --tool $tool on the kernel tests"
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/tt_gpu_tests" --gtest_filter='OpsGpu.*' \
      > "$out/sanitizer_$tool.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$out/sanitizer_$tool.log" | tail -n 2 >&2 || true
  done
else
  say "compute-sanitizer not found: sanitizer runs skipped"
fi

for run in "workshop fp32" "workshop bf16" "medium bf16"; do
  set -- $run
  say "stages side by side: $1 $2"
  "$root/scripts/run_all.sh" --no-build --config "$root/configs/$1.json" --results-dir "$out/$1_$2" \
    --dtype "$2" --profile --log-every 0 > "$out/run_all_$1_$2.log" 2>&1 || status=1
  tail -n 12 "$out/run_all_$1_$2.log" >&2
done

say "kernel benchmark"
"$build/kernel_bench" --output "$out/kernel_bench.json" > "$out/kernel_bench.log" 2>&1 || status=1
say "logs and results in $out"
exit $status
