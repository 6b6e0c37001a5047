# shellcheck shell=bash disable=SC2154
# Shared by scripts/profile_*.sh (sourced, not run): arguments, the stage executable, the GPU vendor,
# the output folder and running a profiler with its log kept. The caller sets `job` and `usage` first
# (hence SC2154 above).
#
# Environment: TT_BUILD_DIR (default build/), TT_GPU_VENDOR=amd|nvidia (skips detection).

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}

say() { echo "[$job] $*" >&2; }
die() {
  echo "[$job] error: $*" >&2
  exit 1
}

# Script options (before the stage) are the caller's business: it shifts them away and passes the rest.
# Sets: stage, exe, stage_args (array, extended later) and user_args (as given).
tt_stage_and_args() {
  if [ $# -eq 0 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then
    echo "$usage" >&2
    exit 2
  fi
  stage=$1
  shift
  stage_args=("$@")
  user_args=("$@")
  exe=$build/$stage
  if [ ! -x "$exe" ]; then
    local have
    have=$(find "$build" -maxdepth 1 -name 'v[0-9]*' -type f -perm -u+x -printf '%f\n' 2>/dev/null | sort -V | tr '\n' ' ')
    die "no stage executable '$exe'. Build first (scripts/build.sh) or set TT_BUILD_DIR; stages built: ${have:-none}"
  fi
  local a
  for a in "${stage_args[@]}"; do
    case $a in
      --profile | --profile-steps | --profile=* | --profile-steps=*)
        die "do not pass --profile here: the built-in profiler uses the same GPU tracing interface (CUPTI / the ROCm tracer) as the vendor profilers; run it on its own: $exe --profile ..." ;;
    esac
  done
}

# True when the stage arguments already set this flag (as "--flag value" or "--flag=value").
tt_has_arg() {
  local a
  for a in "${stage_args[@]}"; do
    [ "$a" = "$1" ] || [ "${a%%=*}" = "$1" ] && return 0
  done
  return 1
}

# Sets vendor=amd|nvidia from the GPU tools that see a device, or dies with what was tried.
tt_detect_vendor() {
  case ${TT_GPU_VENDOR:-} in
    amd | nvidia) vendor=$TT_GPU_VENDOR ;;
    "")
      if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
        vendor=nvidia
      elif command -v rocm-smi >/dev/null && rocm-smi --showproductname 2>/dev/null | grep -qi "GPU\|card"; then
        vendor=amd
      elif command -v amd-smi >/dev/null && amd-smi list 2>/dev/null | grep -qi "GPU"; then
        vendor=amd
      elif command -v rocminfo >/dev/null && rocminfo 2>/dev/null | grep -q "gfx[0-9]"; then
        vendor=amd
      else
        die "no GPU found: neither nvidia-smi (NVIDIA) nor rocm-smi / amd-smi / rocminfo (AMD) lists one. These scripts wrap the vendors' GPU profilers; without a GPU use the built-in profiler: $exe --profile ... (set TT_GPU_VENDOR=amd|nvidia to skip this detection)"
      fi ;;
    *) die "TT_GPU_VENDOR='$TT_GPU_VENDOR' is not allowed: use amd or nvidia" ;;
  esac
  local backend
  backend=$("$exe" --doctor 2>/dev/null | sed -n 's/^ *kernels compiled for *: *//p')
  if { [ "$vendor" = nvidia ] && [ "$backend" = hip ]; } || { [ "$vendor" = amd ] && [ "$backend" = cuda ]; }; then
    say "warning: found an $vendor GPU but $stage was built for $backend; the profile will not show our kernels"
  fi
  say "vendor: $vendor (stage built for: ${backend:-unknown})"
}

# Sets out to a new folder profiles/<job>_<stage>_<UTC time>/ and points the result JSON there unless
# the arguments name an --output.
tt_output_dir() {
  out=$root/profiles/${job}_${stage}_$(date -u +%Y%m%d-%H%M%S)
  mkdir -p "$out"
  if ! tt_has_arg --output; then stage_args+=(--output "$out/$stage.json"); fi
}

tt_require_tool() {
  command -v "$1" >/dev/null || die "$1 not found on PATH. $2"
}

# tt_run LOG COMMAND...: runs the command with its output shown and kept in $out/LOG; returns its status.
tt_run() {
  local log=$out/$1
  shift
  printf '%q ' "$@" >"$out/command.txt"
  echo >>"$out/command.txt"
  say "running: $*"
  local rc=0
  "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  return "$rc"
}

# Dies with a clear message when nsys ran but left no report (seen on machines where nsys cannot write
# its report: unwritable or full temp space, a missing importer, container restrictions).
tt_check_nsys_report() {
  local report=$1 rc=$2 log=$3
  if [ -s "$report" ]; then
    [ "$rc" -eq 0 ] || say "warning: the run exited with status $rc; the report may be incomplete (see $log)"
    return 0
  fi
  local why="nsys finished (status $rc) but wrote no report: '$report' is missing."
  if ls "${report%.nsys-rep}".qdstrm >/dev/null 2>&1; then
    why+=" A .qdstrm file was left behind, so nsys collected data but could not convert it (its QdstrmImporter failed or is missing)."
  fi
  why+=" nsys cannot write reports on some machines: check that \$TMPDIR (default /tmp) and '$(dirname "$report")' are writable and not full, that /tmp is not mounted noexec, and that the container allows nsys. nsys's own messages: $log."
  why+=" The built-in profiler needs none of this: $exe --profile ${user_args[*]}"
  die "$why"
}

# Prints where the output is, with how to open it.
tt_done() {
  say "done. Everything is in $out"
  local line
  for line in "$@"; do say "  $line"; done
}
