#!/usr/bin/env bash
# System view of one run: CPU threads and sampling, OS runtime calls, GPU API calls and kernels, memory,
# with the ROCTX / NVTX ranges; for questions like "is the GPU waiting for the CPU?".
#   AMD:    rocprof-sys-sample (ROCm Systems Profiler, formerly omnitrace) with --trace --host --device:
#           a Perfetto trace (.proto: https://ui.perfetto.dev) or a rocpd database (.db: ROCm Optiq)
#   NVIDIA: nsys profile with CPU sampling, context switches, OS runtime, cuBLAS / cuDNN and memory usage,
#           plus nsys stats summaries (NVTX ranges, API calls, kernels)
# Output: profiles/profile_system_<stage>_<UTC time>/
set -euo pipefail
job=profile_system
usage="usage: scripts/profile_system.sh [--gpu-metrics] STAGE [stage flags...]
  e.g. scripts/profile_system.sh v1_baseline --config configs/workshop.json --num-steps 10
  --gpu-metrics   NVIDIA: also sample GPU metrics (SM activity, DRAM bandwidth); needs profiling permission"
gpu_metrics=0
while [ $# -gt 0 ]; do
  case $1 in
    --gpu-metrics) gpu_metrics=1; shift ;;
    *) break ;;
  esac
done
# shellcheck source=scripts/profile_common.sh
source "$(dirname "$0")/profile_common.sh"
tt_stage_and_args "$@"
tt_detect_vendor
case $vendor in
  amd)
    tool=$(command -v rocprof-sys-sample || command -v rocprof-sys-run || true)
    [ -n "$tool" ] || die "rocprof-sys-sample / rocprof-sys-run not found on PATH. Install ROCm Systems Profiler (package rocprofiler-systems, ROCm 6.3+; formerly omnitrace)." ;;
  nvidia) tt_require_tool nsys "Install Nsight Systems (it comes with the CUDA toolkit, or https://developer.nvidia.com/nsight-systems)." ;;
esac
tt_output_dir

rc=0
case $vendor in
  amd)
    export ROCPROFSYS_OUTPUT_PATH=$out/rocprof-sys ROCPROFSYS_TIME_OUTPUT=OFF ROCPROFSYS_USE_PID=OFF
    tt_run rocprof-sys.log "$tool" --trace --host --device -- "$exe" "${stage_args[@]}" || rc=$?
    proto=$(find "$out" -name '*.proto' | head -n 1)
    db=$(find "$out" -name '*.db' | head -n 1)
    [ -n "$proto$db" ] || die "$(basename "$tool") (status $rc) wrote no trace (.proto or .db) into $out; its messages are in $out/rocprof-sys.log"
    [ "$rc" -eq 0 ] || say "warning: the run exited with status $rc; the trace may be incomplete"
    lines=()
    [ -n "$proto" ] && lines+=("Perfetto trace: $proto (open it in https://ui.perfetto.dev)")
    [ -n "$db" ] && lines+=("rocpd database: $db (open it in ROCm Optiq)")
    lines+=("text summaries (wall clock per function / region): $(find "$out" -name 'wall_clock*.txt' | head -n 1)")
    tt_done "${lines[@]}"
    ;;
  nvidia)
    extra=()
    if [ "$gpu_metrics" = 1 ]; then
      # Renamed in nsys 2024.2 (--gpu-metrics-device -> --gpu-metrics-devices).
      if nsys profile --help 2>&1 | grep -q -- "--gpu-metrics-devices"; then extra+=(--gpu-metrics-devices=all); else extra+=(--gpu-metrics-device=all); fi
    fi
    tt_run nsys.log nsys profile --trace=cuda,nvtx,osrt,cublas,cudnn --sample=process-tree --cpuctxsw=process-tree \
      --cuda-memory-usage=true "${extra[@]}" --force-overwrite=true --output "$out/system" \
      -- "$exe" "${stage_args[@]}" || rc=$?
    tt_check_nsys_report "$out/system.nsys-rep" "$rc" "$out/nsys.log"
    # Report names changed in nsys 2023.1; try the new ones first.
    if ! nsys stats --report nvtx_sum,osrt_sum,cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --force-export=true \
      "$out/system.nsys-rep" >"$out/system_stats.txt" 2>&1; then
      nsys stats --report nvtxsum,osrtsum,cudaapisum,gpukernsum,gpumemtimesum --force-export=true \
        "$out/system.nsys-rep" >"$out/system_stats.txt" 2>&1 || say "warning: nsys stats failed; see $out/system_stats.txt"
    fi
    head -n 40 "$out/system_stats.txt" >&2 || true
    tt_done "report: $out/system.nsys-rep (open it in Nsight Systems: nsys-ui $out/system.nsys-rep)" \
      "summaries (NVTX ranges, OS runtime, CUDA API, kernels, memory copies): $out/system_stats.txt"
    ;;
esac
