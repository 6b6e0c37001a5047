#!/usr/bin/env bash
# Kernel hotspot list of one run: every GPU kernel with its calls, total and mean time, largest first.
#   AMD:    rocprofv3 --kernel-trace --stats (CSV: the kernel trace and *_kernel_stats.csv)
#   NVIDIA: nsys profile + nsys stats --report cuda_gpu_kern_sum (CSV); where nsys cannot write its report,
#           ncu measuring gpu__time_duration of --launch-count kernels instead
# Output: profiles/profile_kernels_<stage>_<UTC time>/ with the tables, the profiler's log and the result JSON.
set -euo pipefail
job=profile_kernels
usage="usage: scripts/profile_kernels.sh [--launch-skip N] [--launch-count N] STAGE [stage flags...]
  e.g. scripts/profile_kernels.sh v2_fused --config configs/workshop.json --num-steps 5
  --launch-skip / --launch-count (default 0 / 500): the kernel window of the ncu fallback on NVIDIA"
launch_skip=0
launch_count=500
while [ $# -gt 0 ]; do
  case $1 in
    --launch-skip) launch_skip=${2:?--launch-skip needs a number}; shift 2 ;;
    --launch-count) launch_count=${2:?--launch-count needs a number}; shift 2 ;;
    *) break ;;
  esac
done
# shellcheck source=scripts/profile_common.sh
source "$(dirname "$0")/profile_common.sh"
tt_stage_and_args "$@"
tt_detect_vendor
case $vendor in
  amd) tt_require_tool rocprofv3 "It comes with ROCm 6.2 or newer (/opt/rocm/bin; package rocprofiler-sdk)." ;;
  nvidia) command -v nsys >/dev/null || tt_require_tool ncu "Neither nsys nor ncu is on PATH: install Nsight Systems or Nsight Compute (both come with the CUDA toolkit)." ;;
esac
tt_output_dir

show_top() {  # show_top CSV: the header and the 15 largest rows, as columns
  say "top kernels ($1):"
  if command -v column >/dev/null; then
    head -n 16 "$1" | cut -c1-220 | column -s, -t >&2
  else
    head -n 16 "$1" | cut -c1-220 >&2
  fi
}

ncu_kernels() {
  tt_require_tool ncu "Install Nsight Compute (it comes with the CUDA toolkit)."
  local rc=0
  # Clocks and caches as in a normal run: this job wants durations, not comparable counter values.
  tt_run ncu.log ncu --metrics gpu__time_duration.sum --launch-skip "$launch_skip" --launch-count "$launch_count" \
    --cache-control none --clock-control none --force-overwrite --export "$out/kernels" \
    "$exe" "${stage_args[@]}" || rc=$?
  if grep -q ERR_NVGPUCTRPERM "$out/ncu.log"; then
    die "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root or allow it for all users, see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
  fi
  [ -s "$out/kernels.ncu-rep" ] || die "ncu (status $rc) wrote no report; its messages are in $out/ncu.log"
  ncu --import "$out/kernels.ncu-rep" --print-summary per-kernel --csv >"$out/kernels_summary.csv" 2>>"$out/ncu.log" || true
  tt_done "report: $out/kernels.ncu-rep (kernels $launch_skip .. $((launch_skip + launch_count - 1)) in launch order)" \
    "per-kernel summary: $out/kernels_summary.csv" \
    "open it in Nsight Compute: ncu-ui $out/kernels.ncu-rep" \
    "ncu serialises kernels: durations are per kernel, not the overlapped step time"
}

rc=0
case $vendor in
  amd)
    tt_run rocprofv3.log rocprofv3 --kernel-trace --stats --output-format csv --output-directory "$out" \
      --output-file kernels -- "$exe" "${stage_args[@]}" || rc=$?
    stats=$(find "$out" -name '*kernel_stats.csv' | head -n 1)
    [ -n "$stats" ] || die "rocprofv3 (status $rc) wrote no *kernel_stats.csv into $out; its messages are in $out/rocprofv3.log"
    show_top "$stats"
    tt_done "kernel statistics: $stats (calls, total / average / min / max ns, share of GPU time)" \
      "every dispatch: $(find "$out" -name '*kernel_trace.csv' | head -n 1)"
    ;;
  nvidia)
    if ! command -v nsys >/dev/null; then
      say "nsys not found: using ncu instead"
      ncu_kernels
      exit 0
    fi
    tt_run nsys.log nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true \
      --output "$out/kernels" -- "$exe" "${stage_args[@]}" || rc=$?
    if [ ! -s "$out/kernels.nsys-rep" ]; then
      if command -v ncu >/dev/null; then
        say "nsys (status $rc) could not write its report on this machine (see $out/nsys.log): falling back to ncu"
        ncu_kernels
        exit 0
      fi
      tt_check_nsys_report "$out/kernels.nsys-rep" "$rc" "$out/nsys.log"
    fi
    # The report was renamed in nsys 2023.1 (gpukernsum -> cuda_gpu_kern_sum).
    for report in cuda_gpu_kern_sum gpukernsum; do
      if nsys stats --report "$report" --format csv --force-export=true --output "$out/kernels" \
        "$out/kernels.nsys-rep" >>"$out/nsys.log" 2>&1; then
        break
      fi
    done
    stats=$(find "$out" -name 'kernels_*kern*sum*.csv' | head -n 1)
    [ -n "$stats" ] || die "nsys stats could not summarise $out/kernels.nsys-rep; its messages are in $out/nsys.log"
    show_top "$stats"
    tt_done "kernel summary: $stats (time share, total, calls, average / median / min / max ns per kernel)" \
      "report: $out/kernels.nsys-rep (open in nsys-ui for the timeline)"
    ;;
esac
