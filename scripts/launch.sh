#!/usr/bin/env bash
# Starts N copies of a stage on this host, one per GPU, for data-parallel training (torchrun's variables):
#   scripts/launch.sh --nproc N [--master-port P] [--master-addr A] <stage> [stage flags...]
# <stage> is v1_baseline, v2_fused, v3_custom, v4_ultra (from ${TT_BUILD_DIR:-build}/) or a path to a program.
# Each copy gets RANK = LOCAL_RANK = 0..N-1, WORLD_SIZE = LOCAL_WORLD_SIZE = N, MASTER_ADDR, MASTER_PORT; its
# output lines are prefixed with "[rank R]".
# When one copy fails, the others are stopped and this script exits with the failed copy's status (128 + signal
# when it was killed); 0 when all succeed.
set -uo pipefail

usage() {
  sed -n '2,8s/^# \{0,1\}//p' "$0" >&2
  exit 2
}
fail() {
  echo "launch.sh: error: $*" >&2
  exit 2
}

nproc=""
master_addr=127.0.0.1
master_port=29500
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) [ $# -ge 2 ] || fail "--nproc needs a value"; nproc=$2; shift 2 ;;
    --nproc=*) nproc=${1#*=}; shift ;;
    --master-port) [ $# -ge 2 ] || fail "--master-port needs a value"; master_port=$2; shift 2 ;;
    --master-port=*) master_port=${1#*=}; shift ;;
    --master-addr) [ $# -ge 2 ] || fail "--master-addr needs a value"; master_addr=$2; shift 2 ;;
    --master-addr=*) master_addr=${1#*=}; shift ;;
    -h|--help) usage ;;
    --*) fail "unknown option '$1' before the stage (allowed: --nproc, --master-port, --master-addr)" ;;
    *) break ;;
  esac
done
[ -n "$nproc" ] || fail "--nproc N is required (processes on this host, one per GPU)"
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] || fail "--nproc '$nproc' is not allowed: must be an integer >= 1"
[[ "$master_port" =~ ^[0-9]+$ ]] && [ "$master_port" -ge 1 ] && [ "$master_port" -le 65535 ] ||
  fail "--master-port '$master_port' is not allowed: must be a TCP port in [1, 65535]"
[ $# -ge 1 ] || fail "no stage given (v1_baseline, v2_fused, v3_custom, v4_ultra, or a program path)"

stage=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ "$stage" == */* ]]; then
  program=$stage
else
  program=${TT_BUILD_DIR:-$root/build}/$stage
fi
[ -x "$program" ] || fail "'$program' is not an executable program (build first: bash scripts/build.sh)"

pids=()     # by rank
live=()     # not yet reaped
reaper=""   # sends SIGKILL to ranks that ignore SIGTERM for 15 s
stop_all() {  # every rank still running (kill -0: exists and not yet reaped)
  local running=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running+=("$pid"); done
  [ ${#running[@]} -gt 0 ] || return 0
  kill -TERM "${running[@]}" 2>/dev/null
  (sleep 15; kill -KILL "${running[@]}" 2>/dev/null) &
  reaper=$!
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM

for ((rank = 0; rank < nproc; rank++)); do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$nproc LOCAL_WORLD_SIZE=$nproc MASTER_ADDR=$master_addr \
    MASTER_PORT=$master_port "$program" "$@" > >(sed -u "s/^/[rank $rank] /") 2>&1 &
  pids+=($!)
  live+=($!)
  echo "[launch] rank $rank pid ${pids[-1]}: $program $*" >&2
done

status=0
while [ ${#live[@]} -gt 0 ]; do
  # Polled rather than `wait -n`, which loses children that bash already reaped in the background.
  sleep 0.2
  still=()
  for pid in "${live[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
    wait "$pid"
    code=$?
    for i in "${!pids[@]}"; do [ "${pids[$i]}" = "$pid" ] && rank=$i; done
    if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
      status=$code
      echo "[launch] rank $rank (pid $pid) exited with status $code: stopping the other ranks" >&2
      stop_all
    fi
  done
  live=("${still[@]}")
done
[ -z "$reaper" ] || kill "$reaper" 2>/dev/null
wait  # the output filters
exit "$status"
