#!/usr/bin/env bash
# lora_lm end to end on the tiny Hugging Face goldens: the adapters train (the loss falls), checkpoints hold only
# the adapters, a run stopped at step 10 and resumed equals one run straight through bit for bit (losses and the
# PEFT file), with and without dropout on the adapters, GPT-2's Conv1D layers train and export, data parallel and FSDP on 2 ranks equal one process bit for
# bit, upstream's LoRA configs resolve with local data or are refused naming the key, and users' mistakes are
# refused with their key. With a Python that has torch, transformers and peft, tests/oracle/check_lora_peft.py loads
# the PEFT exports with peft on the base model (logits within 1e-4 of the merged export, which is base + B.A*alpha/r).
# Usage: lora_program.sh LORA_LM GOLDEN_DIR UPSTREAM_CONFIG_DIR WORK_DIR [MPIEXEC|-] [PYTHON|-]
set -euo pipefail
lora_lm=$(realpath "$1") golden=$(realpath "$2") upstream=$(realpath "$3") work=$4 mpiexec=${5:--} python=${6:--}
oracle=$(realpath "$(dirname "${BASH_SOURCE[0]}")/oracle/check_lora_peft.py")
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

# Token ids below the smallest vocabulary (64), as passthrough text.
printf '{"text": "%s"}\n' "$(for i in $(seq 0 400); do printf '%d ' $(((5 * i + i / 7) % 60)); done)" > train_ids.jsonl
for d in 0 1 2 3 4; do
  printf '{"text": "%s"}\n' "$(for i in $(seq 0 39); do printf '%d ' $(((7 * d + 3 * i) % 60)); done)"
done > ids.jsonl
cat > lora.yaml <<EOF
initialize_from_hf: $golden/hf_llama/llama_mha
max_train_length: 32
lora:
  r: 4
  alpha: 8.0
data:
  tokenizer: passthrough
  vocab_size: 64
  train_urls: ["train_ids.jsonl"]
  validation_urls: ["ids.jsonl"]
  cache_dir: cache
trainer:
  train_batch_size: 4
  per_device_parallelism: 2
  num_train_steps: 20
  steps_per_eval: 10
  log_dir: logs
  checkpointer:
    base_path: ckpt
    keep: [{every: 10}]
optimizer:
  learning_rate: 1e-2
  weight_decay: 0.01
peft_save_path: peft
merged_hf_save_path: merged
hf_save_steps: 10
EOF
summary() { tr -d ' \n' < "logs/$1/summary.json" | grep -o "\"$2\":[^,}]*" | cut -d: -f2; }

# One run straight through.
"$lora_lm" lora.yaml --trainer.id a > a.out 2>&1 || { cat a.out; fail "lora_lm failed"; }
grep -q "LoRA r=4 .* on 8 Linear modules: 4160 trainable parameters" a.out ||
  { cat a.out; fail "lora_lm did not report the adapters (8 modules, 4160 parameters)"; }
first=$(summary a first_loss) final=$(summary a final_loss)
awk -v f="$first" -v l="$final" 'BEGIN { exit !(l < f - 1.0) }' || fail "the loss did not fall: $first -> $final"
for s in 10 19; do
  [ -f "peft/a/step-$s/adapter_model.safetensors" ] && [ -f "peft/a/step-$s/adapter_config.json" ] ||
    fail "no PEFT export at step $s"
  [ -f "merged/a/step-$s/model.safetensors" ] && [ -f "merged/a/step-$s/config.json" ] || fail "no merged export at step $s"
done
if command -v h5ls > /dev/null; then
  h5ls -r ckpt/a/step-20/model.h5 > leaves.txt
  grep -q "/adapters/7/lora_B" leaves.txt || { cat leaves.txt; fail "the checkpoint lacks the adapters"; }
  ! grep -Eq "transformer|embeddings|lm_head" leaves.txt || { cat leaves.txt; fail "the checkpoint holds the frozen model"; }
fi

