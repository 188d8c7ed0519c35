#!/usr/bin/env bash
# train_lm over MPI ranks (docs/distributed.md), through the real program under mpirun -n 1, 2 and 4 (oversubscribed
# on a small machine):
#  - at a fixed micro-batch size (per_device_parallelism), data parallel, ZeRO-1 and FSDP on 4 ranks (one
#    micro-batch each) and ZeRO-1 on 2 ranks (2 micro-batches each) give bitwise the losses, parameters and optimizer
#    state of one process (4 micro-batches): the gradients are summed along one tree whatever the rank count; FSDP on
#    2 ranks (2 micro-batches each, added after the sum over ranks) agrees within float tolerance; two runs on the
#    same ranks and mapping are bitwise equal; FSDP keeps at most 30% of one process's parameters and moments per rank;
#  - with the default micro-batch (the whole local batch) the rank counts agree within float tolerance;
#  - tensor parallelism (model axis 2: heads and mlp split, GPT-2 and Llama) and FSDP x tensor parallelism (data 2 x
#    model 2) agree with one process within float tolerance, and are bitwise reproducible; a checkpoint written under
#    FSDP x TP resumes on one process;
#  - mpirun -n 1 equals a run without mpirun;
#  - a checkpoint written by 4 ranks (ZeRO-1: state gathered) resumes on 2 ranks and on 1, bitwise;
#  - mistakes in the mapping end every rank with the message and exit code 2; a typo in fsdp_axis is named;
#  - SIGKILL of one rank ends the whole job within 30 s, leaves the committed checkpoints intact, and a restart
#    resumes to bitwise the losses of an uninterrupted run;
#  - four ranks opening one new token cache build it once (the others wait) and train;
#  - epoch: 2 ends the run where the data ends, at the same step on 1 process and 2 ranks (ZeRO-1), bitwise;
#  - supervised data (packed records, loss on the responses) trains bitwise alike on 1 process and 2 ranks, and so
#    does the sft program (single-turn chats, sft's packing, from a Hugging Face export).
# Usage: mpi_train_lm.sh TRAIN_LM MPIEXEC WORK_DIR
set -euo pipefail
train_lm=$(realpath "$1")
mpiexec=$2
work=$3
source "$(dirname "${BASH_SOURCE[0]}")/script_lib.sh"
fresh_work_dir "$work"
mpi=("$mpiexec" --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
# One thread per rank keeps 4 ranks on 2 cores from thrashing (the default is the node's cores / ranks).
export HALIAX_NUM_THREADS=1

common=(--trainer.num_train_steps 8 --trainer.steps_per_eval 1000 --trainer.train_batch_size 32
        --trainer.log_dir logs --trainer.checkpointer.base_path ckpt --trainer.checkpointer.keep '[{every: 4}]')
run1() { timeout 300 "$train_lm" "${common[@]}" "$@"; }
runn() { local n=$1; shift; timeout 300 "${mpi[@]}" -n "$n" "$train_lm" "${common[@]}" "$@"; }

# train/loss per step, the last record of each step.
losses() {
  grep '"event":"log"' "logs/$1/metrics.jsonl" | grep '"train/loss"' |
    sed -E 's/.*"step":([0-9]+).*"train\/loss":([^,}]*).*/\1 \2/' |
    awk '{ last[$1] = $2 } END { for (s in last) print s, last[s] }' | sort -n
}
same_state() {  # same_state RUN_A RUN_B STEP: byte-identical model and optimizer state
  for f in model.h5 opt_state.h5; do
    cmp -s "ckpt/$1/step-$3/$f" "ckpt/$2/step-$3/$f" || h5diff -q "ckpt/$1/step-$3/$f" "ckpt/$2/step-$3/$f" ||
      fail "$2: step-$3/$f differs from $1's"
  done
}
same_run() {  # same_run RUN_A RUN_B STEPS: STEPS logged steps, the same losses, the same state after the last
  losses "$1" > "$1.losses"
  losses "$2" > "$2.losses"
  [ "$(wc -l < "$1.losses")" -eq "$3" ] || fail "$1: expected $3 logged steps"
  cmp "$1.losses" "$2.losses" || fail "$2 gave other losses than $1"
  same_state "$1" "$2" "$3"
}
bitwise() {  # bitwise RUN_A RUN_B
  losses "$1" > "$1.losses"
  losses "$2" > "$2.losses"
  [ "$(wc -l < "$1.losses")" -eq 8 ] || fail "$1: expected 8 logged steps"
  cmp "$1.losses" "$2.losses" || { paste "$1.losses" "$2.losses" | head; fail "$2's losses differ from $1's"; }
  same_state "$1" "$2" 8
  echo "OK: $2 is bitwise $1 (losses, parameters, optimizer state)"
}
close() {  # close RUN_A RUN_B REL: every loss within REL relative
  losses "$1" > "$1.losses"
  losses "$2" > "$2.losses"
  paste "$1.losses" "$2.losses" | awk -v rel="$3" -v a="$1" -v b="$2" '
    { d = $2 - $4; if (d < 0) d = -d; if (d > rel * ($2 < 0 ? -$2 : $2)) { print "step " $1 ": " $2 " vs " $4; bad = 1 } ; n++ }
    END { if (bad || n != 8) exit 1; print "OK: " b " within " rel " of " a " at all " n " steps" }' ||
    fail "$2's losses are not within $3 of $1's"
}

run1 --trainer.id ref --trainer.per_device_parallelism 8 > ref.out 2>&1 || { cat ref.out; fail "the reference run failed"; }

runn 4 --trainer.id dp4 --trainer.fsdp_axis '[]' --trainer.per_device_parallelism 8 > dp4.out 2>&1 || { cat dp4.out; fail "mpirun -n 4 data parallel failed"; }
grep -q "4 ranks: mesh replica 1 x data 4 x model 1.*replicated" dp4.out || { cat dp4.out; fail "dp4: no plan line"; }
bitwise ref dp4

runn 4 --trainer.id zero4 --trainer.shard_parameters false --trainer.per_device_parallelism 8 > zero4.out 2>&1 || { cat zero4.out; fail "mpirun -n 4 ZeRO-1 failed"; }
grep -q "optimizer state sharded over data (ZeRO-1" zero4.out || { cat zero4.out; fail "zero4: not ZeRO-1"; }
bitwise ref zero4

# FSDP (the default mapping, fsdp_axis: embed) on 4 ranks, one micro-batch each.
runn 4 --trainer.id z4 --trainer.per_device_parallelism 8 > z4.out 2>&1 || { cat z4.out; fail "mpirun -n 4 FSDP failed"; }
grep -q "parameters and optimizer state sharded over data (FSDP" z4.out || { cat z4.out; fail "z4: not FSDP"; }
bitwise ref z4
# Parameters and moments kept per rank, against one process's.
grep -o "FSDP: each rank keeps at most [0-9]* of the [0-9]* parameters" z4.out | awk '{ print $7, $10 }' |
  awk '{ r = $1 / $2; printf "FSDP on 4 ranks: at most %d of %d parameters (and moments) per rank (%.1f%%)\n", $1, $2, 100 * r; exit !(NR == 1 && r <= 0.30) }' ||
  { cat z4.out; fail "FSDP keeps more than 30% of the parameters and moments per rank"; }

runn 2 --trainer.id zero2 --trainer.shard_parameters false --trainer.per_device_parallelism 8 > zero2.out 2>&1 || { cat zero2.out; fail "mpirun -n 2 ZeRO-1 failed"; }
bitwise ref zero2
runn 2 --trainer.id z2 --trainer.per_device_parallelism 8 > z2.out 2>&1 || { cat z2.out; fail "mpirun -n 2 FSDP failed"; }
runn 2 --trainer.id z2b --trainer.per_device_parallelism 8 > z2b.out 2>&1 || { cat z2b.out; fail "mpirun -n 2 FSDP failed"; }
close ref z2 1e-5
bitwise z2 z2b

# Tensor parallelism: 2 ranks, model axis 2 (no data parallelism); then FSDP x TP on 4 ranks (data 2 x model 2).
tp=(--trainer.model_axis_size 2 --trainer.tensor_parallel_axes '[mlp, heads]' --trainer.per_device_parallelism 8)
runn 2 --trainer.id tp2 "${tp[@]}" > tp2.out 2>&1 || { cat tp2.out; fail "mpirun -n 2 tensor parallel failed"; }
grep -q "mesh replica 1 x data 1 x model 2.*tensor parallel over model: mlp heads" tp2.out || { cat tp2.out; fail "tp2: no TP plan line"; }
runn 2 --trainer.id tp2b "${tp[@]}" > tp2b.out 2>&1 || { cat tp2b.out; fail "mpirun -n 2 tensor parallel failed"; }
close ref tp2 1e-5
bitwise tp2 tp2b
runn 4 --trainer.id ftp4 "${tp[@]}" > ftp4.out 2>&1 || { cat ftp4.out; fail "mpirun -n 4 FSDP x TP failed"; }
grep -q "data 2 x model 2.*(FSDP.*tensor parallel over model" ftp4.out || { cat ftp4.out; fail "ftp4: not FSDP x TP"; }
close ref ftp4 1e-5
# Its step-4 checkpoint (whole trees, gathered over both groups) resumes on one process.
mkdir -p ckpt/ftp4on1
cp -r ckpt/ftp4/step-4 ckpt/ftp4on1/
run1 --trainer.id ftp4on1 --trainer.per_device_parallelism 8 > ftp4on1.out 2>&1 || { cat ftp4on1.out; fail "resume of the FSDP x TP checkpoint on 1 failed"; }
grep -q "resumed from ckpt/ftp4on1/step-4 at step 4" ftp4on1.out || { cat ftp4on1.out; fail "did not resume ftp4 on 1"; }
losses ftp4 | awk '$1 >= 4' > ftp4.tail
losses ftp4on1 | paste ftp4.tail - | awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2) bad = 1; n++ } END { exit bad || n != 4 }' ||
  fail "FSDP x TP checkpoint resumed on 1 process: losses not within 1e-5"
