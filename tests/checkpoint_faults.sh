#!/usr/bin/env bash
# Faults around checkpoints, through the real programs:
#  1. a full disk (a small tmpfs when this user may mount one) and a file-size limit (`ulimit -f`, always) at many
#     sizes while train_lm writes checkpoints and logs: it must end with exit code 5 and a message naming the file,
#     never a signal, leave no unfinished write behind, and the newest committed checkpoint must still load;
#  2. SIGKILL at random moments of a run that checkpoints every step, several times over: every restart resumes from
#     the newest checkpoint without skipping a damaged one, and the last one finishes;
#  3. two processes with one run id: the second is refused, naming the first one's pid, for the run directory and
#     for the checkpoint directory; a restart after the holder died is not;
#  4. export_lm_to_hf and import_hf_to_lm under file-size limits: exit code 5 naming the file, never a signal.
# Usage: checkpoint_faults.sh TRAIN_LM EVAL_LM EXPORT_LM_TO_HF IMPORT_HF_TO_LM GOLDEN_DIR WORK_DIR
set -uo pipefail
train_lm=$(realpath "$1")
eval_lm=$(realpath "$2")
export_prog=$(realpath "$3")
import_prog=$(realpath "$4")
golden=$(realpath "$5")
work=$6
rm -rf "$work"
mkdir -p "$work"
cd "$work" || exit 1
work=$(pwd)

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
mounted=""
cleanup() { [ -n "$mounted" ] && umount "$mounted" 2> /dev/null; }
trap cleanup EXIT

# exit code of the last run; 128+N is death by signal N
check_no_signal() {  # check_no_signal CODE OUTPUT WHAT
  [ "$1" -lt 128 ] || { tail -5 "$2"; fail "$3: killed by signal $(($1 - 128))"; }
}

# The newest committed checkpoint under $1 must pass every check eval_lm makes (sizes, checksums, HDF5, shapes),
# with nothing skipped; no hidden unfinished write may be left.
check_committed() {  # check_committed CKPT_DIR WHAT
  local left
  left=$(find "$1" -maxdepth 1 -name '.step-*' | head -1)
  [ -z "$left" ] || fail "$2: an unfinished write was left behind: $left"
  ls "$1"/step-*/metadata.json > /dev/null 2>&1 || return 0  # nothing committed yet is fine
  "$eval_lm" --checkpoint_path "$1" --trainer.log_dir "$work/eval-logs" --trainer.max_eval_batches 1 \
    > "$work/eval.out" 2>&1 || { tail -5 "$work/eval.out"; fail "$2: the newest committed checkpoint does not load"; }
  if grep -E "skipping|trying an older one" "$work/eval.out"; then fail "$2: a committed checkpoint was damaged"; fi
}

common=(--trainer.steps_per_eval 1000 --trainer.checkpointer.keep '[{every: 2}]')

# A committed checkpoint at step 4 that every disk-full case resumes from.
"$train_lm" "${common[@]}" --trainer.num_train_steps 4 --trainer.id df --trainer.log_dir "$work/seed-logs" \
  --trainer.checkpointer.base_path "$work/seed" > seed.out 2>&1 || { cat seed.out; fail "the seed run failed"; }
[ -f seed/df/step-4/metadata.json ] || fail "the seed run left no step-4"
ckpt_kb=$(($(du -sk seed/df/step-4 | cut -f1) + 64))
echo "seed checkpoint: ${ckpt_kb} KiB per step"

