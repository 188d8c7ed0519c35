#!/usr/bin/env bash
# The device kit's session: everything a short lease of a GPU machine should measure, in one call of at most about
# 8 minutes. Runs device_session's stages (bench/device_session/main.cpp) each under its own time limit, then the
# PyTorch peer on the same card, and writes OUT/summary.md (one table: checks, ceilings, step times, ratios) plus a
# log per stage and the per-kernel tables; prints the table last. docs/portability.md, "Working with a GPU machine",
# says how to build the bundle and call it.
#
#   scripts/device-session.sh --out "$OUT"                      # on the GPU machine, from the bundle (.device-kit)
#   scripts/device-session.sh --small --bin build/bench --out /tmp/kit   # on a CPU build (portable kernels; ctest)
#
# Options: --bin DIR (where device_session is; default: the bundle .device-kit/kit.tar.xz, unpacked into
# $TMPDIR/device-kit, else build/bench), --out DIR (required),
# --small (CPU-sized problems, the portable kernels), --budget SECONDS (all stages; default 450, 300 with --small),
# --no-peer (skip PyTorch), --only STAGE,... (run only these stages), --train-lm PATH (default: train_lm beside
# device_session, if there) and --data DIR (its train.jsonl and validation.jsonl; default: the bundle's data/, else
# build/data/fortunes) for the train_lm stage: config/gpt2_nano.yaml twice, bitwise-equal losses expected.
# Exit status: 0 when every check passed and every stage that ran finished; 1 otherwise (the table says which).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

bin="" out="" small=0 budget="" peer=1 only="" train_lm="" data=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --small) small=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    --no-peer) peer=0; shift ;;
    --only) only=",$2,"; shift 2 ;;
    --train-lm) train_lm=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "device-session: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "device-session: --out DIR is required" >&2; exit 2; }
if [ -z "$bin" ]; then
  if [ -f .device-kit/kit.tar.xz ]; then
    # The bundle (scripts/device-bundle.sh): unpacked outside the working tree.
    kit=${TMPDIR:-/tmp}/device-kit
    rm -rf "$kit" && mkdir -p "$kit"
    if ! tar -xJf .device-kit/kit.tar.xz -C "$kit" 2> /dev/null; then
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' .device-kit/kit.tar.xz "$kit" ||
        { echo "device-session: cannot unpack .device-kit/kit.tar.xz" >&2; exit 2; }
    fi
    bin=$kit/bin
  else
    bin=build/bench
  fi
fi
exe=$bin/device_session
[ -x "$exe" ] || { echo "device-session: no device_session in $bin (build it, or make the bundle: scripts/device-bundle.sh)" >&2; exit 2; }
[ -n "$budget" ] || budget=$([ $small = 1 ] && echo 300 || echo 450)
mkdir -p "$out"
out=$(cd "$out" && pwd)
rows=$out/rows.tsv
: > "$rows"
start=$(date +%s)
status=0

