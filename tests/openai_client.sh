#!/usr/bin/env bash
# serve_lm with the real `openai` Python client (tests/oracle/openai_client_check.py): train_lm makes a 2-step
# checkpoint with the chat test tokenizer, serve_lm serves it, the client checks every endpoint.
# Usage: openai_client.sh PYTHON TRAIN_LM SERVE_LM TOKENIZER_DIR WORK_DIR
set -euo pipefail
python=$1 train_lm=$(realpath "$2") serve_lm=$(realpath "$3") tokenizer=$(realpath "$4") work=$5
check=$(realpath "$(dirname "${BASH_SOURCE[0]}")/oracle/openai_client_check.py")
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"
train_chat_checkpoint "$train_lm" "$tokenizer"
start_serve_lm "$serve_lm" --checkpoint_path ckpt/chatty
"$python" "$check" "$url" chatty
