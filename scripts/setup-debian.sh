#!/usr/bin/env bash
# Installs every Debian package the project needs to build, test and run its programs.
# Usage: sudo scripts/setup-debian.sh   (as root, the sudo may be dropped)
# Safe to run again: apt-get skips what is already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  # Execution and BLAS: Kokkos (Serial backend) + Kokkos Kernels over OpenBLAS.
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev
  # bfloat16 GEMMs (trainer.mp p=f32,c=bfloat16) on CPUs with AVX512_BF16 or AMX-BF16.
  libdnnl-dev
  # Axis algebra (MP11) and struct reflection (Hana) are both in the Boost headers.
  libboost-dev
  # Later subsystems: configs, checkpoints, distribution, data.
  libyaml-cpp-dev libhdf5-dev libopenmpi-dev openmpi-bin zlib1g-dev libzstd-dev nlohmann-json3-dev
  # Tests and benchmarks.
  doctest-dev libbenchmark-dev
  # The fuzz tests (tests/fuzz/): clang++ and its libFuzzer and sanitizer runtimes.
  clang libclang-rt-14-dev
  # serve_lm's HTTP server; curl for its tests.
  libcpp-httplib-dev curl
  # h5dump and h5ls: the tests check that checkpoints open in the standard HDF5 tools.
  hdf5-tools
  # The embedded default's corpus (English text, turned into JSON lines by the build).
  fortunes
)

if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=sudo
else
  sudo_cmd=
fi

export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "setup-debian: installing ${#missing[@]} packages: ${missing[*]}"
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup-debian: done"
