#!/usr/bin/env python3
"""Regenerates tests/cli/data/ from the real allocator: runs remat-alloc-demo, then pins the
fields that change from run to run (created_at, host, pid) so golden outputs stay stable.

usage: make_fixtures.py BUILD_DIR
"""
import json
import pathlib
import subprocess
import sys
import tempfile

PINNED = {"created_at": "2026-01-01T00:00:00Z", "host": "fixture-host", "pid": 4242}


def pin(doc):
    for key, value in PINNED.items():
        if key in doc:
            doc[key] = value
    return doc


def compact(doc):
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def main():
    build = pathlib.Path(sys.argv[1])
    data = pathlib.Path(__file__).resolve().parent / "data"
    data.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([str(build / "examples" / "remat-alloc-demo"), "--out", out, "--layers", "2", "--steps", "1",
                        "--microbatches", "2"], check=True, stdout=subprocess.DEVNULL)
        for name in ("snapshot-peak.json", "snapshot-end.json"):
            doc = json.loads(pathlib.Path(out, name).read_text())
            (data / name).write_text(compact(pin(doc)) + "\n")
        lines = pathlib.Path(out, "trace.jsonl").read_text().splitlines()
        lines[0] = compact(pin(json.loads(lines[0])))
        (data / "trace.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
