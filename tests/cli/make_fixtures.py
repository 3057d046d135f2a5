#!/usr/bin/env python3
"""Regenerates tests/cli/data/ from the real producers: remat-alloc-demo (allocator snapshots,
trace, and an OOM report with --force-oom) and remat-train-demo (the checkpoint runtime's
remat-trace, memory-report and saved-report), then pins the fields that change from run to run
(created_at, host, pid, and the OOM report's dump directory in its config) so golden outputs
stay stable.

usage: make_fixtures.py BUILD_DIR [allocator] [oom] [checkpoint]   (default: all three)
"""
import json
import pathlib
import re
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


def allocator_fixtures(build, data):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([str(build / "examples" / "remat-alloc-demo"), "--out", out, "--layers", "2", "--steps", "1",
                        "--microbatches", "2"], check=True, stdout=subprocess.DEVNULL)
        for name in ("snapshot-peak.json", "snapshot-end.json"):
            doc = json.loads(pathlib.Path(out, name).read_text())
            (data / name).write_text(compact(pin(doc)) + "\n")
        lines = pathlib.Path(out, "trace.jsonl").read_text().splitlines()
        lines[0] = compact(pin(json.loads(lines[0])))
        (data / "trace.jsonl").write_text("\n".join(lines) + "\n")


def oom_fixture(build, data):
    with tempfile.TemporaryDirectory() as out:
        # The demo prints the one-line OOM message on stderr; that is expected.
        subprocess.run([str(build / "examples" / "remat-alloc-demo"), "--out", out, "--force-oom"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reports = sorted(pathlib.Path(out).glob("oom-*.json"))
        if len(reports) != 1:
            sys.exit(f"expected one oom-*.json in {out}, found {len(reports)}")
        doc = pin(json.loads(reports[0].read_text()))
        doc["config"] = re.sub(r"oom_dump_dir:[^,]*", "oom_dump_dir:fixture-dir", doc["config"])
        (data / "oom.json").write_text(compact(doc) + "\n")


def checkpoint_fixtures(build, data):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([str(build / "examples" / "remat-train-demo"), "--out", out, "--steps", "2", "--layers", "2"],
                       check=True, stdout=subprocess.DEVNULL)
        for name in ("remat-trace.json", "memory-report.json", "saved-report.json"):
            doc = json.loads(pathlib.Path(out, name).read_text())
            (data / name).write_text(json.dumps(pin(doc), indent=2, ensure_ascii=False) + "\n")


GROUPS = {"allocator": allocator_fixtures, "oom": oom_fixture, "checkpoint": checkpoint_fixtures}


def main():
    build = pathlib.Path(sys.argv[1])
    data = pathlib.Path(__file__).resolve().parent / "data"
    data.mkdir(exist_ok=True)
    groups = sys.argv[2:] or list(GROUPS)
    for group in groups:
        if group not in GROUPS:
            sys.exit(f"unknown fixture group '{group}'; expected one of {', '.join(GROUPS)}")
        GROUPS[group](build, data)


if __name__ == "__main__":
    main()
