#!/usr/bin/env bash
# Timeline of one run: every kernel, memory copy and runtime call, with the forward / backward /
# optimizer / layer ranges (ROCTX / NVTX) on top.
#   AMD:    rocprofv3 --runtime-trace, written as a Perfetto trace (.pftrace): open it in https://ui.perfetto.dev
#   NVIDIA: nsys profile --trace=cuda,nvtx: open the .nsys-rep in Nsight Systems (nsys-ui)
# Output: profiles/profile_trace_<stage>_<UTC time>/ with the trace, the profiler's log and the run's result JSON.
set -euo pipefail
job=profile_trace
usage="usage: scripts/profile_trace.sh STAGE [stage flags...]
  e.g. scripts/profile_trace.sh v2_fused --config configs/workshop.json --num-steps 5"
# shellcheck source=scripts/profile_common.sh
source "$(dirname "$0")/profile_common.sh"
tt_stage_and_args "$@"
tt_detect_vendor
case $vendor in
  amd) tt_require_tool rocprofv3 "It comes with ROCm 6.2 or newer (/opt/rocm/bin; package rocprofiler-sdk)." ;;
  nvidia) tt_require_tool nsys "Install Nsight Systems (it comes with the CUDA toolkit, or https://developer.nvidia.com/nsight-systems)." ;;
esac
tt_output_dir

rc=0
case $vendor in
  amd)
    tt_run rocprofv3.log rocprofv3 --runtime-trace --output-format pftrace --output-directory "$out" \
      --output-file trace -- "$exe" "${stage_args[@]}" || rc=$?
    trace=$(find "$out" -name '*.pftrace' | head -n 1)
    [ -n "$trace" ] || die "rocprofv3 (status $rc) wrote no .pftrace file into $out; its messages are in $out/rocprofv3.log"
    [ "$rc" -eq 0 ] || say "warning: the run exited with status $rc; the trace may be incomplete"
    tt_done "trace: $trace" \
      "open it: drag the file into https://ui.perfetto.dev (large traces: use the trace_processor it offers)" \
      "the marker tracks hold the forward / backward / optimizer / layer ranges; kernels sit under the GPU queues"
    ;;
  nvidia)
    tt_run nsys.log nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --force-overwrite=true \
      --output "$out/trace" -- "$exe" "${stage_args[@]}" || rc=$?
    tt_check_nsys_report "$out/trace.nsys-rep" "$rc" "$out/nsys.log"
    tt_done "report: $out/trace.nsys-rep" \
      "open it in Nsight Systems: nsys-ui $out/trace.nsys-rep (or copy it to a machine with the GUI)" \
      "summaries on the command line: nsys stats $out/trace.nsys-rep" \
      "the NVTX rows hold the forward / backward / optimizer / layer ranges"
    ;;
esac
