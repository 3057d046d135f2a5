"""`remat-report ranks` over what a job's ranks really write: one process a rank (RANK set, as a
launcher sets it) drives the real allocator on the host backend, tags its memory by layer, and
writes a snapshot; two ranks run out of memory, so the OOM observer writes their OOM dumps too.
Then: the report's figures against each rank's own dumps, equal ranks on one row, each region's
spread, which rank failed first, every kind of unreadable input, --strict, a PyTorch pickle,
the schema, and the picture.

usage: check_ranks.py REMAT_REPORT SCHEMA_DIR   (REMAT_ALLOC_LIBRARY and PYTHONPATH as for remat_alloc)
       check_ranks.py --worker RANK OUT SCALE OOM   (one rank)
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

MiB = 1 << 20
HERE = pathlib.Path(__file__).resolve().parent
# rank: (scale of its layers, runs out of memory). Rank 4 writes nothing; ranks 0 and 1 match.
RANKS = {5: (1, True), 0: (1, False), 1: (1, False), 2: (2, True), 3: (3, False)}
failures = []


def expect(condition, message):
    if not condition:
        failures.append(message)
        print("FAILED", message)


def worker(rank: int, out: str, scale: int, oom: bool) -> None:
    import remat_alloc

    remat_alloc.configure(f"backend:host,host_capacity_mb:64,oom_dump_dir:{out},oom_dump_interval_ms:0")
    lib = remat_alloc.load()
    held = []
    for layer in range(2):
        with remat_alloc.region(f"layers.{layer}"):
            held.append(lib.remat_alloc(scale * (layer + 1) * MiB, 0, None))
    untagged = lib.remat_alloc(5 * MiB, 0, None)  # freed before the snapshot: in the peak only
    lib.remat_free(untagged, 0, 0, None)
    if oom:
        assert lib.remat_alloc(100 * MiB, 0, None) is None, "the request was expected to fail"
    remat_alloc.dump_snapshot(os.path.join(out, f"snapshot-rank{rank}.json"))
    remat_alloc.dump_trace(os.path.join(out, f"trace-rank{rank}.jsonl"))


def report(binary, *args, expect_code=0):
    done = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=120)
    expect(done.returncode == expect_code,
           f"remat-report {' '.join(map(str, args))} exited {done.returncode}, expected {expect_code}: {done.stderr}")
    return done


def validate(schema_dir: pathlib.Path, document: dict) -> None:
    try:
        import jsonschema
    except ImportError:
        print("python-jsonschema not installed: the schema is checked by remat-report validate only")
        return
    schema = json.loads((schema_dir / "ranks.schema.json").read_text())
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(document)]
    expect(not errors, f"the ranks dump passes python-jsonschema: {errors[:3]}")


def check_job(binary, schema_dir, out: pathlib.Path) -> dict:
    done = report(binary, "ranks", out, "--by", "region", "--json")
    document = json.loads(done.stdout)
    validate(schema_dir, document)
    saved = out.parent / "ranks.json"
    saved.write_text(done.stdout)
    expect("valid ranks dump" in report(binary, "validate", saved).stdout, "remat-report validate reads the dump")

    ranks = {entry["rank"]: entry for entry in document["ranks"]}
    expect(sorted(ranks) == sorted(RANKS), f"one entry a rank: {sorted(ranks)}")
    expect(document["missing_ranks"] == [{"first": 4, "last": 4}], f"rank 4 is missing: {document['missing_ranks']}")
    expect(document["unreadable"] == [], f"nothing unreadable: {document['unreadable']}")
    expect(document["skipped"] == {"trace": len(RANKS)}, f"the traces are skipped by kind: {document['skipped']}")
    expect(document["dumps_read"] == len(RANKS) + 2, "five snapshots and two OOM dumps are read")
    for rank, entry in ranks.items():
        summary = json.loads(report(binary, "summary", out / f"snapshot-rank{rank}.json", "--json").stdout)
        expect(entry["peak_allocated_bytes"] == summary["stats"]["allocated.peak"], f"rank {rank}: peak allocated")
        expect(entry["peak_reserved_bytes"] == summary["stats"]["reserved.peak"], f"rank {rank}: peak reserved")
        expect(entry["ooms"] == summary["stats"]["ooms"], f"rank {rank}: OOMs")
        expect(entry["kind"] == "snapshot" and entry["path"].endswith(f"snapshot-rank{rank}.json"),
               f"rank {rank}: its peaks come from its snapshot")
        expect(len(entry["oom_dumps"]) == (1 if RANKS[rank][1] else 0), f"rank {rank}: its OOM dumps")
        scale = RANKS[rank][0]
        layers = {g["name"]: g["bytes"] for g in entry["groups"] if not g["placeholder"]}
        expect(layers == {"layers.0": scale * MiB, "layers.1": 2 * scale * MiB}, f"rank {rank}: its layers {layers}")
        expect(entry["largest_group"]["name"] == ("layers.1" if scale == 3 else "(untagged)"),
               f"rank {rank}: largest region {entry['largest_group']}")
    peaks = [e["peak_allocated_bytes"] for e in document["ranks"]]
    expect(peaks == sorted(peaks, reverse=True), "ranks by peak, highest first")
    expect(document["ranks"][0]["rank"] == 3, "rank 3 is the hottest")
    ordered = sorted(peaks)
    expect(document["median_peak_allocated_bytes"] == ordered[2], "the median of five ranks is the middle one")
    expect(abs(document["imbalance"] - max(peaks) / ordered[2]) < 1e-9, "imbalance is max / median")

    spreads = {g["name"]: g for g in document["groups"]}
    layer1 = spreads["layers.1"]
    expect((layer1["min_bytes"], layer1["median_bytes"], layer1["max_bytes"], layer1["max_rank"]) ==
           (2 * MiB, 2 * MiB, 6 * MiB, 3), f"layers.1 spreads 2 MiB to 6 MiB, max on rank 3: {layer1}")
    expect(layer1["ranks_with_group"] == len(RANKS), "every rank has layers.1")

    first = document["first_oom"]
    expect(first is not None and first["rank"] == 5, f"rank 5 ran out first: {first}")
    expect(first["requested_bytes"] == 100 * MiB and first["time_from"] == "event", f"its request: {first}")
    others = first["others"]
    expect(others[0]["rank"] == 2 and others[0]["failed_after_us"] > 0, f"rank 2 failed after it: {others[0]}")
    standing = others[1:]
    expect(sorted(o["rank"] for o in standing) == [0, 1, 3], f"the ranks that did not fail: {standing}")
    expect(all(o["failed_after_us"] is None and o["headroom_bytes"] == 64 * MiB - ranks[o["rank"]]["peak_reserved_bytes"]
               for o in standing), f"their headroom is the device beyond their peak reserved: {standing}")
    headroom = [o["headroom_bytes"] for o in standing]
    expect(headroom == sorted(headroom), f"least headroom first: {standing}")
    expect(ranks[5]["first_oom"]["time_us"] < ranks[2]["first_oom"]["time_us"], "the failures' times are in order")
    return document


def check_text(binary, out: pathlib.Path) -> None:
    text = report(binary, "ranks", out).stdout
    rows = [line.split() for line in text.splitlines()]
    expect(["0-1"] in [row[:1] for row in rows], f"ranks 0 and 1 share a row:\n{text}")
    expect("missing_ranks          4" in text, f"the missing rank is named:\n{text}")
    expect("Out of memory: rank 5 failed first" in text, f"the first failure is named:\n{text}")
    top = report(binary, "ranks", out, "--top", "1").stdout
    expect("(3 more rows, 4 ranks: --top 0 shows all)" in top, f"--top 1 folds the rest:\n{top}")
    csv = report(binary, "ranks", out, "--csv").stdout.splitlines()
    expect(csv[0].startswith("rank,path,kind,") and len(csv) == 1 + len(RANKS), f"CSV: a row a rank:\n{csv}")


def check_faults(binary, out: pathlib.Path, work: pathlib.Path) -> None:
    faults = work / "faults"
    faults.mkdir()
    good = faults / "snapshot-rank0.json"
    shutil.copy(out / "snapshot-rank0.json", good)
    text = (out / "snapshot-rank1.json").read_text()
    (faults / "cut.json").write_text(text[: len(text) // 2])
    newer = json.loads((out / "snapshot-rank3.json").read_text())
    newer["schema_version"] = 2
    (faults / "newer.json").write_text(json.dumps(newer))
    shutil.copy(out / "snapshot-rank0.json", faults / "again.json")
    (oom,) = [p for p in out.glob("oom-*.json") if json.loads(p.read_text())["rank"] == 2]
    shutil.copy(oom, faults / "oom-a.json")
    shutil.copy(oom, faults / "oom-b.json")
    os.mkfifo(faults / "pipe.json")  # named, never opened: no writer would ever come
    named = [faults / "cut.json", faults / "newer.json", faults / "again.json", out / "trace-rank0.jsonl",
             faults / "oom-a.json", faults / "oom-b.json", faults / "pipe.json"]
    done = report(binary, "ranks", good, *named, "--json")
    document = json.loads(done.stdout)
    reasons = {pathlib.Path(u["path"]).name: u["reason"] for u in document["unreadable"]}
    print(json.dumps(reasons, indent=1))
    expect(sorted(reasons) == ["again.json", "cut.json", "newer.json", "oom-b.json", "pipe.json",
                               "trace-rank0.jsonl"], f"each bad input is named: {sorted(reasons)}")
    expect("not a regular file" in reasons.get("pipe.json", ""), "a pipe is refused, not read")
    expect("schema_version 2" in reasons.get("newer.json", ""), "another schema version")
    expect("rank 0 is already read from" in reasons.get("again.json", ""), "two files claim rank 0")
    expect("trace dump, not a rank's snapshot" in reasons.get("trace-rank0.jsonl", ""), "another kind")
    expect("same dump twice" in reasons.get("oom-b.json", ""), "the same OOM dump twice")
    expect(sorted(e["rank"] for e in document["ranks"]) == [0, 2], "the readable dumps are still reported")
    expect(document["missing_ranks"] == [{"first": 1, "last": 1}], "rank 1 is missing")
    strict = report(binary, "ranks", good, faults / "cut.json", "--strict", expect_code=2)
    expect("Ranks by peak allocated" in strict.stdout and "--strict: 1 of the dumps" in strict.stderr,
           f"--strict prints the report, then fails: {strict.stderr}")

    pickles = work / "pickles"
    pickles.mkdir()
    shutil.copy(HERE / "data" / "torch-snapshot.pickle", pickles / "rank7.pickle")
    shutil.copy(HERE / "data" / "torch-snapshot.pickle", pickles / "nameless.pickle")
    (pickles / "notes.txt").write_text("not a dump\n")
    (pickles / "config.json").write_text('{"lr": 0.1}\n')
    document = json.loads(report(binary, "ranks", pickles, "--json").stdout)
    expect([(e["rank"], e["kind"]) for e in document["ranks"]] == [(7, "torch_snapshot")],
           f"a pickle's rank from its name: {document['ranks']}")
    expect([pathlib.Path(u["path"]).name for u in document["unreadable"]] == ["nameless.pickle"],
           f"a pickle without a rank in its name: {document['unreadable']}")
    expect(document["skipped"] == {"not a dump": 2}, f"other files in the folder: {document['skipped']}")
    expect(document["missing_ranks"] == [{"first": 0, "last": 6}], "ranks 0-6 are missing")

    absent = report(binary, "ranks", good, faults / "absent.json", expect_code=2)
    expect("absent.json: no such file or folder" in absent.stderr and not absent.stdout,
           f"a path that does not exist fails before any report, naming it: {absent.stderr}")

    empty = work / "empty"
    empty.mkdir()
    expect("no rank's snapshot or OOM dump" in report(binary, "ranks", empty, expect_code=2).stderr, "an empty folder")
    report(binary, "ranks", "-", expect_code=1)
    report(binary, "ranks", out, "--svg", work / "picture.png", expect_code=1)


def check_rank_named_faults(binary, out: pathlib.Path, work: pathlib.Path) -> None:
    """A file named like a rank's dump that holds none is unreadable, not skipped: --strict fails."""
    folder = work / "rank-named"
    folder.mkdir()
    shutil.copy(out / "snapshot-rank0.json", folder / "snapshot-rank0.json")
    (folder / "snapshot-rank1.json").write_bytes(b"")
    (folder / "snapshot-rank2.json").write_bytes(b"\xef\xbb\xbf" + (out / "snapshot-rank2.json").read_bytes())
    (folder / "notes.txt").write_text("not a dump\n")
    done = report(binary, "ranks", folder, "--json", "--strict", expect_code=2)
    document = json.loads(done.stdout)
    reasons = {pathlib.Path(u["path"]).name: u["reason"] for u in document["unreadable"]}
    expect(sorted(reasons) == ["snapshot-rank1.json", "snapshot-rank2.json"], f"both are unreadable: {reasons}")
    expect("empty" in reasons.get("snapshot-rank1.json", ""), f"the empty file says so: {reasons}")
    expect("UTF-8 byte-order mark" in reasons.get("snapshot-rank2.json", ""), f"the BOM is named: {reasons}")
    expect(document["skipped"] == {"not a dump": 1}, f"only the notes are skipped: {document['skipped']}")


