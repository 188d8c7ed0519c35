#!/usr/bin/env bash
# The optimizers written as rules (lion, adopt, rmsprop, cautious, mars, muon, scion, mini, soap, kron, sophia-h;
# optim/rules.hpp)
# through the real program: each trains GPT-2 (the embedded default) with falling loss and resumes from a checkpoint
# to byte-identical losses and final state; each trains a nano Llama;
# Cautious trains on 2 ranks under ZeRO-1, FSDP and tensor parallelism, Muon, Kron and Sophia-H under ZeRO-1 and FSDP, to the losses
# of one process; a model average (trainer.model_averaging) is evaluated and resumes bitwise.
# Usage: train_lm_optimizers.sh PART TRAIN_LM REPO_VIEW WORK_DIR [MPIEXEC]
# PART is gpt2 (training and resuming on GPT-2, the model average), llama (the nano Llama) or ranks (2 ranks against
# one process): three tests, so that CTest runs them side by side.
set -euo pipefail
part=$1
shift
case $part in gpt2 | llama | ranks) ;; *) echo "train_lm_optimizers.sh: PART must be gpt2, llama or ranks, not '$part'" >&2; exit 2 ;; esac
train_lm=$(realpath "$1")
repo=$(realpath "$2")
work=$3
mpiexec=${4:-}
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"
work=$(pwd)
types=(lion adopt rmsprop cautious mars muon scion mini soap kron sophia-h)

common=(--trainer.num_train_steps 12 --trainer.steps_per_eval 1000 --trainer.log_dir "$work/logs"
        --trainer.checkpointer.base_path "$work/ckpt" --trainer.checkpointer.keep '[{every: 6}]')
run() { timeout 300 "$train_lm" "${common[@]}" "$@"; }

# train/loss per step, the last record of each step (a resumed run logs the steps after its checkpoint again).
losses() {
  grep '"event":"log"' "logs/$1/metrics.jsonl" | grep '"train/loss"' |
    sed -E 's/.*"step":([0-9]+).*"train\/loss":([^,}]*).*/\1 \2/' |
    awk '{ last[$1] = $2 } END { for (s in last) print s, last[s] }' | sort -n
}
# The run's first and final loss from its summary; the final must be below the first.
falls() {
  local first final
  first=$(sed -nE 's/.*"first_loss": ([^,]*),.*/\1/p' "logs/$1/summary.json")
  final=$(sed -nE 's/.*"final_loss": ([^,]*),.*/\1/p' "logs/$1/summary.json")
  awk -v a="$first" -v b="$final" 'BEGIN { exit !(b < a) }' || fail "$1: the loss did not fall ($first -> $final)"
  echo "OK: $1 loss $first -> $final"
}

# resumes ID ARGS...: without its final checkpoint, the same command resumes from step-6 and must end where it ended.
resumes() {
  local id=$1
  shift
  losses "$id" > "$id.losses"
  mv "ckpt/$id/step-12" "$id.step-12"
  run "$@" --trainer.id "$id" > "$id.resumed.out" 2>&1 || { cat "$id.resumed.out"; fail "$id: resume failed"; }
  grep -q "resumed from .*step-6" "$id.resumed.out" || { cat "$id.resumed.out"; fail "$id: did not resume from step-6"; }
  losses "$id" > "$id.resumed.losses"
  cmp "$id.losses" "$id.resumed.losses" || { paste "$id.losses" "$id.resumed.losses"; fail "$id: resumed losses differ"; }
  for f in model.h5 opt_state.h5 training_state.h5; do
    cmp "$id.step-12/$f" "ckpt/$id/step-12/$f" || fail "$id: step-12/$f differs after resuming"
  done
  echo "OK: $id resumed from step-6 to byte-identical losses and step-12 state"
}

# own_args TYPE: SOAP and Kron pad every block to block_size; 64 keeps this small model's blocks small (and cuts its
# 257-token vocabulary into 5 blocks). Sophia-H re-estimates its Hessian every 3 steps (Hessian products at steps 3,
# 6, 9, 12: the checkpoint at 6 holds the probe key a resumed run must continue from).
own_args() {
  case $1 in
    soap | kron) echo --optimizer.block_size 64 ;;
    sophia-h) echo --optimizer.update_interval 3 ;;
  esac
}
if [ "$part" = gpt2 ]; then
for t in "${types[@]}"; do
  read -ra own <<< "$(own_args "$t")"
  run --optimizer.type "$t" "${own[@]}" --trainer.id "g-$t" > "g-$t.out" 2>&1 || { cat "g-$t.out"; fail "$t on GPT-2 failed"; }
  grep -rq "type: $t" "logs/g-$t" || fail "$t: the run's config does not record the optimizer"
  falls "g-$t"
  resumes "g-$t" --optimizer.type "$t" "${own[@]}"
done

