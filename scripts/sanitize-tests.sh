#!/usr/bin/env bash
# Builds everything (libraries, tests, examples) with AddressSanitizer, LeakSanitizer and
# UndefinedBehaviorSanitizer in a separate build directory, then runs the whole ctest suite there. Any sanitizer
# report makes its test fail: ASan and UBSan stop the process at the first error with a non-zero exit code.
# Not part of CI (a full build takes about 47 minutes on 2 cores, the tests about 7 more); run it before a release
# or after touching memory handling. Uses the project's compiler (g++ unless CXX says otherwise).
# Usage: scripts/sanitize-tests.sh [BUILD_DIR]      (default: build-asan)
# Environment: JOBS (build and ctest parallelism, default 2), CTEST_TIMEOUT (seconds per test, default 1800, as
# sanitized programs run 2-5x slower), CTEST_ARGS (extra ctest arguments, e.g. "-R safetensors").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-asan}
jobs=${JOBS:-2}

flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -g1"
# Exported rather than passed as -DCMAKE_CXX_FLAGS so that the projects the tests configure themselves (the
# find_package consumer test, which links the sanitized static libraries) get the same flags.
export CFLAGS="$flags" CXXFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined"
# halt_on_error: the first report ends the process with exitcode 23 (ASan) / non-zero (UBSan), so the test fails.
# Leak reports from the system's uninstrumented libraries are listed, each with its reason, in lsan.supp.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:exitcode=23:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1:suppressions=$root/scripts/ubsan.supp"
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"

echo "sanitize-tests: configuring $build"
# The fuzz tests (tests/fuzz/) build their own sanitized programs with clang++; the normal build runs them.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHALIAX_FUZZ=OFF
echo "sanitize-tests: building ($jobs jobs)"
start=$(date +%s)
# -k 0: a target that fails (a test program whose test listing, run at build time, trips a sanitizer) does not stop
# the others; the tests that did build still run.
build_rc=0
cmake --build "$build" -j "$jobs" -- -k 0 || build_rc=$?
echo "sanitize-tests: built in $(( $(date +%s) - start )) s (exit $build_rc); running the tests"
start=$(date +%s)
rc=0
# Three passes. (1) Everything but the MPI tests and the peak-RSS ratio. (2) The MPI tests, with the slow unwinder
# on every allocation: Open MPI's leaks come from components it has dlclose'd by exit, so only the deeper frames
# name the library that lsan.supp suppresses (the fast unwinder stops at the unloaded one). (3) The peak-memory
# program without its ratio: under ASan a process's RSS is the shadow memory, redzones and quarantine on top of
# ours (the ratio is tested by the normal build), but its memory accesses are checked here like everything else.
# shellcheck disable=SC2086
ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout "${CTEST_TIMEOUT:-1800}" -E '^mpi: ' -LE rss \
  ${CTEST_ARGS:-} || rc=$?
echo "sanitize-tests: tests other than mpi ran in $(( $(date +%s) - start )) s (ctest exit $rc)"
mpi_start=$(date +%s)
mpi_rc=0
# shellcheck disable=SC2086
ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" \
  ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout "${CTEST_TIMEOUT:-1800}" -R '^mpi: ' \
  ${CTEST_ARGS:-} || mpi_rc=$?
echo "sanitize-tests: mpi tests ran in $(( $(date +%s) - mpi_start )) s (ctest exit $mpi_rc)"
[ "$mpi_rc" -eq 0 ] || rc=$mpi_rc
if [ -x "$build/tests/peak_memory" ] && [ -z "${CTEST_ARGS:-}" ]; then
  "$build/tests/peak_memory" --layers 12 --embed 256 --heads 4 --batch 8 --pos 256 --max-ratio 1 ||
    { echo "sanitize-tests: peak_memory failed"; rc=1; }
fi
echo "sanitize-tests: tests ran in $(( $(date +%s) - start )) s"
if [ "$rc" -ne 0 ] || [ "$build_rc" -ne 0 ]; then
  echo "sanitize-tests: FAILED (build exit $build_rc, ctest exit $rc); grep the output for 'ERROR: AddressSanitizer'," \
       "'ERROR: LeakSanitizer' and 'runtime error:'"
  exit 1
fi
echo "sanitize-tests: no sanitizer findings"