# Llama (grouped-query heads split with the query heads) under TP against one process.
llama=(--model.type llama --model.seq_len 128 --model.hidden_dim 32 --model.intermediate_dim 64 --model.num_heads 4
       --model.num_kv_heads 2 --model.num_layers 2 --trainer.train_batch_size 8)
run1 "${llama[@]}" --trainer.id lref > lref.out 2>&1 || { cat lref.out; fail "llama reference failed"; }
runn 2 "${llama[@]}" --trainer.id ltp2 --trainer.model_axis_size 2 --trainer.tensor_parallel_axes '[mlp, heads]' \
  > ltp2.out 2>&1 || { cat ltp2.out; fail "llama under TP failed"; }
grep -q "tensor parallel over model: mlp heads kv_head" ltp2.out || { cat ltp2.out; fail "ltp2: kv heads not split"; }
close lref ltp2 1e-5
echo "OK: tensor parallelism (GPT-2, Llama) and FSDP x TP agree with one process"
runn 4 --trainer.id default4 > default4.out 2>&1 || { cat default4.out; fail "mpirun -n 4 with the default micro-batch failed"; }

run1 --trainer.id plain > plain.out 2>&1 || { cat plain.out; fail "plain run failed"; }
runn 1 --trainer.id n1 > n1.out 2>&1 || { cat n1.out; fail "mpirun -n 1 failed"; }
bitwise plain n1
close plain default4 1e-5