# Our programs' libraries: the bundle's, the CUDA toolkit's (cudart, cuBLAS), then PyTorch's environment for what
# the toolkit lacks there (cuDNN and NCCL: found, never bundled; one of cuDNN's libraries alone is 234 MB;
# device_session looks them up only to report their versions). Only our programs get this path: the bundle's
# Debian libraries must not replace those of the machine's Python (the PyTorch peer).
libdirs=""
[ -d "$bin/../lib" ] && libdirs=$(cd "$bin/../lib" && pwd)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && libdirs="$libdirs:$d"; done
if command -v python3 > /dev/null; then
  for d in $(python3 -c 'import glob, os, site
for s in site.getsitepackages():
    print(" ".join(sorted(glob.glob(os.path.join(s, "nvidia", "*", "lib")))))' 2>/dev/null); do
    libdirs="$libdirs:$d"
  done
fi
kit_ld="${libdirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ $small = 1 ]; then
  export HALIAX_PORTABLE_KERNELS=1   # the kernels a GPU runs, on this CPU
else
  export HALIAX_CACHE_MB=${HALIAX_CACHE_MB:-65536}   # keep a step's buffers: no allocation in a steady-state step
fi

row() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" "${5:-}" >> "$rows"; }
# A stage is wanted when --only names it; "train_lm" names both train_lm runs.
wanted() { [ -z "$only" ] || [[ "$only" == *",$1,"* ]] || [[ "$1" == train_lm-* && "$only" == *",train_lm,"* ]]; }

# run NAME LIMIT COMMAND...: one stage, its output in NAME.log, its @row lines into the table.
run() {
  local name=$1 limit=$2
  shift 2
  wanted "$name" || return 0
  local left=$(( budget - ($(date +%s) - start) ))
  if [ "$left" -lt 10 ]; then
    row "stages" "$name" "skipped" "" "the session's ${budget} s were spent"
    echo "== $name: skipped (time budget)"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit} s): $*"
  local t0=$(date +%s) rc
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  grep -v '^@' "$out/$name.log" | tail -n 40
  grep '^@row' "$out/$name.log" | cut -f2- >> "$rows"
  local took=$(( $(date +%s) - t0 ))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    row "stages" "$name" "TIMED OUT" "after ${limit} s" "see $name.log"
    status=1
  elif [ $rc -ne 0 ]; then
    row "stages" "$name" "FAILED (exit $rc)" "${took} s" "see $name.log"
    status=1
  else
    row "stages" "$name" "ok" "${took} s" ""
  fi
}

if [ $small = 1 ]; then
  B=4 S=128 LB=4 LS=128 RB=2 RS=64 sz=--small
else
  B=8 S=1024 LB=4 LS=2048 RB=4 RS=1024 sz=
fi
ds=(env LD_LIBRARY_PATH="$kit_ld" "$exe" --out "$out")
[ -n "$sz" ] && ds+=("$sz")

run env 30 "${ds[@]}" --stage env
run checks 90 "${ds[@]}" --stage checks
run ceilings 60 "${ds[@]}" --stage ceilings
run ops 60 "${ds[@]}" --stage ops
run gpt2-bf16 120 "${ds[@]}" --stage step --model gpt2 --precision bf16 --batch $B --seq $S --kernels
run repro-1 45 "${ds[@]}" --stage repro --precision bf16 --batch $RB --seq $RS --steps 3
run repro-2 45 "${ds[@]}" --stage repro --precision bf16 --batch $RB --seq $RS --steps 3
if wanted repro-1 && wanted repro-2 && [ -f "$out/repro-1.log" ] && [ -f "$out/repro-2.log" ]; then
  a=$(grep '^@repro' "$out/repro-1.log"); b=$(grep '^@repro' "$out/repro-2.log")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then
    row "reproducibility" "two fresh processes" "bitwise identical" "" "$(echo "$a" | wc -l) losses and the parameter hash"
  else
    row "reproducibility" "two fresh processes" "FAILED: they differ" "" "compare repro-1.log and repro-2.log"
    status=1
  fi
