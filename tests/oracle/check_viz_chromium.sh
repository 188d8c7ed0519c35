#!/usr/bin/env bash
# Renders viz_logprobs pages in headless Chromium and checks the screenshots are real pictures (not CI: it
# installs Debian's chromium when missing, which needs root and a network). The PNGs stay in OUT_DIR for a person
# to look at.
# Usage: tests/oracle/check_viz_chromium.sh OUT_DIR PAGE.html [PAGE.html ...]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT_DIR PAGE.html [PAGE.html ...]" >&2; exit 2; }
out=$(realpath -m "$1")
shift
mkdir -p "$out"

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "check_viz_chromium: installing Debian's chromium" >&2
  apt-get install -y chromium > "$out/apt.log" 2>&1 || { apt-get update > /dev/null && apt-get install -y chromium > "$out/apt.log" 2>&1; }
  browser=$(command -v chromium)
fi

status=0
for page in "$@"; do
  [ -f "$page" ] || { echo "FAIL: $page does not exist" >&2; status=1; continue; }
  name=$(basename "$page" .html)
  png="$out/$name.png"
  rm -f "$png"
  # A fresh profile per page; --virtual-time-budget lets layout finish before the shot.
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$out/.profile-$name" \
    --virtual-time-budget=3000 --window-size=1200,900 --screenshot="$png" "file://$(realpath "$page")" \
    > "$out/$name.chromium.log" 2>&1 || true
  rm -rf "$out/.profile-$name"
  if ! python3 - "$png" <<'PY'; then
import struct, sys, zlib
path = sys.argv[1]
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, width, height = 8, b"", 0, 0
while pos < len(data):
    (length,) = struct.unpack(">I", data[pos:pos + 4])
    kind = data[pos + 4:pos + 8]
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and colour in (2, 6), f"unexpected PNG format depth {depth} colour {colour}"
        channels = 3 if colour == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
assert (width, height) == (1200, 900), f"size {width}x{height}"
raw = zlib.decompress(idat)
stride = width * channels + 1
# Undo the PNG row filters, then count distinct colours and non-white pixels.
prev = bytearray(stride - 1)
colours, nonwhite, warm = set(), 0, 0
for y in range(height):
    f, row = raw[y * stride], bytearray(raw[y * stride + 1:(y + 1) * stride])
    for i in range(len(row)):
        a = row[i - channels] if i >= channels else 0
        b, c = prev[i], prev[i - channels] if i >= channels else 0
        if f == 1: row[i] = (row[i] + a) & 255
        elif f == 2: row[i] = (row[i] + b) & 255
        elif f == 3: row[i] = (row[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = row
    for x in range(0, width, 2):
        px = tuple(row[x * channels:x * channels + 3])
        colours.add(px)
        if px != (255, 255, 255): nonwhite += 1
        if px[0] > 200 and px[2] < 150: warm += 1  # the red-to-yellow scale
total = width * height // 2
print(f"{path}: {width}x{height}, {len(colours)} colours, {100 * nonwhite / total:.1f}% non-white, "
      f"{100 * warm / total:.1f}% red/orange/yellow")
assert len(colours) > 50, "too few colours: a blank or broken page?"
assert nonwhite > total // 50, "almost entirely white"
PY
    echo "FAIL: $png is not a plausible rendering (see $out/$name.chromium.log)" >&2
    status=1
  fi
done
exit $status
