#!/usr/bin/env bash
# viz_logprobs end to end: train_lm trains a tiny model for 10 steps (and another for 3), viz_logprobs writes the
# heatmap of the first and the diff page against the second, and the pages are checked: one span per token,
# titles and colours, the header, the mean log-prob over train_lm's own evaluation windows equal to minus
# train_lm's eval loss, and the model that trained longer better on average. Then multi-byte characters and markup
# in the text, a Hugging Face directory with the passthrough tokenizer, and the errors a user can make.
# Usage: viz_program.sh TRAIN_LM VIZ_LOGPROBS GOLDEN_DIR WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1") viz=$(realpath "$2") golden=$(realpath "$3") work=$4
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"
count() { grep -o -- "$1" "$2" | wc -l; }

common=(--trainer.steps_per_eval 1000 --trainer.log_dir logs --trainer.checkpointer.base_path ckpt)
"$train_lm" "${common[@]}" --trainer.num_train_steps 10 --trainer.id ten > train10.out 2>&1 ||
  { cat train10.out; fail "train_lm (10 steps) failed"; }
"$train_lm" "${common[@]}" --trainer.num_train_steps 3 --trainer.id three > train3.out 2>&1 ||
  { cat train3.out; fail "train_lm (3 steps) failed"; }
[ -f ckpt/ten/step-10/metadata.json ] && [ -f ckpt/three/step-3/metadata.json ] || fail "train_lm wrote no checkpoints"

