#!/usr/bin/env bash
# Preemption test through the real program: train_lm run straight through, and the same run killed with SIGKILL
# at a varying point (after its first permanent checkpoint, possibly in the middle of writing a temporary one)
# and started again, must give byte-identical loss logs and byte-identical final parameters and optimizer state.
# Usage: train_lm_kill_resume.sh TRAIN_LM WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1")
work=$2
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

common=(--trainer.num_train_steps 40 --trainer.steps_per_eval 1000 --trainer.id kr
        --trainer.checkpointer.save_interval 1s --trainer.checkpointer.keep '[{every: 10}]')
run() {  # run NAME: the output directories of a run are under NAME/
  "$train_lm" "${common[@]}" --trainer.log_dir "$1/logs" --trainer.checkpointer.base_path "$1/ckpt"
}
# The same in the background: exec, so that $! is train_lm itself and the SIGKILL reaches it (killing a subshell
# would leave train_lm running, and the restart would be refused as a second writer of the run).
run_in_background() {
  exec "$train_lm" "${common[@]}" --trainer.log_dir "$1/logs" --trainer.checkpointer.base_path "$1/ckpt"
}

run whole > whole.out 2>&1 || { cat whole.out; fail "the uninterrupted run failed"; }

run_in_background split > split1.out 2>&1 &
pid=$!
for _ in $(seq 1 1200); do
  [ -f split/ckpt/kr/step-10/metadata.json ] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.05
done
[ -f split/ckpt/kr/step-10/metadata.json ] || { cat split1.out; fail "no checkpoint at step 10"; }
delay=$((RANDOM % 2)).$((RANDOM % 10))$((RANDOM % 10))
sleep "$delay"
kill -9 "$pid"
wait "$pid" 2> /dev/null && fail "train_lm finished before it could be killed (make the run longer)"
[ -f split/logs/kr/summary.json ] && fail "the killed run wrote its summary"
echo "killed after step-10 + ${delay}s; checkpoints left: $(ls -A split/ckpt/kr | tr '\n' ' ')"

run split > split2.out 2>&1 || { cat split2.out; fail "the resumed run failed"; }
grep "resumed from" split2.out || fail "the second run did not resume"

# train/loss per step (the last record of each step: a resumed run logs the steps after its checkpoint again).
losses() {
  grep '"event":"log"' "$1" | grep '"train/loss"' | sed -E 's/.*"step":([0-9]+).*/\1/' > "$1.steps"
  grep '"event":"log"' "$1" | grep '"train/loss"' | sed -E 's/.*"train\/loss":([^,}]*).*/\1/' > "$1.values"
  paste -d' ' "$1.steps" "$1.values" | awk '{ last[$1] = $2 } END { for (s in last) print s, last[s] }' | sort -n
}
losses whole/logs/kr/metrics.jsonl > whole.losses
losses split/logs/kr/metrics.jsonl > split.losses
[ "$(wc -l < whole.losses)" -eq 40 ] || fail "expected 40 logged steps, got $(wc -l < whole.losses)"
cmp whole.losses split.losses || { diff whole.losses split.losses | head; fail "the loss logs differ"; }
for f in model.h5 opt_state.h5 training_state.h5; do
  cmp "whole/ckpt/kr/step-40/$f" "split/ckpt/kr/step-40/$f" || fail "step-40/$f differs"
done
echo "OK: 40 losses and the final model, optimizer and training state are byte-identical after SIGKILL and resume"
