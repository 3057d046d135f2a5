#!/usr/bin/env python3
"""Categories (remat_alloc.track's parameter, gradient, ..., with a module path) through
remat-report: a snapshot whose tags carry them groups by them with --by category and --by module
in memory, diff and timeline, and shows them in summary; export writes them as frames and import
reads them back; an OOM dump's holders by category and module are shown by `oom` and read by
`ranks --by category`, whose largest group per rank is then a category, not a placeholder.

usage: check_categories.py REMAT_REPORT
"""
import json
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def run(*args):
    return subprocess.run([sys.argv[1], *args], cwd=HERE, capture_output=True, text=True, check=True).stdout


def categorized_snapshot(path, source="data/snapshot-peak.json"):
    """`source` with the tags of layers.N (and regions under it) as activations of module
    model.layers.N, those whose region has "attention" as temporaries of it, and the untagged
    tag (no region) a parameter of module embed.weight."""
    snap = json.loads((HERE / source).read_text())
    names = snap["names"]
    for tag in snap["tags"]:
        region = names[tag["region"]]
        if not region:
            tag["category"] = "parameter"
            module = "embed.weight"
        else:
            layer = region.split("::")[0]
            tag["category"] = "temporary" if "attention" in region else "activation"
            module = "model." + layer
        if module not in names:
            names.append(module)
        tag["module"] = names.index(module)
    path.write_text(json.dumps(snap))
    return snap


def live_by(path, by):
    rows = json.loads(run("memory", str(path), "--by", by, "--json"))["memory"]
    return {row[by]: row["live_bytes"] for row in rows}


def expected_live(snap, key):
    """Live bytes per group from the tag statistics, computed independently of remat-report."""
    out = {}
    for stat in snap["tag_stats"]:
        name = key(snap["tags"][stat["tag"]], snap["names"])
        out[name] = out.get(name, 0) + stat["bytes"]["current"]
    return {name: bytes_ for name, bytes_ in out.items() if bytes_}


