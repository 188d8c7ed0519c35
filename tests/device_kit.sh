#!/usr/bin/env bash
# The device kit in its CPU mode (docs/portability.md, "Working with a GPU machine"): scripts/device-session.sh runs
# every stage of device_session at small sizes on the portable kernels (the kernels a GPU runs), plus train_lm twice
# on GPT-2 and twice on Llama, and must produce a summary table in which every check passed, both repro runs and each
# pair of train_lm runs agree bit for bit, every stage finished, and the per-kernel table was written. Also:
# device_session refuses bad arguments.
# Usage: device_kit.sh DEVICE_SESSION TRAIN_LM WORK_DIR DATA_DIR
set -euo pipefail
exe=$(realpath "$1")
train_lm=$(realpath "$2")
work=$3
data=$(realpath "$4")
root=$(realpath "$(dirname "${BASH_SOURCE[0]}")/..")
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"

set +e
"$root/scripts/device-session.sh" --small --no-peer --bin "$(dirname "$exe")" --train-lm "$train_lm" --data "$data" \
  --out "$work/out" > session.log 2>&1
rc=$?
set -e
summary=$work/out/summary.md
[ -f "$summary" ] || { cat session.log; fail "no summary.md"; }
[ $rc -eq 0 ] || { cat "$summary"; fail "device-session.sh exited $rc"; }
# The table is printed last.
tail -n 1 session.log | grep -q '^| ' || { tail -n 5 session.log; fail "the summary table is not the last thing printed"; }

need() { grep -q -- "$1" "$summary" || { cat "$summary"; fail "summary.md lacks: $1"; }; }
need '| environment | device |'
need '| checks | an unwritten output element reads NaN (the poison works) | ok |'
need '| checks | flash attention, GQA, causal, forward + backward | ok |'
need '| checks | AdamW update (portable loop)'
need '| ceilings | copy bandwidth (deep_copy) |'
need '| ceilings | GEMM f32, small GPT-2 step shapes |'
need '| ops vs copy | cross-entropy loss, forward + backward |'
need '| ops vs copy | AdamW fused pass'
need 'bf16 | time per step |'
need 'f32 | time per step |'
need '| step: Llama'
need 'MFU (6 x params x tokens/s)'
need 'per step: kernels, GEMMs, fences, deep copies'
need 'per step: allocations, cache misses'
need 'per step: allocations besides buffer-cache misses'
# A steady-state step allocates nothing besides the buffer cache's own misses (no scratch views, mirrors or tables).
while IFS= read -r line; do
  value=$(awk -F'|' '{ gsub(/ /, "", $4); print $4 }' <<< "$line")
  [ "$value" = 0 ] || { cat "$summary"; fail "a step allocated outside the buffer cache: $line"; }
done < <(grep 'per step: allocations besides buffer-cache misses' "$summary")
# With the steps marked (as the Trainer marks them), a steady-state step allocates nothing at all: no buffer-cache
# miss either (the counted step is at least the fifth of its trainer).
while IFS= read -r line; do
  value=$(awk -F'|' '{ print $4 }' <<< "$line")
  [[ $value =~ ^\ 0\ \(0\ MB\), ]] || { cat "$summary"; fail "a steady-state step allocated: $line"; }
done < <(grep 'per step: allocations, cache misses' "$summary")
# What would synchronise a GPU in a steady-state step (fences, deep copies, allocations): at most 3 now (AdamW's chunk
# table copied up and its gradient norm and update sums read back together, the loss read once). The small GPT-2 f32
# step made 14 deep copies, then 5 (the loss finished on the device, a gradient's second contribution summed by a
# kernel), now 3 (AdamW's clipping decided on the device, one table for its two passes).
while IFS= read -r line; do
  value=$(awk -F'|' '{ gsub(/ /, "", $4); print $4 }' <<< "$line")
  [[ $value =~ ^[0-9]+$ ]] && [ "$value" -le 3 ] || { cat "$summary"; fail "a step synchronises too often: $line"; }
done < <(grep 'per step: device synchronisations' "$summary")
need 'per step: device synchronisations'
need '| kernels: GPT-2'
need '| reproducibility | two fresh processes | bitwise identical |'
need '| train_lm | config/gpt2_nano.yaml, 10 steps, twice | bitwise identical |'
need '| train_lm | config/llama2_nano.yaml, 4 steps, twice | bitwise identical |'
need '| peer: PyTorch | GPT-2 step | not run |'
checks=$(grep -c '^| checks |' "$summary")
[ "$checks" -ge 20 ] || fail "only $checks check rows"
if grep -q 'FAILED\|TIMED OUT\|skipped' "$summary"; then cat "$summary"; fail "a row failed, timed out or was skipped"; fi
# The largest-batch stage found a batch above the fixed one (4) on this machine.
grep -q '^| step: GPT-2 (2 layers, 128 wide), \(1[0-9]\|[5-9]\) x 128, bf16 | time per step' "$summary" ||
  { cat "$summary"; fail "no largest-batch step row"; }
tsv=$(ls out/kernels-*.tsv | head -n 1)
[ "$(wc -l < "$tsv")" -gt 10 ] || fail "the kernel table $tsv is nearly empty"
grep -q 'flash_attention' "$tsv" || fail "the kernel table has no flash-attention kernel"

# Bad arguments: exit 2 and a message naming the argument.
expect2() {
  local want=$1
  shift
  set +e
  "$exe" "$@" > bad.out 2>&1
  local code=$?
  set -e
  [ $code -eq 2 ] || { cat bad.out; fail "device_session $* exited $code, not 2"; }
  grep -q -- "$want" bad.out || { cat bad.out; fail "device_session $*: message lacks '$want'"; }
}
expect2 "unknown argument '--bogus'" --stage env --bogus
expect2 "--model must be gpt2 or llama1b" --stage step --model bert
expect2 "--precision must be f32 or bf16" --stage step --precision fp8
expect2 "usage" --stage nothing
echo "OK: $(grep -c '^| ' "$summary") summary rows, $checks checks, every stage finished"
