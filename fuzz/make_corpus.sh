#!/usr/bin/env bash
# Seeds the fuzz corpus with real dumps and small variants of them.
# usage: make_corpus.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: make_corpus.sh OUT_DIR}
mkdir -p "$out"
data=$here/../tests/cli/data
cp "$data"/snapshot-peak.json "$data"/torch-snapshot.json "$data"/torch-snapshot.pickle "$out"/
head -c 4000 "$data"/snapshot-end.json > "$out"/snapshot-cut.json
head -n 12 "$data"/trace.jsonl > "$out"/trace-head.jsonl
head -n 1 "$data"/trace.jsonl > "$out"/trace-header-only.jsonl
printf '%s\n' '{"kind":"trace","schema_version":1,"producer":"p","created_at":"c","host":"h","pid":1,"rank":0,"device":0,"names":["","r"],"tags":[{"region":1,"policy":"save","phase":"forward","site":0,"recv":{"stage":0,"direction":"B","slot":1}}],"event_count":2}' \
  '{"action":"alloc","time_us":1,"address":4096,"size":512,"stream":0,"tag":0}' \
  '{"action":"free_requested","time_us":2,"address":4096,"size":512,"stream":0,"tag":0}' > "$out"/trace-tiny.jsonl
