#!/usr/bin/env bash
# On a machine with a GPU: build, then any of these parts (all by default, in this order):
#   tests      the whole test suite (the `gpu` label included)
#   sanitizer  our kernels under compute-sanitizer memcheck, racecheck, synccheck and initcheck, each tool first
#              proven on a planted bug; a verdict per tool and suite in sanitizer_verdicts.txt (NVIDIA only)
#   stages     every stage side by side with --profile: workshop fp32 and bf16, medium bf16, long-context bf16
#   bench      the kernel benchmark
#   peer       the Python peer (torch.compile with CUDA graphs) on the same configs, when PEER points to
#              clean_llama.py: one JSON line per run in peer.jsonl
# Logs and results go to ${VALIDATE_DIR:-results/validate_<UTC time>}. Exit status 1 when a part failed.
# Environment: TT_BUILD_DIR, VALIDATE_DIR, PEER, STAGE_CONFIGS (default "workshop:fp32 workshop:bf16
# medium:bf16 long-context:bf16"), SANITIZER_TIMEOUT (seconds per sanitizer run, default 300), SANITIZER_BUDGET
# (seconds for all of them, default 600), SANITIZER_KERNELS (compute-sanitizer's --kernel-name filter, default
# kns=2tt7kernels: our kernels only).
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
  if ! command -v compute-sanitizer >/dev/null; then
    say "compute-sanitizer not found (NVIDIA only): sanitizer runs skipped"
  elif [ ! -x "$build/tests/tt_sanitizer_controls" ]; then
    say "$build/tests/tt_sanitizer_controls is missing (built with the CUDA backend only): no sanitizer verdicts"
    status=1
  else
    # Four tools, each first on its positive control (tests/sanitizer_controls.cu: the one bug the tool exists to
    # find, planted in a kernel of tt::kernels): a tool that does not report it gives no verdict. Then every suite
    # that launches our kernels; the attention suite is its one sanitizer-sized test, which launches every
    # attention kernel once. memcheck, racecheck and synccheck instrument only kernels of tt::kernels: the
    # references' cuBLAS and ATen kernels are not ours to judge, and instrumenting them costs most of the time.
    # initcheck instruments every kernel, because memory written by a kernel it does not
    # instrument looks uninitialised to it. Without LibTorch's caching allocator every tensor is its own
    # allocation, so memcheck sees an access past a tensor's end and initcheck a read of memory nothing wrote.
    # Each run has a time limit (SANITIZER_TIMEOUT) and all of them a budget (SANITIZER_BUDGET); runs left when
    # it is spent are not started. sanitizer_verdicts.txt has one line per tool and run.
    ours=${SANITIZER_KERNELS:-kns=2tt7kernels}  # the filter reads mangled names: _ZN2tt7kernels is tt::kernels
    deadline=$((SECONDS + ${SANITIZER_BUDGET:-600}))
    verdicts="$out/sanitizer_verdicts.txt"
    verdict_line() { printf '%-10s %-92s %-10s %s\n' "$@" >> "$verdicts"; }
    : > "$verdicts"
    verdict_line tool run verdict seconds
    # sanitize TOOL NAME LOG ARGS...: compute-sanitizer --tool TOOL ARGS (filter options, then the program),
    # appends the verdict line, returns the exit status (9: the tool reported errors).
    sanitize() {
      local tool=$1 name=$2 log=$3; shift 3
      local began=$SECONDS rc=0 limit=$((deadline - SECONDS))
      [ "$limit" -gt "${SANITIZER_TIMEOUT:-300}" ] && limit=${SANITIZER_TIMEOUT:-300}
      if [ "$limit" -le 0 ]; then
        verdict_line "$tool" "$name" not-run 0
        say "$tool on $name: not run, the sanitizer budget (SANITIZER_BUDGET) is spent"
        return 124
      fi
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 30 "$limit" compute-sanitizer --tool "$tool" \
        --error-exitcode 9 "$@" > "$log" 2>&1 || rc=$?
      local verdict
      case $rc in
        0) verdict=clean ;; 9) verdict=ERRORS ;; 124 | 137) verdict=cut-off ;; *) verdict="failed($rc)" ;;
      esac
      verdict_line "$tool" "$name" "$verdict" $((SECONDS - began))
      say "$tool on $name: $verdict in $((SECONDS - began)) s ($(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1))"
      return $rc
    }
    # Two tools cannot judge a process in which a cuBLAS GEMM runs (H100, compute-sanitizer 2025.3.1): racecheck
    # fails ("failed to handle a hardware exception") even when the GEMM is not instrumented, and initcheck reports
    # the GEMM's output as uninitialised to the next kernel that reads it. Two op tests need a GEMM and are left to
    # memcheck and synccheck: the naive SwiGLU test against its reference (the naive kernels still run in the test
    # after it) and linear_cross_entropy's (the cross-entropy kernels the other tests run). The attention test
    # computes its references on the CPU.
    ops_without_gemm='OpsGpu.*:-OpsGpu.NaiveSwigluMatchesReferenceOverShapesAndDtypes:OpsGpu.LinearCrossEntropy*'
    for tool in memcheck racecheck synccheck initcheck; do
      filter=(--kernel-name "$ours")
      ops='OpsGpu.*'
      case $tool in
        memcheck) planted='Invalid __global__ write' ;;
        synccheck) planted='Barrier error' ;;
        racecheck) planted='Race reported' ops=$ops_without_gemm ;;
        initcheck) planted='Uninitialized __global__ memory read' ops=$ops_without_gemm filter=() ;;
      esac
      suites=("$ops" 'AdamWGpu.*' 'FlashAttentionGpu.EveryKernelOnceAtSanitizerSize')
      control_log="$out/sanitizer_${tool}_control.log"
      rc=0
      sanitize "$tool" "control (planted bug)" "$control_log" "${filter[@]}" \
        "$build/tests/tt_sanitizer_controls" "$tool" || rc=$?
      if [ "$rc" != 9 ] || ! grep -q "$planted" "$control_log"; then
        say "$tool did not report the planted bug ('$planted', exit status $rc): no verdict from $tool"
        for suite in "${suites[@]}"; do verdict_line "$tool" "$suite" no-verdict 0; done
        status=1
        continue
      fi
      for suite in "${suites[@]}"; do
        sanitize "$tool" "$suite" "$out/sanitizer_${tool}_${suite%%.*}.log" "${filter[@]}" \
          "$build/tests/tt_gpu_tests" --gtest_filter="$suite" || status=1
      done
    done
    cat "$verdicts" >&2
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