# 1. The heatmap of the 10-step model: model and data come from the checkpoint's config.yaml.
"$viz" --checkpoint_path ckpt/ten --path pages/ten --num_docs 6 > viz1.out 2>&1 || { cat viz1.out; fail "viz_logprobs failed"; }
page=pages/ten.html
[ -f "$page" ] || { cat viz1.out; fail "no $page (.html should have been appended)"; }
ls -a pages | grep -q tmp && fail "a temporary file was left in pages/"
seq_len=128
n=$(count '<span class="t' "$page")
[ "$n" = $((6 * seq_len)) ] || fail "$page has $n token spans, expected $((6 * seq_len))"
[ "$(count '<span' "$page")" = "$(count '</span>' "$page")" ] || fail "unbalanced spans in $page"
[ "$(count ' title="' "$page")" -ge "$n" ] || fail "not every token has a title"
[ "$(count 'data-lp="' "$page")" = $((6 * (seq_len - 1))) ] || fail "expected a log-prob on every token but the first"
[ "$(count 'class="t na"' "$page")" = 6 ] || fail "expected one unscored first token per document"
[ "$(count '<div class="doc"' "$page")" = 6 ] || fail "expected 6 documents"
grep -q 'step <b>10</b>' "$page" || fail "the header does not show step 10"
grep -q 'ckpt/ten/step-10' "$page" || fail "the header does not name the checkpoint"
grep -q 'class="legend"' "$page" || fail "no legend"
grep -q 'background:hsla(' "$page" || fail "no colours"
grep -Eq 'perplexity [0-9]+\.[0-9]+' "$page" || fail "no perplexity"
grep -q '<script' "$page" && fail "the page should need no script"
grep -Eq '(src|href)="https?:' "$page" && fail "the page refers to an external resource"
grep -q 'title="&#39;' "$page" || fail "titles do not quote the token"
grep -q 'logprob -[0-9]' "$page" || fail "titles do not show the log-prob"
grep -q 'top: ' "$page" || fail "titles do not show the top prediction"
grep -q '&lt;|endoftext|&gt;' "$page" || fail "EOS is not shown"

# 2. Over train_lm's own evaluation windows (the first 4 batches of 32, file order) the mean log-prob is minus
#    train_lm's eval loss.
"$viz" --checkpoint_path ckpt/ten --path pages/eval.html --num_docs 128 --data_seed null > viz2.out 2>&1 ||
  { cat viz2.out; fail "viz_logprobs (eval windows) failed"; }
eval_loss=$(sed -n 's/.*"eval_loss": *\([-0-9.eE+]*\).*/\1/p' logs/ten/summary.json)
[ -n "$eval_loss" ] || fail "logs/ten/summary.json has no eval_loss"
grep -o 'data-lp="[-0-9.]*"' pages/eval.html | cut -d'"' -f2 | awk -v loss="$eval_loss" '
  { sum += $1; n++ }
  END {
    mean = sum / n; d = mean + loss; if (d < 0) d = -d
    printf "eval_loss %.6f  mean log-prob over %d tokens %.6f\n", loss, n, mean
    exit (n == 128 * 127 && d < 2e-3) ? 0 : 1
  }' || fail "the mean log-prob over the eval windows is not minus the eval loss"

# 3. The diff page against the 3-step model: the more trained model predicts better on average.
"$viz" --checkpoint_path ckpt/ten --comparison_model_path ckpt/three --path pages/cmp.html --num_docs 4 > viz3.out 2>&1 ||
  { cat viz3.out; fail "viz_logprobs with a comparison failed"; }
[ -f pages/cmp.html ] && [ -f pages/cmp_diff.html ] || fail "expected cmp.html and cmp_diff.html"
grep -o 'data-lp="[-0-9.]*" data-cmp="[-0-9.]*" data-diff="[-0-9.]*"' pages/cmp_diff.html | cut -d'"' -f2,4,6 |
  awk -F'"' '
    { d = $1 - $2 - $3; if (d < 0) d = -d; if (d > 2e-4) bad++; sum += $3; n++ }
    END {
      printf "mean diff (10 steps - 3 steps) %.4f over %d tokens\n", sum / n, n
      exit (n == 4 * 127 && !bad && sum > 0) ? 0 : 1
    }' || fail "the diff page's values are wrong (or the 10-step model is not better than the 3-step one)"
grep -q 'hsla(219,' pages/cmp_diff.html && grep -q 'border-top-color:' pages/cmp_diff.html ||
  fail "the diff page has no blue or no borders"
grep -q 'ckpt/three/step-3' pages/cmp_diff.html || fail "the diff page does not name the comparison"

# 4. A Hugging Face directory (vocabulary 101, seq_len 16) with the passthrough tokenizer.
for d in 0 1 2 3 4; do
  printf '{"text": "%s"}\n' "$(for i in $(seq 0 39); do printf '%d ' $(((7 * d + 3 * i) % 100)); done)"
done > ids.jsonl
"$viz" --checkpoint_path "$golden/hf_gpt2_tiny" --checkpoint_is_hf true --path pages/hf.html --num_docs 3 \
  --data.tokenizer passthrough --data.vocab_size 101 --data.validation_urls '["ids.jsonl"]' > viz4.out 2>&1 ||
  { cat viz4.out; fail "viz_logprobs on a Hugging Face directory failed"; }
[ "$(count '<span class="t' pages/hf.html)" = 48 ] || fail "hf.html: expected 3 windows of 16 tokens"

# 5. Byte tokens of multi-byte characters, markup and tabs in the text.
for d in 0 1 2 3 4 5; do
  printf '{"text": "doc %d: caf\\u00e9 \\u65e5\\u672c na\\u00efve <b>x</b> & \\"q\\" tab\\there"}\n' "$d"
done > utf8.jsonl
"$viz" --checkpoint_path ckpt/ten --path pages/utf8.html --num_docs 1 --data_seed null \
  --data.validation_urls '["utf8.jsonl"]' > viz5.out 2>&1 || { cat viz5.out; fail "viz_logprobs on utf8.jsonl failed"; }
grep -q '>é</span><span class="t cont"' pages/utf8.html || fail "é is not shown on its first byte"
grep -q '>日</span><span class="t cont"[^>]*></span><span class="t cont"' pages/utf8.html || fail "日 is not shown on its first byte"
grep -q '>&lt;</span><span[^>]*>b</span><span[^>]*>&gt;</span>' pages/utf8.html || fail "markup in the text is not escaped"
grep -q '<b>x' pages/utf8.html && fail "markup from the text leaked into the page"
grep -q '>⇥	</span>' pages/utf8.html || fail "a tab is not shown as ⇥"
[ "$(count '<span class="t' pages/utf8.html)" = 128 ] || fail "utf8.html: expected one window of 128 tokens"

# 6. What users get wrong.
expect_fail 5 "no complete checkpoint under 'nowhere'" "$viz" --checkpoint_path nowhere
expect_fail 2 "checkpoint_path is required" "$viz"
expect_fail 2 "num_docs must be positive" "$viz" --checkpoint_path ckpt/ten --num_docs 0
expect_fail 2 "num_doc" "$viz" --checkpoint_path ckpt/ten --num_doc 3
expect_fail 3 "data file 'missing.jsonl' not found" "$viz" --checkpoint_path ckpt/ten --data.validation_urls '["missing.jsonl"]'
expect_fail 2 "validation_urls is empty" "$viz" --checkpoint_path "$golden/hf_gpt2_tiny" --checkpoint_is_hf true
expect_fail 1 "outside the model's vocabulary" "$viz" --checkpoint_path "$golden/hf_gpt2_tiny" --checkpoint_is_hf true \
  --data.tokenizer byte --data.validation_urls "[\"$PWD/ids.jsonl\"]"
"$viz" --help | grep -- "--comparison_model_path" > /dev/null || fail "--help does not list comparison_model_path"
echo "OK: train_lm -> viz_logprobs heatmap, eval-window mean = -eval loss, diff page, HF + passthrough, errors"
