#!/usr/bin/env bash
# The main job: builds what is missing (scripts/build.sh), runs every stage executable on one config, each
# writing its result into one run folder, then compares them: the table on the terminal, Markdown, CSV and
# an SVG chart in the run folder.
#
# Without a GPU the runs work but are slow (the workshop config takes minutes per stage on a CPU): unless
# the stage flags set --num-steps or --warmup-steps, CPU runs use 2 warm-up + 10 measured steps instead of
# the config's numbers. This is printed, and every result JSON records the steps it measured; --full-cpu
# keeps the config's numbers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}
say() { echo "[run_all] $*" >&2; }
die() {
  echo "[run_all] error: $*" >&2
  exit 1
}
usage() {
  cat <<USAGE
usage: scripts/run_all.sh [options] [stage flags...]
  --config FILE        config for every stage [configs/workshop.json]
  --stages "A B"       stages to run [every v* executable in the build folder, in version order]
  --results-dir DIR    where the run folder run_<UTC time>/ goes [results/]
  --no-build           use the executables as they are (default: scripts/build.sh first, a no-op when up to date)
  --full-cpu           on a machine without a GPU, keep the config's step counts (default there: 2 + 10 steps)
  stage flags          passed to every stage, e.g. --dtype bf16, --num-steps 100, --profile, --device cpu
environment: TT_BUILD_DIR (build folder, default build/)
USAGE
}

config=$root/configs/workshop.json
stages=""
results=$root/results
build_first=1
full_cpu=0
pass=()
while [ $# -gt 0 ]; do
  case $1 in
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --config=*) config=${1#*=}; shift ;;
    --stages) stages=${2:?--stages needs a list}; shift 2 ;;
    --results-dir) results=${2:?--results-dir needs a folder}; shift 2 ;;
    --no-build) build_first=0; shift ;;
    --full-cpu) full_cpu=1; shift ;;
    --output | --output=*) die "--output is chosen per stage (<run folder>/<stage>.json); use --results-dir to move the run folder" ;;
    -h | --help) usage; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -f "$config" ] || die "config file '$config' does not exist"
has_flag() {
  local a
  for a in "${pass[@]}"; do [ "$a" = "$1" ] || [ "${a%%=*}" = "$1" ] && return 0; done
  return 1
}

if [ "$build_first" = 1 ]; then
  say "building (scripts/build.sh; quick when nothing changed)"
  TT_BUILD_DIR=$build "$root/scripts/build.sh" || die "the build failed (see above); fix it or rerun with --no-build to use existing executables"
fi
[ -x "$build/compare" ] || die "no compare executable in $build: build it (scripts/build.sh) or drop --no-build"

if [ -z "$stages" ]; then
  stages=$(find "$build" -maxdepth 1 -type f -perm -u+x -name 'v[0-9]*' -printf '%f\n' | sort -V | tr '\n' ' ')
fi
read -r -a stage_list <<<"$stages"
[ ${#stage_list[@]} -gt 0 ] || die "no stage executables (v1_baseline, ...) in $build"
for stage in "${stage_list[@]}"; do
  [ -x "$build/$stage" ] || die "stage '$stage' has no executable $build/$stage"
done

device=gpu
if ! "$build/${stage_list[0]}" --doctor 2>/dev/null | grep -q "GPU visible *: yes"; then device=cpu; fi
for ((i = 0; i < ${#pass[@]}; i++)); do
  [ "${pass[$i]}" = "--device=cpu" ] && device=cpu
  [ "${pass[$i]}" = "--device" ] && [ "${pass[$((i + 1))]:-}" = "cpu" ] && device=cpu
done
if [ "$device" = cpu ]; then
  if [ "$full_cpu" = 0 ] && ! has_flag --num-steps && ! has_flag --warmup-steps; then
    pass+=(--warmup-steps 2 --num-steps 10)
    say "NOTE: no GPU: running each stage with --warmup-steps 2 --num-steps 10 instead of the config's step counts,"
    say "      because CPU training is slow. Every result JSON records this; pass --num-steps N or --full-cpu to change it."
  else
    say "NOTE: no GPU: running on the CPU with the config's step counts; expect minutes per stage."
  fi
  say "NOTE: CPU numbers show the stages' relative cost on this CPU only; GPU memory, MFU and kernel counts stay empty."
fi

run=$results/run_$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$run"
printf '%q ' "$0" "$@" >"$run/command.txt"
echo >>"$run/command.txt"
say "run folder: $run"
say "stages: ${stage_list[*]} | config: $config | flags: ${pass[*]:-(none)}"

files=()
failed=()
for stage in "${stage_list[@]}"; do
  say "=== $stage ==="
  rc=0
  "$build/$stage" --config "$config" --output "$run/$stage.json" "${pass[@]}" 2>&1 | tee "$run/$stage.log" || rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ] && [ -f "$run/$stage.json" ]; then
    files+=("$run/$stage.json")
  else
    failed+=("$stage")
    say "$stage failed (status $rc); its output is in $run/$stage.log"
  fi
done
[ ${#files[@]} -gt 0 ] || die "every stage failed; see the logs in $run"

say "=== comparison ==="
rc=0
"$build/compare" --output-dir "$run" "${files[@]}" || rc=$?
[ "$rc" -eq 0 ] || die "compare failed (status $rc, see above)"
say "results: $run/<stage>.json (one per stage), logs: $run/<stage>.log"
say "table: $run/comparison.md (Markdown), $run/comparison.csv (CSV)"
say "chart: $run/comparison.svg (open it in a browser)"
if has_flag --profile; then say "traces: $run/<stage>.trace.json (open them in https://ui.perfetto.dev)"; fi
if [ ${#failed[@]} -gt 0 ]; then die "these stages failed and are not in the table: ${failed[*]}"; fi
