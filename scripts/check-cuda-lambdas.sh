#!/usr/bin/env bash
# Checks a CUDA build's executable for nvcc's extended-lambda pointers that are set in one place and read in another.
#
#   scripts/check-cuda-lambdas.sh build-device/bench/device_session [more executables...]
#
# nvcc keeps the host side of every extended __host__ __device__ lambda (KOKKOS_LAMBDA) behind copy/call/delete
# pointers in an unnamed namespace, one set per translation unit (`(anonymous namespace)::__nv_hdl_helper<...>`).
# The routines that write and read them are inline and keep external linkage, so the linker keeps one copy of each;
# when the copies come from different translation units, a lambda's pointers are written at one address and read at
# another, which is still null: the program calls address 0 the first time it copies that kernel's functor. haliax
# compiles a CUDA build's host code without inlining (CMakeLists.txt) so that this cannot happen; this script
# checks it from the disassembly (no GPU needed): every pointer variable must be referenced at one address only.
# Exit status 1 lists the variables referenced at several addresses and the functions that reference them.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/check-cuda-lambdas.sh EXECUTABLE..." >&2; exit 2; }
command -v objdump > /dev/null || { echo "check-cuda-lambdas: objdump not found (binutils)" >&2; exit 2; }
status=0
for exe in "$@"; do
  [ -f "$exe" ] || { echo "check-cuda-lambdas: $exe: no such file" >&2; exit 2; }
  report=$(objdump -d --no-show-raw-insn "$exe" | awk '
    /^[0-9a-f]+ <.*>:$/ { fn = substr($2, 2, length($2) - 3); next }
    /# [0-9a-f]+ <_ZN12_GLOBAL__N_115__nv_hdl_helper/ {
      for (i = 1; i <= NF; ++i) if ($i == "#") { addr = $(i + 1); sym = $(i + 2); break }
      sub(/^</, "", sym); sub(/[+>].*$/, "", sym)
      if (!((sym, addr) in seen)) { seen[sym, addr] = fn; n[sym]++ }
      vars[sym] = 1
    }
    END {
      total = 0; bad = 0
      for (s in vars) { total++; if (n[s] > 1) bad++ }
      printf "%d %d\n", total, bad
      for (k in seen) { split(k, p, SUBSEP); if (n[p[1]] > 1) printf "%s %s %s\n", p[1], p[2], seen[k] }
    }')
  read -r total bad <<< "$(head -n 1 <<< "$report")"
  if [ "$total" = 0 ]; then
    echo "$exe: no extended-lambda pointers (not an nvcc build, or stripped of nothing it needs): nothing to check"
  elif [ "$bad" = 0 ]; then
    echo "$exe: ok, each of $total extended-lambda pointer variables is referenced at one address"
  else
    status=1
    echo "$exe: $bad of $total extended-lambda pointer variables are referenced at more than one address:"
    tail -n +2 <<< "$report" | sort | head -n 12 | while read -r sym addr fn; do
      printf '  %s at %s, from %s\n' "$(c++filt "$sym" | cut -c1-160)" "$addr" "$(c++filt "$fn" | cut -c1-120)"
    done
  fi
done
exit $status
