#!/usr/bin/env bash
# Every model family through every door: for each transformers-written golden directory (GPT-2, Llama, Mistral with a
# window, Qwen2 with windows from max_window_layers on, Qwen3, Gemma, Gemma 2, Gemma 3 (text-only and multimodal), OLMo 2,
# Mixtral), eval_lm on the Hugging Face directory, on its
# import_hf_to_lm checkpoint and on that checkpoint's export_lm_to_hf directory must print the same loss;
# viz_logprobs must draw the directory (model.type from config.json, and with the family's type given) and the
# imported checkpoint with the same mean log-prob; the export keeps every config.json field the import read; and
# train_lm --model.type T --initialize_from_hf DIR --use_hf_model_config true (train_lm, as upstream's, takes the
# family from model.type and refuses a directory of another one) records the directory's architecture in its
# checkpoint (and hf_save_path writes the config.json export_lm_to_hf writes), so that eval_lm and export_lm_to_hf on that checkpoint build the model that trained.
# Usage: family_doors.sh TRAIN_LM EVAL_LM VIZ_LOGPROBS IMPORT_HF_TO_LM EXPORT_LM_TO_HF GOLDEN_DIR WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1") eval_lm=$(realpath "$2") viz=$(realpath "$3") import=$(realpath "$4")
export=$(realpath "$5") golden=$(realpath "$6") work=$7
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

# run NAME CMD...: CMD must succeed; its output is kept in NAME.out.
run() {
  local name=$1
  shift
  "$@" > "$name.out" 2>&1 || { cat "$name.out"; fail "$name: '$*' failed"; }
}
loss_of() { sed -n 's/^Loss: //p' "$1.out"; }
logprob_of() { sed -n 's/.*mean log-prob \([-0-9.eE+]*\) .*/\1/p' "$1.out"; }
same() {  # same WHAT A B: A and B are the same non-empty string
  [ -n "$2" ] && [ "$2" = "$3" ] || fail "$1: '$2' vs '$3'"
}
# The config.json keys that describe the architecture, as one JSON line (jq-free: the export writes one key a line).
arch_keys() {
  local f=$1
  for k in model_type vocab_size hidden_size n_embd intermediate_size num_hidden_layers n_layer num_attention_heads \
           n_head num_key_value_heads head_dim rms_norm_eps layer_norm_epsilon tie_word_embeddings sliding_window \
           use_sliding_window max_window_layers bos_token_id eos_token_id rope_theta hidden_activation \
           query_pre_attn_scalar attn_logit_softcapping final_logit_softcapping; do
    tr -d ' \n' < "$f" | grep -o "\"$k\":[^,}]*" || true
  done | sort
}

# A Qwen2 with a window size but use_sliding_window false (the window is kept, and used by no layer).
mkdir -p qwen2_off
cp "$golden/hf_llama/qwen2_sw/model.safetensors" qwen2_off/
sed -e 's/"use_sliding_window": true/"use_sliding_window": false/' -e 's/"sliding_attention"/"full_attention"/' \
  "$golden/hf_llama/qwen2_sw/config.json" > qwen2_off/config.json
grep -q '"use_sliding_window": false' qwen2_off/config.json || fail "could not write qwen2_off/config.json"

