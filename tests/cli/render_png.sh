#!/usr/bin/env bash
# Renders remat-report's pictures (the timeline, and the ranks of a job) in headless Chromium
# to PNG files and checks they are real images. Exits 77 (skipped) when no Chromium is installed.
#
# usage: render_png.sh REMAT_REPORT [DUMP] [OUT_DIR]
set -euo pipefail
report=${1:?usage: render_png.sh REMAT_REPORT [DUMP] [OUT_DIR]}
here=$(cd "$(dirname "$0")" && pwd)
dump=${2:-$here/data/trace.jsonl}
out=${3:-}
if [[ -z $out ]]; then  # a folder of its own, removed at the end
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
browser=""
for candidate in chromium chromium-browser google-chrome; do
  if command -v "$candidate" >/dev/null 2>&1; then browser=$candidate; break; fi
done
if [[ -z $browser ]]; then
  echo "no chromium installed (apt-get install chromium); skipping"
  exit 77
fi
mkdir -p "$out"
"$report" timeline "$dump" -o "$out/timeline.svg" >/dev/null
"$report" timeline "$dump" -o "$out/timeline.html" >/dev/null
"$report" ranks "$here/data/snapshot-peak.json" "$here/data/oom.json" --svg "$out/ranks.svg" --html "$out/ranks.html" \
  >/dev/null
for name in timeline.svg timeline.html ranks.svg ranks.html; do
  timeout 90 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1260,760 \
    --user-data-dir="$out/profile" --screenshot="$out/${name%.*}-${name##*.}.png" "file://$out/$name" \
    >/dev/null 2>&1
  png="$out/${name%.*}-${name##*.}.png"
  [[ -s $png ]] || { echo "chromium wrote no $png"; exit 1; }
  [[ $(head -c 8 "$png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || { echo "$png is not a PNG"; exit 1; }
  size=$(stat -c %s "$png")
  (( size > 20000 )) || { echo "$png is suspiciously small ($size bytes): nothing drawn?"; exit 1; }
  echo "rendered $png ($size bytes)"
done
rm -rf "$out/profile"
