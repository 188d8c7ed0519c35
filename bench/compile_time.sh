#!/usr/bin/env bash
# Times the compile-time benchmark: the generated translation unit with 300 distinct axis-set operations,
# and one test file that uses every op family. Run after configuring a build directory (default: build).
set -euo pipefail
build=${1:-build}
src="$build/tests/static/axis_ops_300.cpp"
if [ ! -f "$src" ]; then
  echo "compile_time: $src not found; configure first: cmake -S . -B $build" >&2
  exit 1
fi
inc=(-Iinclude -isystem /usr/include/trilinos)
t0=$(date +%s.%N)
g++ -std=c++20 -O2 "${inc[@]}" -c "$src" -o /dev/null
t1=$(date +%s.%N)
g++ -std=c++20 -O2 "${inc[@]}" -c tests/test_dot.cpp -o /dev/null
t2=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "axis_ops_300.cpp (300 axis-set operations): %.2f s\n", b - a }'
awk -v a="$t1" -v b="$t2" 'BEGIN { printf "tests/test_dot.cpp (all op headers, -O2): %.2f s\n", b - a }'
