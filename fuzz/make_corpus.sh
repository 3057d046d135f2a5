#!/usr/bin/env bash
# Seeds a fuzz corpus with real dumps and small variants of them.
# usage: make_corpus.sh OUT_DIR [dump|trace|config|pipeline]
#   dump  (default) whole dumps of every kind, for fuzz_dump_reader
#   trace           event lines without their header, for fuzz_trace_reader
#   config          allocator configuration texts, for fuzz_config
#   pipeline        PyTorch's schedule CSVs behind a form byte, for fuzz_pipeline_csv
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: make_corpus.sh OUT_DIR [dump|trace|config|pipeline]}
target=${2:-dump}
mkdir -p "$out"
data=$here/../tests/cli/data

if [ "$target" = pipeline ]; then
  # Byte 0 picks the form: '0' compute_only, '1' compute_comms (lowered files).
  for csv in "$here"/../tests/pipeline/reference/*.csv; do
    name=$(basename "$csv" .csv)
    case $name in index | grid) continue ;; esac
    form=0
    case $name in *lowered* | *comms* | *runtime*) form=1 ;; esac
    { printf '%s' "$form"; cat "$csv"; } > "$out/$name.bin"
  done
  exit 0
fi

if [ "$target" = config ]; then
  printf '%s' 'backend:host,host_capacity_mb:64,max_split_size_mb:40,memory_fraction:0.5,trace_entries:128' > "$out"/every-number.txt
  printf '%s' ' backend:cuda , oom_dump_dir:/tmp/a:b ,oom_dump_interval_ms:0,tagging:off,' > "$out"/spaces-and-colons.txt
  printf '%s' 'max_split_size_mb:unlimited,memory_fraction:1e-3,trace_entries:0' > "$out"/edge-values.txt
  printf '%s' 'backend,host_capacity_mb:-1,memory_fraction:nan,bogus:1' > "$out"/errors.txt
  exit 0
fi

if [ "$target" = trace ]; then
  tail -n +2 "$data"/trace.jsonl > "$out"/events-all.jsonl
  tail -n +2 "$data"/trace.jsonl | head -n 8 > "$out"/events-head.jsonl
  tail -n +2 "$data"/trace.jsonl | head -n 1 > "$out"/event-one.jsonl
  # The shapes the hot path leaves to the full parser, and the checks after decoding.
  printf '%s\n' '{"tag":1,"size":512,"action":"alloc","stream":0,"address":4096,"time_us":-3}' \
    '{"action":"alloc","time_us":1,"address":4096,"size":512,"stream":0,"tag":1,"tag":2}' \
    '{"action":"alloc","time_us":1,"address":4096,"size":512,"stream":0,"tag":1,"note":"x"}' \
    '{"action":"al\u006coc","time_us":1,"address":8192,"size":512,"stream":0,"tag":2}' \
    '{"action":"alloc","time_us":2,"address":8192,"size":512.5,"stream":0,"tag":2}' > "$out"/events-unusual.jsonl
  printf '%s\n' '{"action":"alloc","time_us":1,"address":4096,"size":512,"stream":0,"tag":1}' \
    '{"action":"alloc","time_us":2,"address":4096,"size":512,"stream":0,"tag":1}' > "$out"/events-alloc-twice.jsonl
  printf '%s\n' '{"action":"segment_alloc","time_us":1,"address":0,"size":9223372036854775808,"stream":0,"tag":0}' \
    '{"action":"segment_alloc","time_us":2,"address":9223372036854775808,"size":9223372036854775807,"stream":0,"tag":0}' \
    '{"action":"segment_alloc","time_us":3,"address":1,"size":5,"stream":0,"tag":0}' > "$out"/events-reserved-overflow.jsonl
  printf '%s\n' '{"action":"free_requested","time_us":-9223372036854775807,"address":4096,"size":512,"stream":0,"tag":1}' \
    '{"action":"oom","time_us":9223372036854775807,"address":0,"size":1,"stream":3,"tag":2}' > "$out"/events-time-span.jsonl
  exit 0
fi

cp "$data"/snapshot-peak.json "$data"/torch-snapshot.json "$data"/torch-snapshot.pickle "$out"/
head -c 4000 "$data"/snapshot-end.json > "$out"/snapshot-cut.json
head -n 12 "$data"/trace.jsonl > "$out"/trace-head.jsonl
head -n 1 "$data"/trace.jsonl > "$out"/trace-header-only.jsonl
printf '%s\n' '{"kind":"trace","schema_version":1,"producer":"p","created_at":"c","host":"h","pid":1,"rank":0,"device":0,"names":["","r"],"tags":[{"region":1,"policy":"save","phase":"forward","site":0,"recv":{"stage":0,"direction":"B","slot":1}}],"event_count":2}' \
  '{"action":"alloc","time_us":1,"address":4096,"size":512,"stream":0,"tag":0}' \
  '{"action":"free_requested","time_us":2,"address":4096,"size":512,"stream":0,"tag":0}' > "$out"/trace-tiny.jsonl
cp "$data"/oom.json "$data"/memory-report.json "$data"/saved-report.json "$data"/remat-trace.json "$out"/
printf '\xef\xbb\xbf{"kind":"snapshot","schema_version":1}' > "$out"/bom.json
printf '{"kind":"snapshot","schema_version":1,"kind":"trace"}' > "$out"/duplicate-key.json