fi
# train_lm itself on the device, before the peer and the larger steps so that a short budget still runs it:
# config/gpt2_nano.yaml and config/llama2_nano.yaml (100 steps each, 10 with --small), each twice, the same losses
# expected.
[ -n "$train_lm" ] || { [ -x "$bin/train_lm" ] && train_lm=$bin/train_lm; }
[ -n "$data" ] || { if [ -f "$bin/../data/train.jsonl" ]; then data=$bin/../data; else data=build/data/fortunes; fi; }
if [ -n "$train_lm" ] && wanted train_lm; then
  if [ -f "$data/train.jsonl" ]; then
    data=$(cd "$data" && pwd)
    steps=$([ $small = 1 ] && echo 10 || echo 100)
    losses() { grep '"event":"log"' "$out/train_lm/$1/metrics.jsonl" 2> /dev/null | grep -o '"\(train\|eval\)/loss":[^,}]*'; }
    # GPT-2 (stages train_lm-a, train_lm-b) and Llama (train_lm-llama-a, -b), each twice from scratch. On a CPU
    # (--small) the nano Llama's default 11008-wide MLP makes a step of its 32 x 256 tokens take seconds: 4 steps of
    # 8 sequences there.
    for model in gpt2 llama2; do
      tag=$([ $model = gpt2 ] && echo "" || echo "llama-")
      extra=()
      [ $small = 1 ] && [ $model = llama2 ] && extra=(--trainer.train_batch_size 8 --trainer.max_eval_batches 1) && steps=4
      for r in a b; do
        run "train_lm-$tag$r" 120 env LD_LIBRARY_PATH="$kit_ld" "$train_lm" "config/${model}_nano.yaml" --trainer.id "kit-$model-$r" \
          "${extra[@]}" --trainer.num_train_steps $steps --trainer.steps_per_eval $steps --trainer.log_dir "$out/train_lm" \
          --trainer.checkpointer.base_path "$out/ckpt" --data.train_urls "[\"$data/train.jsonl\"]" \
          --data.validation_urls "[\"$data/validation.jsonl\"]" --data.cache_dir "$out/cache-$model-$r"
      done
      wanted "train_lm-${tag}a" || continue
      la=$(losses "kit-$model-a"); lb=$(losses "kit-$model-b")
      if [ -n "$la" ] && [ "$la" = "$lb" ]; then
        row "train_lm" "config/${model}_nano.yaml, $steps steps, twice" "bitwise identical" \
          "$(echo "$la" | grep train/loss | tail -n 1)" "$(echo "$la" | grep eval/loss | tail -n 1)"
      else
        row "train_lm" "config/${model}_nano.yaml, $steps steps, twice" "FAILED: losses differ or missing" "" \
          "see train_lm-${tag}a.log, train_lm-${tag}b.log"
        status=1
      fi
    done
  else
    row "train_lm" "config/gpt2_nano.yaml" "not run" "" "no corpus at $data (pass --data DIR)"
  fi
fi
if [ $peer = 1 ] && python3 -c 'import torch' 2> /dev/null; then
  run peer-torch 200 env PYTHONUNBUFFERED=1 python3 bench/reference/torch_gpt2_step.py $sz --batch $B --seq $S \
    --precision bf16 --steps 5
elif wanted peer-torch; then
  row "peer: PyTorch" "GPT-2 step" "not run" "" "$([ $peer = 1 ] && echo 'python3 cannot import torch here' || echo '--no-peer')"
fi
run gpt2-f32 120 "${ds[@]}" --stage step --model gpt2 --precision f32 --batch $B --seq $S
run llama-bf16 150 "${ds[@]}" --stage step --model llama1b --precision bf16 --batch $LB --seq $LS
run gpt2-bf16-max 150 "${ds[@]}" --stage step --model gpt2 --precision bf16 --batch max --seq $S --steps 2

# Ours against the peer, same card, same call: tokens/s ratios.
ours=$(awk -F'\t' '$1 ~ /^step: GPT-2.*bf16$/ && $2 == "time per step" && $1 !~ /max/ {split($4, a, " "); print a[1]; exit}' "$rows")
for mode in eager compile; do
  theirs=$(awk -F'\t' -v m="$mode: time per step" '$1 ~ /^peer: PyTorch/ && $2 == m {split($4, a, " "); print a[1]; exit}' "$rows")
  if [ -n "$ours" ] && [ -n "$theirs" ]; then
    row "ratios" "GPT-2 bf16 step: ours / PyTorch $mode (tokens/s)" "$(awk -v a="$ours" -v b="$theirs" 'BEGIN {printf "%.3f", a / b}')" "" "above 1: we are faster"
  fi
done
grep -q $'\tFAILED' "$rows" && status=1

{
  echo "# Device kit session"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%MZ), $(cat "$bin/../kit-info.txt" 2> /dev/null | head -n 1 || echo "binary $exe"), $(( $(date +%s) - start )) s"
  echo
  echo "| section | item | value | comparison | note |"
  echo "| --- | --- | --- | --- | --- |"
  awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}' "$rows"
} > "$out/summary.md"
echo
cat "$out/summary.md"
exit $status
