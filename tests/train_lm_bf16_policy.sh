#!/usr/bin/env bash
# trainer.mp p=f32,c=bfloat16 through the real program: train_lm says once what the policy does on this machine
# (no bfloat16 compute yet: on a CPU without AVX512_BF16 or AMX-BF16 that is the expected behaviour), and its
# losses are bitwise those of the same run under mp: f32.
# Usage: train_lm_bf16_policy.sh TRAIN_LM WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1")
work=$2
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

common=(--model.hidden_dim 32 --model.num_heads 2 --model.num_layers 2 --model.seq_len 64
        --trainer.train_batch_size 8 --trainer.num_train_steps 6 --trainer.steps_per_eval 3)
run() {  # run NAME POLICY
  "$train_lm" "${common[@]}" --trainer.mp "$2" --trainer.id "$1" --trainer.log_dir logs \
    --trainer.checkpointer.base_path ckpt > "$1.out" 2>&1 || { cat "$1.out"; fail "the $2 run failed"; }
}
run f32 f32
run bf16 p=f32,c=bfloat16

notes=$(grep -c "trainer.mp" bf16.out || true)
[ "$notes" -eq 1 ] || { cat bf16.out; fail "expected the trainer.mp note once, found it $notes times"; }
grep "trainer.mp" bf16.out
grep -q "computes in f32" bf16.out || fail "the note does not say the run computes in f32"
if ! grep -q "avx512_bf16\|amx_bf16" /proc/cpuinfo 2> /dev/null; then
  grep -q "this CPU has no bfloat16 instructions" bf16.out || fail "the note does not say this CPU lacks bfloat16"
fi
if grep -q "trainer.mp" f32.out; then fail "mp: f32 printed a precision note"; fi

# Every logged train and eval loss, at full precision, in order.
losses() { grep '"event":"log"' "$1" | grep -o '"\(train\|eval\)/loss":[^,}]*'; }
losses logs/f32/metrics.jsonl > f32.losses
losses logs/bf16/metrics.jsonl > bf16.losses
[ "$(grep -c train/loss f32.losses)" -ge 6 ] || { cat f32.losses; fail "expected 6 logged train losses"; }
grep -q eval/loss f32.losses || fail "no eval loss logged"
cmp f32.losses bf16.losses || { diff f32.losses bf16.losses | head; fail "the bfloat16 policy's losses differ from f32"; }
echo "OK: $(wc -l < f32.losses) losses bitwise equal under p=f32,c=bfloat16 and f32"
