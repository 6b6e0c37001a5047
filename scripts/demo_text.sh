#!/usr/bin/env bash
# End to end on text, no downloads: makes a training text and a held-out text (or takes yours), trains
# the workshop model on it with a held-out curve and a checkpoint, evaluates the checkpoint with another
# stage, and generates from it (greedy, then sampled).
#
#   scripts/demo_text.sh                      # defaults below
#   STEPS=1000 DTYPE=fp32 scripts/demo_text.sh
#   TRAIN_TEXT=my.txt EVAL_TEXT=held_out.txt PROMPT="Once upon a time" scripts/demo_text.sh
#   LR_SCHEDULE=cosine scripts/demo_text.sh   # Ctrl-C while it trains, then the same with RESUME=1
#
# Settings (environment): STEPS (600), EVAL_EVERY (100), STAGE (v2_fused), EVAL_STAGE (v3_custom),
# CONFIG (configs/workshop.json), DTYPE (bf16), DEVICE (auto), LEARNING_RATE (1e-3), PROMPT,
# TRAIN_TEXT / EVAL_TEXT (default: generated), OUT (results/demo), TT_BUILD_DIR (build),
# LR_SCHEDULE (constant | cosine | linear), LR_WARMUP_STEPS (0), MIN_LR (1e-4, for cosine and linear),
# GRAD_ACCUM (1), CHECKPOINT_EVERY (100: checkpoints into OUT/checkpoints, the newest 3 kept),
# RESUME (1: continue from the newest of those checkpoints; docs/training.md; without it, a new run moves the
# previous run's checkpoints to OUT/checkpoints.previous).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TT_BUILD_DIR:-$root/build}
out=${OUT:-$root/results/demo}
steps=${STEPS:-600}
eval_every=${EVAL_EVERY:-100}
stage=${STAGE:-v2_fused}
eval_stage=${EVAL_STAGE:-v3_custom}
config=${CONFIG:-$root/configs/workshop.json}
dtype=${DTYPE:-bf16}
device=${DEVICE:-auto}
learning_rate=${LEARNING_RATE:-1e-3}
prompt=${PROMPT:-the quick brown }
lr_schedule=${LR_SCHEDULE:-constant}
lr_warmup_steps=${LR_WARMUP_STEPS:-0}
min_lr=${MIN_LR:-1e-4}
[ "$lr_schedule" = constant ] && min_lr=0  # the floor applies to the decaying schedules only
grad_accum=${GRAD_ACCUM:-1}
checkpoint_every=${CHECKPOINT_EVERY:-100}
say() { echo "[demo] $*" >&2; }

for app in "$stage" "$eval_stage" generate; do
  if [ ! -x "$build/$app" ]; then
    say "$build/$app is missing: building"
    TT_BUILD_DIR="$build" "$root/scripts/build.sh"
    break
  fi
done
mkdir -p "$out"

# A small English-like language: sentences drawn from a fixed grammar, with the pangram mixed in, so a
# few hundred steps are enough to see words, agreement and punctuation being learned. The generator is a
# Park-Miller LCG (products stay below 2^53, so every awk computes it exactly): a seed gives the same
# text on every machine. The held-out text comes from another seed: same language, unseen sentences.
make_text() {  # seed, sentences
  awk -v seed="$1" -v count="$2" '
    function next_int(n) { state = (state * 16807) % 2147483647; return int(state / 2147483647 * n) }
    function pick(list,    words, n) { n = split(list, words, "|"); return words[next_int(n) + 1] }
    BEGIN {
      state = seed
      subjects = "the cat|a small dog|the old man|my sister|the teacher|a tired farmer|the children|our neighbour|the queen|a young bird"
      plural = "the children"
      verbs = "sees|likes|follows|finds|paints|remembers|visits|watches|carries|forgets"
      plural_verbs = "see|like|follow|find|paint|remember|visit|watch|carry|forget"
      objects = "the red ball|a wooden boat|the river|an old letter|the green door|a quiet song|the morning train|a warm bowl of soup|the tall tree|a secret map"
      places = "in the garden|near the river|at the station|under the bridge|in the kitchen|on the hill|by the sea|in the old house"
      times = "every morning|at night|on sunday|in the spring|after the rain|before dinner"
      for (i = 0; i < count; i++) {
        if (next_int(10) == 0) { line = line "the quick brown fox jumps over the lazy dog. "; continue }
        subject = pick(subjects)
        verb = subject == plural ? pick(plural_verbs) : pick(verbs)
        sentence = subject " " verb " " pick(objects) " " pick(places)
        if (next_int(3) == 0) sentence = sentence " " pick(times)
        line = line sentence ". "
        if (i % 8 == 7) { print line; line = "" }
      }
      if (line != "") print line
    }'
}

