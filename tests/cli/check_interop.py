#!/usr/bin/env python3
"""Export and import against PyTorch's snapshot format: the exported pickle loads with
Python's pickle and has the layout PyTorch's memory tools read (and, where torch is
installed, `python -m torch.cuda._memory_viz stats` reads it); a pickle in PyTorch's layout
imports into a valid remat snapshot; export then import keeps live bytes per region.

usage: check_interop.py REMAT_REPORT
"""
import importlib.util
import json
import pathlib
import pickle
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def run(*args):
    return subprocess.run([sys.argv[1], *args], cwd=HERE, capture_output=True, text=True, check=True).stdout


def memory_viz_command():
    """How to run PyTorch's _memory_viz: as a module where torch imports, else as its file
    (it needs nothing from torch itself), or None without torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return None
    if subprocess.run([sys.executable, "-c", "import torch.cuda._memory_viz"], capture_output=True).returncode == 0:
        return [sys.executable, "-m", "torch.cuda._memory_viz"]
    script = pathlib.Path(spec.origin).parent / "cuda" / "_memory_viz.py"
    return [sys.executable, str(script)] if script.exists() else None


def mib(text):
    number, unit = text[:-3], text[-3:]
    return float(number) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit] if unit in ("KiB", "MiB", "GiB") else float(text[:-1])


def segsum(snapshot):
    """What `_memory_viz stats` totals: reserved, allocated (requested bytes of active blocks)."""
    reserved = allocated = 0
    for seg in snapshot["segments"]:
        reserved += seg["total_size"]
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"], "blocks do not tile the segment"
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                allocated += b["requested_size"]
    return reserved, allocated


def check_export(tmp):
    out = tmp / "peak.pickle"
    run("export", "data/snapshot-peak.json", "--to", "torch-snapshot", "-o", str(out))
    with open(out, "rb") as f:
        snap = pickle.load(f)
    ours = json.loads((HERE / "data/snapshot-peak.json").read_text())
    assert len(snap["segments"]) == len(ours["segments"])
    reserved, allocated = segsum(snap)
    assert reserved == ours["stats"]["reserved_bytes"]["current"], (reserved, ours["stats"]["reserved_bytes"])
    assert allocated == sum(b["requested_size"] for s in ours["segments"] for b in s["blocks"]
                            if b["state"] == "active_allocated")
    trace = snap["device_traces"][ours["device"]]
    assert len(trace) == len(ours["trace"]["events"])
    assert {"action", "addr", "size", "stream", "time_us", "frames"} <= set(trace[0])
    assert all(seg["device"] == ours["device"] for seg in snap["segments"])
    tagged = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated" and b["frames"]]
    assert tagged, "no block carries its tag as frames"
    assert any(fr["filename"] == "remat:region" and fr["name"].startswith("layers.") for b in tagged for fr in b["frames"])
    viz = memory_viz_command()
    if viz is not None:
        stats = subprocess.run([*viz, "stats", str(out)], capture_output=True, text=True, check=True).stdout
        totals = dict(line.split(": ", 1) for line in stats.splitlines() if line.startswith("total_"))
        assert abs(mib(totals["total_reserved"]) - reserved) < 2**16, (totals, reserved)
        assert abs(mib(totals["total_allocated"].split()[0]) - allocated) < 2**16, (totals, allocated)
        trace_text = subprocess.run([*viz, "trace", str(out)], capture_output=True, text=True, check=True).stdout
        assert f"{len(trace)} entries" in trace_text, trace_text[:200]
        print(f"ok PyTorch's _memory_viz stats and trace read the export ({' '.join(viz[1:])})")
    else:
        print("torch not installed (or does not import): skipped `python -m torch.cuda._memory_viz stats`")
    return out


def live_by_region(path):
    rows = json.loads(run("memory", str(path), "--json"))["memory"]
    return {r["region"]: r["live_bytes"] for r in rows if r["live_bytes"]}


def check_roundtrip(tmp, exported):
    back = tmp / "back.json"
    run("import", str(exported), "-o", str(back))
    run("validate", str(back))
    assert live_by_region(back) == live_by_region(HERE / "data/snapshot-peak.json"), "tags lost in the round trip"


def check_torch_layout(tmp):
    pickled = tmp / "torch.pickle"
    subprocess.run([sys.executable, str(HERE / "write_torch_snapshot.py"), str(pickled)], check=True)
    imported = tmp / "torch.json"
    run("import", str(pickled), "-o", str(imported))
    run("validate", str(imported))
    sites = {r["site"]: r for r in json.loads(run("memory", str(imported), "--by", "site", "--json"))["memory"]}
    assert sites["model.py:17 (attention)"]["live_bytes"] == 4 * 2**20 + 512, sites
    assert sites["train.py:42 (step)"]["live_bytes"] == 8 * 2**20, sites
    device1 = tmp / "torch-device1.json"
    run("import", str(pickled), "-o", str(device1), "--device", "1")
    assert json.loads(device1.read_text())["segments"][0]["total_size"] == 2 * 2**20


def check_refusals(tmp):
    """Pickles Python itself wrote: addresses from 2^63 up import; a block outside its segment and
    two allocs at one address are refused with exit 2, naming the pickle path, writing nothing."""
    sys.path.insert(0, str(HERE))
    import write_torch_snapshot

    high = write_torch_snapshot.snapshot()
    shift = 2**63
    for seg in high["segments"]:
        seg["address"] += shift
        for block in seg["blocks"]:
            block["address"] += shift
    for entry in high["device_traces"][0]:
        entry["addr"] += shift if entry["addr"] else 0
    pickled = tmp / "high.pickle"
    pickled.write_bytes(pickle.dumps(high))
    imported = tmp / "high.json"
    run("import", str(pickled), "-o", str(imported))
    run("validate", str(imported))
    assert json.loads(imported.read_text())["segments"][0]["address"] == 0x7F0000000000 + shift

    outside = write_torch_snapshot.snapshot()
    outside["segments"][0]["blocks"][0]["address"] = 10**9
    twice = write_torch_snapshot.snapshot()
    twice["device_traces"] = [[{"action": "alloc", "addr": 0x1000, "size": 512, "stream": 0, "time_us": t,
                                "frames": []} for t in (1, 2)]]
    for name, snap, where in (("outside", outside, "$['segments'][0]['blocks'][0]['address']: block at 0x3b9aca00"),
                              ("twice", twice, "$['device_traces'][0][1]['addr']: alloc at 0x1000")):
        pickled = tmp / f"{name}.pickle"
        pickled.write_bytes(pickle.dumps(snap))
        out = tmp / f"{name}.json"
        r = subprocess.run([sys.argv[1], "import", str(pickled), "-o", str(out)], capture_output=True, text=True)
        assert r.returncode == 2, (name, r.returncode, r.stderr)
        assert r.stderr.startswith(f"remat-report: {pickled}: {where}"), r.stderr
        assert not out.exists(), f"{name}: import wrote a dump it refused"


def check_expandable_segments(tmp):
    """An expandable segment (is_expandable) shows in `segments`, survives export to PyTorch's
    layout and comes back on import."""
    snap = json.loads((HERE / "data/snapshot-peak.json").read_text())
    snap["segments"][0]["is_expandable"] = True
    for other in snap["segments"][1:]:
        other["is_expandable"] = False
    mine = tmp / "expandable.json"
    mine.write_text(json.dumps(snap))
    run("validate", str(mine))
    rows = json.loads(run("segments", str(mine), "--json"))["segments"]
    assert [row["is_expandable"] for row in rows] == ["yes"] + ["no"] * (len(snap["segments"]) - 1), rows
    plain = json.loads(run("segments", "data/snapshot-peak.json", "--json"))["segments"]
    assert "is_expandable" not in plain[0], "the column appears only where a segment is expandable"
    pickled = tmp / "expandable.pickle"
    run("export", str(mine), "--to", "torch-snapshot", "-o", str(pickled))
    exported = pickle.loads(pickled.read_bytes())["segments"]
    assert [s["is_expandable"] for s in exported] == [True] + [False] * (len(exported) - 1)
    back = tmp / "expandable-back.json"
    run("import", str(pickled), "-o", str(back))
    imported = json.loads(back.read_text())["segments"]
    assert [s.get("is_expandable", False) for s in imported] == [True] + [False] * (len(imported) - 1)


def check_gpu_made_snapshot(tmp):
    """A pickle PyTorch's own CUDA allocator wrote on an H200 (bench/gpu/record_torch_snapshot.py,
    three training steps with history on): import keeps every segment and block, and whatif's
    replay under the recorded settings reserves what the trace's segment_alloc events reserved,
    give or take one 2 MiB segment (4 segments were made before history started, and their free
    space is not in the trace)."""
    pickled = HERE / "data" / "torch-snapshot-h200.pickle"
    torch_made = pickle.loads(pickled.read_bytes())
    imported = tmp / "h200.json"
    run("import", str(pickled), "-o", str(imported))
    doc = json.loads(imported.read_text())
    assert len(doc["segments"]) == len(torch_made["segments"]) == 27, len(doc["segments"])
    assert sum(s["total_size"] for s in doc["segments"]) == sum(s["total_size"] for s in torch_made["segments"])
    replay = json.loads(run("whatif", str(pickled), "--conf", "expandable_segments:True", "--json"))
    recorded, expandable = replay["runs"]
    traced = sum(e["size"] for e in torch_made["device_traces"][0] if e["action"] == "segment_alloc")
    assert replay["input"]["events"] == len(torch_made["device_traces"][0]) == 1633
    assert 0 <= recorded["peak_reserved"] - traced <= 2 << 20, (recorded["peak_reserved"], traced)
    assert recorded["failure"] is None and expandable["failure"] is None
    assert expandable["peak_reserved"] < recorded["peak_reserved"], expandable


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        exported = check_export(tmp)
        check_roundtrip(tmp, exported)
        check_torch_layout(tmp)
        check_refusals(tmp)
        check_expandable_segments(tmp)
        check_gpu_made_snapshot(tmp)
        print("ok export, import and round trip")


if __name__ == "__main__":
    main()
