#!/usr/bin/env bash
# CPU test of a clean stop (issue 23), on the real executable: SIGTERM during training finishes the step,
# writes the checkpoint and a result marked interrupted, and exits with 128 + 15; --resume of that
# checkpoint continues the run; a second signal ends the process at once, with nothing written.
# Usage: test_stop_signal.sh <v1_baseline executable>. Run by ctest (label cpu).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
program=$1
work=$(mktemp -d)
trap 'kill -KILL ${pid:-} 2>/dev/null; rm -rf "$work"' EXIT
failures=0
check() {  # check <description> <command...>: the command must succeed
  local what=$1
  shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; failures=$((failures + 1)); fi
}
wait_for_line() {  # wait_for_line <file> <pattern>: up to 120 s
  for _ in $(seq 1200); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1:"; cat "$1"; return 1
}
json_int() { grep -o "\"$2\": [0-9]*" "$1" | head -1 | grep -o '[0-9]*$'; }

smoke=(--config "$root/configs/smoke.json" --device cpu --warmup-steps 1 --log-every 1)

# One signal: the run stops after its step, with a checkpoint and a marked result.
"$program" "${smoke[@]}" --num-steps 100000 --checkpoint-dir "$work/ck" --output "$work/first.json" \
  > "$work/first.log" 2>&1 &
pid=$!
wait_for_line "$work/first.log" "step 3/"
kill -TERM $pid
wait $pid
check "exit status 143 (128 + SIGTERM) after a stop" test $? -eq 143
pid=
check "the result is marked interrupted" grep -q '"interrupted": true' "$work/first.json"
done_steps=$(json_int "$work/first.json" steps_done)
check "the result says how many steps were done (${done_steps:-none})" test "${done_steps:-0}" -ge 3
checkpoint=$(printf '%s/ck/step_%06d.pt' "$work" "${done_steps:-0}")
check "the checkpoint of the stop step was written" test -f "$checkpoint"
check "no temporary file is left" test -z "$(find "$work/ck" -name '*.tmp')"

# The resume continues from there: three more steps, same config.
"$program" "${smoke[@]}" --num-steps $((done_steps + 2)) --resume "$checkpoint" --output "$work/second.json" \
  > "$work/second.log" 2>&1
check "the resumed run succeeds" test $? -eq 0
check "the resumed run starts after the stop step" test "$(json_int "$work/second.json" first_step)" = "$done_steps"
check "the resumed run ends at its last step" test "$(json_int "$work/second.json" steps_done)" = $((done_steps + 3))

# Two signals: the second ends the process at once (a step of the workshop model takes long enough on a
# CPU for both to land in one step).
"$program" --config "$root/configs/workshop.json" --device cpu --warmup-steps 1 --log-every 1 --num-steps 1000 \
  --output "$work/third.json" > "$work/third.log" 2>&1 &
pid=$!
wait_for_line "$work/third.log" "step 1/"
kill -TERM $pid
sleep 0.05
kill -INT $pid
wait $pid
check "exit status 130 (128 + SIGINT) after a second signal" test $? -eq 130
pid=
check "the second signal says it exits now" grep -q "second signal" "$work/third.log"
check "nothing was written after a second signal" test ! -e "$work/third.json"

[ $failures -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
