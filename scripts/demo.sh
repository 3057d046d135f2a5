#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs the demos on the CPU host backend (no GPU
# needed): the allocator through a training-like pattern, a small model trained on CPU
# with activation checkpointing, and a model split over 4 pipeline ranks with pooled receive
# buffers; renders what they wrote with remat-report. Every demo names its memory by category and
# module (parameter, activation, ... of layers.0), not only by region.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
TARGETS="remat-alloc-demo remat-report remat_launch $(test -d remat && echo remat-train-demo remat-pipeline-train)" \
  bash scripts/build.sh >/dev/null
out=${DEMO_OUT:-demo-out}
build_dir=${BUILD_DIR:-build}
report="$build_dir/cli/remat-report"

echo "== allocator: training-like allocation pattern, tagged =="
"$build_dir/examples/remat-alloc-demo" --out "$out" --force-oom
echo
"$report" memory "$out/snapshot-peak.json" --by region --top 10
"$report" memory "$out/snapshot-peak.json" --by category
"$report" timeline "$out/trace.jsonl" -o "$out/timeline.html" --by region
echo "timeline: $out/timeline.html"
echo
"$report" oom "$(ls -t "$out"/oom-*.json | head -n 1)" | sed -n '/Held by region/,/^$/p;/Held by category/,/^$/p;/Suggestions/,/^$/p'

if [ -x "$build_dir/examples/remat-train-demo" ]; then
  echo
  echo "== checkpoint runtime: 4 checkpointed layers trained on CPU =="
  "$build_dir/examples/remat-train-demo" --out "$out/train"
  "$report" summary "$out/train/remat-trace.json" | sed -n '1,8p'
  "$report" summary "$out/train/saved-report.json" | sed -n '1,4p'
  "$report" memory "$out/train/snapshot.json" --by region --top 8
  "$report" memory "$out/train/snapshot.json" --by module --top 8
  "$report" timeline "$out/train/trace.jsonl" -o "$out/train/timeline.svg" --by region
  echo "timeline: $out/train/timeline.svg"
fi

if [ -x "$build_dir/examples/remat-pipeline-train" ]; then
  echo
  echo "== pipeline: each rank's peak predicted before the job, from each stage profiled in one process =="
  "$build_dir/examples/remat-pipeline-train" --profile-stages 4 --checkpoint --out "$out/profiles"
  "$report" predict "$out"/profiles/stage-profile-stage*.json --schedule 1f1b --ranks 4 --microbatches 16 \
    --buffers pooled --json >"$out/prediction.json"
  "$report" predict "$out"/profiles/stage-profile-stage*.json --schedule 1f1b --ranks 4 --microbatches 16 \
    --buffers pooled
  echo
  echo "== pipeline: 4 ranks over Gloo on 127.0.0.1, 1F1B, 16 microbatches, pooled receive buffers =="
  "$build_dir/remat-launch" --nproc 4 --timeout 300 -- "$build_dir/examples/remat-pipeline-train" \
    --schedule 1f1b --microbatches 16 --checkpoint --out "$out/pipeline"
  "$report" memory "$out/pipeline/snapshot-rank1.json" --by slot
  "$report" plan --schedule 1f1b --ranks 4 --microbatches 16 --buffer-bytes 1KiB
  echo
  echo "== every rank in one report: which rank is hot, and what it holds =="
  "$report" ranks "$out/pipeline" --by category --svg "$out/ranks.svg"
  echo "ranks picture: $out/ranks.svg"
  echo
  echo "== the job's measured peaks beside the prediction =="
  "$report" ranks "$out/pipeline" --predicted "$out/prediction.json"
fi