def check_read_once(binary, out: pathlib.Path, work: pathlib.Path) -> None:
    """A file reached twice (named twice, its folder twice, a symlink beside it) is read once."""
    folder = work / "twice"
    folder.mkdir()
    shutil.copy(out / "snapshot-rank0.json", folder / "snapshot-rank0.json")
    shutil.copy(out / "snapshot-rank3.json", folder / "snapshot-rank3.json")
    os.symlink(folder / "snapshot-rank0.json", folder / "latest.json")
    file = folder / "snapshot-rank0.json"
    for args in ([file, file], [folder, folder], [folder, file], [folder]):
        document = json.loads(report(binary, "ranks", *args, "--json", "--strict").stdout)
        expect(document["unreadable"] == [], f"{args}: nothing reported twice: {document['unreadable']}")
        expect(sorted(e["rank"] for e in document["ranks"]) == ([0] if args[0] == file else [0, 3]),
               f"{args}: each rank once: {document['ranks']}")


def check_picture(binary, out: pathlib.Path, work: pathlib.Path, document: dict) -> None:
    svg, html = work / "ranks.svg", work / "ranks.html"
    report(binary, "ranks", out, "--svg", svg, "--html", html)
    root = ElementTree.parse(svg).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    bars = [g for g in root.iter(f"{ns}g") if g.get("class") == "bar"]
    peaks = {e["rank"]: e["peak_allocated_bytes"] for e in document["ranks"]}
    expect({int(b.get("data-rank")): int(b.get("data-peak")) for b in bars} == peaks, "a bar a rank, at its peak")
    expect({int(b.get("data-rank")) for b in bars if b.get("data-oom") == "true"} == {2, 5}, "the OOM ranks marked")
    for bar in bars:
        parts = sum(int(r.get("data-bytes")) for r in bar.iter(f"{ns}rect") if r.get("class") == "part")
        expect(parts == int(bar.get("data-peak")), f"rank {bar.get('data-rank')}: its stack adds up to its peak")
    expect(html.read_text().count("<tr>") == 1 + len(RANKS), "the page lists the hottest ranks")


