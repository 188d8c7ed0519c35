#!/bin/sh
# Fuzzes levanter::safetensors::parse with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, starting
# from tests/fuzz/safetensors-seeds/. Not part of the CMake build or CI. Needs clang++ with libFuzzer.
# Usage: scripts/fuzz-safetensors.sh SECONDS CRASH_DIR [WORK_DIR]
#   SECONDS    how long to fuzz
#   CRASH_DIR  where crashing, leaking or too-slow inputs go (keep each in tests/golden/safetensors-bad/ once fixed)
#   WORK_DIR   build output and the growing corpus (default: ${TMPDIR:-/tmp}/fuzz-safetensors); reuse it to resume
# Extra libFuzzer flags may follow in FUZZ_FLAGS, e.g. FUZZ_FLAGS=-jobs=2.
set -eu
usage="usage: fuzz-safetensors.sh SECONDS CRASH_DIR [WORK_DIR]"
secs=${1:?$usage}
crashes=${2:?$usage}
work=${3:-${TMPDIR:-/tmp}/fuzz-safetensors}
root=$(cd "$(dirname "$0")/.." && pwd)
cxx=${CXX:-clang++}
mkdir -p "$work/corpus" "$crashes"

# -fno-sanitize-recover turns undefined behaviour into a crash the fuzzer records, rather than a log line.
"$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" "$root/tests/fuzz/fuzz_safetensors.cpp" -o "$work/fuzz_safetensors"

# JSON and format tokens, so mutations produce headers that get past the lexer.
cat > "$work/safetensors.dict" <<'DICT'
"{"
"}"
"["
"]"
":"
","
"\x22"
"\x5cu0000"
"\x5cud800"
" "
"null"
"true"
"-1"
"1.5"
"1e400"
"18446744073709551616"
"9223372036854775807"
"\x22dtype\x22"
"\x22shape\x22"
"\x22data_offsets\x22"
"\x22__metadata__\x22"
"\x22F32\x22"
"\x22F16\x22"
"\x22BF16\x22"
"\x22F64\x22"
"\x22I64\x22"
"\x22BOOL\x22"
"\x22F8_E4M3\x22"
DICT

# Allocations are bounded by a small multiple of the input (at most 4 KiB here), so 64 MB in one malloc is a bug.
# shellcheck disable=SC2086
exec "$work/fuzz_safetensors" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=1024 \
  -malloc_limit_mb=64 -print_final_stats=1 -artifact_prefix="$crashes/" -dict="$work/safetensors.dict" \
  ${FUZZ_FLAGS:-} "$work/corpus" "$root/tests/fuzz/safetensors-seeds"
