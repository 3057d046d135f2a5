#!/usr/bin/env python3
"""Labels (the allocator's set_label, PyTorch's _set_memory_metadata) through remat-report: a
snapshot whose tags carry labels shows them in summary, groups by them with --by label and names
them in trace; export writes them as each trace entry's user_metadata and import reads them back;
a pickle from PyTorch's own allocator with user_metadata imports with its labels as tags.

usage: check_labels.py REMAT_REPORT
"""
import json
import pathlib
import pickle
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
MiB = 1 << 20


def run(*args):
    return subprocess.run([sys.argv[1], *args], cwd=HERE, capture_output=True, text=True, check=True).stdout


def labelled_snapshot(path):
    """data/snapshot-peak.json with "step 1" on the tags of layers.0 (and regions under it) and
    "step 2" on those of layers.1; the rest keep no label."""
    snap = json.loads((HERE / "data/snapshot-peak.json").read_text())
    names = snap["names"]
    names += ["step 1", "step 2"]
    for tag in snap["tags"]:
        region = names[tag["region"]]
        if region == "layers.0" or region.startswith("layers.0::"):
            tag["label"] = len(names) - 2
        elif region == "layers.1" or region.startswith("layers.1::"):
            tag["label"] = len(names) - 1
    path.write_text(json.dumps(snap))
    return snap


def live_by(path, by):
    rows = json.loads(run("memory", str(path), "--by", by, "--json"))["memory"]
    return {row[by]: row["live_bytes"] for row in rows}


def expected_live_by_label(snap):
    """Live bytes per label from the tag statistics, computed independently of remat-report."""
    out = {}
    for stat in snap["tag_stats"]:
        label = snap["tags"][stat["tag"]].get("label")
        key = snap["names"][label] if label else "(no label)"
        out[key] = out.get(key, 0) + stat["bytes"]["current"]
    return out


def check_snapshot(tmp):
    path = tmp / "labelled.json"
    snap = labelled_snapshot(path)
    run("validate", str(path))
    expected = expected_live_by_label(snap)
    by_label = live_by(path, "label")
    assert by_label == expected, (by_label, expected)
    assert by_label == {"step 1": 16253440, "step 2": 16253440, "(no label)": 4194304}, by_label

    summary = json.loads(run("summary", str(path), "--json"))
    rows = [(row["label"], row["live_bytes"], row["peak_bytes"]) for row in summary["top_labels"]]
    assert rows == [("step 1", 16253440, 25690624), ("step 2", 16253440, 25690624), ("(no label)", 4194304, 4194304)], rows
    text = run("summary", str(path))
    assert "Largest labels by peak" in text and "\nstep 1      15.50 MiB" in text, text
    plain = json.loads(run("summary", "data/snapshot-peak.json", "--json"))
    assert "top_labels" not in plain, "a snapshot without labels has no label table"

    events = json.loads(run("trace", str(path), "--action", "alloc", "--region", "layers.1", "--json"))["events"]
    assert events and {e["label"] for e in events} == {"step 2"}, events[:2]
    shown = run("trace", str(path), "--action", "alloc", "--region", "layers.0", "--limit", "1")
    assert shown.splitlines()[1].endswith("[step 1]"), shown
    csv = run("trace", str(path), "--action", "alloc", "--region", "layers.0", "--limit", "1", "--csv").splitlines()
    assert csv[0].endswith(",site,label") and csv[1].endswith(",step 1"), csv
    refused = subprocess.run([sys.argv[1], "memory", str(path), "--by", "colour"], cwd=HERE, capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "label" in refused.stderr, refused.stderr
    print("ok a labelled snapshot: summary, memory --by label, trace")
    return path, snap


def check_roundtrip(tmp, path, snap):
    pickled = tmp / "labelled.pickle"
    run("export", str(path), "--to", "torch-snapshot", "-o", str(pickled))
    exported = pickle.loads(pickled.read_bytes())
    trace = exported["device_traces"][snap["device"]]
    expected = []
    for event in snap["trace"]["events"]:
        label = snap["tags"][event["tag"]].get("label")
        expected.append(snap["names"][label] if label else "")
    assert [entry["user_metadata"] for entry in trace] == expected
    assert "step 1" in expected and "step 2" in expected and "" in expected
    back = tmp / "labelled-back.json"
    run("import", str(pickled), "-o", str(back))
    run("validate", str(back))
    assert live_by(back, "label") == live_by(path, "label"), "labels lost in the round trip"
    print("ok export writes labels as user_metadata; import reads them back")


def check_pytorch_pickle(tmp):
    """A pickle as PyTorch's allocator writes it after _set_memory_metadata: labels only in the
    trace entries' user_metadata; a live block takes the label of the latest alloc at its address."""
    sys.path.insert(0, str(HERE))
    import write_torch_snapshot

    snap = write_torch_snapshot.snapshot()
    labels = ["", "warmup", "step 7", "step 7", "step 7", "step 7", ""]  # per trace entry, in order
    for entry, label in zip(snap["device_traces"][0], labels):
        entry["user_metadata"] = label
    pickled = tmp / "metadata.pickle"
    pickled.write_bytes(pickle.dumps(snap))
    imported = tmp / "metadata.json"
    run("import", str(pickled), "-o", str(imported))
    run("validate", str(imported))
    doc = json.loads(imported.read_text())
    names = doc["names"]
    base = 0x7F0000000000
    block_labels = {}
    for segment in doc["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "inactive":
                label = doc["tags"][block["tag"]].get("label")
                block_labels[block["address"] - base] = names[label] if label else ""
    # 8 MiB at +0 by "warmup", 4 MiB at +8 MiB by "step 7"; the small segment's blocks have no
    # alloc in the trace, so no label.
    assert block_labels == {0: "warmup", 8 * MiB: "step 7", 64 * MiB: "", 64 * MiB + 512: ""}, block_labels
    event_labels = []
    for event in doc["trace"]["events"]:
        label = doc["tags"][event["tag"]].get("label")
        event_labels.append(names[label] if label else "")
    assert event_labels == labels[:-1], event_labels  # the "snapshot" marker is dropped
    assert live_by(imported, "label") == {"warmup": 8 * MiB, "step 7": 4 * MiB, "(no label)": 512}
    sites = live_by(imported, "site")
    assert sites["train.py:42 (step)"] == 8 * MiB and sites["model.py:17 (attention)"] == 4 * MiB + 512, sites
    # remat's allocator under PyTorch writes a tag with more than a label as a JSON object.
    snap["device_traces"][0][2]["user_metadata"] = '{"region":"layers.0","phase":"forward","label":"step 3"}'
    pickled.write_bytes(pickle.dumps(snap))
    run("import", str(pickled), "-o", str(imported))
    doc = json.loads(imported.read_text())
    tag = doc["tags"][doc["segments"][0]["blocks"][1]["tag"]]
    assert (doc["names"][tag["region"]], tag["phase"], doc["names"][tag["label"]]) == ("layers.0", "forward", "step 3")
    assert doc["names"][tag["site"]] == "model.py:17 (attention)", tag
    print("ok a PyTorch pickle's user_metadata imports as labels, or as tags where it is one")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        path, snap = check_snapshot(tmp)
        check_roundtrip(tmp, path, snap)
        check_pytorch_pickle(tmp)
        print("ok labels")


if __name__ == "__main__":
    main()