# A 4-rank FSDP checkpoint (step-4: gathered to rank 0) resumes on 2 ranks (ZeRO-1: bitwise; FSDP: within float
# tolerance, its 2 micro-batches per rank add in another order) and on 1.
for n in 2 1 2f; do
  mkdir -p "ckpt/from4on$n"
  cp -r ckpt/z4/step-4 "ckpt/from4on$n/"
  if [ "$n" = 1 ]; then
    run1 --trainer.id "from4on$n" --trainer.per_device_parallelism 8 > "from4on$n.out" 2>&1 || { cat "from4on$n.out"; fail "resume on 1 failed"; }
  elif [ "$n" = 2 ]; then
    runn 2 --trainer.id "from4on$n" --trainer.shard_parameters false --trainer.per_device_parallelism 8 > "from4on$n.out" 2>&1 || { cat "from4on$n.out"; fail "resume on 2 failed"; }
  else
    runn 2 --trainer.id "from4on$n" --trainer.per_device_parallelism 8 > "from4on$n.out" 2>&1 || { cat "from4on$n.out"; fail "FSDP resume on 2 failed"; }
  fi
  grep -q "resumed from ckpt/from4on$n/step-4 at step 4" "from4on$n.out" || { cat "from4on$n.out"; fail "did not resume on $n"; }
