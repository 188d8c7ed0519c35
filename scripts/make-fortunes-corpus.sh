#!/bin/sh
# Builds the embedded default's corpus: Debian's `fortunes` package (English quotations, jokes and
# literature, about 2.5 MB) as JSON lines {"text": "..."}, one fortune per line. Every 50th fortune goes to the
# validation file. Usage: scripts/make-fortunes-corpus.sh OUT_DIR [FORTUNES_DIR]
set -eu
out=${1:?usage: make-fortunes-corpus.sh OUT_DIR [FORTUNES_DIR]}
src=${2:-/usr/share/games/fortunes}
if [ ! -f "$src/fortunes" ]; then
  echo "make-fortunes-corpus: $src/fortunes not found; install Debian's 'fortunes' package (scripts/setup-debian.sh)" >&2
  exit 1
fi
mkdir -p "$out"
files=$(cd "$src" && for f in *; do
  case "$f" in *.dat|*.u8|ascii-art) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] && echo "$src/$f"
done | sort)
# shellcheck disable=SC2086
LC_ALL=C awk -v train="$out/train.jsonl.tmp" -v valid="$out/validation.jsonl.tmp" '
function flush(   s) {
  if (doc == "") return
  s = doc
  gsub(/.\010/, "", s)                     # overstriking (x BACKSPACE) keeps the later character
  gsub(/[\001-\010\013-\037\177]/, "", s)  # other control characters (tab and newline stay)
  gsub(/\\/, "\\\\\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, "\\t", s); gsub(/\r/, "", s)
  gsub(/\n/, "\\n", s)
  n++
  if (n % 50 == 0) print "{\"text\": \"" s "\"}" > valid; else print "{\"text\": \"" s "\"}" > train
  doc = ""
}
FNR == 1 { flush() }
/^%$/ { flush(); next }
{ doc = (doc == "" ? $0 : doc "\n" $0) }
END { flush() }' $files
mv "$out/train.jsonl.tmp" "$out/train.jsonl"
mv "$out/validation.jsonl.tmp" "$out/validation.jsonl"
