#!/usr/bin/env bash
# sample_lm end to end: train_lm trains the embedded default for 2 steps, sample_lm continues prompts from its
# checkpoint (model and byte tokenizer from the checkpoint's config.yaml): greedy and sampled runs print every
# continuation, a rerun prints the same text, and the errors users make exit with their codes.
# Usage: sample_program.sh TRAIN_LM SAMPLE_LM WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1") sample_lm=$(realpath "$2") work=$3
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

"$train_lm" --trainer.num_train_steps 2 --trainer.steps_per_eval 1000 --trainer.id two --trainer.log_dir logs \
  --trainer.checkpointer.base_path ckpt > train.out 2>&1 || { cat train.out; fail "train_lm failed"; }

run() { "$sample_lm" --checkpoint_path ckpt/two --prompts '["Q: What is", "The cat"]' --max_new_tokens 12 \
  --n_rounds 1 "$@"; }
run --temperature 0 > greedy.out 2>&1 || { cat greedy.out; fail "sample_lm (greedy) failed"; }
grep -q "Prompt 1: The cat (7 tokens)" greedy.out || { cat greedy.out; fail "the prompts were not tokenized as bytes"; }
[ "$(grep -c '^Generation [01]\.0 (round 0, ' greedy.out)" = 2 ] || { cat greedy.out; fail "not one continuation per prompt"; }
run --temperature 1 --seed 5 --n_generations 2 > a.out 2>&1 || { cat a.out; fail "sample_lm (sampled) failed"; }
run --temperature 1 --seed 5 --n_generations 2 > b.out 2>&1 || { cat b.out; fail "sample_lm (sampled) failed"; }
[ "$(grep -c '^Generation' a.out)" = 4 ] || { cat a.out; fail "not two continuations per prompt"; }
diff <(grep '^Generation' a.out) <(grep '^Generation' b.out) || fail "the same seed gave different text"
grep -q '^Round 0 took' a.out || fail "no round timing"

expect_fail 2 "give checkpoint_path .* or hf_checkpoint" "$sample_lm"
expect_fail 2 "both set" "$sample_lm" --checkpoint_path ckpt/two --hf_checkpoint ckpt/two
expect_fail 5 "no complete checkpoint|checkpoint_path" "$sample_lm" --checkpoint_path no/such/run
expect_fail 2 "temperature must be at least 0" run --temperature -1
echo "sample_lm: ok"