done
losses z4 | awk '$1 >= 4' > z4.tail
losses from4on2f | paste z4.tail - | awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2) bad = 1; n++ } END { exit bad || n != 4 }' ||
  fail "resumed on 2 FSDP ranks: losses not within 1e-5 of the 4-rank run's"
losses from4on1 > from4on1.losses
cmp z4.tail from4on1.losses || fail "resumed on 1 rank: losses differ from the 4-rank run's"
same_state z4 from4on1 8
losses from4on2 > from4on2.losses
cmp z4.tail from4on2.losses || fail "resumed on 2 ranks: losses differ from the 4-rank run's"
same_state z4 from4on2 8
echo "OK: a 4-rank checkpoint resumes on 1 rank and on 2 ranks, bitwise"

# Mapping mistakes: every rank stops with the message, exit code 2.
set +e
runn 4 --trainer.id bad1 --trainer.train_batch_size 30 > bad1.out 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat bad1.out; fail "a batch that does not divide over 4 ranks: exit $code, expected 2"; }
grep -q "train_batch_size: 30 (from step 0) does not divide over 4 ranks" bad1.out || { cat bad1.out; fail "bad1 message"; }
set +e
runn 2 --trainer.id bad2 --trainer.fsdp_axis embd > bad2.out 2>&1
code=$?
set -e
[ "$code" -eq 2 ] || { cat bad2.out; fail "fsdp_axis typo: exit $code, expected 2"; }
grep -q "trainer.fsdp_axis: 'embd' is not an axis of the model's parameters (they have: .*embed" bad2.out ||
  { cat bad2.out; fail "bad2 message"; }
set +e
runn 4 --trainer.id bad3 --trainer.model_axis_size 3 --trainer.tensor_parallel_axes '[mlp]' > bad3.out 2>&1
code3=$?
runn 2 --trainer.id bad4 --trainer.model_axis_size 2 > bad4.out 2>&1
code4=$?
runn 4 --trainer.id bad5 --trainer.model_axis_size 4 --trainer.tensor_parallel_axes '[heads]' --model.num_heads 2 > bad5.out 2>&1
code5=$?
set -e
[ "$code3" -eq 2 ] && grep -q "trainer.model_axis_size: 3 does not divide the 4 ranks" bad3.out || { cat bad3.out; fail "bad3"; }
[ "$code4" -eq 2 ] && grep -q "trainer.model_axis_size: 2 needs trainer.tensor_parallel_axes" bad4.out || { cat bad4.out; fail "bad4"; }
[ "$code5" -eq 2 ] && grep -q "axis 'heads' of '.*' has size 2, which does not divide over 4 ranks" bad5.out || { cat bad5.out; fail "bad5"; }
echo "OK: mapping mistakes end every rank with exit 2 and the key"

