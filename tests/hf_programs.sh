#!/usr/bin/env bash
# The conversion programs end to end: train_lm writes a checkpoint, export_lm_to_hf turns it into a Hugging Face
# directory, import_hf_to_lm turns that back into a checkpoint, and train_lm starts a run from it; plus the
# import of the transformers-written golden model and the errors a user can make.
# Usage: hf_programs.sh TRAIN_LM EXPORT IMPORT GOLDEN_DIR WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1") export_prog=$(realpath "$2") import_prog=$(realpath "$3") golden=$(realpath "$4") work=$5
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"
expect_fail() {  # expect_fail REGEX CMD...: CMD must fail and print REGEX
  local re=$1
  shift
  if "$@" > out.txt 2>&1; then cat out.txt; fail "'$*' should have failed"; fi
  grep -Eq "$re" out.txt || { cat out.txt; fail "'$*' did not say /$re/"; }
}

small=(--trainer.num_train_steps 4 --trainer.steps_per_eval 1000 --trainer.id hf --trainer.log_dir logs
       --trainer.checkpointer.base_path ckpt)
"$train_lm" "${small[@]}" > train1.out 2>&1 || { cat train1.out; fail "train_lm failed"; }
[ -f ckpt/hf/step-4/metadata.json ] || fail "train_lm wrote no final checkpoint"

# The standard HDF5 tools read the checkpoint, axis names included.
command -v h5dump > /dev/null || fail "h5dump is missing (scripts/setup-debian.sh installs hdf5-tools)"
h5dump -A ckpt/hf/step-4/model.h5 > h5dump.out || fail "h5dump cannot read model.h5"
grep -q 'DATASET "weight"' h5dump.out || fail "h5dump shows no weight dataset"
grep -q '"layers", "embed", "qkv", "heads", "head_size"' h5dump.out || { head -50 h5dump.out; fail "h5dump shows no axes"; }
h5dump -d /step ckpt/hf/step-4/training_state.h5 | grep "(0): 4" > /dev/null || fail "h5dump: training_state.h5 step is not 4"

# Export: the model config comes from the checkpoint's config.yaml.
"$export_prog" --checkpoint_path ckpt/hf --output_dir exported --save_dtype float32 > export.out 2>&1 ||
  { cat export.out; fail "export_lm_to_hf failed"; }
grep -q "step 4" export.out || { cat export.out; fail "export did not take the newest checkpoint"; }
for f in config.json model.safetensors; do [ -f "exported/$f" ] || fail "the export lacks $f"; done
grep -q '"model_type": "gpt2"' exported/config.json || fail "config.json lacks model_type gpt2"
# The byte tokenizer (the run's data.tokenizer): its EOS id in config.json, no BOS, no files to copy.
grep -q '"eos_token_id": 256' exported/config.json || { cat exported/config.json; fail "config.json lacks eos_token_id 256"; }
grep -q '"bos_token_id": null' exported/config.json || { cat exported/config.json; fail "config.json should have no BOS"; }
grep -q "built in and has no Hugging Face files" export.out || { cat export.out; fail "export did not say the byte tokenizer has no files"; }
[ ! -e exported/tokenizer.json ] || fail "the byte tokenizer has no tokenizer.json to export"

# A run with a Hugging Face tokenizer.json: the export carries its files and the ids transformers reads from them
# (tests/golden/hf_export_tokenizer_ids.json, written by tests/oracle/check_hf_export_tokenizer.py --golden).
"$train_lm" --trainer.num_train_steps 2 --trainer.steps_per_eval 1000 --trainer.id bpe --trainer.log_dir logs \
  --trainer.checkpointer.base_path ckpt --data.tokenizer "$golden/tokenizers/gpt2_style" \
  --data.train_urls "[\"$golden/upstream_train_lm/train.jsonl\"]" --data.validation_urls '[]' \
  --data.cache_dir bpe_cache > bpe.out 2>&1 || { cat bpe.out; fail "train_lm with a tokenizer.json failed"; }
"$export_prog" --checkpoint_path ckpt/bpe --output_dir exported_bpe > export_bpe.out 2>&1 ||
  { cat export_bpe.out; fail "export of the tokenizer.json run failed"; }
