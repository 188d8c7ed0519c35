#!/usr/bin/env bash
# eval_lm end to end: train_lm trains the embedded default for 2 steps, eval_lm evaluates its checkpoint (model,
# data and evaluation batches from the checkpoint's config.yaml) and must print `Loss: <x>` with x train_lm's
# final eval loss, log it at step 0 and write its report; then the exit codes of the errors users make.
# Usage: eval_program.sh TRAIN_LM EVAL_LM WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1") eval_lm=$(realpath "$2") work=$3
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

"$train_lm" --trainer.num_train_steps 2 --trainer.steps_per_eval 1000 --trainer.id two --trainer.log_dir logs \
  --trainer.checkpointer.base_path ckpt > train.out 2>&1 || { cat train.out; fail "train_lm failed"; }
[ -f ckpt/two/step-2/metadata.json ] || fail "train_lm wrote no checkpoint"
trained=$(sed -n 's/.*"eval_loss": *\([-0-9.eE+]*\).*/\1/p' logs/two/summary.json)
[ -n "$trained" ] || fail "logs/two/summary.json has no eval_loss"

"$eval_lm" --checkpoint_path ckpt/two --trainer.id eval --trainer.log_dir logs --output_path results.json \
  > eval.out 2>&1 || { cat eval.out; fail "eval_lm failed"; }
loss=$(sed -n 's/^Loss: //p' eval.out)
[ -n "$loss" ] || { cat eval.out; fail "eval_lm printed no 'Loss: '"; }
awk -v a="$loss" -v b="$trained" 'BEGIN {
  d = a - b; if (d < 0) d = -d
  printf "eval_lm loss %s, train_lm eval loss %s\n", a, b
  exit d <= 1e-6 ? 0 : 1
}' || fail "eval_lm's loss is not train_lm's final eval loss"
grep -q '"eval/loss"' results.json || fail "results.json has no eval/loss"
grep -q '"step": 2' results.json || fail "results.json does not name the checkpoint's step"
grep -q '"event": *"log".*"step": *0' logs/eval/metrics.jsonl || fail "the tracker got no record at step 0"
[ -f logs/eval/eval_lm.log ] || fail "no eval_lm.log in the run directory"

expect_fail 2 "no model given" "$eval_lm" --trainer.log_dir logs
expect_fail 2 "checkpoint_path and hf_checkpoint are both set" "$eval_lm" --checkpoint_path ckpt/two \
  --hf_checkpoint ckpt/two --trainer.log_dir logs
expect_fail 5 "no complete checkpoint under 'nowhere'" "$eval_lm" --checkpoint_path nowhere --trainer.log_dir logs
expect_fail 5 "hf_checkpoint: 'nowhere' is not a local directory" "$eval_lm" --hf_checkpoint nowhere \
  --trainer.log_dir logs
expect_fail 2 "data.validation_urls is empty" "$eval_lm" --checkpoint_path ckpt/two --data.validation_urls '[]' \
  --trainer.log_dir logs
"$eval_lm" --help | grep -- "--log_entropy" > /dev/null || fail "--help does not list log_entropy"
"$eval_lm" --checkpoint_path ckpt/two --log_entropy true --dry_run 2> /dev/null | grep "log_entropy: true" > /dev/null ||
  fail "--dry_run does not print the resolved config"
echo "OK: train_lm -> eval_lm reports train_lm's eval loss ($loss), report and tracker written, errors exit 2 / 5"
