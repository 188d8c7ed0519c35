#!/usr/bin/env bash
# trainer.mp p=f32,c=bfloat16 through the real program: train_lm says once what the policy does on this machine.
# Where bfloat16 GEMMs run (oneDNN and a CPU with AVX512_BF16 or AMX-BF16: the note says "run in bfloat16"), the
# losses differ from mp: f32's by less than 2% each, and a second bfloat16 run gives bitwise the same losses.
# Elsewhere the run computes in f32 and its losses are bitwise those of mp: f32.
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
if grep -q "matrix products run in bfloat16" bf16.out; then
  computes=bf16
else
  computes=f32
  grep -q "computes in f32" bf16.out || fail "the note says neither bfloat16 products nor f32"
  if ! grep -q "avx512_bf16\|amx_bf16" /proc/cpuinfo 2> /dev/null; then
    grep -q "this CPU has no bfloat16 instructions" bf16.out || fail "the note does not say this CPU lacks bfloat16"
  fi
fi
if grep -q "trainer.mp" f32.out; then fail "mp: f32 printed a precision note"; fi

# Every logged train and eval loss, at full precision, in order.
losses() { grep '"event":"log"' "$1" | grep -o '"\(train\|eval\)/loss":[^,}]*'; }
losses logs/f32/metrics.jsonl > f32.losses
losses logs/bf16/metrics.jsonl > bf16.losses
[ "$(grep -c train/loss f32.losses)" -ge 6 ] || { cat f32.losses; fail "expected 6 logged train losses"; }
grep -q eval/loss f32.losses || fail "no eval loss logged"
if [ "$computes" = f32 ]; then
  cmp f32.losses bf16.losses || { diff f32.losses bf16.losses | head; fail "the bfloat16 policy's losses differ from f32"; }
  echo "OK: $(wc -l < f32.losses) losses bitwise equal under p=f32,c=bfloat16 and f32"
  exit 0
fi
# bfloat16 products: not f32's bits, within 2% of them, and reproducible.
if cmp -s f32.losses bf16.losses; then fail "bfloat16 products were announced but the losses are bitwise f32's"; fi
paste -d' ' f32.losses bf16.losses | awk '{
  split($1, a, ":"); split($2, b, ":");
  if (a[1] != b[1]) { print "different metrics: " $0; bad = 1; next }
  r = (b[2] - a[2]) / a[2]; if (r < 0) r = -r;
  if (r > worst) worst = r;
  if (r > 0.02) { print "more than 2% apart: " $0; bad = 1 }
} END { printf "largest relative difference from f32: %.5f\n", worst; exit bad }' || fail "bfloat16 losses too far from f32"
run bf16_again p=f32,c=bfloat16
losses logs/bf16_again/metrics.jsonl > bf16_again.losses
cmp bf16.losses bf16_again.losses || { diff bf16.losses bf16_again.losses | head; fail "two bfloat16 runs differ"; }
echo "OK: $(wc -l < f32.losses) losses under p=f32,c=bfloat16 within 2% of f32's, bitwise equal over two runs"