train_text=${TRAIN_TEXT:-$out/train.txt}
eval_text=${EVAL_TEXT:-$out/eval.txt}
if [ -z "${TRAIN_TEXT:-}" ]; then make_text 12345 40000 > "$train_text"; fi
if [ -z "${EVAL_TEXT:-}" ]; then make_text 67890 2000 > "$eval_text"; fi
say "train text: $train_text ($(wc -c < "$train_text") bytes); held-out text: $eval_text ($(wc -c < "$eval_text") bytes)"

checkpoint=$out/model.pt
resume=()
if [ "${RESUME:-0}" = 1 ]; then
  newest=$(ls "$out"/checkpoints/step_*.pt 2>/dev/null | tail -1)
  [ -n "$newest" ] || { say "RESUME=1 but $out/checkpoints holds no checkpoint"; exit 2; }
  resume=(--resume "$newest")
  say "resuming from $newest"
elif ls "$out"/checkpoints/step_*.pt > /dev/null 2>&1; then
  # A new run never writes into a folder of checkpoints (docs/training.md): the previous demo run's are kept
  # aside, one generation deep, rather than written over.
  rm -rf "$out/checkpoints.previous"
  mv "$out/checkpoints" "$out/checkpoints.previous"
  say "a new run: the previous run's checkpoints moved to $out/checkpoints.previous (RESUME=1 continues that run)"
fi
say "training $stage for $steps steps ($dtype, lr $learning_rate $lr_schedule, ramp $lr_warmup_steps," \
  "accumulating $grad_accum micro-batches), held-out loss every $eval_every steps; Ctrl-C stops it cleanly"
# A stop on Ctrl-C exits non-zero after writing a checkpoint: set -e ends the demo there; RESUME=1 goes on.
"$build/$stage" --config "$config" --device "$device" --dtype "$dtype" --data "$train_text" \
  --num-steps "$steps" --warmup-steps 5 --learning-rate "$learning_rate" --grad-clip 1.0 --log-every 50 \
  --lr-schedule "$lr_schedule" --lr-warmup-steps "$lr_warmup_steps" --min-lr "$min_lr" \
  --grad-accum-steps "$grad_accum" \
  --checkpoint-dir "$out/checkpoints" --checkpoint-every "$checkpoint_every" --keep-checkpoints 3 "${resume[@]}" \
  --eval-data "$eval_text" --eval-every "$eval_every" \
  --save-checkpoint "$checkpoint" --output "$out/train.json" --overwrite

say "evaluating the checkpoint with $eval_stage (another stage's components, the same weights)"
"$build/$eval_stage" --config "$config" --device "$device" --dtype "$dtype" \
  --load-checkpoint "$checkpoint" --eval-only --eval-data "$eval_text" --output "$out/eval.json" --overwrite

say "greedy continuation of '$prompt' (KV cache), then the same by full recomputation: equal in fp32 (a" \
  "difference fails the demo); in bf16 rounding may flip a near tie, which is reported, not failed"
greedy=$("$build/generate" --checkpoint "$checkpoint" --prompt "$prompt" --max-new-tokens 120 --device "$device" --dtype "$dtype")
printf '%s%s\n' "$prompt" "$greedy"
recomputed=$("$build/generate" --checkpoint "$checkpoint" --prompt "$prompt" --max-new-tokens 120 --device "$device" \
  --dtype "$dtype" --no-kv-cache 2>/dev/null)
if [ "$greedy" = "$recomputed" ]; then say "KV cache and full recomputation agree"; else
  printf '%s%s\n' "$prompt" "$recomputed"
  if [ "$dtype" = fp32 ]; then
    say "error: in fp32 the KV cache and full recomputation must give the same greedy text, and they differ"
    exit 1
  fi
  say "KV cache and full recomputation differ in bf16 (rounding flipped a near tie; DTYPE=fp32 must match)"
fi

say "sampled continuation (temperature 0.8, top-k 20, seed 1)"
sampled=$("$build/generate" --checkpoint "$checkpoint" --prompt "$prompt" --max-new-tokens 200 --device "$device" \
  --dtype "$dtype" --temperature 0.8 --top-k 20 --seed 1)
printf '%s%s\n' "$prompt" "$sampled"
say "results: $out/train.json (evaluation.curve), $out/eval.json, checkpoint $checkpoint"