# SIGKILL of one rank: the job ends within 30 s; a restart resumes bitwise.
long=(--trainer.num_train_steps 60 --trainer.checkpointer.keep '[{every: 10}]' --trainer.per_device_parallelism 16)
runn 2 "${long[@]}" --trainer.id whole2 > whole2.out 2>&1 || { cat whole2.out; fail "the uninterrupted 2-rank run failed"; }
timeout 300 "${mpi[@]}" -n 2 "$train_lm" "${common[@]}" "${long[@]}" --trainer.id killed > killed1.out 2>&1 &
job=$!
# The rank to kill is found while the job starts, so that it dies the moment step 10 is committed (the whole run
# takes a few seconds; looking for it afterwards could miss the job on a loaded machine).
rank_of_killed() {  # the pid of one train_lm rank of the job, or nothing (never fails: set -e)
  local p
  for p in $(pgrep -f -- "--trainer.id killed" || true); do
    if [ "$(cat /proc/"$p"/comm 2> /dev/null)" = train_lm ]; then echo "$p"; fi
  done | tail -1
}
victim=""
for _ in $(seq 1 1200); do
  [ -n "$victim" ] || victim=$(rank_of_killed)
  if [ -n "$victim" ] && [ -f ckpt/killed/step-10/metadata.json ]; then break; fi
  kill -0 "$job" 2> /dev/null || break
  sleep 0.02
done
[ -f ckpt/killed/step-10/metadata.json ] || { cat killed1.out; fail "no checkpoint at step 10"; }
[ -n "$victim" ] || fail "no train_lm rank to kill"
t0=$(date +%s)
kill -9 "$victim" || { cat killed1.out; fail "the job ended before a rank could be killed"; }
set +e
wait "$job"
code=$?
set -e
elapsed=$(($(date +%s) - t0))
[ "$code" -ne 0 ] || fail "the job finished normally after a rank was killed"
[ "$elapsed" -le 30 ] || fail "the job took ${elapsed}s to end after a rank was killed"
[ -f logs/killed/summary.json ] && fail "the killed job wrote its summary"
echo "killed rank $victim; mpirun ended in ${elapsed}s with exit $code; checkpoints: $(ls ckpt/killed | tr '\n' ' ')"
runn 2 "${long[@]}" --trainer.id killed > killed2.out 2>&1 || { cat killed2.out; fail "the restarted job failed"; }
grep -q "resumed from" killed2.out || { cat killed2.out; fail "the restart did not resume"; }
same_run whole2 killed 60  # after SIGKILL of a rank and a restart
echo "OK: SIGKILL of a rank ends the job in ${elapsed}s; the restart resumes to bitwise the uninterrupted run"

# Four ranks, one new token cache: built once, the others wait for it.
runn 4 --trainer.id cache4 --data.cache_dir "$work/newcache" > cache4.out 2>&1 || { cat cache4.out; fail "4 ranks on a new cache failed"; }
[ -f newcache/train/shard_ledger.json ] || fail "the cache was not built"
grep -q '"is_finished": *true' newcache/train/shard_ledger.json || fail "the cache is not finished"
bitwise default4 cache4
echo "OK: 4 ranks built one cache and trained on it"

# epoch: N ends the run where the data ends, at the same step on 1 and 2 ranks, bitwise (every rank computes the
# data's length itself; a rank that stopped elsewhere would hang the job).
for i in $(seq 1 200); do
  printf '{"text": "document %d: the cat sat on the mat, and the dog ran after it again and again (%d)"}\n' "$i" $((i * 7))
done > epoch.jsonl
ep=(--data.train_urls '["epoch.jsonl"]' --data.validation_urls '[]' --data.cache_dir epochcache --data.tokenizer byte
    --data.shuffle true --epoch 2 --trainer.num_train_steps 1000 --trainer.per_device_parallelism 8
    --trainer.shard_parameters false)
