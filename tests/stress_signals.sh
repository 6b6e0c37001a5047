#!/usr/bin/env bash
# Signals at random times (issue 26): a run writing a checkpoint after every step gets SIGTERM at a random
# moment, and in half the trials a second signal (SIGINT) a few milliseconds later, which may land in the
# middle of a checkpoint write. After each trial: no temporary file anywhere, every checkpoint left is
# complete and loadable (read back by `generate`, which verifies it), and resuming the newest gives the
# uninterrupted run's losses for the remaining steps, bitwise.
# Usage: stress_signals.sh <build folder> [trials]; trials default to $TT_STRESS_TRIALS or 10 (ctest, label cpu;
# the issue's 100 with `stress_signals.sh build 100`).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1
trials=${2:-${TT_STRESS_TRIALS:-10}}
work=$(mktemp -d)
trap 'kill -KILL ${pid:-} 2>/dev/null; rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL trial $trial: $*"; failures=$((failures + 1)); }
losses() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(" ".join(repr(x) for x in d["losses"]))' "$1"; }

steps=40
run=(--config "$root/configs/smoke.json" --device cpu --warmup-steps 1 --num-steps "$steps" --log-every 0)
"$build/v1_baseline" "${run[@]}" --output "$work/reference.json" > "$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; exit 1; }
read -r -a reference <<< "$(losses "$work/reference.json")"
total=$((steps + 1))

for trial in $(seq "$trials"); do
  dir="$work/t$trial"
  mkdir -p "$dir"
  "$build/v1_baseline" "${run[@]}" --checkpoint-dir "$dir/ck" --checkpoint-every 1 --keep-checkpoints 2 \
    --output "$dir/first.json" > "$dir/first.log" 2>&1 &
  pid=$!
  # The signal lands while the run trains and writes checkpoints: after its first checkpoint (start-up takes
  # seconds on a loaded machine), at a random moment within the next 0.6 s (a smoke step and its write take ms).
  for _ in $(seq 600); do
    ls "$dir"/ck/step_*.pt > /dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.3f", rand() * 0.6 }')"
  kill -TERM $pid 2>/dev/null
  second=$((RANDOM % 2))
  if [ $second -eq 1 ]; then
    sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.4f", rand() * 0.03 }')"
    kill -INT $pid 2>/dev/null
  fi
  wait $pid
  status=$?
  pid=
  case $status in 0 | 130 | 143) ;; *) fail "exit status $status"; cat "$dir/first.log" ;; esac
  leftovers=$(find "$dir" -name '*.tmp')
  [ -z "$leftovers" ] || fail "temporary files left: $leftovers"
  newest=""
  for ck in "$dir"/ck/step_*.pt; do
    [ -e "$ck" ] || continue
    "$build/generate" --checkpoint "$ck" --prompt a --max-new-tokens 0 --device cpu > /dev/null 2> "$dir/load.log" ||
      { fail "checkpoint $ck does not load"; cat "$dir/load.log"; }
    newest=$ck
  done
  [ -n "$newest" ] || { echo "trial $trial: stopped before the first checkpoint (status $status)"; continue; }
  [ $status -ne 0 ] || { echo "trial $trial: the run ended before the signal"; continue; }
  if [ "$(basename "$newest")" = "$(printf 'step_%06d.pt' $total)" ]; then
    # The signal came after the last step (during the final writes): the run is complete and there is nothing to
    # resume (--resume refuses such a checkpoint). Its losses, where the result was written, are the reference's.
    if [ -e "$dir/first.json" ]; then
      read -r -a got <<< "$(losses "$dir/first.json")"
      [ "${got[*]}" = "${reference[*]}" ] || { fail "stopped after the last step: losses differ from the uninterrupted run's"; continue; }
    fi
    echo "trial $trial: signal after the last step, exit $status: nothing to resume$([ -e "$dir/first.json" ] && echo ", losses equal")"
    continue
  fi
  "$build/v1_baseline" "${run[@]}" --resume "$newest" --output "$dir/resumed.json" > "$dir/resumed.log" 2>&1 ||
    { fail "resume of $newest failed"; cat "$dir/resumed.log"; continue; }
  first=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_step"])' "$dir/resumed.json")
  read -r -a resumed <<< "$(losses "$dir/resumed.json")"
  expected="${reference[*]:$first}"
  [ "${resumed[*]}" = "$expected" ] || fail "resumed from step $first: losses differ from the uninterrupted run's"
  echo "trial $trial: signal$([ $second -eq 1 ] && echo "s TERM+INT" || echo " TERM"), exit $status," \
    "resumed from step $first of $total: equal"
done
[ $failures -eq 0 ] || { echo "$failures failure(s) in $trials trials"; exit 1; }
echo "all $trials trials: no temporary file, every checkpoint loads, resumed = uninterrupted"
