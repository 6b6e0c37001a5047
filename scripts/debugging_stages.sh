#!/usr/bin/env bash
# The performance-debugging exercise (README, "The debugging exercise"): v3_custom five times on one config,
# each with one pitfall put back (--pitfall), the last as shipped; every run with --profile, so each result
# keeps its kernel hotspots and a trace. Then compare: the stage table, the exercise's summary (loss,
# samples/s, speed against stage 5, joules per step, what each stage teaches) and the files and HTML report
# in the run folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}
say() { echo "[debugging_stages] $*" >&2; }
die() {
  echo "[debugging_stages] error: $*" >&2
  exit 1
}
usage() {
  cat <<USAGE
usage: scripts/debugging_stages.sh [options] [stage flags...]
  --config FILE        the config [configs/workshop.json]
  --results-dir DIR    where the run folder debugging_<UTC time>/ goes [results/]
  --no-build           use the executables as they are (default: scripts/build.sh first)
  stage flags          passed to every run, e.g. --dtype bf16, --num-steps 100
environment: TT_BUILD_DIR (build folder, default build/)
Without a GPU each run defaults to --warmup-steps 2 --num-steps 10 (CPU training is slow).
USAGE
}

config=$root/configs/workshop.json
results=$root/results
build_first=1
pass=()
while [ $# -gt 0 ]; do
  case $1 in
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --results-dir) results=${2:?--results-dir needs a folder}; shift 2 ;;
    --no-build) build_first=0; shift ;;
    --output | --output=* | --pitfall | --pitfall=*) die "$1 is chosen per run by this script" ;;
    -h | --help) usage; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -f "$config" ] || die "config file '$config' does not exist"
if [ "$build_first" = 1 ]; then
  TT_BUILD_DIR=$build "$root/scripts/build.sh" || die "the build failed (see above)"
fi
for exe in v3_custom compare; do [ -x "$build/$exe" ] || die "no $exe executable in $build: build it first"; done

if ! "$build/v3_custom" --doctor 2>/dev/null | grep -q "GPU visible *: yes"; then
  case " ${pass[*]:-} " in
    *" --num-steps"* | *" --warmup-steps"*) ;;
    *) pass+=(--warmup-steps 2 --num-steps 10); say "NOTE: no GPU: each run takes 2 warm-up + 10 measured steps" ;;
  esac
fi

run=$results/debugging_$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$run"
printf '%q ' "$0" "$@" >"$run/command.txt"
echo >>"$run/command.txt"
say "run folder: $run"

# The exercise's order: stage N of the five is the N-th pitfall; stage 5 (none) is v3 as shipped.
pitfalls=(missing-init non-contiguous no-sync-timing naive-swiglu none)
files=()
for i in "${!pitfalls[@]}"; do
  name=${pitfalls[$i]}
  stem=$run/stage$((i + 1))_$name
  say "=== stage $((i + 1)): --pitfall $name ==="
  "$build/v3_custom" --config "$config" --pitfall "$name" --profile --output "$stem.json" "${pass[@]}" 2>&1 |
    tee "$stem.log" || die "stage $((i + 1)) (--pitfall $name) failed; see $stem.log"
  files+=("$stem.json")
done

say "=== summary ==="
"$build/compare" --output-dir "$run" "${files[@]}" || die "compare failed (see above)"
say "results and traces: $run/stage<N>_<pitfall>.{json,trace.json,log}"
say "report: $run/report.html (open it in a browser); table: $run/comparison.md"
