#!/usr/bin/env bash
# Receive-buffer sets, stock against pooled, for every schedule remat-report generates, and
# the time `remat-report plan` takes on a large interleaved shape next to generating, lowering
# and printing the same schedule (`remat-report schedule --lowered`) and to starting the
# program (`remat-report --version`), measured in the same run.
#
# usage: bench/pipeline/plan_table.sh [REMAT_REPORT]   (default: build/cli/remat-report)
#
# Stock: one buffer set per microbatch per receiving stage and direction, as PyTorch's stages
# allocate. Colored: the sum of the colored minima. Pooled: one set per ring slot (remat-report
# plan's ring_size, slack 2: NeMo's closed form for 1F1B where safe, else the colored minimum);
# pooled(rt): the same in the runtime order (--lowering runtime). Rings by
# stage are listed for F (activations received) and B (gradients received); "-" = the stage
# receives nothing in that direction. Shapes use each schedule's default stages per rank (1 for
# gpipe and 1f1b, 2 for the others). Orders: add-send-recv (the default) and runtime.
set -euo pipefail

report=${1:-build/cli/remat-report}
[[ -x $report ]] || { echo "no remat-report at $report; build it or pass its path" >&2; exit 1; }
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
schedules=(gpipe 1f1b interleaved-1f1b looped-bfs interleaved-zero-bubble zbv-zero-bubble dualpipev)

summarize() {  # reads a pipeline-plan dump on stdin; prints one table row
  python3 -c '
import json, sys
name, ranks, runtime_pooled = sys.argv[1:4]
plan = json.load(sys.stdin)
rings = {"F": {}, "B": {}}
for e in plan["entries"]:
    rings[e["direction"]][e["stage"]] = "-" if e["ring_size"] is None else str(e["ring_size"])
by_stage = {d: " ".join(rings[d][s] for s in range(plan["stages"])) for d in rings}
t = plan["totals"]
colored = sum(e["min_slots"] for e in plan["entries"])
saved = 100.0 * (t["stock_sets"] - t["pooled_sets"]) / t["stock_sets"] if t["stock_sets"] else 0.0
print(name, ranks, plan["stages"], plan["microbatches"], t["stock_sets"], colored, t["pooled_sets"], "%.1f%%" % saved,
      runtime_pooled, "|", by_stage["F"], "|", by_stage["B"])
' "$@"
}

echo "Receive-buffer sets per step, all stages and directions: stock (one per microbatch) vs pooled (ring_size)"
printf '%-24s %-6s %-6s %-4s %-6s %-8s %-7s %-7s %-11s %s\n' schedule ranks stages M stock colored pooled saved \
  "pooled(rt)" "| F rings by stage | B rings by stage"
for ranks in 4 8; do
  for m in 16 32 64; do
    for s in "${schedules[@]}"; do
      if ! json=$("$report" plan --schedule "$s" --ranks "$ranks" --microbatches "$m" --json 2>"$errors"); then
        printf '%-24s %-6s %-6s %-4s refused: %s\n' "$s" "$ranks" - "$m" "$(cat "$errors")"
        continue
      fi
      runtime=$("$report" plan --schedule "$s" --ranks "$ranks" --microbatches "$m" --lowering runtime --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["pooled_sets"])')
      row=$(summarize "$s" "$ranks" "$runtime" <<<"$json")
      read -r name r stages mb stock colored pooled saved rt rest <<<"$row"
      printf '%-24s %-6s %-6s %-4s %-6s %-8s %-7s %-7s %-11s %s\n' "$name" "$r" "$stages" "$mb" "$stock" "$colored" \
        "$pooled" "$saved" "$rt" "$rest"
    done
  done
done

# Median of 5 runs, in milliseconds.
median_ms() {
  local times=()
  for _ in 1 2 3 4 5; do
    local start end
    start=$(date +%s%N)
    "$@" >/dev/null
    end=$(date +%s%N)
    times+=($(((end - start) / 1000)))
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 3p | awk '{printf "%.1f", $1 / 1000}'
}

echo
echo "remat-report plan, 8 ranks x 4 stages per rank = 32 stages, 256 microbatches (median of 5 runs)"
startup=$(median_ms "$report" --version)
echo "process start (remat-report --version): $startup ms"
printf '%-24s %-10s %-12s %-20s %-16s %s\n' schedule "plan (ms)" "plan --json" "schedule --lowered" "plan / schedule" \
  "plan / start"
for s in interleaved-1f1b looped-bfs interleaved-zero-bubble; do
  shape=(--schedule "$s" --ranks 8 --virtual-stages 4 --microbatches 256)
  plan=$(median_ms "$report" plan "${shape[@]}")
  json=$(median_ms "$report" plan "${shape[@]}" --json)
  lowered=$(median_ms "$report" schedule "${shape[@]}" --lowered)
  printf '%-24s %-10s %-12s %-20s %-16s %s\n' "$s" "$plan" "$json" "$lowered" \
    "$(awk -v a="$plan" -v b="$lowered" 'BEGIN { printf "%.2fx", a / b }')" \
    "$(awk -v a="$plan" -v b="$startup" 'BEGIN { printf "%.1fx", a / b }')"
done
