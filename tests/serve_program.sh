#!/usr/bin/env bash
# serve_lm end to end, with curl: train_lm trains the embedded default for 2 steps with the chat test tokenizer,
# serve_lm serves the checkpoint on a free loopback port; /health, /v1/models, a completion (greedy: the same text
# twice), a streamed one (ends with [DONE]), a chat completion, bad requests answered 4xx while the server keeps
# serving; SIGTERM stops it cleanly; and the errors users make starting it exit with their codes.
# Usage: serve_program.sh TRAIN_LM SERVE_LM TOKENIZER_DIR WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1") serve_lm=$(realpath "$2") tokenizer=$(realpath "$3") work=$4
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

train_chat_checkpoint "$train_lm" "$tokenizer"
start_serve_lm "$serve_lm" --checkpoint_path ckpt/chatty --port 0 --max_body_bytes 2000

req() { curl -sS -o body.txt -w '%{http_code}' "$@"; }
[ "$(req "$url/health")" = 200 ] && grep -q '"healthy"' body.txt || fail "/health: $(cat body.txt)"
[ "$(req "$url/v1/models")" = 200 ] && grep -q '"id":"chatty"' body.txt || fail "/v1/models: $(cat body.txt)"

completion='{"model": "chatty", "prompt": "Hello", "max_tokens": 8, "temperature": 0}'
[ "$(req "$url/v1/completions" -d "$completion")" = 200 ] || fail "completion: $(cat body.txt)"
grep -q '"object":"text_completion"' body.txt && grep -q '"completion_tokens":' body.txt || fail "completion: $(cat body.txt)"
first=$(sed 's/"created":[0-9]*,"id":"[^"]*",//' body.txt)
req "$url/v1/completions" -d "$completion" > /dev/null
[ "$(sed 's/"created":[0-9]*,"id":"[^"]*",//' body.txt)" = "$first" ] || fail "greedy gave two texts: $first / $(cat body.txt)"

[ "$(req -N "$url/v1/completions" -d '{"model": "chatty", "prompt": "Hi", "max_tokens": 4, "stream": true}')" = 200 ] ||
  fail "stream: $(cat body.txt)"
[ "$(grep -c '^data: {' body.txt)" -ge 1 ] && [ "$(tail -n 2 body.txt | head -n 1)" = "data: [DONE]" ] ||
  fail "stream: $(cat body.txt)"

[ "$(req "$url/v1/chat/completions" -d '{"model": "chatty", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}')" = 200 ] ||
  fail "chat: $(cat body.txt)"
grep -q '"role":"assistant"' body.txt || fail "chat: $(cat body.txt)"

[ "$(req "$url/v1/completions" -d '{"model": "chatty", "prompt": ')" = 400 ] && grep -q "not valid JSON" body.txt ||
  fail "malformed JSON: $(cat body.txt)"
[ "$(req "$url/v1/completions" -d '{"model": "other", "prompt": "x"}')" = 404 ] && grep -q "model_not_found" body.txt ||
  fail "unknown model: $(cat body.txt)"
[ "$(req "$url/v1/completions" -d '{"model": "chatty", "prompt": "x", "max_tokens": 5000}')" = 400 ] &&
  grep -q "max_tokens" body.txt || fail "too many tokens: $(cat body.txt)"
head -c 3000 /dev/zero | tr '\0' 'a' > big.txt
[ "$(req "$url/v1/completions" --data-binary @big.txt)" = 413 ] && grep -q "max_body_bytes" body.txt ||
  fail "body over the limit: $(cat body.txt)"
[ "$(req "$url/health")" = 200 ] || fail "the server stopped serving after bad requests"

kill -TERM $server
wait $server || { cat serve.out; fail "serve_lm exited with $? on SIGTERM"; }
trap - EXIT
grep -q "serve_lm: stopped" serve.out || { cat serve.out; fail "serve_lm did not stop cleanly"; }

expect_fail 2 "give checkpoint_path .* or hf_checkpoint" "$serve_lm"
expect_fail 5 "no complete checkpoint|checkpoint_path" "$serve_lm" --checkpoint_path no/such/run
expect_fail 2 "port must be" "$serve_lm" --checkpoint_path ckpt/chatty --port 70000
echo "serve_lm: ok"
