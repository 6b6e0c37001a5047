#!/usr/bin/env bash
# Hardware counters per kernel: speed of light (compute and memory throughput against peak), memory
# hierarchy, occupancy and launch configuration.
#   AMD:    rocprof-compute profile (analyse with rocprof-compute analyze; a summary is written here)
#   NVIDIA: ncu with the sections SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, LaunchStats on a window
#           of --launch-count kernels (every kernel is replayed once per counter pass: the full run would take hours)
# Counter collection replays kernels (ncu) or the whole run (rocprof-compute) many times, so by default the
# run is 2 warm-up + 2 measured steps (a graphed stage captures during the warm-up) unless the stage flags set --num-steps / --warmup-steps; the step times
# in that run's result JSON are distorted by the replays and are not for comparison.
# Output: profiles/profile_counters_<stage>_<UTC time>/
set -euo pipefail
job=profile_counters
usage="usage: scripts/profile_counters.sh [--launch-skip N] [--launch-count N] [--kernel TEXT] [--sections \"A B\"] STAGE [stage flags...]
  e.g. scripts/profile_counters.sh v3_custom --config configs/workshop.json --dtype bf16
  --launch-skip N    NVIDIA: kernels to skip, in launch order from the first training step [0]
  --launch-count N   NVIDIA: kernels to profile [50]; one step launches hundreds (the stage's --profile
                     run prints its kernels per step)
  --kernel TEXT      only kernels whose name contains TEXT (AMD: rocprof-compute -k; NVIDIA: ncu --kernel-name regex:TEXT)
  --sections LIST    NVIDIA: ncu sections [SpeedOfLight MemoryWorkloadAnalysis Occupancy LaunchStats]"
launch_skip=0
launch_count=50
kernel=""
sections="SpeedOfLight MemoryWorkloadAnalysis Occupancy LaunchStats"
while [ $# -gt 0 ]; do
  case $1 in
    --launch-skip) launch_skip=${2:?--launch-skip needs a number}; shift 2 ;;
    --launch-count) launch_count=${2:?--launch-count needs a number}; shift 2 ;;
    --kernel) kernel=${2:?--kernel needs a name fragment}; shift 2 ;;
    --sections) sections=${2:?--sections needs a list}; shift 2 ;;
    *) break ;;
  esac
done
# shellcheck source=scripts/profile_common.sh
source "$(dirname "$0")/profile_common.sh"
tt_stage_and_args "$@"
tt_detect_vendor
case $vendor in
  amd) tt_require_tool rocprof-compute "Install ROCm Compute Profiler (package rocprofiler-compute, ROCm 6.3+; formerly omniperf) and its Python requirements." ;;
  nvidia) tt_require_tool ncu "Install Nsight Compute (it comes with the CUDA toolkit)." ;;
esac
tt_output_dir
if ! tt_has_arg --num-steps && ! tt_has_arg --warmup-steps; then
  stage_args+=(--warmup-steps 2 --num-steps 2)
  say "note: running 2 warm-up + 2 measured steps (counter collection replays the work; pass --num-steps / --warmup-steps to change)"
fi

rc=0
case $vendor in
  amd)
    # Newer releases replace --path with --output-directory.
    if rocprof-compute profile --help 2>&1 | grep -q -- "--output-directory"; then dir_flag=--output-directory; else dir_flag=--path; fi
    filter=()
    [ -n "$kernel" ] && filter=(--kernel "$kernel")
    tt_run rocprof-compute.log rocprof-compute profile --name "$stage" "$dir_flag" "$out/workloads" "${filter[@]}" \
      -- "$exe" "${stage_args[@]}" || rc=$?
    workload=$(dirname "$(find "$out" -name pmc_perf.csv | head -n 1)")
    [ "$workload" != "." ] || die "rocprof-compute (status $rc) wrote no counters (pmc_perf.csv) into $out; its messages are in $out/rocprof-compute.log"
    if rocprof-compute analyze --path "$workload" >"$out/analysis.txt" 2>&1; then
      say "summary (speed of light, memory chart, occupancy per kernel): $out/analysis.txt"
      head -n 60 "$out/analysis.txt" >&2
    else
      say "warning: rocprof-compute analyze failed (its Python requirements?); see $out/analysis.txt"
    fi
    tt_done "workload: $workload" \
      "analyse: rocprof-compute analyze --path $workload   (add --gui for the browser view, -k N for one kernel)" \
      "roofline plots (when collected): $workload/empirRoof_*.pdf"
    ;;
  nvidia)
    section_args=()
    for s in ${sections//,/ }; do section_args+=(--section "$s"); done
    filter=()
    [ -n "$kernel" ] && filter=(--kernel-name "regex:$kernel")
    # --nvtx keeps the forward / backward / optimizer / layer ranges with each kernel in the report.
    tt_run ncu.log ncu "${section_args[@]}" --nvtx --launch-skip "$launch_skip" --launch-count "$launch_count" \
      "${filter[@]}" --force-overwrite --export "$out/counters" "$exe" "${stage_args[@]}" || rc=$?
    if grep -q ERR_NVGPUCTRPERM "$out/ncu.log"; then
      die "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root or allow it for all users, see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
    fi
    [ -s "$out/counters.ncu-rep" ] || die "ncu (status $rc) wrote no report; its messages are in $out/ncu.log"
    ncu --import "$out/counters.ncu-rep" --page details >"$out/counters_details.txt" 2>>"$out/ncu.log" || true
    ncu --import "$out/counters.ncu-rep" --page details --csv >"$out/counters_details.csv" 2>>"$out/ncu.log" || true
    head -n 60 "$out/counters_details.txt" >&2 || true
    tt_done "report: $out/counters.ncu-rep (kernels $launch_skip .. $((launch_skip + launch_count - 1)) in launch order${kernel:+, names matching $kernel})" \
      "open it in Nsight Compute: ncu-ui $out/counters.ncu-rep" \
      "as text / CSV: $out/counters_details.txt, $out/counters_details.csv"
    ;;
esac