# Interrupted after step 10 (a copy of that checkpoint is all run b has), resumed to 20: the same as straight
# through, bit for bit.
[ -f ckpt/a/step-10/metadata.json ] || fail "no permanent checkpoint at step 10 (checkpointer.keep every 10)"
mkdir -p ckpt/b && cp -r ckpt/a/step-10 ckpt/b/
"$lora_lm" lora.yaml --trainer.id b > b.out 2>&1 || { cat b.out; fail "lora_lm (resumed) failed"; }
grep -q "resumed from .*ckpt/b/step-10 at step 10" b.out || { cat b.out; fail "the second run did not resume at step 10"; }
[ "$(summary b final_loss)" = "$final" ] || fail "resumed final loss $(summary b final_loss) != straight-through $final"
cmp peft/a/step-19/adapter_model.safetensors peft/b/step-19/adapter_model.safetensors ||
  fail "the resumed run's adapters differ from the straight-through run's"

# Dropout on the adapters' input (upstream's LoraLinear), through the layers gradient checkpointing recomputes: the
# loss falls, training differs from the run without dropout, and a run resumed at step 10 equals it bit for bit.
"$lora_lm" lora.yaml --trainer.id d --lora.dropout 0.1 > d.out 2>&1 || { cat d.out; fail "lora_lm with dropout failed"; }
dfinal=$(summary d final_loss)
grep -q "lora.dropout 0.1 acts on 7 of 8 adapters; not on lm_head" d.out ||
  { cat d.out; fail "lora_lm did not say which adapters the dropout reaches (all but the LM head)"; }
awk -v f="$(summary d first_loss)" -v l="$dfinal" 'BEGIN { exit !(l < f - 1.0) }' ||
  fail "with dropout the loss did not fall: $(summary d first_loss) -> $dfinal"
[ "$dfinal" != "$final" ] || fail "lora.dropout 0.1 trained exactly as without dropout ($final)"
grep -q '"lora_dropout": 0.1' peft/d/step-19/adapter_config.json || fail "the PEFT config lacks lora_dropout 0.1"
mkdir -p ckpt/d2 && cp -r ckpt/d/step-10 ckpt/d2/
"$lora_lm" lora.yaml --trainer.id d2 --lora.dropout 0.1 > d2.out 2>&1 || { cat d2.out; fail "lora_lm with dropout (resumed) failed"; }
grep -q "resumed from .*ckpt/d2/step-10 at step 10" d2.out || { cat d2.out; fail "the dropout run did not resume at step 10"; }
[ "$(summary d2 final_loss)" = "$dfinal" ] || fail "with dropout, resumed final loss $(summary d2 final_loss) != $dfinal"
cmp peft/d/step-19/adapter_model.safetensors peft/d2/step-19/adapter_model.safetensors ||
  fail "with dropout, the resumed run's adapters differ from the straight-through run's"

# GPT-2 (Conv1D weights {in, out}: PEFT's fan_in_fan_out).
vocab=$(tr -d ' \n' < "$golden/hf_gpt2_tiny/config.json" | grep -o '"vocab_size":[0-9]*' | cut -d: -f2)
"$lora_lm" lora.yaml --trainer.id g --initialize_from_hf "$golden/hf_gpt2_tiny" --max_train_length 16 \
  --data.vocab_size "$vocab" --data.cache_dir cache16 --lora.target_modules '[c_attn, mlp.c_proj]' > g.out 2>&1 ||
  { cat g.out; fail "lora_lm on GPT-2 failed"; }
grep -q '"fan_in_fan_out": true' peft/g/step-19/adapter_config.json || fail "GPT-2's PEFT config lacks fan_in_fan_out"
awk -v f="$(summary g first_loss)" -v l="$(summary g final_loss)" 'BEGIN { exit !(l < f) }' || fail "GPT-2's loss did not fall"

