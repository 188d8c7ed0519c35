#!/usr/bin/env bash
# Compiler launcher of the test programs (tests/CMakeLists.txt, HALIAX_TEST_CXX): CMake runs it as
#   test-cxx.sh CLANG PROJECT_CXX ARGS...
# and it compiles with CLANG instead of the project's compiler, with the same arguments. The test programs are built
# at -O0, where clang++ compiles our headers about twice as fast as g++ (g++ 12 spends half of an -O0 compile
# generating code for the instantiated templates); the libraries they link keep the project's compiler, and both
# use libstdc++, so the objects link together. Flags only GCC knows (-Wno-restrict) are left to clang's
# -Wno-unknown-warning-option.
#
# The precompiled header: CMake builds cmake_pch.hxx.gch with `-include cmake_pch.hxx`, and clang, seeing the
# .gch of an included header beside it, loads the old one into the new (a chained PCH). After a header change the
# new file then refers to an out-of-date one, and every test compile fails with "PCH file ... is out of date". So
# the old output is removed before a header is compiled.
set -euo pipefail
clang=$1
shift 2
header=0 out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    -x) [ "${args[i + 1]:-}" = c++-header ] && header=1 ;;
    -o) out=${args[i + 1]:-} ;;
  esac
done
if [ $header = 1 ] && [ -n "$out" ]; then rm -f "$out"; fi
exec "$clang" -Wno-unknown-warning-option "$@"
