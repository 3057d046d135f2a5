#!/usr/bin/env bash
# Runs each fuzz target for SECONDS (default 600) at low priority, one after the other, and
# prints the number of executions. Crashes land in BUILD_DIR/fuzz-artifacts/.
# usage: run_fuzz.sh BUILD_DIR [SECONDS] [TARGET...]   (default: every target)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run_fuzz.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-600}
shift $(($# < 2 ? $# : 2))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_dump_reader fuzz_trace_reader fuzz_pipeline_csv fuzz_config)
mkdir -p "$build/fuzz-artifacts"
status=0
for target in "${targets[@]}"; do
  case $target in
    fuzz_dump_reader) seeds=dump ;;
    fuzz_trace_reader) seeds=trace ;;
    fuzz_config) seeds=config ;;
    fuzz_pipeline_csv) seeds=pipeline ;;
    *) seeds= ;;  # a target without seeds starts from an empty corpus
  esac
  corpus=$build/fuzz-corpus/$target
  mkdir -p "$corpus"
  [ -z "$seeds" ] || "$here"/make_corpus.sh "$corpus" "$seeds"
  log=$build/$target.log
  echo "== $target for ${seconds}s"
  nice -n 19 "$build/$target" "$corpus" -max_total_time="$seconds" -max_len=65536 -timeout=20 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$target-" 2>&1 | tee "$log" |
    grep -E "^#[0-9]+.*(pulse|DONE)|stat::|ERROR|SUMMARY" || true
  grep -q "stat::number_of_executed_units" "$log" || { echo "$target did not finish cleanly"; status=1; }
done
exit $status