for f in tokenizer.json tokenizer_config.json; do
  [ -f "exported_bpe/$f" ] || fail "the export lacks the tokenizer's $f"
  cmp -s "exported_bpe/$f" "$golden/tokenizers/gpt2_style/$f" || fail "exported $f differs from the tokenizer's"
done
want=$(tr -d ' \n' < "$golden/hf_export_tokenizer_ids.json" | sed -n 's/.*"gpt2_style":{"bos_token_id":\([0-9]*\),"eos_token_id":\([0-9]*\).*/\1 \2/p')
[ -n "$want" ] || fail "no gpt2_style ids in hf_export_tokenizer_ids.json"
read -r want_bos want_eos <<< "$want"
grep -q "\"bos_token_id\": $want_bos," exported_bpe/config.json &&
  grep -q "\"eos_token_id\": $want_eos," exported_bpe/config.json ||
  { cat exported_bpe/config.json; fail "config.json ids differ from transformers' (bos $want_bos, eos $want_eos)"; }
# --tokenizer names what to save; a hub name cannot be fetched and is refused, not ignored.
expect_fail "not a local tokenizer.json" "$export_prog" --checkpoint_path ckpt/bpe --output_dir x --tokenizer gpt2
expect_fail "more than the model's vocabulary" "$export_prog" --checkpoint_path ckpt/hf --output_dir x \
  --tokenizer "$golden/tokenizers/gpt2_style"

# Import it back, and start a run from the imported model.
"$import_prog" --hf_checkpoint exported --output_path imported > import.out 2>&1 || { cat import.out; fail "import failed"; }
[ -f imported/metadata.json ] && [ -f imported/model.h5 ] || fail "the import wrote no checkpoint"
"$train_lm" "${small[@]}" --trainer.id from_import --trainer.num_train_steps 1 \
  --initialize_from_checkpoint_path imported > train2.out 2>&1 || { cat train2.out; fail "train_lm from the import failed"; }
grep -q "model initialised from" train2.out || { cat train2.out; fail "train_lm did not start from the import"; }

# The transformers-written golden imports, and exports again.
"$import_prog" --hf_checkpoint "$golden/hf_gpt2_tiny_sharded" --output_path golden_ckpt > g.out 2>&1 || { cat g.out; fail "golden import failed"; }
"$export_prog" --checkpoint_path golden_ckpt --output_dir golden_again --max_shard_size 50000 > g2.out 2>&1 || { cat g2.out; fail "golden re-export failed"; }
[ -f golden_again/model.safetensors.index.json ] || fail "a small max_shard_size did not shard the export"
# That directory has no tokenizer, so the import records upstream's default ("gpt2", a hub name) and config.json's
# special-token ids: the export says so and writes those ids back (they used to become null).
grep -q "is not a local tokenizer.json: config.json gets the bos_token_id / eos_token_id the checkpoint was imported with" g2.out ||
  { cat g2.out; fail "no word about the missing tokenizer"; }
for k in bos_token_id eos_token_id; do
  want=$(grep -o "\"$k\": [^,}]*" "$golden/hf_gpt2_tiny_sharded/config.json")
  got=$(grep -o "\"$k\": [^,}]*" golden_again/config.json)
  [ -n "$want" ] && [ "$want" = "$got" ] || fail "import -> export changed $k: '$want' became '$got'"
done

# What users get wrong.
expect_fail "no complete checkpoint under 'nowhere'" "$export_prog" --checkpoint_path nowhere --output_dir x
expect_fail "not a local directory" "$import_prog" --hf_checkpoint openai-community/gpt2 --output_path x
expect_fail "unknown dtype 'int4'" "$export_prog" --checkpoint_path ckpt/hf --output_dir x --save_dtype int4
expect_fail "n_layer 2 but the model config says 12" "$import_prog" --hf_checkpoint "$golden/hf_gpt2_tiny" \
  --output_path x --use_hf_model_config false --model.type gpt2 --model.seq_len 16 --model.hidden_dim 32 --model.num_heads 4
echo "OK: train_lm -> export_lm_to_hf -> import_hf_to_lm -> train_lm, golden import/export, and the error messages"
