#!/usr/bin/env bash
# Compiler launcher of the test programs (tests/CMakeLists.txt, HALIAX_TEST_CXX): CMake runs it as
#   test-cxx.sh CLANG PROJECT_CXX ARGS...
# and it compiles with CLANG instead of the project's compiler, with the same arguments. The test programs are built
# at -O0, where clang++ compiles our headers about twice as fast as g++ (g++ 12 spends half of an -O0 compile
# generating code for the instantiated templates); the libraries they link keep the project's compiler, and both
# use libstdc++, so the objects link together. Flags only GCC knows (-Wno-restrict) are left to clang's
# -Wno-unknown-warning-option.
set -euo pipefail
clang=$1
shift 2
exec "$clang" -Wno-unknown-warning-option "$@"
