#!/usr/bin/env bash
# On a machine with a GPU: build, then any of these parts (all by default, in this order):
#   tests      the whole test suite (the `gpu` label included)
#   sanitizer  every kernel test under compute-sanitizer memcheck and racecheck (NVIDIA only)
#   stages     every stage side by side with --profile: workshop fp32 and bf16, medium bf16, long-context bf16
#   bench      the kernel benchmark
#   peer       the Python peer (torch.compile with CUDA graphs) on the same configs, when PEER points to
#              clean_llama.py: one JSON line per run in peer.jsonl
# Logs and results go to ${VALIDATE_DIR:-results/validate_<UTC time>}. Exit status 1 when a part failed.
# Environment: TT_BUILD_DIR, VALIDATE_DIR, PEER, STAGE_CONFIGS (default "workshop:fp32 workshop:bf16
# medium:bf16 long-context:bf16"), SANITIZER_TIMEOUT (seconds per sanitizer suite, default 600).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}
out=${VALIDATE_DIR:-$root/results/validate_$(date -u +%Y%m%d-%H%M%S)}
parts=${*:-tests sanitizer stages bench peer}
mkdir -p "$out"
say() { echo "[gpu_validate] $*" >&2; }
wants() { [[ " $parts " == *" $1 "* ]]; }
status=0

TT_BUILD_DIR="$build" "$root/scripts/build.sh" 2>&1 | tail -n 3

if wants tests; then
  say "test suite (ctest, all labels)"
  (cd "$build" && ctest --output-on-failure --parallel 8 > "$out/ctest.log" 2>&1) || status=1
  grep -E "tests passed|tests failed" "$out/ctest.log" >&2 || true
fi

if wants sanitizer; then
  if command -v compute-sanitizer >/dev/null; then
    # Every suite that launches our kernels directly, one at a time with its own time limit, so that a slow
    # suite under racecheck (100x and more slower) still leaves the others' verdicts. TT_SANITIZER_SHAPES=1
    # shortens the long-sequence attention cases from 4096 to 1040 positions: still the two-row-fragment path
    # (>= 1024) with a masked tail, at a quarter of the tiles.
    for tool in memcheck racecheck; do
      for suite in OpsGpu AdamWGpu FlashAttentionGpu; do
        say "compute-sanitizer --tool $tool on $suite.* (limit ${SANITIZER_TIMEOUT:-600} s)"
        TT_SANITIZER_SHAPES=1 timeout "${SANITIZER_TIMEOUT:-600}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
          "$build/tests/tt_gpu_tests" --gtest_filter="$suite.*" > "$out/sanitizer_${tool}_$suite.log" 2>&1 || {
          rc=$?
          [ "$rc" = 124 ] && say "$tool on $suite.*: cut off by the time limit, no verdict"
          status=1
        }
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$out/sanitizer_${tool}_$suite.log" | tail -n 2 >&2 || true
      done
    done
  else
    say "compute-sanitizer not found: sanitizer runs skipped"
  fi
fi

if wants stages; then
  for run in ${STAGE_CONFIGS:-workshop:fp32 workshop:bf16 medium:bf16 long-context:bf16}; do
    config=${run%%:*} dtype=${run##*:}
    say "stages side by side: $config $dtype"
    "$root/scripts/run_all.sh" --no-build --config "$root/configs/$config.json" --results-dir "$out/${config}_$dtype" \
      --dtype "$dtype" --profile --log-every 0 > "$out/run_all_${config}_$dtype.log" 2>&1 || status=1
    tail -n 12 "$out/run_all_${config}_$dtype.log" >&2
  done
fi

if wants bench; then
  say "kernel benchmark"
  "$build/kernel_bench" --output "$out/kernel_bench.json" > "$out/kernel_bench.log" 2>&1 || status=1
fi

if wants peer; then
  if [ -n "${PEER:-}" ] && [ -f "$PEER" ]; then
    say "peer: $PEER (torch.compile, reduce-overhead = CUDA graphs)"
    for run in workshop:bf16 workshop:fp32 medium:bf16 long:bf16; do
      python3 -c "import sys; sys.path.insert(0, '$(dirname "$PEER")'); import clean_llama as c; \
c.run('${run%%:*}', 'reduce-overhead', '${run##*:}')" >> "$out/peer.jsonl" 2> "$out/peer_${run%%:*}_${run##*:}.log" \
        || { status=1; say "peer ${run} failed (see peer_${run%%:*}_${run##*:}.log)"; }
    done
    cat "$out/peer.jsonl" >&2 || true
  else
    say "PEER is not set to the peer's clean_llama.py: peer runs skipped"
  fi
fi
say "logs and results in $out"
exit $status
