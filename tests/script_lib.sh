# Sourced by the end-to-end test scripts: the failure helpers and a fresh working directory.

# fail MESSAGE...: report the failure on stderr and exit 1.
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# fresh_work_dir DIR: DIR emptied (created if missing) and made the current directory.
fresh_work_dir() {
  rm -rf "$1"
  mkdir -p "$1"
  cd "$1"
}

# expect_fail CODE REGEX CMD...: CMD must exit with CODE and print REGEX (its output is in out.txt).
expect_fail() {
  local code=$1 re=$2 rc=0
  shift 2
  "$@" > out.txt 2>&1 || rc=$?
  [ "$rc" = "$code" ] || { cat out.txt; fail "'$*' exited with $rc, expected $code"; }
  grep -Eq "$re" out.txt || { cat out.txt; fail "'$*' did not say /$re/"; }
}

# start_serve_lm CMD...: runs serve_lm (CMD) in the background with its output in serve.out, waits until it listens,
# and sets $server (its pid) and $url (http://127.0.0.1:PORT); the server is killed when the script exits.
start_serve_lm() {
  "$@" > serve.out 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  for _ in $(seq 1 100); do
    grep -q "listening on" serve.out && break
    kill -0 $server 2>/dev/null || { cat serve.out; fail "serve_lm exited before listening"; }
    sleep 0.2
  done
  url=$(grep -o 'http://127.0.0.1:[0-9]*' serve.out) || { cat serve.out; fail "serve_lm did not say where it listens"; }
}

# train_chat_checkpoint TRAIN_LM TOKENIZER_DIR: a 2-step train_lm run "chatty" with that tokenizer, in ckpt/chatty.
train_chat_checkpoint() {
  "$1" --trainer.num_train_steps 2 --trainer.steps_per_eval 1000 --trainer.id chatty --trainer.log_dir logs \
    --trainer.checkpointer.base_path ckpt --data.tokenizer "$2" --data.cache_dir cache > train.out 2>&1 ||
    { cat train.out; fail "train_lm failed"; }
}
