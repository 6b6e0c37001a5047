#!/usr/bin/env bash
# The performance-debugging exercise (docs/debugging.md): v3_custom on one config, each run with one pitfall
# put back (--pitfall), the last as shipped (none); every run with --profile, so that its speed can be read from
# the GPU time per step (which launch gaps on the host do not change) beside the wall time. The five stages run
# --repeats times, interleaved (1..5, 1..5, ...), so that slow drift of the machine hits every stage alike and
# the spread between repeats states the noise band. Then compare: the stage table, the exercise's summary (each
# pitfall's verdict against the band and its own figure), where the time goes, and the HTML report.
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
  --repeats N          runs of each of the five stages, interleaved; 2 or more give a noise band [2]
  --output-dir DIR     the run folder itself (must not hold results yet) [<results-dir>/debugging_<UTC time>]
  --results-dir DIR    where the run folder goes when --output-dir is not given [results/]
  --no-build           use the executables as they are (default: scripts/build.sh first)
  stage flags          passed to every run, e.g. --dtype bf16, --num-steps 100, --profile-steps 20
environment: TT_BUILD_DIR (build folder, default build/)
On a GPU each run defaults to --num-steps 200 --profile-steps 10 (a steadier median and GPU time than the
config's 50 and 3); without a GPU to --warmup-steps 2 --num-steps 10 (CPU training is slow).
Writes: round<R>_stage<N>_<pitfall>.{json,trace.json,log}, summary.txt (what compare printed),
comparison.{md,csv,svg}, report.html and command.txt in the run folder.
USAGE
}

config=$root/configs/workshop.json
results=$root/results
run=
repeats=2
build_first=1
pass=()
while [ $# -gt 0 ]; do
  case $1 in
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --repeats) repeats=${2:?--repeats needs a number}; shift 2 ;;
    --output-dir) run=${2:?--output-dir needs a folder}; shift 2 ;;
    --results-dir) results=${2:?--results-dir needs a folder}; shift 2 ;;
    --no-build) build_first=0; shift ;;
    --output | --output=* | --pitfall | --pitfall=* | --profile | --overwrite)
      die "$1 is chosen per run by this script" ;;
    -h | --help) usage; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -f "$config" ] || die "config file '$config' does not exist"
case $repeats in
  '' | *[!0-9]* | 0) die "--repeats '$repeats' is not allowed: it must be a whole number >= 1 (2 or more for a noise band)" ;;
esac
[ "$repeats" -ge 2 ] || say "NOTE: --repeats 1: no noise band, so no difference can be called noise"
if [ "$build_first" = 1 ]; then
  TT_BUILD_DIR=$build "$root/scripts/build.sh" || die "the build failed (see above)"
fi
for exe in v3_custom compare; do [ -x "$build/$exe" ] || die "no $exe executable in $build: build it first"; done

given() { case " ${pass[*]:-} " in *" $1"*) return 0 ;; *) return 1 ;; esac; }
if "$build/v3_custom" --doctor 2>/dev/null | grep -q "GPU visible *: yes"; then
  given --num-steps || pass+=(--num-steps 200)
  given --profile-steps || pass+=(--profile-steps 10)
else
  if ! given --num-steps && ! given --warmup-steps; then
    pass+=(--warmup-steps 2 --num-steps 10)
    say "NOTE: no GPU: each run takes 2 warm-up + 10 measured steps, and there is no GPU time to judge by"
  fi
fi

[ -n "$run" ] || run=$results/debugging_$(date -u +%Y%m%d-%H%M%S)
if [ -d "$run" ] && compgen -G "$run/round*_stage*.json" >/dev/null; then
  die "the run folder '$run' already holds results of the exercise; choose another --output-dir"
fi
mkdir -p "$run"
printf '%q ' "$0" "$@" >"$run/command.txt"
echo >>"$run/command.txt"
say "run folder: $run"

# The exercise's order: stage N of the five is the N-th pitfall; stage 5 (none) is v3 as shipped.
pitfalls=(missing-init non-contiguous no-sync-timing naive-swiglu none)
files=()
for round in $(seq 1 "$repeats"); do
  for i in "${!pitfalls[@]}"; do
    name=${pitfalls[$i]}
    stem=$run/round${round}_stage$((i + 1))_$name
    say "=== round $round of $repeats, stage $((i + 1)): --pitfall $name ==="
    "$build/v3_custom" --config "$config" --pitfall "$name" --profile --output "$stem.json" "${pass[@]}" 2>&1 |
      tee "$stem.log" || die "round $round, stage $((i + 1)) (--pitfall $name) failed; see $stem.log"
    files+=("$stem.json")
  done
done

say "=== summary ==="
"$build/compare" --output-dir "$run" "${files[@]}" | tee "$run/summary.txt" ||
  die "compare failed (see above)"
say "results and traces: $run/round<R>_stage<N>_<pitfall>.{json,trace.json,log}"
say "summary: $run/summary.txt; report: $run/report.html (open it in a browser); table: $run/comparison.md"
