#!/usr/bin/env bash
# Runs the dump-reader fuzzer for SECONDS (default 600) at low priority and prints the
# number of executions. Crashes land in BUILD_DIR/fuzz-artifacts/.
# usage: run_fuzz.sh BUILD_DIR [SECONDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run_fuzz.sh BUILD_DIR [SECONDS]}
seconds=${2:-600}
corpus=$build/fuzz-corpus
mkdir -p "$corpus" "$build/fuzz-artifacts"
"$here"/make_corpus.sh "$corpus"
nice -n 19 "$build"/fuzz_dump_reader "$corpus" -max_total_time="$seconds" -max_len=65536 -timeout=20 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/" 2>&1 | tee "$build/fuzz.log" |
  grep -E "^#[0-9]+.*(pulse|DONE)|stat::|ERROR|SUMMARY" || true
grep -q "stat::number_of_executed_units" "$build/fuzz.log" || { echo "fuzzer did not finish cleanly"; exit 1; }