def check_crowded_picture(binary, out: pathlib.Path, work: pathlib.Path) -> None:
    """2,000 ranks share bars: the hottest and the OOM ranks are still marked and named, over the frame."""
    folder = work / "crowded"
    folder.mkdir()
    base = json.loads((out / "snapshot-rank0.json").read_text())
    base["trace"]["events"] = []
    hottest = [1234, 1999, 7]
    failed = set(range(3, 2000, 40))  # 50 ranks, most of them not the highest of their bar
    for rank in range(2000):
        doc = dict(base, rank=rank)
        stats = json.loads(json.dumps(base["stats"]))
        peak = 64 * MiB + (rank % 3) * MiB
        if rank in hottest:
            peak = (200 - hottest.index(rank)) * MiB
        stats["allocated_bytes"]["peak"] = peak
        stats["reserved_bytes"]["peak"] = max(stats["reserved_bytes"]["peak"], peak)
        stats["num_ooms"] = 1 if rank in failed else 0
        doc["stats"] = stats
        (folder / f"snapshot-rank{rank}.json").write_text(json.dumps(doc))
    svg = work / "crowded.svg"
    report(binary, "ranks", folder, "--svg", svg, "--strict")
    root = ElementTree.parse(svg).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    children = list(root)
    frame = max(i for i, e in enumerate(children) if e.tag == f"{ns}rect" and e.get("stroke") == "#888")
    named = [(i, e) for i, e in enumerate(children) if e.get("id") == "named-ranks"]
    expect(len(named) == 1 and named[0][0] > frame, "the named ranks are drawn over the frame line")
    marks = [g for g in named[0][1] if g.get("class") == "named"] if named else []
    got = [(int(g.get("data-rank")), g.get("data-reason")) for g in marks]
    expect(got == [(r, "hottest") for r in hottest] + [(r, "oom") for r in sorted(failed)[:3]],
           f"the 3 hottest and the first 3 OOM ranks are marked: {got}")
    expect(all(f"rank {r}" in "".join(g.itertext()) for g, (r, _) in zip(marks, got)), "each mark names its rank")
    bars = [g for g in root.iter(f"{ns}g") if g.get("class") == "bar"]
    expect(len(bars) < 2000 and all(int(b.get("data-rank")) in range(int(b.get("data-first-rank")),
                                                                          int(b.get("data-last-rank")) + 1) for b in bars),
           f"{len(bars)} bars, each the highest of its ranks")
    shared = [b for b in bars if b.get("data-oom") == "true"]
    expect(len(shared) == len(failed), f"a bar for each OOM rank's bucket: {len(shared)}")
    for bar in shared:
        oom = [r for r in failed if int(bar.get("data-first-rank")) <= r <= int(bar.get("data-last-rank"))]
        titles = " ".join("".join(t.itertext()) for t in bar.iter(f"{ns}title"))
        expect(all(f"ran out of memory: rank {r}" in titles for r in oom), f"the tooltip names the OOM rank {oom}: {titles}")
    expect(not [p for p in root.iter(f"{ns}path") if p.get("class") == "oom"], "no OOM triangles stacked over the bars")
    legend = "".join(next(g for g in root.iter(f"{ns}g") if g.get("id") == "legend").itertext())
    expect("ran out of memory (50 ranks" in legend and "hottest: rank 1234" in legend, f"the legend names them: {legend}")


