#!/usr/bin/env python3
"""Benchmarks `remat-report ranks` over thousands of rank snapshots, beside the two ways to
look at them without it, measured in the same run: reading the bytes alone (`cat`, the floor)
and one `remat-report summary` process a file (what a person does today, on a sample).

usage: ranks_bench.py BUILD_DIR [--ranks 2000 20000] [--templates DIR] [--work DIR] [--sample N]

The rank snapshots are copies of templates with each copy's rank in its header: by default
four snapshots the real allocator writes (libremat_alloc.so, host backend) for a pipeline-like
step -- tagged regions and receive slots, a few thousand trace events, about 300 KB, like the
pipeline demo's; --templates DIR takes a folder of snapshots instead (the demo's own:
demo-out/pipeline). Needs GNU time (/usr/bin/time) for peak RSS.
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from run_cli_bench import measure

MiB = 1 << 20


def write_template(rank: int, out: pathlib.Path) -> None:
    """One rank's 1F1B step on stage `rank` of 4: 16 microbatches through its layers, each
    microbatch's receive buffer from a ring of 4 - rank slots, and as in 1F1B the activations
    of 4 - rank microbatches alive at once (stage 0 holds the most)."""
    import remat_alloc

    remat_alloc.configure("backend:host,host_capacity_mb:4096,trace_entries:16384")
    lib = remat_alloc.load()
    in_flight = 4 - rank % 4
    received, kept = [], []
    for microbatch in range(16):
        if len(received) == in_flight:  # the ring's slot is free again before it receives
            lib.remat_free(received.pop(0), 0, 0, None)
        with remat_alloc.recv_slot(rank, "F", microbatch % in_flight):
            received.append(lib.remat_alloc(64 * 1024, 0, None))
        with remat_alloc.region(f"stages.{rank}"):
            for layer in range(2):
                with remat_alloc.region(f"fc{layer + 1}"):
                    blocks = [lib.remat_alloc((layer + 1) * 4096 + 512 * i, 0, None) for i in range(30)]
                    kept.append(blocks.pop())
                    for block in blocks:
                        lib.remat_free(block, 0, 0, None)
        while len(kept) > 2 * in_flight:  # backward of the oldest microbatch frees its activations
            lib.remat_free(kept.pop(0), 0, 0, None)
    remat_alloc.dump_snapshot(str(out / f"snapshot-rank{rank}.json"))


def templates(args, work: pathlib.Path) -> list[bytes]:
    if args.templates:
        files = sorted(args.templates.glob("snapshot-rank*.json"))
        if not files:
            sys.exit(f"{args.templates} holds no snapshot-rank*.json")
    else:
        made = work / "templates"
        made.mkdir(exist_ok=True)
        for rank in range(4):
            subprocess.run([sys.executable, __file__, "--template", str(rank), str(made)], check=True,
                           env=dict(os.environ, RANK=str(rank)), timeout=120)
        files = sorted(made.glob("snapshot-rank*.json"))
    return [f.read_bytes() for f in files]


def write_job(folder: pathlib.Path, ranks: int, texts: list[bytes]) -> int:
    """Rank r is template r % len(texts) with its header's rank set to r; returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for text in texts:
        match = re.search(rb'"rank":\s*\d+', text)
        parts.append((text[: match.start()], text[match.end():]))
    total = 0
    for rank in range(ranks):
        head, tail = parts[rank % len(parts)]
        data = head + b'"rank":' + str(rank).encode() + tail
        (folder / f"snapshot-rank{rank}.json").write_bytes(data)
        total += len(data)
    return total


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--template":
        write_template(int(sys.argv[2]), pathlib.Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--templates", type=pathlib.Path)
    parser.add_argument("--work", type=pathlib.Path)
    parser.add_argument("--sample", type=int, default=200, help="files summarized one process each (default 200)")
    args = parser.parse_args()
    report = args.build_dir / "cli" / "remat-report"
    os.environ.setdefault("REMAT_ALLOC_LIBRARY", str(args.build_dir / "allocator" / "libremat_alloc.so"))
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = pathlib.Path(tmp)
        texts = templates(args, work)
        sizes = [len(t) for t in texts]
        events = [len(json.loads(t)["trace"]["events"]) for t in texts]
        print(f"templates: {len(texts)} snapshots, {min(sizes) // 1024}-{max(sizes) // 1024} KB, "
              f"{min(events)}-{max(events)} trace events")
        print(f"{'ranks':>6} {'input':>9} {'cat s':>7} {'ranks s':>8} {'RSS MiB':>8} {'--json s':>9} {'RSS MiB':>8} "
              f"{'summary/file s':>15} {'vs ranks':>9}")
        for count in args.ranks:
            job = work / f"job-{count}"
            total = write_job(job, count, texts)
            files = sorted(job.iterdir())
            start = time.perf_counter()
            subprocess.run(["cat", *map(str, files[:1])], stdout=subprocess.DEVNULL, check=True)
            subprocess.run(f"cat {job}/* > /dev/null", shell=True, check=True)
            cat_s = time.perf_counter() - start
            text_s, text_rss, _ = measure([report, "ranks", job])
            json_s, json_rss, out = measure([report, "ranks", job, "--by", "slot", "--json"], stdout=subprocess.PIPE)
            document = json.loads(out)
            assert len(document["ranks"]) == count and not document["unreadable"], "every rank read"
            sample = files[: args.sample]
            start = time.perf_counter()
            for f in sample:
                subprocess.run([report, "summary", f], stdout=subprocess.DEVNULL, check=True)
            per_file = (time.perf_counter() - start) / len(sample)
            print(f"{count:>6} {total / MiB:>7.0f}MB {cat_s:>7.2f} {text_s:>8.2f} {text_rss:>8.1f} {json_s:>9.2f} "
                  f"{json_rss:>8.1f} {per_file * count:>15.1f} {per_file * count / text_s:>8.1f}x")
            for f in files:
                f.unlink()
    print("summary/file: one `remat-report summary` process a file, timed on the first --sample files and scaled to "
          "all; vs ranks: that time over `ranks`'s")


if __name__ == "__main__":
    main()
