#!/usr/bin/env bash
# Builds the device kit's bundle here, for a GPU machine that has a GPU, the CUDA toolkit and PyTorch but none of our
# build's libraries and no network: device_session (and train_lm with --train-lm) compiled with nvcc for sm_90
# against a CUDA Kokkos prefix, packed with the shared libraries that machine lacks into one git-ignored folder that
# travels with the working tree (the device tool's `carry`). docs/portability.md, "Working with a GPU machine", has
# the whole procedure and how long each step takes.
#
#   scripts/device-bundle.sh /opt/kokkos-4.6-cuda                 # -> .device-kit/kit.tar.xz (device_session)
#   scripts/device-bundle.sh /opt/kokkos-4.6-cuda --train-lm      # also train_lm and its libraries
#
# Options: --build-dir DIR (default build-device), --out DIR (default .device-kit), --arch SM (default 90). The
# folder holds kit.tar.xz (bin/, lib/, data/, kit-info.txt) and kit-info.txt; scripts/device-session.sh unpacks it.
# The prefix is a Kokkos built with CUDA (Kokkos Kernels is not needed: cuBLAS does every device GEMM); the script
# never builds Kokkos itself. Prints the bundle's size and the build times; fails if the bundle exceeds 50 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix="" build=build-device out=.device-kit arch=90 train=0
while [ $# -gt 0 ]; do
  case "$1" in
    --train-lm) train=1; shift ;;
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "device-bundle: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) prefix=$1; shift ;;
  esac
done
[ -n "$prefix" ] || { echo "usage: scripts/device-bundle.sh KOKKOS_CUDA_PREFIX [--train-lm] [--build-dir DIR] [--out DIR]" >&2; exit 2; }
prefix=$(cd "$prefix" && pwd)
wrapper=$prefix/bin/nvcc_wrapper
[ -x "$wrapper" ] || { echo "device-bundle: $prefix has no bin/nvcc_wrapper: not a Kokkos install with CUDA (docs/portability.md)" >&2; exit 2; }
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc > /dev/null || { echo "device-bundle: nvcc not found (install the CUDA toolkit or put it on PATH)" >&2; exit 2; }

t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DHALIAX_KOKKOS_ROOT="$prefix" -DCMAKE_CXX_COMPILER="$wrapper" \
  -DCMAKE_CXX_FLAGS="-arch=sm_$arch" -DCMAKE_BUILD_TYPE=Release -DHALIAX_BUILD_TESTS=OFF -DHALIAX_BUILD_BENCH=OFF \
  -DHALIAX_BUILD_DEVICE_SESSION=ON -DLEVANTER_MPI=OFF -DLEVANTER_NCCL=OFF > "$build.configure.log" 2>&1 ||
  { tail -n 30 "$build.configure.log"; echo "device-bundle: configure failed ($build.configure.log)" >&2; exit 1; }
t1=$(date +%s)
cmake --build "$build" --target device_session
t2=$(date +%s)
timings="configure $((t1 - t0)) s, device_session $((t2 - t1)) s"
if [ $train = 1 ]; then
  cmake --build "$build" --target train_lm
  t3=$(date +%s)
  timings="$timings, train_lm $((t3 - t2)) s more"
fi

# nvcc's lambda wrappers must not be read through another translation unit's pointers (docs/portability.md, "nvcc's
# lambdas across translation units"): a binary that fails this would crash on the GPU at its first kernel copy.
progs=("$build/bench/device_session")
[ $train = 1 ] && progs+=("$build/examples/train_lm")
scripts/check-cuda-lambdas.sh "${progs[@]}" ||
  { echo "device-bundle: refusing to pack programs that would call unset lambda pointers on the GPU" >&2; exit 1; }

# Staged in a folder, then packed into one xz archive (about a quarter of the size: the device tool carries 64 MiB
# with the working tree); scripts/device-session.sh unpacks it on the GPU machine.
rm -rf "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
final=$out
out=$stage
mkdir -p "$out/bin" "$out/lib"
cp "$build/bench/device_session" "$out/bin/"
[ $train = 1 ] && cp "$build/examples/train_lm" "$out/bin/"
# Host symbols are not needed to run or to read a kernel table (kernel names come from Kokkos' labels).
strip --strip-unneeded "$out"/bin/*

# Shared libraries the GPU machine lacks. It has the NVIDIA driver, the CUDA toolkit (cudart, cuBLAS) and a newer
# glibc and libstdc++; everything else a binary links (yaml-cpp, HDF5 and its compression libraries for train_lm)
# comes along.
provided='^(linux-vdso|ld-linux.*|libc|libm|libdl|librt|libpthread|libresolv|libutil|libanl|libnsl|libnss_.*|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnvidia-.*)\.so'
for b in "$out"/bin/*; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ "$name" =~ $provided ]]; then cp -L "$path" "$out/lib/$name"; fi
  done
done
strip --strip-unneeded "$out"/lib/* 2> /dev/null || true

if [ $train = 1 ]; then
  # train_lm's embedded corpus (built into the build tree by CMake) for a run on the GPU machine.
  mkdir -p "$out/data"
  cp "$build/data/fortunes/train.jsonl" "$build/data/fortunes/validation.jsonl" "$out/data/"
fi

{
  echo "commit $(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD -- . || echo '+changes'), built $(date -u +%Y-%m-%dT%H:%MZ), sm_$arch, nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), Kokkos $prefix"
  echo "build times: $timings"
  echo "contents (unpacked):"
  (cd "$out" && find . -type f ! -name kit-info.txt -printf '%s %p\n' | sort -k2)
} > "$out/kit-info.txt"
unpacked=$(du -sb "$out" | cut -f1)

mkdir -p "$final"
final=$(cd "$final" && pwd)
(cd "$out" && tar -cf - bin lib $([ -d data ] && echo data) kit-info.txt | xz -6 -T2 > "$final/kit.tar.xz")
cp "$out/kit-info.txt" "$final/"
size=$(du -sb "$final" | cut -f1)
echo "device-bundle: $final is $((size / 1024 / 1024)) MiB ($size bytes; $((unpacked / 1024 / 1024)) MiB unpacked); $timings"
cat "$final/kit-info.txt"
if [ "$size" -gt $((50 * 1024 * 1024)) ]; then
  echo "device-bundle: the bundle is over 50 MiB: the device tool carries 64 MiB with the working tree" >&2
  exit 1
fi