# trainer.model_averaging: the average is evaluated beside the model (eval/ema/...), checkpointed with the optimizer
# state and resumed to the same bits.
ema=(--optimizer.type lion --trainer.model_averaging '{type: ema, beta: 0.9}' --trainer.steps_per_eval 6)
run "${ema[@]}" --trainer.id ema > ema.out 2>&1 || { cat ema.out; fail "model averaging failed"; }
grep -q '"eval/ema/loss"' logs/ema/metrics.jsonl || fail "ema: no eval/ema/loss in the metrics"
grep -q '"eval/loss"' logs/ema/metrics.jsonl || fail "ema: the current model is no longer evaluated"
grep -q "eval step 11  (average)" ema.out || { cat ema.out; fail "ema: the final evaluation of the average is missing"; }
strings ckpt/ema/step-12/opt_state.h5 | grep model_averaging > /dev/null || fail "ema: opt_state.h5 holds no model average"
resumes ema "${ema[@]}"
fi

# A nano Llama (config/llama2_nano.yaml, from the repository root as a user runs it), with every rule: its Linears are
# laid out outputs first and its untied lm_head is left to Adam by Muon and Scion, named "lm_head" by Adam-mini.
# (Kron at 3e-3: its first steps, RMS-clipped from identity factors, move this model's loss by under 1e-2 at 1e-3.)
# Sequences of 64 tokens: at the config's 256 the eleven runs took 78 s of the suite, at 64 about 20.
if [ "$part" = llama ]; then
for t in "${types[@]}"; do
  read -ra own <<< "$(own_args "$t")"
  lr=1e-3
  [ "$t" = kron ] && lr=3e-3
  (cd "$repo" && timeout 300 "$train_lm" config/llama2_nano.yaml "${common[@]}" --optimizer.type "$t" "${own[@]}" --optimizer.learning_rate "$lr" \
                     --trainer.num_train_steps 5 --trainer.train_batch_size 4 --trainer.max_eval_batches 1 --model.seq_len 64 \
                     --trainer.id "l-$t") > "l-$t.out" 2>&1 ||
    { cat "l-$t.out"; fail "$t on Llama failed"; }
  falls "l-$t"
done
fi

# Two ranks: ZeRO-1, FSDP and tensor parallelism against one process (float tolerance: the batch's micro-batches
# are summed in another grouping, as for AdamW in mpi_train_lm.sh; the updates themselves are bitwise those of
# one process for the same gradient, tests/test_distributed.cpp).
if [ "$part" = ranks ]; then
  [ -n "$mpiexec" ] || { echo "no mpiexec given: the 2-rank part needs one" >&2; exit 2; }
  mpi=("$mpiexec" --oversubscribe)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
  export HALIAX_NUM_THREADS=1
  par=(--trainer.num_train_steps 8 --trainer.train_batch_size 32 --trainer.per_device_parallelism 8)
  close() {  # close RUN_A RUN_B REL
    losses "$1" > "$1.losses"
    losses "$2" > "$2.losses"
    paste "$1.losses" "$2.losses" | awk -v rel="$3" '
      { d = $2 - $4; if (d < 0) d = -d; if (d > rel * ($2 < 0 ? -$2 : $2)) { print "step " $1 ": " $2 " vs " $4; bad = 1 } ; n++ }
      END { exit (bad || n != 8) }' || fail "$2's losses are not within $3 of $1's"
    echo "OK: $2 within $3 of $1"
  }
  # cautious: its per-leaf sums run over the model group under TP; muon: Newton-Schulz on matrices gathered from the
  # ranks' ranges; kron: its factors replicated, every rank fitting every block (tensor parallelism refused for
  # both); sophia-h: its Hessian products from gradients at perturbed parameters, each rank perturbing the part it
  # holds. Every rule's update: tests/test_distributed.cpp.
  for t in cautious muon kron sophia-h; do
    read -ra own <<< "$(own_args "$t")"
    run --optimizer.type "$t" "${own[@]}" "${par[@]}" --trainer.id "ref-$t" > "ref-$t.out" 2>&1 || { cat "ref-$t.out"; fail "$t: reference failed"; }
    timeout 300 "${mpi[@]}" -n 2 "$train_lm" "${common[@]}" --optimizer.type "$t" "${own[@]}" "${par[@]}" --trainer.id "zero-$t" \
      --trainer.shard_parameters false > "zero-$t.out" 2>&1 || { cat "zero-$t.out"; fail "$t: ZeRO-1 on 2 ranks failed"; }
    close "ref-$t" "zero-$t" 1e-5
    timeout 300 "${mpi[@]}" -n 2 "$train_lm" "${common[@]}" --optimizer.type "$t" "${own[@]}" "${par[@]}" --trainer.id "fsdp-$t" \
      > "fsdp-$t.out" 2>&1 || { cat "fsdp-$t.out"; fail "$t: FSDP on 2 ranks failed"; }
    grep -q "FSDP" "fsdp-$t.out" || { cat "fsdp-$t.out"; fail "$t: the 2-rank run was not FSDP"; }
    close "ref-$t" "fsdp-$t" 1e-5
    [ "$t" != cautious ] && continue
    timeout 300 "${mpi[@]}" -n 2 "$train_lm" "${common[@]}" --optimizer.type "$t" "${par[@]}" --trainer.id "tp-$t" \
      --trainer.model_axis_size 2 --trainer.tensor_parallel_axes '[mlp, heads]' > "tp-$t.out" 2>&1 ||
      { cat "tp-$t.out"; fail "$t: tensor parallel on 2 ranks failed"; }
    close "ref-$t" "tp-$t" 1e-5
  done
fi
echo "OK: every rule optimizer ($part part)"
