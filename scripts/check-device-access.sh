#!/usr/bin/env bash
# Finds host code that reads or writes array memory where a GPU build would have it in device memory, without a
# GPU. Builds the project with AddressSanitizer in a separate build directory and runs the programs a GPU run
# uses under HALIAX_DEVICE_GUARD=1 (haliax/detail/device_guard.hpp): array memory is poisoned outside Kokkos
# kernels and deep copies, and the portable kernels (the ones a GPU runs) are on. A host access to an array's
# elements then stops the program with AddressSanitizer's "use-after-poison" report, its stack and where the
# array was allocated. On a CPU build these accesses work; on a GPU they crash (docs/portability.md).
#
# Usage: scripts/check-device-access.sh [BUILD_DIR]     (default: build-guard)
# Environment: JOBS (build parallelism, default 2), TESTS (the test programs to run, default below),
# STEPS (train_lm steps, default 12). With mpirun on the PATH, test_distributed also runs on 3 ranks.
# Not part of CI: the ASan build of train_lm and the test programs takes about 30 minutes on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-guard}
jobs=${JOBS:-2}
tests=${TESTS:-"test_core test_nn test_grad_nn test_loss test_flash_attention test_optim test_gpt2 test_llama test_checkpoint"}
steps=${STEPS:-12}

flags="-fsanitize=address -fno-omit-frame-pointer -g1"
export CFLAGS="$flags" CXXFLAGS="$flags" LDFLAGS="-fsanitize=address"
# Leaks are not what this looks for (scripts/sanitize-tests.sh does); the first report ends the program.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=0:exitcode=23"

echo "check-device-access: configuring $build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" \
  -DHALIAX_FUZZ=OFF >/dev/null
targets="train_lm haliax_device_guard_probe haliax_test_distributed"
for t in $tests; do targets="$targets haliax_$t"; done
echo "check-device-access: building $targets ($jobs jobs)"
start=$(date +%s)
# shellcheck disable=SC2086
cmake --build "$build" -j "$jobs" --target $targets
echo "check-device-access: built in $(( $(date +%s) - start )) s"

# From here on every program runs under the guard (not the build: doctest lists the test cases at link time).
export HALIAX_DEVICE_GUARD=1
failed=()

# The guard must catch a host read of array memory, or a clean run below would prove nothing.
probe=$build/tests/haliax_device_guard_probe
"$probe" good >"$build/guard-probe-good.log" 2>&1 || failed+=("probe: a read through to_host() was refused")
probe_rc=0
"$probe" bad >"$build/guard-probe-bad.log" 2>&1 || probe_rc=$?
if [ "$probe_rc" -ne 23 ] || ! grep -q "use-after-poison" "$build/guard-probe-bad.log"; then
  failed+=("probe: a host read through data() was not caught (exit $probe_rc)")
fi

run() {
  local name=$1; shift
  echo "check-device-access: $name"
  if ! "$@" >"$build/guard-$name.log" 2>&1; then
    failed+=("$name")
    echo "check-device-access: $name FAILED ($build/guard-$name.log):"
    grep -m1 -A30 "ERROR: AddressSanitizer" "$build/guard-$name.log" || tail -30 "$build/guard-$name.log"
  fi
}

for t in $tests; do
  prog=$build/tests/haliax_$t
  [ -x "$prog" ] || prog=
  if [ -z "$prog" ]; then failed+=("$t (not built)"); continue; fi
  run "$t" "$prog"
done

# The collectives, ZeRO-1, FSDP and tensor parallelism on 3 ranks (their host buffers and the shards' copies).
if command -v mpirun >/dev/null; then
  run test_distributed_mpi mpirun --oversubscribe --allow-run-as-root -n 3 -x HALIAX_DEVICE_GUARD -x ASAN_OPTIONS \
    -x HALIAX_NUM_THREADS=1 "$build/tests/haliax_test_distributed"
else
  echo "check-device-access: no mpirun: the 3-rank test_distributed run is skipped"
fi

# train_lm end to end on the embedded default: data, steps, evaluation, watch, a checkpoint, and a resume from it.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"  # train_lm writes its logs/ and run directories here
common=(--trainer.num_train_steps "$steps" --trainer.steps_per_eval 6 --trainer.checkpointer.base_path "$work/ckpt"
        --trainer.checkpointer.keep '[{every: 6}]' --trainer.watch.interval 5 --data.cache_dir "$work/cache" --trainer.id guard)
run train_lm "$build/examples/train_lm" "${common[@]}"
run train_lm_resume "$build/examples/train_lm" "${common[@]}" --trainer.num_train_steps $((steps + 2))

# train_lm on 2 ranks: FSDP (the default), ZeRO-1 and tensor parallelism.
if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe --allow-run-as-root -n 2 -x HALIAX_DEVICE_GUARD -x ASAN_OPTIONS -x HALIAX_NUM_THREADS=1)
  ranks=(--trainer.num_train_steps 6 --trainer.train_batch_size 32 --trainer.per_device_parallelism 8
         --trainer.steps_per_eval 3 --trainer.watch.interval 3 --data.cache_dir "$work/cache"
         --trainer.checkpointer.base_path "$work/ckpt-mpi" --trainer.checkpointer.keep '[{every: 3}]')
  run train_lm_fsdp2 "${mpi[@]}" "$build/examples/train_lm" "${ranks[@]}" --trainer.id fsdp2
  run train_lm_zero2 "${mpi[@]}" "$build/examples/train_lm" "${ranks[@]}" --trainer.id zero2 \
    --trainer.shard_parameters false
  run train_lm_tp2 "${mpi[@]}" "$build/examples/train_lm" "${ranks[@]}" --trainer.id tp2 --trainer.model_axis_size 2 \
    --trainer.tensor_parallel_axes '[mlp, heads]'
fi

if [ ${#failed[@]} -ne 0 ]; then
  echo "check-device-access: FAILED: ${failed[*]}"
  exit 1
fi
echo "check-device-access: no host access to array memory outside kernels"
