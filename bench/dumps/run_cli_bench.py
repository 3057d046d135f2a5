#!/usr/bin/env python3
"""Benchmarks remat-report on a large generated trace and compares it, side by side in one
run, with jq computing the same per-region live and peak bytes.

usage: run_cli_bench.py BUILD_DIR [--events N] [--work DIR] [--skip-jq]

Needs GNU time (/usr/bin/time, Debian package `time`) for peak RSS. Prints wall time and
peak RSS of each command, the ratio jq / remat-report, and checks that
both produce the same per-region numbers.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent


def measure(args, stdout=subprocess.DEVNULL):
    """Wall seconds, peak RSS in MB and stdout of one command. Peak RSS comes from GNU time:
    a child forked from Python would count the interpreter's pages it started with."""
    with tempfile.NamedTemporaryFile("r") as rss_file:
        start = time.perf_counter()
        run = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file.name, *map(str, args)], stdout=stdout,
                             stderr=subprocess.PIPE)
        wall = time.perf_counter() - start
        if run.returncode != 0:
            sys.exit(f"{' '.join(map(str, args))} failed: {run.stderr.decode()}")
        rss_kb = float(rss_file.read().strip().splitlines()[-1])
    return wall, rss_kb / 1024.0, run.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/remat-cli-bench"))
    parser.add_argument("--skip-jq", action="store_true")
    opts = parser.parse_args()
    report = opts.build_dir / "cli" / "remat-report"
    generator = opts.build_dir / "bench" / "dumps" / "remat-dump-gen"
    opts.work.mkdir(parents=True, exist_ok=True)
    trace = opts.work / f"trace-{opts.events}.jsonl"
    if not trace.exists():
        wall, _, _ = measure([generator, "--events", str(opts.events), "-o", trace])
        print(f"generated {trace} in {wall:.1f} s")
    size = trace.stat().st_size
    print(f"trace: {size / 1e9:.2f} GB, {opts.events} events, {os.cpu_count()} CPUs")
    # Read once so every command below starts from the page cache alike.
    measure(["cat", trace])

    rows = []
    for name, args in [
        ("summary", ["summary", trace]),
        ("memory --by region", ["memory", trace]),
        ("memory --by site", ["memory", trace, "--by", "site"]),
        ("segments", ["segments", trace]),
        ("timeline -o .svg", ["timeline", trace, "-o", opts.work / "timeline.svg"]),
        ("timeline -o .html", ["timeline", trace, "-o", opts.work / "timeline.html"]),
        ("validate", ["validate", trace]),
    ]:
        wall, rss, _ = measure([report, *args])
        rows.append((f"remat-report {name}", wall, rss))

    wall, rss, out = measure([report, "memory", trace, "--json"], stdout=subprocess.PIPE)
    ours = {r["region"]: (r["live_bytes"], r["peak_bytes"]) for r in json.loads(out)["memory"]}
    rows.append(("remat-report memory --json", wall, rss))
    ours_wall = wall

    jq = shutil.which("jq")
    if jq and not opts.skip_jq:
        jq_wall, jq_rss, out = measure([jq, "-n", "-c", "-f", HERE / "region_totals.jq", trace], stdout=subprocess.PIPE)
        rows.append(("jq region_totals.jq", jq_wall, jq_rss))
        theirs = json.loads(out)
        theirs = {r: (theirs["live"].get(r, 0), theirs["peak"].get(r, 0)) for r in theirs["peak"]}
        agree = theirs == ours
    print(f"{'command':34} {'wall s':>8} {'peak RSS MB':>12} {'MB/s':>8}")
    for name, wall, rss in rows:
        print(f"{name:34} {wall:8.2f} {rss:12.1f} {size / 1e6 / wall:8.0f}")
    if jq and not opts.skip_jq:
        print(f"jq / remat-report (same per-region live and peak bytes): {jq_wall / ours_wall:.1f}x; "
              f"results {'agree' if agree else 'DIFFER'}")
        if not agree:
            sys.exit(1)


if __name__ == "__main__":
    main()