# 1a. A full disk: a tmpfs too small for the checkpoints (and then the logs) of the next steps.
cases=0
if mkdir -p tfs && mount -t tmpfs -o size=64m tmpfs tfs 2> /dev/null; then
  mounted=$work/tfs
  umount tfs
  for extra_kb in 16 200 600 900 1300 1700 2100 2600 3400; do
    size=$((ckpt_kb + extra_kb))
    mount -t tmpfs -o size=${size}k tmpfs tfs || fail "cannot mount a ${size} KiB tmpfs"
    mkdir -p tfs/df && cp -r seed/df/step-4 tfs/df/ || fail "cannot copy the seed checkpoint"
    out=$work/full-$extra_kb.out
    "$train_lm" "${common[@]}" --trainer.num_train_steps 10 --trainer.id df --trainer.log_dir "$work/full-logs" \
      --trainer.checkpointer.base_path "$work/tfs" > "$out" 2>&1
    code=$?
    check_no_signal $code "$out" "disk full with ${extra_kb} KiB free"
    if [ $code -ne 0 ]; then
      [ $code -eq 5 ] || { tail -3 "$out"; fail "disk full with ${extra_kb} KiB free: exit code $code, expected 5"; }
      grep -E "(No space left on device|disk full).*|'$work/tfs/[^']*'" "$out" | grep -q "$work/tfs" ||
        { tail -3 "$out"; fail "disk full with ${extra_kb} KiB free: the message does not name the file"; }
    fi
    check_committed tfs/df "disk full with ${extra_kb} KiB free (exit $code)"
    echo "disk full, ${extra_kb} KiB free: exit $code, committed: $(ls tfs/df | tr '\n' ' ')"
    umount tfs
    cases=$((cases + 1))
  done
  # Logs on a full disk: the run directory itself cannot be written.
  mount -t tmpfs -o size=8k tmpfs tfs || fail "cannot mount a small tmpfs"
  "$train_lm" "${common[@]}" --trainer.num_train_steps 4 --trainer.id dl --trainer.log_dir "$work/tfs/logs" \
    --trainer.checkpointer.base_path "$work/dl-ckpt" > logs-full.out 2>&1
  code=$?
  check_no_signal $code logs-full.out "logs on a full disk"
  [ $code -eq 5 ] || { tail -3 logs-full.out; fail "logs on a full disk: exit code $code, expected 5 (a write failure)"; }
  grep -q "$work/tfs/logs" logs-full.out || { tail -3 logs-full.out; fail "logs on a full disk: no file named"; }
  umount tfs
  mounted=""
else
  echo "note: cannot mount a tmpfs here (not root?); the full-disk cases run with ulimit -f only"
fi

# 1b. A file-size limit: the same failures through EFBIG (SIGXFSZ is ignored by the programs).
for limit_kb in 40 200 400 700 1000 4000; do
  rm -rf lim && cp -r seed lim
  out=$work/ulimit-$limit_kb.out
  (ulimit -f "$limit_kb" && exec "$train_lm" "${common[@]}" --trainer.num_train_steps 10 --trainer.id df \
    --trainer.log_dir "$work/lim-logs" --trainer.checkpointer.base_path "$work/lim") > "$out" 2>&1
  code=$?
  check_no_signal $code "$out" "ulimit -f $limit_kb"
  if [ $code -ne 0 ]; then
    [ $code -eq 5 ] || { tail -3 "$out"; fail "ulimit -f $limit_kb: exit code $code, expected 5"; }
    grep -q "'$work/lim/" "$out" || { tail -3 "$out"; fail "ulimit -f $limit_kb: the message does not name the file"; }
  fi
  check_committed lim/df "ulimit -f $limit_kb (exit $code)"
  echo "ulimit -f ${limit_kb} KiB: exit $code, committed: $(ls lim/df | tr '\n' ' ')"
  cases=$((cases + 1))
done

# 2. SIGKILL at random moments; checkpoints every step; each restart resumes from the newest one.
kr=(--trainer.steps_per_eval 1000 --trainer.checkpointer.keep '[{every: 1}]' --trainer.num_train_steps 30
    --trainer.id kill --trainer.log_dir "$work/kill-logs" --trainer.checkpointer.base_path "$work/kill")
kills=0
for round in 1 2 3 4 5 6; do
  "$train_lm" "${kr[@]}" > "kill-$round.out" 2>&1 &
  pid=$!
  # wait for a first checkpoint of this round, then kill at a random moment after it
  for _ in $(seq 1 600); do
    grep -q "committed" "kill-$round.out" && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.02
  done
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  kill -9 $pid 2> /dev/null && kills=$((kills + 1))
  wait $pid 2> /dev/null
  if grep -E "skipping|cannot load|trying an older one" "kill-$round.out"; then
    fail "round $round: a restart met a damaged checkpoint"
  fi
  [ "$round" -eq 1 ] || grep -q "resumed from" "kill-$round.out" || { tail -5 "kill-$round.out"; fail "round $round did not resume"; }