# Data parallel (ZeRO-1) and FSDP on 2 ranks equal one process.
if [ "$mpiexec" != - ] && command -v "$mpiexec" > /dev/null; then
  mpi=("$mpiexec" --oversubscribe --allow-run-as-root -n 2)
  HALIAX_NUM_THREADS=1 "${mpi[@]}" "$lora_lm" lora.yaml --trainer.id f2 > f2.out 2>&1 || { cat f2.out; fail "lora_lm with FSDP on 2 ranks failed"; }
  grep -q "FSDP" f2.out || { cat f2.out; fail "the 2-rank run did not shard the adapters (FSDP)"; }
  HALIAX_NUM_THREADS=1 "${mpi[@]}" "$lora_lm" lora.yaml --trainer.id z2 --trainer.shard_parameters false > z2.out 2>&1 ||
    { cat z2.out; fail "lora_lm with ZeRO-1 on 2 ranks failed"; }
  HALIAX_NUM_THREADS=1 "${mpi[@]}" "$lora_lm" lora.yaml --trainer.id fd2 --lora.dropout 0.1 > fd2.out 2>&1 ||
    { cat fd2.out; fail "lora_lm with dropout and FSDP on 2 ranks failed"; }
  for r in f2 z2; do
    [ "$(summary $r final_loss)" = "$final" ] || fail "$r: final loss $(summary $r final_loss) != one process's $final"
    cmp peft/a/step-19/adapter_model.safetensors peft/$r/step-19/adapter_model.safetensors ||
      fail "$r: the adapters differ from one process's"
  done
  # every micro-batch draws its masks from its index in the global batch, whichever rank computes it
  [ "$(summary fd2 final_loss)" = "$dfinal" ] || fail "fd2: final loss $(summary fd2 final_loss) != one process's $dfinal"
  cmp peft/d/step-19/adapter_model.safetensors peft/fd2/step-19/adapter_model.safetensors ||
    fail "fd2: with dropout, the adapters differ from one process's"
  echo "lora_lm: 2 ranks (FSDP, ZeRO-1, FSDP with dropout) equal one process bit for bit"
fi

# The real peft on the exports.
if [ "$python" != - ]; then
  "$python" "$oracle" "$golden/hf_llama/llama_mha" peft/a/step-19 merged/a/step-19 > peft_llama.out 2>&1 ||
    { cat peft_llama.out; fail "peft check (Llama) failed"; }
  "$python" "$oracle" "$golden/hf_gpt2_tiny" peft/g/step-19 merged/g/step-19 > peft_gpt2.out 2>&1 ||
    { cat peft_gpt2.out; fail "peft check (GPT-2) failed"; }
  "$python" "$oracle" "$golden/hf_llama/llama_mha" peft/d/step-19 merged/d/step-19 > peft_dropout.out 2>&1 ||
    { cat peft_dropout.out; fail "peft check (Llama trained with dropout) failed"; }
  grep -h "PEFT logits" peft_llama.out peft_gpt2.out peft_dropout.out
fi

# Upstream's LoRA configs: with a local model and data they resolve, or are refused naming the key.
local_data=(--initialize_from_hf "$golden/hf_llama/llama_mha" --data.train_urls '["train_ids.jsonl"]' --data.validation_urls '[]'
            --data.cache_dir cache_up --data.tokenizer passthrough --data.vocab_size 64 --trainer.wandb null
            --trainer.tracker '{type: json_logger}')
"$lora_lm" --config_path "$upstream/lora_llama2.yaml" "${local_data[@]}" --dry_run > up1.out 2>&1 ||
  { cat up1.out; fail "lora_llama2.yaml did not resolve with a local model and data"; }
grep -q "config resolved and valid" up1.out || { cat up1.out; fail "lora_llama2.yaml: no resolution line"; }
expect_fail 2 "initialize_from_hf.*not a local directory" "$lora_lm" --config_path "$upstream/lora/mpt_biomed.yaml" --dry_run
# mpt_biomed's target (Wqkv) on a Llama: no such module, named at the start of the run
expect_fail 2 "lora.target_modules matches none of the model's Linear modules" \
  "$lora_lm" --config_path "$upstream/lora/mpt_biomed.yaml" "${local_data[@]}" --trainer.num_train_steps 1 \
  --trainer.train_batch_size 2 --trainer.per_device_parallelism -1 --max_train_length 32 --trainer.id mpt

# Users' mistakes.
expect_fail 2 "initialize_from_hf.*required" "$lora_lm" --data.train_urls '["train_ids.jsonl"]'
expect_fail 2 "lora.dropout.*must be in \[0, 1)" "$lora_lm" lora.yaml --lora.dropout 1
expect_fail 2 "lora.r" "$lora_lm" lora.yaml --lora.r 0
expect_fail 2 "lora.target_modules.*not a valid regular expression" "$lora_lm" lora.yaml --lora.target_modules '"q_proj("'
expect_fail 2 "peft_hf_upload.*not supported" "$lora_lm" lora.yaml --peft_hf_upload someone/repo
expect_fail 2 "trainer.model_axis_size.*tensor parallelism under LoRA" "$lora_lm" lora.yaml --trainer.model_axis_size 2
expect_fail 2 "trainer.fsdp_axis: 'nope' is not an axis of the model" "$lora_lm" lora.yaml --trainer.id x --trainer.fsdp_axis nope
echo "lora_lm: ok"
