#!/usr/bin/env bash
# Gemma, Gemma 2, Gemma 3, OLMo 2 and Mixtral through the real programs, from their configs (config/gemma*_nano.yaml,
# config/olmo2_nano.yaml and config/mixtral_nano.yaml, cut to a tiny context and batch): each trains 20 steps with falling loss, and its export to Hugging Face imports back and exports
# again to the same bytes (and eval_lm gives the checkpoint and the export the same loss). Resuming bitwise is
# tested in-process for every type (tests/test_llama_train.cpp).
# Usage: train_lm_families.sh TRAIN_LM IMPORT_HF_TO_LM EXPORT_LM_TO_HF EVAL_LM REPO_DIR WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1") import=$(realpath "$2") export=$(realpath "$3") eval_lm=$(realpath "$4")
repo=$(realpath "$5") work=$6
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

# The fortunes corpus the configs name, relative to the repository root: run there, write here.
data_dir="$repo/build/data/fortunes"
[ -f "$data_dir/train.jsonl" ] || data_dir="$(dirname "$(dirname "$train_lm")")/data/fortunes"
[ -f "$data_dir/train.jsonl" ] || fail "no fortunes corpus under $repo/build/data or next to $train_lm"
small=(--model.seq_len 64 --trainer.train_batch_size 4 --trainer.num_train_steps 20 --trainer.steps_per_eval 1000
       --trainer.max_eval_batches 1 --data.train_urls "[\"$data_dir/train.jsonl\"]"
       --data.validation_urls "[\"$data_dir/validation.jsonl\"]" --data.cache_dir "$PWD/cache"
       --trainer.log_dir "$PWD/logs" --trainer.checkpointer.base_path "$PWD/ckpt"
       --trainer.checkpointer.keep '[{every: 10}]')
for t in gemma gemma2 gemma3 olmo2 mixtral; do
  cfg="$repo/config/${t}_nano.yaml"
  run() { (cd "$repo" && timeout 300 "$train_lm" --config_path "$cfg" "${small[@]}" --trainer.id "$t"); }
  run > "$t.out" 2>&1 || { cat "$t.out"; fail "$t: train_lm on config/${t}_nano.yaml failed"; }
  grep -q "^  type: $t\$" "ckpt/$t/step-20/config.yaml" || fail "$t: the checkpoint does not record type: $t"
  first=$(sed -nE 's/.*"first_loss": ([^,]*),.*/\1/p' "logs/$t/summary.json")
  final=$(sed -nE 's/.*"final_loss": ([^,]*),.*/\1/p' "logs/$t/summary.json")
  awk -v a="$first" -v b="$final" 'BEGIN { exit !(b < a - 0.1) }' || fail "$t: the loss did not fall ($first -> $final)"
  # export -> import -> export: the same bytes; the export evaluates to the checkpoint's loss
  "$export" --checkpoint_path "ckpt/$t" --output_dir "ex_$t" > "$t.export.out" 2>&1 ||
    { cat "$t.export.out"; fail "$t: export_lm_to_hf failed"; }
  grep -q "\"model_type\": \"$( [ $t = gemma3 ] && echo gemma3_text || echo $t)\"" "ex_$t/config.json" ||
    fail "$t: the export's config.json has another model_type"
  "$import" --hf_checkpoint "ex_$t" --output_path "ck2_$t" > "$t.import.out" 2>&1 ||
    { cat "$t.import.out"; fail "$t: import_hf_to_lm failed"; }
  "$export" --checkpoint_path "ck2_$t" --output_dir "ex2_$t" > "$t.export2.out" 2>&1 ||
    { cat "$t.export2.out"; fail "$t: the second export failed"; }
  cmp "ex_$t/model.safetensors" "ex2_$t/model.safetensors" || fail "$t: export -> import -> export changed the weights"
  cmp "ex_$t/config.json" "ex2_$t/config.json" || fail "$t: export -> import -> export changed config.json"
  ev=(--data.tokenizer byte --data.validation_urls "[\"$data_dir/validation.jsonl\"]" --data.cache_dir "$PWD/cache_eval"
      --trainer.max_eval_batches 1 --trainer.train_batch_size 4 --trainer.log_dir "$PWD/logs_eval")
  "$eval_lm" --checkpoint_path "ckpt/$t" "${ev[@]}" > "$t.eval_ck.out" 2>&1 || { cat "$t.eval_ck.out"; fail "$t: eval_lm on the checkpoint failed"; }
  "$eval_lm" --hf_checkpoint "ex_$t" "${ev[@]}" > "$t.eval_ex.out" 2>&1 || { cat "$t.eval_ex.out"; fail "$t: eval_lm on the export failed"; }
  a=$(sed -n 's/^Loss: //p' "$t.eval_ck.out") b=$(sed -n 's/^Loss: //p' "$t.eval_ex.out")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$t: eval_lm gives the checkpoint $a and its export $b"
  echo "OK: $t loss $first -> $final, export -> import -> export bitwise, eval $a both ways"
