#!/usr/bin/env bash
# CPU test of scripts/launch.sh with a stand-in program: the variables each rank gets, the exit status,
# and that the other ranks are stopped when one fails or is killed. Run by ctest (label cpu).
set -uo pipefail
unset CUDA_DEVICE_MAX_CONNECTIONS  # the checks below expect it unset: the launcher adds nothing
root=$(cd "$(dirname "$0")/.." && pwd)
launch="$root/scripts/launch.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check <description> <command...>: the command must succeed
  local what=$1
  shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; failures=$((failures + 1)); fi
}

# The stand-in rank: records its variables and pid, then fails, kills itself or sleeps as told.
cat > "$work/rank.sh" <<'EOF'
#!/usr/bin/env bash
echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $*" > "$OUT/env.$RANK"
echo "${CUDA_DEVICE_MAX_CONNECTIONS:-unset}" > "$OUT/queues.$RANK"
echo $$ > "$OUT/pid.$RANK"
echo "hello from $RANK"
case "${ACTION:-}:$RANK" in
  "fail:1") sleep 0.3; exit 3 ;;
  "kill:1") sleep 0.3; kill -KILL $$ ;;
esac
exec sleep "${SLEEP:-0}"
EOF
chmod +x "$work/rank.sh"

# All ranks succeed: each gets its own rank, the shared size and rendezvous, the flags unchanged.
mkdir -p "$work/ok"
OUT="$work/ok" bash "$launch" --nproc 3 --master-port 29650 "$work/rank.sh" --config x.json --dtype bf16 \
  > "$work/ok.log" 2>&1
check "all ranks succeed: exit 0" [ $? -eq 0 ]
for r in 0 1 2; do
  check "rank $r variables and flags" [ "$(cat "$work/ok/env.$r")" = "$r $r 3 3 127.0.0.1 29650 --config x.json --dtype bf16" ]
done
check "output lines carry the rank" grep -q '^\[rank 2\] hello from 2$' "$work/ok.log"

# The launcher passes the environment on and adds nothing to it: a stage that needs CUDA_DEVICE_MAX_CONNECTIONS
# (ZeRO-1's --zero-gather forward) restarts itself with it (apps/cli/stage_cli.cpp), under any launcher.
mkdir -p "$work/queues"
OUT="$work/queues" bash "$launch" --nproc 2 "$work/rank.sh" --shard-optimizer --zero-gather forward > "$work/queues.log" 2>&1
check "no hardware queues set by the launcher" [ "$(cat "$work/queues/queues.1")" = unset ]
OUT="$work/queues" CUDA_DEVICE_MAX_CONNECTIONS=16 bash "$launch" --nproc 2 "$work/rank.sh" --zero-gather forward \
  > "$work/queues.log" 2>&1
check "the environment's hardware queues are passed on" [ "$(cat "$work/queues/queues.1")" = 16 ]

# One rank fails: its status comes back, and the sleeping ranks are stopped (not waited for).
for action in fail kill; do
  mkdir -p "$work/$action"
  OUT="$work/$action" ACTION=$action SLEEP=300 bash "$launch" --nproc 3 "$work/rank.sh" > "$work/$action.log" 2>&1
  code=$?
  expected=3
  [ "$action" = kill ] && expected=137
  check "rank 1 $action: launcher exits $expected (got $code)" [ "$code" -eq "$expected" ]
  check "rank 1 $action: the launcher names the rank" grep -q 'rank 1 (pid [0-9]*) exited with status' "$work/$action.log"
  for r in 0 2; do
    pid=$(cat "$work/$action/pid.$r")
    check "rank 1 $action: rank $r (pid $pid) was stopped" bash -c "! kill -0 $pid 2>/dev/null"
  done
done

# Bad use: exit 2 with a message naming the problem, nothing started.
expect_refusal() {  # expect_refusal <message fragment> <launch.sh arguments...>
  local fragment=$1
  shift
  bash "$launch" "$@" > "$work/refusal.log" 2>&1
  local code=$?
  check "refused ($*): exit 2 (got $code)" [ "$code" -eq 2 ]
  check "refused ($*): says '$fragment'" grep -q -- "$fragment" "$work/refusal.log"
}
expect_refusal "--nproc N is required" "$work/rank.sh"
expect_refusal "--nproc '0' is not allowed" --nproc 0 "$work/rank.sh"
expect_refusal "--nproc 'two' is not allowed" --nproc two "$work/rank.sh"
expect_refusal "--master-port '70000' is not allowed" --nproc 1 --master-port 70000 "$work/rank.sh"
expect_refusal "unknown option '--gpus'" --gpus 2 "$work/rank.sh"
expect_refusal "no stage given" --nproc 2
expect_refusal "is not an executable program" --nproc 2 "$work/missing-program"

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
