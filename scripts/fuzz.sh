#!/usr/bin/env bash
# Builds and runs one libFuzzer target with AddressSanitizer and UndefinedBehaviorSanitizer.
# Usage: scripts/fuzz.sh TARGET SECONDS [CRASH_DIR] [WORK_DIR]
#   TARGET     NAME of tests/fuzz/fuzz_NAME.cpp (e.g. safetensors, ledger, checkpoint_metadata)
#   SECONDS    how long to fuzz; 0 only builds (and prints the binary's path)
#   CRASH_DIR  where crashing, leaking, too-slow or too-hungry inputs go (default: WORK_DIR/findings)
#   WORK_DIR   objects, binary and the growing corpus (default: ${TMPDIR:-/tmp}/fuzz-NAME); reuse it to resume
# Environment: CXX (default clang++), FUZZ_FLAGS (extra libFuzzer flags, e.g. -jobs=2), FUZZ_JOBS (parallel
# compiles, default 2), FUZZ_OBJ_DIR (where the project sources' objects go, shared between targets; default
# WORK_DIR/obj), FUZZ_OPT (the optimisation level, default -O1; the build's fuzz tests use -O0, which compiles
# about 2.5x faster and runs a few times slower: fine for their short runs, not for long fuzzing).
#
# A harness says what it needs in its leading // comment lines (paths relative to the repository root):
#   // fuzz-sources: src/a.cpp src/b/*.cpp   the project sources compiled (instrumented) into the fuzzer (patterns
#                                            expand from the root: every model's src/models/*_config.cpp)
#   // fuzz-libs: -lfoo                       extra linker flags
#   // fuzz-flags: -max_len=4096 -dict=tests/fuzz/NAME.dict   extra libFuzzer flags
# Its seeds are in tests/fuzz/NAME-seeds/. Objects are rebuilt only when a source or a header they include changes.
# Prints "fuzz: NAME: N executions in S s" and exits non-zero on any finding (crash, sanitizer report, leak,
# timeout, out-of-memory); the input that caused it is saved in CRASH_DIR.
set -euo pipefail
usage="usage: fuzz.sh TARGET SECONDS [CRASH_DIR] [WORK_DIR]"
name=${1:?$usage}
secs=${2:?$usage}
root=$(cd "$(dirname "$0")/.." && pwd)
work=${4:-${TMPDIR:-/tmp}/fuzz-$name}
crashes=${3:-$work/findings}
cxx=${CXX:-clang++}
harness=$root/tests/fuzz/fuzz_$name.cpp
seeds=$root/tests/fuzz/$name-seeds
[ -f "$harness" ] || { echo "fuzz: no harness $harness" >&2; exit 2; }
case $secs in '' | *[!0-9]*) echo "$usage" >&2; exit 2 ;; esac
mkdir -p "$work/obj" "$work/corpus" "$crashes"
work=$(cd "$work" && pwd)
crashes=$(cd "$crashes" && pwd)

# The harness's leading comment block: `// fuzz-KEY: value` lines.
header() { sed -n '/^\/\//!q; s|^// fuzz-'"$1"':[[:space:]]*||p' "$harness" | tr '\n' ' '; }
# shellcheck disable=SC2046  # the words are patterns, expanded from the root
sources=$(cd "$root" && printf '%s ' $(header sources))
libs=$(header libs)
flags=$(header flags)

# -fno-sanitize-recover turns undefined behaviour into a crash the fuzzer records, rather than a log line.
cxxflags="-std=c++20 -g ${FUZZ_OPT:--O1} -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$root/include \
-isystem /usr/include/trilinos -isystem /usr/include/hdf5/serial -DBOOST_ALL_NO_LIB"
# Sources other than the harness get no libFuzzer main, only its coverage instrumentation.
libflags=${cxxflags/-fsanitize=fuzzer,/-fsanitize=fuzzer-no-link,}

# The project's sources compile the same for every target: with FUZZ_OBJ_DIR (the build gives every target one),
# their objects are shared, so a source two harnesses name is compiled once. Each object is written under a temporary
# name and renamed, so a target reading it never sees half of one.
shared=${FUZZ_OBJ_DIR:-$work/obj}
mkdir -p "$shared"
shared=$(cd "$shared" && pwd)
# A small Makefile, so that objects are rebuilt only when needed (-MMD lists each object's headers).
objs=() rules=""
for src in fuzz/fuzz_$name.cpp $sources; do
  case $src in
    fuzz/*) path=$root/tests/$src f=$cxxflags dir=$work/obj stamp=$work/flags ;;
    *) path=$root/$src f=$libflags dir=$shared stamp=$shared/flags ;;
  esac
  [ -f "$path" ] || { echo "fuzz: $harness names missing source $src" >&2; exit 2; }
  obj=$dir/$(echo "$src" | tr '/' '_').o
  objs+=("$obj")
  rules+="$obj: $path $stamp
	$cxx $f -MMD -MF $obj.d.\$\$\$\$ -MT $obj -c $path -o $obj.\$\$\$\$ && mv -f $obj.d.\$\$\$\$ $obj.d && mv -f $obj.\$\$\$\$ $obj
"
done
bin=$work/fuzz_$name
# Flags stamps, rewritten only when they change (objects depend on them).
stamp_if_changed() { printf '%s\n' "$2" > "$1.new.$$"; cmp -s "$1.new.$$" "$1" 2>/dev/null && rm -f "$1.new.$$" || mv -f "$1.new.$$" "$1"; }
stamp_if_changed "$work/flags" "$cxx $cxxflags $libs"
stamp_if_changed "$shared/flags" "$cxx $libflags"
cat > "$work/Makefile" <<EOF
$bin: ${objs[*]}
	$cxx $cxxflags ${objs[*]} $libs -o $bin
$rules
-include $work/obj/*.d $shared/*.d
EOF
make -s -j "${FUZZ_JOBS:-2}" -f "$work/Makefile" "$bin"
if [ "$secs" -eq 0 ]; then
  echo "$bin"
  exit 0
fi

# Allocations are bounded by a small multiple of the input (the harnesses cap its length), so 64 MB in one
# malloc is a bug; so is a single input running 10 s.
cd "$root"
log=$work/fuzz.log
corpora=("$work/corpus")
[ -d "$seeds" ] && corpora+=("$seeds")
rc=0
# shellcheck disable=SC2086
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=64 -print_final_stats=1 \
  -artifact_prefix="$crashes/" $flags ${FUZZ_FLAGS:-} "${corpora[@]}" > "$log" 2>&1 || rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units:[[:space:]]*//p' "$log" | awk '{s += $1} END {print s + 0}')
if [ "$rc" -ne 0 ]; then
  tail -n 80 "$log" >&2
  echo "fuzz: $name: FINDING after $runs executions (exit $rc); input saved in $crashes/, full log $log" >&2
  ls -1 "$crashes" >&2
  exit 1
fi
echo "fuzz: $name: $runs executions in $secs s, no findings (corpus $work/corpus)"