done

# Mixtral logs its auxiliary losses as upstream does
for k in train/load_balancing_loss train/router_z_loss; do
  grep -q "\"$k\"" logs/mixtral/metrics.jsonl || fail "mixtral: no $k in the metrics"
done
# and each layer's routing entropy and expert loads (moe/layer{i}/...): the loads of a layer sum to 1, the entropy
# lies in [0, log(experts)]
line=$(grep '"event":"log"' logs/mixtral/metrics.jsonl | grep '"train/loss"' | tail -1)
layers=$(sed -nE 's/.*num_layers: ([0-9]+).*/\1/p' "$repo/config/mixtral_nano.yaml" | head -1)
experts=$(sed -nE 's/.*n_routed_experts: ([0-9]+).*/\1/p' "$repo/config/mixtral_nano.yaml" | head -1)
[ -n "$layers" ] && [ -n "$experts" ] || fail "mixtral_nano.yaml: no num_layers or n_routed_experts"
for ((i = 0; i < layers; i++)); do
  h=$(grep -oE "\"moe/layer$i/routing_entropy\":[^,}]*" <<< "$line" | cut -d: -f2)
  [ -n "$h" ] || fail "mixtral: no moe/layer$i/routing_entropy in the metrics"
  sum=0
  for ((e = 0; e < experts; e++)); do
    l=$(grep -oE "\"moe/layer$i/expert${e}_load\":[^,}]*" <<< "$line" | cut -d: -f2)
    [ -n "$l" ] || fail "mixtral: no moe/layer$i/expert${e}_load in the metrics"
    sum=$(awk -v a="$sum" -v b="$l" 'BEGIN { printf "%.12f", a + b }')
  done
  awk -v s="$sum" -v h="$h" -v n="$experts" 'BEGIN { exit !(s > 0.999999 && s < 1.000001 && h >= 0 && h <= log(n) + 1e-9) }' ||
    fail "mixtral: layer $i's expert loads sum to $sum and its routing entropy is $h"
done

# Mixtral's routing is the same at any thread count: 1 and 2 threads give the same losses and the same weights.
for n in 1 2; do
  (cd "$repo" && HALIAX_NUM_THREADS=$n timeout 300 "$train_lm" --config_path "$repo/config/mixtral_nano.yaml" "${small[@]}" \
     --trainer.num_train_steps 10 --trainer.id "mixtral-t$n") > "mixtral-t$n.out" 2>&1 ||
    { cat "mixtral-t$n.out"; fail "mixtral on $n threads failed"; }
  grep '"event":"log"' "logs/mixtral-t$n/metrics.jsonl" | grep '"train/loss"' | sed -E 's/.*"train\/loss":([^,}]*).*/\1/' > "mixtral-t$n.losses"
done
[ "$(wc -l < mixtral-t1.losses)" -eq 10 ] || fail "mixtral: expected 10 logged losses, got $(wc -l < mixtral-t1.losses)"
cmp mixtral-t1.losses mixtral-t2.losses || { paste mixtral-t1.losses mixtral-t2.losses; fail "mixtral: the losses depend on the thread count"; }
cmp ckpt/mixtral-t1/step-10/model.h5 ckpt/mixtral-t2/step-10/model.h5 || fail "mixtral: the weights depend on the thread count"
echo "OK: mixtral on 1 and 2 threads: the same losses and weights, bit for bit"
