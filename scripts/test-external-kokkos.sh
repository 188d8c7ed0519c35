#!/usr/bin/env bash
# Builds the project against a Kokkos + Kokkos Kernels installed under a prefix of your choice (a Kokkos 4.x or
# 5.x from Spack or from source, with the Serial, OpenMP or CUDA backend), runs the whole test suite, and runs
# train_lm on its embedded default. It never builds Kokkos itself: docs/portability.md says how we built the
# installs we verified against.
#
# Usage: scripts/test-external-kokkos.sh <kokkos-prefix> [build-dir] [--compare-with <train_lm>] [--no-tests]
#   <kokkos-prefix>   where lib/cmake/Kokkos and lib/cmake/KokkosKernels are (passed as -DHALIAX_KOKKOS_ROOT)
#   [build-dir]       default build-kokkos-<basename of the prefix>
#   --compare-with P  also run the train_lm program P (e.g. build/examples/train_lm, the Debian Serial build) on the
#                     embedded default and require bitwise the same train/eval losses
#   --no-tests        build everything, skip ctest (a CUDA build on a machine without a GPU: compile and link only)
# Extra CMake arguments can be given in CMAKE_ARGS (e.g. CMAKE_ARGS='-DCMAKE_CXX_COMPILER=.../nvcc_wrapper').
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -ge 1 ] || usage
prefix=$1
shift
build=
compare=
run_tests=1
while [ $# -gt 0 ]; do
  case $1 in
    --compare-with) compare=${2:?--compare-with needs a train_lm path}; shift 2 ;;
    --no-tests) run_tests=0; shift ;;
    -h|--help) usage ;;
    *) if [ -z "$build" ]; then build=$1; shift; else echo "test-external-kokkos: unexpected argument '$1'" >&2; usage; fi ;;
  esac
done

if [ ! -d "$prefix/lib/cmake/Kokkos" ] && [ ! -d "$prefix/lib64/cmake/Kokkos" ]; then
  echo "test-external-kokkos: no Kokkos CMake package under '$prefix' (expected lib/cmake/Kokkos or lib64/cmake/Kokkos)." >&2
  echo "  Install Kokkos and Kokkos Kernels into one prefix first (docs/portability.md)." >&2
  exit 2
fi
if [ ! -d "$prefix/lib/cmake/KokkosKernels" ] && [ ! -d "$prefix/lib64/cmake/KokkosKernels" ]; then
  echo "test-external-kokkos: '$prefix' has Kokkos but no Kokkos Kernels (lib/cmake/KokkosKernels); install it into the same prefix." >&2
  exit 2
fi

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(cd "$prefix" && pwd)
build=${build:-$root/build-kokkos-$(basename "$prefix")}
jobs=${JOBS:-$(nproc)}

# A CUDA Kokkos compiles everything through its nvcc_wrapper, for the architecture it was built for (the
# wrapper's own default, sm_70, is gone from CUDA 13).
if grep -q '^#define KOKKOS_ENABLE_CUDA$' "$prefix/include/KokkosCore_config.h" 2>/dev/null; then
  case " ${CMAKE_ARGS:-} " in
    *CMAKE_CXX_COMPILER*) ;;
    *)
      arch=$(sed -n 's/^#define KOKKOS_ARCH_\(HOPPER90\|ADA89\|AMPERE86\|AMPERE80\|VOLTA70\|TURING75\|BLACKWELL100\|BLACKWELL120\)$/\1/p' \
        "$prefix/include/KokkosCore_config.h" | head -n 1)
      sm=$(echo "$arch" | grep -o '[0-9]*$')
      CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_CXX_COMPILER=$prefix/bin/nvcc_wrapper -DCMAKE_CXX_FLAGS=-arch=sm_${sm:-90}"
      echo "== CUDA Kokkos ($arch): compiling with $prefix/bin/nvcc_wrapper -arch=sm_${sm:-90}"
      ;;
  esac
fi

echo "== configure $build against $prefix"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja -DHALIAX_KOKKOS_ROOT="$prefix" ${CMAKE_ARGS:-}
echo "== build (-j $jobs)"
cmake --build "$build" -j "$jobs"

if [ "$run_tests" = 1 ]; then
  echo "== tests"
  ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 600
fi

if [ "$run_tests" = 1 ] || [ -n "$compare" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  losses() {  # every train/eval loss the program logs on the embedded default (full precision), in a fresh directory
    local prog=$1 dir=$2
    mkdir -p "$dir"
    (cd "$dir" && "$prog" > log.txt 2>&1) || { cat "$dir/log.txt" >&2; echo "test-external-kokkos: $prog failed" >&2; exit 1; }
    grep -ohE '"(train|eval)/loss":[^,}]*' "$dir"/logs/*/metrics.jsonl > "$dir/losses.txt"
    [ -s "$dir/losses.txt" ] || { echo "test-external-kokkos: no losses in $dir/logs/*/metrics.jsonl" >&2; exit 1; }
  }
  echo "== train_lm on the embedded default"
  losses "$build/examples/train_lm" "$work/ext"
  tail -n 3 "$work/ext/losses.txt"
  if [ -n "$compare" ]; then
    compare=$(cd "$(dirname "$compare")" && pwd)/$(basename "$compare")
    losses "$compare" "$work/ref"
    if cmp -s "$work/ext/losses.txt" "$work/ref/losses.txt"; then
      echo "== losses bitwise equal to $compare ($(wc -l < "$work/ext/losses.txt") values)"
    else
      echo "test-external-kokkos: losses differ from $compare:" >&2
      diff "$work/ref/losses.txt" "$work/ext/losses.txt" | head -20 >&2
      exit 1
    fi
  fi
fi
echo "== done"