def check_snapshot(tmp):
    path = tmp / "categorized.json"
    snap = categorized_snapshot(path)
    run("validate", str(path))
    by_category = live_by(path, "category")
    expected = expected_live(snap, lambda tag, names: tag["category"])
    assert {k: v for k, v in by_category.items() if v} == expected, (by_category, expected)
    assert set(expected) == {"parameter", "activation", "temporary"}, expected
    by_module = live_by(path, "module")
    expected = expected_live(snap, lambda tag, names: f"{names[tag['module']]} ({tag['category']})")
    assert {k: v for k, v in by_module.items() if v} == expected, (by_module, expected)

    summary = json.loads(run("summary", str(path), "--json"))
    assert {row["category"] for row in summary["top_categories"]} >= {"parameter", "activation"}, summary
    assert summary["top_modules"], summary
    plain = json.loads(run("summary", "data/snapshot-peak.json", "--json"))
    assert "top_categories" not in plain, "a snapshot without categories has no category table"
    assert set(live_by(HERE / "data/snapshot-peak.json", "category")) == {"(no category)"}

    end = tmp / "categorized-end.json"
    categorized_snapshot(end, "data/snapshot-end.json")
    diff = json.loads(run("diff", str(path), str(end), "--by", "category", "--json"))
    assert diff and "activation" in json.dumps(diff), diff
    trace = tmp / "trace.jsonl"
    lines = (HERE / "data/trace.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["tags"] = [dict(tag, category="activation") if tag["region"] else tag for tag in header["tags"]]
    trace.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    run("timeline", str(trace), "--by", "category", "-o", str(tmp / "timeline.svg"))
    assert "activation" in (tmp / "timeline.svg").read_text()
    refused = subprocess.run([sys.argv[1], "memory", str(path), "--by", "colour"], cwd=HERE, capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "category" in refused.stderr, refused.stderr
    bad = json.loads(path.read_text())
    bad["tags"][1]["category"] = "weights"
    (tmp / "bad.json").write_text(json.dumps(bad))
    refused = subprocess.run([sys.argv[1], "validate", str(tmp / "bad.json")], cwd=HERE, capture_output=True, text=True)
    assert refused.returncode != 0 and "weights" in refused.stdout + refused.stderr, refused
    print("ok a categorized snapshot: memory, summary, diff and timeline by category and module")
    return path


def check_retag(tmp):
    """A retag event moves a live block to its new tag's group: memory's live and peak columns and
    timeline's series name it by the category it was given, from that event on; validate accepts it."""
    trace = tmp / "retagged.jsonl"
    header = json.loads((HERE / "data/trace.jsonl").read_text().splitlines()[0])
    header["names"] = ["", "layers.0", "w"]
    header["tags"] = [{"region": 0, "policy": "none", "phase": "other", "site": 0, "recv": None},
                      {"region": 0, "policy": "none", "phase": "forward", "site": 0, "recv": None,
                       "category": "temporary", "module": 1},
                      {"region": 0, "policy": "none", "phase": "forward", "site": 0, "recv": None,
                       "category": "parameter", "module": 2}]
    events = [("alloc", 0x1000, 4096, 1), ("retag", 0x1000, 4096, 2), ("alloc", 0x3000, 1024, 1),
              ("free_requested", 0x3000, 1024, 1), ("free_completed", 0x3000, 1024, 1)]
    header["event_count"] = len(events)
    header.pop("dropped_records", None)
    lines = [json.dumps(header)]
    for i, (action, address, size, tag) in enumerate(events):
        lines.append(json.dumps({"action": action, "time_us": 1000 + i, "address": address, "size": size, "stream": 0,
                                 "tag": tag}))
    trace.write_text("\n".join(lines) + "\n")
    run("validate", str(trace))
    memory = json.loads(run("memory", str(trace), "--by", "category", "--json"))["memory"]
    rows = {row["category"]: row for row in memory}
    assert rows["parameter"]["live_bytes"] == 4096 and rows["parameter"]["peak_bytes"] == 4096, rows
    assert rows["temporary"]["live_bytes"] == 0 and rows["temporary"]["peak_bytes"] == 4096, rows
    summary = run("summary", str(trace))
    assert "retag" in summary, summary
    run("timeline", str(trace), "--by", "category", "-o", str(tmp / "retagged.svg"))
    assert "parameter" in (tmp / "retagged.svg").read_text()
    print("ok a retag event moves a block to its new category in memory and timeline")


def check_roundtrip(tmp, path):
    pickled = tmp / "categorized.pickle"
    run("export", str(path), "--to", "torch-snapshot", "-o", str(pickled))
    back = tmp / "categorized-back.json"
    run("import", str(pickled), "-o", str(back))
    run("validate", str(back))
    assert live_by(back, "category") == live_by(path, "category"), "categories lost in the round trip"
    assert live_by(back, "module") == live_by(path, "module"), "modules lost in the round trip"
    print("ok export writes categories and modules as frames; import reads them back")


def check_oom_and_ranks(tmp, snapshot):
    oom = json.loads((HERE / "data/oom.json").read_text())
    held = oom["figures"]["allocated_bytes"] if "figures" in oom else None
    total = sum(h["bytes"] for h in oom["holders"]["by_region"])
    oom["holders"]["by_category"] = [{**oom["holders"]["by_region"][0], "name": "optimizer_state", "bytes": total}]
    oom["holders"]["by_module"] = [{**oom["holders"]["by_region"][0], "name": "layers.0.weight", "bytes": total}]
    path = tmp / "oom-categorized.json"
    path.write_text(json.dumps(oom))
    run("validate", str(path))
    text = run("oom", str(path))
    assert "Held by category" in text and "optimizer_state" in text and "Held by module" in text, text
    assert held is None or held >= 0

    job = tmp / "job"
    job.mkdir()
    for rank in (0, 1):
        doc = json.loads(snapshot.read_text())
        doc["rank"] = rank
        (job / f"snapshot-rank{rank}.json").write_text(json.dumps(doc))
    ranks = json.loads(run("ranks", str(job), "--by", "category", "--json"))
    for row in ranks["ranks"]:
        largest = row["largest_group"]
        assert largest is not None and not largest["placeholder"], row
        assert largest["name"] in {"parameter", "activation", "temporary"}, row
    print("ok OOM holders by category and module; ranks --by category")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        path = check_snapshot(tmp)
        check_retag(tmp)
        check_roundtrip(tmp, path)
        check_oom_and_ranks(tmp, path)
        print("ok categories")


if __name__ == "__main__":
    main()
