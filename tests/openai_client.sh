#!/usr/bin/env bash
# serve_lm with the real `openai` Python client (tests/oracle/openai_client_check.py): train_lm makes a 2-step
# checkpoint with the chat test tokenizer, serve_lm serves it, the client checks every endpoint.
# Usage: openai_client.sh PYTHON TRAIN_LM SERVE_LM TOKENIZER_DIR WORK_DIR
set -euo pipefail
python=$1 train_lm=$(realpath "$2") serve_lm=$(realpath "$3") tokenizer=$(realpath "$4") work=$5
check=$(realpath "$(dirname "${BASH_SOURCE[0]}")/oracle/openai_client_check.py")
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"
"$train_lm" --trainer.num_train_steps 2 --trainer.steps_per_eval 1000 --trainer.id chatty --trainer.log_dir logs \
  --trainer.checkpointer.base_path ckpt --data.tokenizer "$tokenizer" --data.cache_dir cache > train.out 2>&1 ||
  { cat train.out; fail "train_lm failed"; }
"$serve_lm" --checkpoint_path ckpt/chatty > serve.out 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  grep -q "listening on" serve.out && break
  kill -0 $server 2>/dev/null || { cat serve.out; fail "serve_lm exited before listening"; }
  sleep 0.2
done
url=$(grep -o 'http://127.0.0.1:[0-9]*' serve.out) || { cat serve.out; fail "serve_lm did not say where it listens"; }
"$python" "$check" "$url" chatty