families="$golden/hf_gpt2_tiny:gpt2 $golden/hf_llama/llama_mha:llama $golden/hf_llama/mistral_sw:mistral"
families+=" $golden/hf_llama/qwen2_sw:qwen $PWD/qwen2_off:qwen $golden/hf_llama/qwen3:qwen3"
families+=" $golden/hf_llama/gemma_mqa:gemma $golden/hf_llama/gemma2_softcap:gemma2 $golden/hf_llama/gemma3_local:gemma3"
families+=" $golden/hf_llama/olmo2_gqa:olmo2 $golden/hf_llama/mixtral_top2:mixtral"
# a multimodal Gemma 3 (Gemma3ForConditionalGeneration): its language model, read from text_config
families+=" $golden/hf_llama/gemma3_multimodal:gemma3"
for entry in $families; do
  dir=${entry%%:*} type=${entry##*:}
  name=$(basename "$dir")
  vocab=$(tr -d ' \n' < "$dir/config.json" | grep -o '"vocab_size":[0-9]*' | cut -d: -f2)
  # Token ids below the smallest vocabulary (64), as passthrough text.
  for d in 0 1 2 3 4; do
    printf '{"text": "%s"}\n' "$(for i in $(seq 0 39); do printf '%d ' $(((7 * d + 3 * i) % 60)); done)"
  done > ids.jsonl
  data=(--data.tokenizer passthrough --data.vocab_size "$vocab" --data.validation_urls '["ids.jsonl"]'
        --data.cache_dir "cache_$name" --trainer.log_dir logs)

  run "$name.eval_hf" "$eval_lm" --hf_checkpoint "$dir" "${data[@]}"
  run "$name.import" "$import" --hf_checkpoint "$dir" --output_path "ck_$name"
  run "$name.eval_ck" "$eval_lm" --checkpoint_path "ck_$name" "${data[@]}"
  run "$name.export" "$export" --checkpoint_path "ck_$name" --output_dir "ex_$name"
  run "$name.eval_ex" "$eval_lm" --hf_checkpoint "ex_$name" "${data[@]}"
  same "$name: eval_lm on the HF directory vs the imported checkpoint" "$(loss_of "$name.eval_hf")" \
       "$(loss_of "$name.eval_ck")"
  same "$name: eval_lm on the HF directory vs the export" "$(loss_of "$name.eval_hf")" "$(loss_of "$name.eval_ex")"
  # What the import read, the export writes (the export may add keys; none it shares may change). A multimodal
  # wrapper's export is its language model alone (model_type gemma3_text): compared through eval_lm above.
  grep -q '"model_type": "gemma3",' "$dir/config.json" && multimodal=1 || multimodal=0
  [ $multimodal = 1 ] || while read -r kv; do
    grep -qxF -- "$kv" <(arch_keys "ex_$name/config.json") ||
      fail "$name: the export's config.json lost or changed $kv (has: $(arch_keys "ex_$name/config.json" | tr '\n' ' '))"
  done < <(arch_keys "$dir/config.json" | grep -v '"rope_theta"')

  run "$name.viz_hf" "$viz" --checkpoint_path "$dir" --checkpoint_is_hf true --path "viz_$name.html" --num_docs 2 \
      "${data[@]}"
  run "$name.viz_typed" "$viz" --checkpoint_path "$dir" --checkpoint_is_hf true --model.type "$type" \
      --path "viz_${name}_typed.html" --num_docs 2 "${data[@]}"
  run "$name.viz_ck" "$viz" --checkpoint_path "ck_$name" --path "viz_${name}_ck.html" --num_docs 2 "${data[@]}"
  same "$name: viz_logprobs, HF directory vs with model.type $type" "$(logprob_of "$name.viz_hf")" \
       "$(logprob_of "$name.viz_typed")"
  same "$name: viz_logprobs, HF directory vs imported checkpoint" "$(logprob_of "$name.viz_hf")" \
       "$(logprob_of "$name.viz_ck")"

  # Training from the directory with its own architecture; the checkpoint must say which one.
  printf '{"text": "%s"}\n' "$(for i in $(seq 0 200); do printf '%d ' $(((5 * i) % 60)); done)" > train_ids.jsonl
  seq_len=$(tr -d ' \n' < "$dir/config.json" | grep -o '"\(max_position_embeddings\|n_positions\)":[0-9]*' | cut -d: -f2)
  run "$name.train" "$train_lm" --model.type "$type" --initialize_from_hf "$dir" --use_hf_model_config true \
      --data.train_urls '["train_ids.jsonl"]' "${data[@]}" --trainer.train_batch_size 2 --trainer.num_train_steps 2 \
      --trainer.steps_per_eval 1000 --trainer.id "tr_$name" --trainer.checkpointer.base_path ckpt --model.seq_len "$seq_len" \
      --hf_save_path hfsave --hf_save_steps 1
  grep -Eq "^  type: $type\$" "ckpt/tr_$name/step-2/config.yaml" ||
    { cat "ckpt/tr_$name/step-2/config.yaml"; fail "$name: the trained checkpoint's config.yaml does not record type: $type"; }
  run "$name.eval_tr" "$eval_lm" --checkpoint_path "ckpt/tr_$name" "${data[@]}"
  run "$name.export_tr" "$export" --checkpoint_path "ckpt/tr_$name" --output_dir "ex_tr_$name"
  [ "$(arch_keys "hfsave/tr_$name/step-1/config.json")" = "$(arch_keys "ex_tr_$name/config.json")" ] ||
    fail "$name: train_lm's hf_save_path config.json and export_lm_to_hf's differ:" \
         "$(arch_keys "hfsave/tr_$name/step-1/config.json" | tr '\n' ' ') vs $(arch_keys "ex_tr_$name/config.json" | tr '\n' ' ')"
  same "$name: the trained model's size" "$(wc -c < "ex_tr_$name/model.safetensors")" \
       "$(wc -c < "ex_$name/model.safetensors")"
  echo "$name: loss $(loss_of "$name.eval_hf") through the directory, the import and the export; viz and train_lm agree"
done
echo "OK: every family through every door (eval_lm, viz_logprobs, import, export, train_lm from HF)"
