#!/usr/bin/env bash
# The roofline of a stage's kernels: ncu collects, for a window of kernels of the first training step, GPU
# time, DRAM bytes and the FLOP counters (the metrics `build/roofline --help` reads), exports them as CSV,
# and the roofline tool turns them into a table and an SVG chart against the GPU's compute roofs (the peak
# table MFU uses) and the memory roof it measures (1 GiB device-to-device copies).
#   NVIDIA: as above.
#   AMD:    not automated: rocprof-compute has its own roofline (README, "The roofline report").
# Output: profiles/profile_roofline_<stage>_<UTC time>/ (counters.ncu-rep, counters.csv, roofline.{md,svg,json})
# and, with --into DIR (a run folder), copies of the roofline files there as <stage>.roofline.* for the
# folder's report.html (made by the next compare on that folder).
set -euo pipefail
job=profile_roofline
usage="usage: scripts/profile_roofline.sh [--launch-skip N] [--launch-count N] [--top N] [--into DIR] STAGE [stage flags...]
  e.g. scripts/profile_roofline.sh --launch-count 331 v3_custom --config configs/workshop.json
  --launch-skip N    kernels to skip, in launch order from the first training step [0]
  --launch-count N   kernels to profile [400]: set it to the stage's kernels/step (from a --profile run) for one step
  --top N            kernels in the table and chart [12]
  --into DIR         also copy the roofline files into DIR as <stage>.roofline.{md,svg,json}"
launch_skip=0
launch_count=400
top=12
into=""
while [ $# -gt 0 ]; do
  case $1 in
    --launch-skip) launch_skip=${2:?--launch-skip needs a number}; shift 2 ;;
    --launch-count) launch_count=${2:?--launch-count needs a number}; shift 2 ;;
    --top) top=${2:?--top needs a number}; shift 2 ;;
    --into) into=${2:?--into needs a folder}; shift 2 ;;
    *) break ;;
  esac
done
# shellcheck source=scripts/profile_common.sh
source "$(dirname "$0")/profile_common.sh"
tt_stage_and_args "$@"
tt_detect_vendor
[ "$vendor" = nvidia ] || die "the roofline report reads Nsight Compute counters (NVIDIA). On AMD use rocprof-compute's own roofline: rocprof-compute profile --name $stage --roof-only -- $exe ... (README, \"The roofline report\")"
tt_require_tool ncu "Install Nsight Compute (it comes with the CUDA toolkit)."
[ -x "$build/roofline" ] || die "no roofline executable in $build: build it (scripts/build.sh)"
tt_output_dir
if ! tt_has_arg --num-steps && ! tt_has_arg --warmup-steps; then
  stage_args+=(--warmup-steps 2 --num-steps 2)
  say "note: running 2 warm-up + 2 measured steps (ncu replays every kernel once per counter pass)"
fi

# Only the metrics this ncu knows for this GPU: an unknown one would stop ncu altogether.
known=$(ncu --query-metrics 2>/dev/null | awk '{print $1}')
metrics=()
for m in $("$build/roofline" --list-metrics); do
  base=${m%%.*}
  if grep -qx "$base" <<<"$known"; then metrics+=("$m"); else say "note: ncu does not know $base here; left out"; fi
done
[ ${#metrics[@]} -gt 0 ] || die "ncu --query-metrics lists none of the roofline metrics (is a GPU visible to ncu?)"
metric_list=$(IFS=,; echo "${metrics[*]}")

rc=0
tt_run ncu.log ncu --metrics "$metric_list" --launch-skip "$launch_skip" --launch-count "$launch_count" \
  --force-overwrite --export "$out/counters" "$exe" "${stage_args[@]}" || rc=$?
if grep -q ERR_NVGPUCTRPERM "$out/ncu.log"; then
  die "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root or allow it for all users, see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
fi
[ -s "$out/counters.ncu-rep" ] || die "ncu (status $rc) wrote no report; its messages are in $out/ncu.log"
ncu --import "$out/counters.ncu-rep" --csv --page raw --print-units base >"$out/counters.csv" 2>>"$out/ncu.log" ||
  die "ncu could not export $out/counters.ncu-rep as CSV; see $out/ncu.log"
result=$out/$stage.json
for ((i = 0; i < ${#stage_args[@]}; i++)); do
  [ "${stage_args[$i]}" = --output ] && result=${stage_args[$((i + 1))]}
done
"$build/roofline" --counters "$out/counters.csv" --result "$result" --measure-bandwidth --top "$top" --output-dir "$out" ||
  die "the roofline tool failed (see above)"
if [ -n "$into" ]; then
  mkdir -p "$into"
  for ext in md svg json; do cp "$out/roofline.$ext" "$into/$stage.roofline.$ext"; done
  say "copied into $into as $stage.roofline.{md,svg,json}; run compare on that folder to include it in report.html"
fi
tt_done "table: $out/roofline.md" "chart: $out/roofline.svg (open it in a browser)" "counters: $out/counters.csv, $out/counters.ncu-rep (ncu-ui)"
