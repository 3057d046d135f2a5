#!/usr/bin/env bash
# Times `remat-report whatif` on a synthetic training-like trace (bench/whatif/make_trace.py):
# the recorded settings alone, then with expandable_segments:True beside them in the same pass,
# from a file and from standard input; prints seconds, peak RSS and the two-run/one-run ratio.
#
# usage: run_whatif_bench.sh [REMAT_REPORT] [EVENTS]   (defaults: build/cli/remat-report, 10000000)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
report=$(realpath "${1:-$root/build/cli/remat-report}")
events=${2:-10000000}
trace=${WHATIF_TRACE:-/tmp/remat-whatif-$events.jsonl}
[[ -s $trace ]] || python3 "$root/bench/whatif/make_trace.py" "$trace" --events "$events"

measure() {  # label, then the command; prints "label seconds rss_mib"
  local label=$1; shift
  local log; log=$(mktemp)
  /usr/bin/time -v "$@" >/dev/null 2>"$log"
  local wall rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log" | awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
  rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2 / 1024}' "$log")
  rm -f "$log"
  printf '%-34s %8.2f s  %8s MiB\n' "$label" "$wall" "$rss"
  echo "$wall" >"$label.seconds.tmp"
}

cd "$(mktemp -d)"
echo "trace: $trace ($(du -h "$trace" | cut -f1), $events events)"
measure one_config "$report" whatif "$trace"
measure two_configs "$report" whatif "$trace" --conf expandable_segments:True
measure two_configs_stdin bash -c "\"$report\" whatif - --conf expandable_segments:True < \"$trace\""
awk -v a="$(cat one_config.seconds.tmp)" -v b="$(cat two_configs.seconds.tmp)" \
  'BEGIN { printf "two configurations / one: %.2fx\n", b / a }'
"$report" whatif "$trace" --conf expandable_segments:True | sed -n '/^Replayed/,/^first_failing/p'