done
"$train_lm" "${kr[@]}" > kill-final.out 2>&1 || { tail -5 kill-final.out; fail "the run after $kills kills failed"; }
grep -q "resumed from" kill-final.out || fail "the final run did not resume"
if grep -E "skipping|cannot load" kill-final.out; then fail "the final run met a damaged checkpoint"; fi
[ -f kill/kill/step-30/metadata.json ] || fail "no step-30 after the final run"
check_committed kill/kill "after $kills kills"
echo "SIGKILL: $kills kills at random moments, every restart resumed from the newest checkpoint"

# 3. One writer per run.
long=(--trainer.steps_per_eval 1000 --trainer.num_train_steps 100000 --trainer.id lock)
"$train_lm" "${long[@]}" --trainer.log_dir "$work/lock-logs" --trainer.checkpointer.base_path "$work/lock" \
  > lock-a.out 2>&1 &
holder=$!
for _ in $(seq 1 600); do
  grep -q "step 1/" lock-a.out && break
  sleep 0.05
done
grep -q "step 1/" lock-a.out || { kill -9 $holder; cat lock-a.out; fail "the first run did not start"; }
"$train_lm" "${long[@]}" --trainer.log_dir "$work/lock-logs" --trainer.checkpointer.base_path "$work/lock" \
  > lock-b.out 2>&1
code=$?
[ $code -eq 2 ] || { kill -9 $holder; cat lock-b.out; fail "a second run with the same id: exit $code, expected 2"; }
grep -q "in use by another process (pid $holder on" lock-b.out ||
  { kill -9 $holder; cat lock-b.out; fail "the refusal does not name the holder's pid $holder"; }
"$train_lm" "${long[@]}" --trainer.log_dir "$work/lock-logs-2" --trainer.checkpointer.base_path "$work/lock" \
  > lock-c.out 2>&1
code=$?
[ $code -eq 5 ] || { kill -9 $holder; cat lock-c.out; fail "a second writer of the checkpoint directory: exit $code"; }
grep -q "checkpoint directory '$work/lock/lock' is in use by another process (pid $holder" lock-c.out ||
  { kill -9 $holder; cat lock-c.out; fail "the checkpoint-directory refusal does not name the holder"; }
kill -9 $holder
wait $holder 2> /dev/null
"$train_lm" --trainer.steps_per_eval 1000 --trainer.num_train_steps 2 --trainer.id lock \
  --trainer.log_dir "$work/lock-logs" --trainer.checkpointer.base_path "$work/lock" > lock-d.out 2>&1 ||
  { cat lock-d.out; fail "a restart after the holder was killed was refused"; }
# 4. The conversion programs on a file-size limit.
for limit_kb in 1 30 100; do
  (ulimit -f "$limit_kb" && exec "$export_prog" --checkpoint_path seed/df --output_dir "$work/exp-$limit_kb") \
    > "export-$limit_kb.out" 2>&1
  code=$?
  check_no_signal $code "export-$limit_kb.out" "export_lm_to_hf, ulimit -f $limit_kb"
  [ $code -eq 5 ] || { tail -3 "export-$limit_kb.out"; fail "export_lm_to_hf, ulimit -f $limit_kb: exit $code"; }
  grep -q "$work/exp-$limit_kb" "export-$limit_kb.out" || { tail -3 "export-$limit_kb.out"; fail "export: no file named"; }
  (ulimit -f "$limit_kb" && exec "$import_prog" --hf_checkpoint "$golden/hf_gpt2_tiny" --output_path "$work/imp-$limit_kb") \
    > "import-$limit_kb.out" 2>&1
  code=$?
  check_no_signal $code "import-$limit_kb.out" "import_hf_to_lm, ulimit -f $limit_kb"
  [ $code -eq 5 ] || { tail -3 "import-$limit_kb.out"; fail "import_hf_to_lm, ulimit -f $limit_kb: exit $code"; }
  grep -q "imp-$limit_kb" "import-$limit_kb.out" || { tail -3 "import-$limit_kb.out"; fail "import: no file named"; }
  [ ! -e "$work/imp-$limit_kb/metadata.json" ] || fail "import_hf_to_lm, ulimit -f $limit_kb: a checkpoint was committed"
  cases=$((cases + 2))
done
echo "OK: $cases full-disk / file-size cases, $kills kills, two-writer refusals"