run1 --trainer.id ep1 "${ep[@]}" > ep1.out 2>&1 || { cat ep1.out; fail "epoch: 2 on one process failed"; }
runn 2 --trainer.id ep2 "${ep[@]}" > ep2.out 2>&1 || { cat ep2.out; fail "epoch: 2 on 2 ranks (ZeRO-1) failed"; }
end=$(grep -o "training stops after step [0-9]*" ep1.out | awk '{ print $5 }')
[ -n "$end" ] && [ "$end" -gt 4 ] && [ "$end" -lt 1000 ] || { cat ep1.out; fail "epoch: 2 did not end the run early"; }
grep -q "training stops after step $end of" ep2.out || { cat ep2.out; fail "2 ranks stopped elsewhere than step $end"; }
same_run ep1 ep2 "$end"
echo "OK: epoch: 2 ends at step $end on 1 and 2 ranks, bitwise"

# Supervised data (packed {prompt, response} records, trained on the responses) on 2 ranks (ZeRO-1): every rank
# packs the same examples, so the losses and state are bitwise those of one process.
for i in $(seq 1 160); do
  printf '{"prompt": "Q%d: what follows %d?", "response": " %d, then %d."}\n' "$i" "$i" $((i + 1)) $((i + 2))
done > sft.jsonl
sft=(--data.train_urls '["sft.jsonl"]' --data.validation_urls '[]' --data.cache_dir sftcache --data.tokenizer byte
     --data.format '{type: supervised}' --trainer.per_device_parallelism 8 --trainer.shard_parameters false)
run1 --trainer.id sft1 "${sft[@]}" > sft1.out 2>&1 || { cat sft1.out; fail "supervised data on one process failed"; }
runn 2 --trainer.id sft2 "${sft[@]}" > sft2.out 2>&1 || { cat sft2.out; fail "supervised data on 2 ranks failed"; }
grep -q "160 records packed into" sft1.out || { cat sft1.out; fail "the supervised records were not packed"; }
same_run sft1 sft2 8
echo "OK: supervised data trains bitwise alike on 1 process and 2 ranks (ZeRO-1)"

# sft (docs/sft.md) on 2 ranks (ZeRO-1) equals one process, bitwise: every rank reads the same permuted rows and packs
# the same examples. The model to fine-tune is a Hugging Face export of a short train_lm run (the embedded default's
# architecture: max_seq_len is its 128 positions).
sft_bin="$(dirname "$train_lm")/sft"
run1 --trainer.id base "${sft[@]}" --hf_save_path hf --hf_save_steps 4 > base.out 2>&1 ||
  { cat base.out; fail "the run to fine-tune failed"; }
[ -f hf/base/step-7/config.json ] || { cat base.out; fail "no Hugging Face export to fine-tune"; }
for i in $(seq 1 120); do
  printf '{"messages": [{"role": "user", "content": "Q%d: what follows %d?"}, {"role": "assistant", "content": "%d."}]}\n' \
    "$i" "$i" $((i + 1))
done > chats.jsonl
chat=(--tokenizer byte --chat_train_urls '["chats.jsonl"]' --supervised_data '{cache_dir: chatcache}'
      --initialize_from_hf hf/base/step-7 --max_seq_len 128 --epoch 9 --trainer.per_device_parallelism 8
      --trainer.shard_parameters false)
timeout 300 "$sft_bin" "${common[@]}" --trainer.id chat1 "${chat[@]}" > chat1.out 2>&1 ||
  { cat chat1.out; fail "sft on one process failed"; }
timeout 300 "${mpi[@]}" -n 2 "$sft_bin" "${common[@]}" --trainer.id chat2 "${chat[@]}" > chat2.out 2>&1 ||
  { cat chat2.out; fail "sft on 2 ranks failed"; }
grep -q "120 records, 9 epochs, packed into" chat1.out || { cat chat1.out; fail "sft did not pack its rows"; }
same_run chat1 chat2 8
echo "OK: sft trains bitwise alike on 1 process and 2 ranks (ZeRO-1)"