def check_median_label(binary, out: pathlib.Path, work: pathlib.Path) -> None:
    """At a few ranks the median's value sits in the legend, not on its line over the right-most bars."""
    svg = work / "median.svg"
    report(binary, "ranks", out, "--svg", svg)
    root = ElementTree.parse(svg).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    median = next(g for g in root.iter(f"{ns}g") if g.get("id") == "median")
    expect(not list(median.iter(f"{ns}text")), "no text on the median line")
    legend = "".join(next(g for g in root.iter(f"{ns}g") if g.get("id") == "legend").itertext())
    expect("median " in legend, f"the legend gives the median: {legend}")
    expect(not any(g.get("id") == "named-ranks" for g in root.iter(f"{ns}g")), "a bar a rank needs no names")


def main() -> int:
    if sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1")
        return 0
    binary, schema_dir = sys.argv[1], pathlib.Path(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        out = work / "job"
        out.mkdir()
        for rank, (scale, oom) in RANKS.items():  # rank 5 first: it runs out of memory first
            env = dict(os.environ, RANK=str(rank))
            subprocess.run([sys.executable, __file__, "--worker", str(rank), str(out), str(scale), "1" if oom else "0"],
                           env=env, check=True, timeout=60)
        document = check_job(binary, schema_dir, out)
        check_text(binary, out)
        check_faults(binary, out, work)
        check_rank_named_faults(binary, out, work)
        check_read_once(binary, out, work)
        check_picture(binary, out, work, document)
        check_crowded_picture(binary, out, work)
        check_median_label(binary, out, work)
    print("FAILED" if failures else "OK", f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
