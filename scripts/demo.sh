#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs the demo: a training-like allocation pattern on
# the host backend (no GPU needed), its per-tag table, and the dumps it wrote.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DREMAT_BUILD_TESTS=OFF >/dev/null
out=${DEMO_OUT:-demo-out}
build_dir=${BUILD_DIR:-build}
"$build_dir/examples/remat-alloc-demo" --out "$out"
if [ -x "$build_dir/cli/remat-report" ]; then
  echo
  "$build_dir/cli/remat-report" memory "$out/snapshot-peak.json" --by region --top 10
  "$build_dir/cli/remat-report" timeline "$out/trace.jsonl" -o "$out/timeline.html" --by region
  echo "timeline: $out/timeline.html"
fi
