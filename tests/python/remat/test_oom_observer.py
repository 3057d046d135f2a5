"""OOM reports for PyTorch's native allocator: the dump built from a torch.cuda.memory._snapshot()
dict (numbers, region attribution by address, schema, malformed input), the observer PyTorch calls
(one file per OOM, never an exception into the allocator), the checks made when attaching, and the
tagging allocator's own report behind the same call."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

import remat
import remat_alloc
from remat import _oom

REPO = pathlib.Path(__file__).resolve().parents[3]
MiB = 1 << 20
GiB = 1 << 30
SEG_A, SEG_B, SEG_C, SEG_OTHER = 0x7F0000000000, 0x7F0010000000, 0x7F0020000000, 0x7E0000000000


def block(address, size, state="active_allocated", requested=None):
    return {"address": address, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": []}


def segment(address, blocks, *, device=0, stream=0, segment_type="large"):
    total = sum(b["size"] for b in blocks)
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": address, "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": sum(b["requested_size"] for b in blocks
                                                         if b["state"] == "active_allocated"),
            "stream": stream, "segment_type": segment_type, "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": [], "blocks": blocks}


def two_stream_snapshot(traces=None):
    """Device 0: a 20 MiB segment on the default stream (two live blocks, a block waiting on
    another stream, a free one), a 2 MiB segment on stream 7 that is wholly free, a 4 MiB one on
    stream 7 with one live block; device 1: a segment that must not count."""
    a = segment(SEG_A, [block(SEG_A, 8 * MiB, requested=8 * MiB - 100), block(SEG_A + 8 * MiB, 4 * MiB),
                        block(SEG_A + 12 * MiB, 2 * MiB, "active_pending_free"),
                        block(SEG_A + 14 * MiB, 6 * MiB, "inactive")])
    b = segment(SEG_B, [block(SEG_B, 2 * MiB, "inactive")], stream=7, segment_type="small")
    c = segment(SEG_C, [block(SEG_C, 4 * MiB, requested=3 * MiB)], stream=7)
    other = segment(SEG_OTHER, [block(SEG_OTHER, 64 * MiB)], device=1)
    return {"segments": [a, b, other, c], "device_traces": traces if traces is not None else [[], []]}


def build(snapshot, **kwargs):
    args = dict(device=0, segment_bytes=20 * MiB, device_limit=80 * GiB, device_free=10 * MiB)
    args.update(kwargs)
    return _oom.oom_dump_from_snapshot(snapshot, **args)


def tensor(address, nbytes, device="cuda:0", name="t"):
    return SimpleNamespace(name=name, shape=[nbytes // 4], dtype="float32", bytes=nbytes, address=address,
                           device=device)


def report(checkpoint, *regions):
    return SimpleNamespace(checkpoint=checkpoint, regions=[
        SimpleNamespace(region=name, bytes=sum(t.bytes for t in tensors), storages=len(tensors), tensors=tensors)
        for name, tensors in regions])


def holders(dump, kind="by_region"):
    return [(h["name"], h["bytes"], h["blocks"], h["saved_bytes"]) for h in dump["holders"][kind]]


def oom_validator():
    """jsonschema's validator for schemas/oom.schema.json, or None without jsonschema."""
    try:
        import jsonschema
    except ImportError:
        return None
    return jsonschema.Draft202012Validator(json.loads((REPO / "schemas" / "oom.schema.json").read_text()))


@pytest.fixture(scope="module")
def validate_oom():
    """Checks a dump against the schema where jsonschema is installed (without it,
    test_the_dumps_validate_against_the_oom_schema is skipped and says so)."""
    validator = oom_validator()

    def check(dump):
        if validator is None:
            return
        errors = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                  for e in validator.iter_errors(dump)]
        assert errors == []

    return check


def remat_report():
    """The build's remat-report (beside build/python, where remat._C comes from), or REMAT_REPORT."""
    candidates = [os.environ.get("REMAT_REPORT", "")]
    candidates.append(str(pathlib.Path(remat._C.__file__).resolve().parents[2] / "cli" / "remat-report"))
    candidates.append(str(REPO / "build" / "cli" / "remat-report"))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("remat-report is not built (build/cli/remat-report); build the cli target or set REMAT_REPORT")


# --- the dump from a snapshot -------------------------------------------------------------------

def test_memory_and_fragmentation_add_up_the_failing_devices_segments_on_every_stream(validate_oom):
    dump = build(two_stream_snapshot())
    assert dump["kind"] == "oom" and dump["schema_version"] == 1 and dump["backend"] == "cuda"
    assert dump["device"] == 0 and dump["pid"] == os.getpid() and dump["producer"].startswith("remat ")
    assert dump["producer"].endswith(" (PyTorch's native allocator)")
    assert dump["memory"] == {"device_free_bytes": 10 * MiB, "device_total_bytes": 80 * GiB,
                              "reserved_bytes": 26 * MiB, "allocated_bytes": 16 * MiB,
                              "requested_bytes": 15 * MiB - 100, "active_bytes": 18 * MiB, "segments": 3,
                              "memory_fraction": 1.0}
    assert dump["fragmentation"] == {"largest_free_block": 6 * MiB, "cached_free_bytes": 8 * MiB,
                                     "releasable_bytes": 2 * MiB, "fragmented_free_bytes": 6 * MiB,
                                     "free_blocks_in_split_segments": 1, "internal_bytes": MiB + 100,
                                     "request_pool": {"pool": "large", "free_bytes": 6 * MiB,
                                                      "fragmented_free_bytes": 6 * MiB,
                                                      "free_blocks_in_split_segments": 1}}
    assert dump["request"] == {"requested_bytes": 20 * MiB, "rounded_bytes": 20 * MiB, "segment_bytes": 20 * MiB}
    assert dump["cause"] == "device_full" and dump["num_ooms"] == 1
    assert holders(dump) == [("<untagged>", 16 * MiB, 3, 0)]
    assert dump["holders"]["by_recv_slot"] == dump["holders"]["by_site"] == dump["holders"]["by_phase"] == []
    assert dump["tag_stack"] == [] and dump["last_events"] == []
    validate_oom(dump)


def test_the_request_pools_free_blocks_are_counted_apart(validate_oom):
    """A request of at most 1 MiB goes to PyTorch's small pool, a larger one to the large pool:
    only that pool's free blocks could hold it (remat-report's advice counts those)."""
    small = build(two_stream_snapshot(), rounded_bytes=512 * 1024)
    assert small["fragmentation"]["request_pool"] == {"pool": "small", "free_bytes": 2 * MiB,
                                                      "fragmented_free_bytes": 0, "free_blocks_in_split_segments": 0}
    validate_oom(small)
    # Without memory history PyTorch's observer is handed the segment alone: a 2 MiB one is the
    # small pool's (a request of 1 MiB or less), filed under the large pool before
    assert build(two_stream_snapshot(), segment_bytes=2 * MiB)["fragmentation"]["request_pool"]["pool"] == "small"
    assert build(two_stream_snapshot(), segment_bytes=20 * MiB)["fragmentation"]["request_pool"]["pool"] == "large"
    # A snapshot whose segments do not say their pool: the figures are left out, not guessed
    snapshot = two_stream_snapshot()
    del snapshot["segments"][1]["segment_type"]
    assert "request_pool" not in build(snapshot)["fragmentation"]
    snapshot["segments"][1]["segment_type"] = "tiny"
    with pytest.raises(ValueError, match=r"\['segment_type'\] is 'tiny'; expected 'small' or 'large'"):
        build(snapshot)


def test_the_other_devices_segments_are_reported_when_it_fails(validate_oom):
    dump = build(two_stream_snapshot(), device=1)
    assert dump["device"] == 1
    assert dump["memory"]["reserved_bytes"] == dump["memory"]["allocated_bytes"] == 64 * MiB
    assert holders(dump) == [("<untagged>", 64 * MiB, 1, 0)]
    validate_oom(dump)


def test_live_blocks_holding_resident_storages_are_billed_to_their_regions_and_the_rest_untagged(validate_oom):
    resident = [
        report("layers.0",
               ("<inputs>", [tensor(SEG_A, 8 * MiB - 100, name="input 0")]),
               ("layers.0::attention", [tensor(SEG_C, 3 * MiB, name="saved 0"),
                                        tensor(SEG_C, 3 * MiB, name="view of saved 0")])),  # same storage
        report("layers.1",
               ("layers.1::mlp", [tensor(SEG_A + 8 * MiB + 512, 1024),  # inside a live block, not at its start
                                  tensor(SEG_A + 12 * MiB, 2 * MiB),  # a block waiting to be freed: not live
                                  tensor(SEG_A + 14 * MiB, MiB),  # a free block
                                  tensor(SEG_A, 4096, device="cpu"),  # another device's storages never match
                                  tensor(SEG_C, 4096, device="cuda:1"),
                                  tensor(0x1000, 4096)])),  # outside every segment
    ]
    dump = build(two_stream_snapshot(), resident=resident)
    assert holders(dump) == [("layers.0::<inputs>", 8 * MiB, 1, 0),
                             ("layers.0::attention", 4 * MiB, 1, 4 * MiB),
                             ("layers.1::mlp", 4 * MiB, 1, 4 * MiB)]
    assert sum(h["bytes"] for h in dump["holders"]["by_region"]) == dump["memory"]["allocated_bytes"]
    validate_oom(dump)


def test_a_block_is_billed_once_to_the_first_report_that_keeps_its_storage(validate_oom):
    resident = [report("first", ("first::a", [tensor(SEG_A, 8 * MiB)])),
                report("second", ("second::b", [tensor(SEG_A + 16, 64)]))]
    dump = build(two_stream_snapshot(), resident=resident)
    assert holders(dump) == [("<untagged>", 8 * MiB, 2, 0), ("first::a", 8 * MiB, 1, 8 * MiB)]  # equal: by name
    validate_oom(dump)


def test_resident_storages_that_match_no_block_leave_everything_untagged(validate_oom):
    resident = [report("far", ("far::away", [tensor(SEG_OTHER + 4096, 4096), tensor(0x10, 16)]))]
    dump = build(two_stream_snapshot(), resident=resident)
    assert holders(dump) == [("<untagged>", 16 * MiB, 3, 0)]
    validate_oom(dump)


def test_resident_data_may_come_as_dicts_with_the_same_fields(validate_oom):
    resident = [{"checkpoint": "ck", "regions": [
        {"region": "ck::kept", "tensors": [{"address": SEG_C, "bytes": 3 * MiB, "device": "cuda:0"}]}]}]
    assert holders(build(two_stream_snapshot(), resident=resident)) == [("<untagged>", 12 * MiB, 2, 0),
                                                                        ("ck::kept", 4 * MiB, 1, 4 * MiB)]


def test_the_largest_ten_regions_are_kept_largest_first_then_by_name():
    sizes = [MiB * (1 + k % 4) for k in range(14)]
    starts = [SEG_A + sum(sizes[:k]) for k in range(14)]
    snapshot = {"segments": [segment(SEG_A, [block(a, n) for a, n in zip(starts, sizes)])], "device_traces": []}
    resident = [report("ck", *[(f"ck::r{k:02d}", [tensor(a, n)]) for k, (a, n) in enumerate(zip(starts, sizes))])]
    rows = build(snapshot, resident=resident)["holders"]["by_region"]
    assert [(h["name"], h["bytes"] // MiB) for h in rows] == [
        ("ck::r03", 4), ("ck::r07", 4), ("ck::r11", 4), ("ck::r02", 3), ("ck::r06", 3), ("ck::r10", 3),
        ("ck::r01", 2), ("ck::r05", 2), ("ck::r09", 2), ("ck::r13", 2)]


def test_an_empty_snapshot_is_a_valid_report_with_nothing_held(validate_oom):
    dump = build({"segments": [], "device_traces": []}, segment_bytes=2 * MiB)
    assert dump["memory"]["reserved_bytes"] == dump["memory"]["allocated_bytes"] == dump["memory"]["segments"] == 0
    pool = dump["fragmentation"].pop("request_pool")
    assert set(dump["fragmentation"].values()) == {0}
    assert pool == {"pool": "small", "free_bytes": 0, "fragmented_free_bytes": 0, "free_blocks_in_split_segments": 0}
    dump["fragmentation"]["request_pool"] = pool
    assert dump["holders"]["by_region"] == []
    validate_oom(dump)
    assert build({"segments": []})["last_events"] == []  # device_traces is optional


def test_blocks_without_addresses_tile_their_segment_in_order():
    blocks = [{"size": MiB, "state": "inactive"}, {"size": 2 * MiB, "state": "active_allocated"}]
    snapshot = {"segments": [{"device": 0, "address": SEG_A, "total_size": 3 * MiB, "blocks": blocks}]}
    dump = build(snapshot, resident=[report("ck", ("ck::r", [tensor(SEG_A + MiB, 2 * MiB)]))])
    assert holders(dump) == [("ck::r", 2 * MiB, 1, 2 * MiB)]
    assert dump["memory"]["requested_bytes"] == 2 * MiB  # requested_size defaults to the block's size


def test_a_cap_from_set_per_process_memory_fraction_is_reported_as_the_cause(validate_oom):
    dump = build(two_stream_snapshot(), device_limit=32 * MiB, device_total=128 * MiB, segment_bytes=20 * MiB)
    assert dump["cause"] == "memory_fraction_cap"
    assert dump["memory"]["reserved_limit_bytes"] == 32 * MiB and dump["memory"]["memory_fraction"] == 0.25
    assert dump["memory"]["device_total_bytes"] == 128 * MiB
    validate_oom(dump)


def test_a_segment_larger_than_the_device_is_reported_as_the_cause(validate_oom):
    dump = build(two_stream_snapshot(), segment_bytes=81 * GiB)
    assert dump["cause"] == "request_exceeds_device" and "reserved_limit_bytes" not in dump["memory"]
    validate_oom(dump)


def test_recorded_history_gives_the_rounded_request_the_oom_count_and_the_last_events(validate_oom):
    trace = [{"action": "segment_alloc", "addr": SEG_A, "size": 20 * MiB, "stream": 0, "time_us": 10, "frames": []},
             {"action": "alloc", "addr": SEG_A, "size": 8 * MiB, "stream": 0, "time_us": 11, "frames": []},
             {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 12, "frames": []},
             {"action": "oom", "size": 5 * MiB, "stream": 0, "device_free": 3, "time_us": 13, "frames": []},
             {"action": "free_requested", "addr": SEG_A, "size": 8 * MiB, "stream": 7, "time_us": 14, "frames": []},
             {"action": "oom", "size": 18 * MiB, "stream": 0, "device_free": 3, "time_us": 15, "frames": []}]
    dump = build(two_stream_snapshot([trace, []]))
    assert dump["request"] == {"requested_bytes": 18 * MiB, "rounded_bytes": 18 * MiB, "segment_bytes": 20 * MiB}
    assert dump["num_ooms"] == 2
    assert [(e["action"], e["address"], e["size"], e["stream"], e["time_us"]) for e in dump["last_events"]] == [
        ("segment_alloc", SEG_A, 20 * MiB, 0, 10), ("alloc", SEG_A, 8 * MiB, 0, 11), ("oom", 0, 5 * MiB, 0, 13),
        ("free_requested", SEG_A, 8 * MiB, 7, 14), ("oom", 0, 18 * MiB, 0, 15)]  # 'snapshot' is not an oom event
    assert build(two_stream_snapshot([trace, []]), num_ooms=7, requested_bytes=17 * MiB)["request"][
        "requested_bytes"] == 17 * MiB
    validate_oom(dump)


def test_the_dump_names_are_the_allocators_and_the_ones_the_schemas_list():
    names = remat._C.dump_names()
    snapshot_schema = json.loads((REPO / "schemas" / "snapshot.schema.json").read_text())
    oom_schema = json.loads((REPO / "schemas" / "oom.schema.json").read_text())

    def enums(node):  # every "enum" list in a schema, whatever its depth
        if isinstance(node, dict):
            if "enum" in node:
                yield node["enum"]
            for value in node.values():
                yield from enums(value)
        elif isinstance(node, list):
            for value in node:
                yield from enums(value)

    snapshot_enums, oom_enums = list(enums(snapshot_schema)), list(enums(oom_schema))
    assert names["policy"] == ["none", "save", "recompute"] and names["policy"] in snapshot_enums
    assert names["phase"] in snapshot_enums and "offloaded" in names["phase"]
    assert names["category"][0] == "none" and names["category"][1:] in snapshot_enums  # none: left out
    assert names["block_state"] == ["active_allocated", "active_pending_free", "inactive"]
    assert names["block_state"] in snapshot_enums
    assert names["trace_action"] in snapshot_enums and names["trace_action"] in oom_enums
    assert names["torch_trace_action"] == {"segment_map": "segment_alloc", "segment_unmap": "segment_free",
                                           "free": "free_requested"}
    assert names["torch_block_state"] == {"active_awaiting_free": "active_pending_free"}


def test_pytorchs_own_spellings_read_as_remat_report_import_reads_them(tmp_path):
    """segment_map/segment_unmap (expandable segments), free and active_awaiting_free: the oom dump
    and `remat-report import` of the same snapshot keep the same events under the same names."""
    trace = [{"action": "segment_map", "addr": SEG_A, "size": 20 * MiB, "stream": 0, "time_us": 10, "frames": []},
             {"action": "alloc", "addr": SEG_A, "size": 8 * MiB, "stream": 0, "time_us": 11, "frames": []},
             {"action": "free", "addr": SEG_A, "size": 8 * MiB, "stream": 0, "time_us": 12, "frames": []},
             {"action": "free_completed", "addr": SEG_A, "size": 8 * MiB, "stream": 0, "time_us": 13, "frames": []},
             {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 14, "frames": []},
             {"action": "segment_map", "addr": SEG_B, "size": 2 * MiB, "stream": 7, "time_us": 15, "frames": []},
             {"action": "segment_unmap", "addr": SEG_B, "size": 2 * MiB, "stream": 7, "time_us": 16, "frames": []}]
    snapshot = two_stream_snapshot([trace, []])
    snapshot["segments"][0]["blocks"][2]["state"] = "active_awaiting_free"  # PyTorch's documented spelling
    dump = build(snapshot)
    events = [(e["action"], e["address"], e["size"], e["stream"]) for e in dump["last_events"]]
    assert events == [("segment_alloc", SEG_A, 20 * MiB, 0), ("alloc", SEG_A, 8 * MiB, 0),
                      ("free_requested", SEG_A, 8 * MiB, 0), ("free_completed", SEG_A, 8 * MiB, 0),
                      ("segment_alloc", SEG_B, 2 * MiB, 7), ("segment_free", SEG_B, 2 * MiB, 7)]
    assert dump["memory"]["active_bytes"] == 14 * MiB + 4 * MiB  # the awaiting block is active, not free

    import pickle
    pickled, imported = tmp_path / "snapshot.pickle", tmp_path / "imported.json"
    pickled.write_bytes(pickle.dumps(snapshot))
    run = subprocess.run([remat_report(), "import", str(pickled), "-o", str(imported)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    doc = json.loads(imported.read_text())
    assert [(e["action"], e["address"], e["size"], e["stream"]) for e in doc["trace"]["events"]] == events
    states = [b["state"] for b in doc["segments"][0]["blocks"]]
    assert states == ["active_allocated", "active_allocated", "active_pending_free", "inactive"]


def test_only_the_newest_64_events_are_kept():
    trace = [{"action": "alloc", "addr": SEG_A, "size": i, "stream": 0, "time_us": i} for i in range(100)]
    events = build(two_stream_snapshot([trace]))["last_events"]
    assert [e["size"] for e in events] == list(range(36, 100))


def test_the_dumps_validate_against_the_oom_schema_and_a_broken_one_does_not():
    validator = oom_validator()
    if validator is None:
        pytest.skip("python3-jsonschema is not installed (apt-get install python3-jsonschema, or pip install "
                    "jsonschema): the other tests check their dumps' numbers but not the schema")
    resident = [report("ck", ("<inputs>", [tensor(SEG_A, 8 * MiB)]), ("ck::r", [tensor(SEG_C, 3 * MiB)]))]
    trace = [{"action": "alloc", "addr": SEG_A, "size": MiB, "stream": 0, "time_us": 1},
             {"action": "oom", "size": MiB, "stream": 0, "device_free": 0, "time_us": 2}]
    dumps = [build(two_stream_snapshot()), build(two_stream_snapshot([trace]), resident=resident),
             build({"segments": []}), build(two_stream_snapshot(), device_limit=32 * MiB, device_total=128 * MiB),
             build(two_stream_snapshot(), segment_bytes=81 * GiB)]
    for dump in dumps:
        assert list(validator.iter_errors(dump)) == []
    broken = dict(dumps[1], backend="rocm")
    del broken["fragmentation"]
    assert len(list(validator.iter_errors(broken))) == 2


@pytest.mark.parametrize("snapshot, problem", [
    (None, "snapshot must be a dict"),
    ([], "snapshot must be a dict"),
    ({}, "snapshot has no 'segments'"),
    ({"segments": {"0": {}}}, "snapshot['segments'] must be a list"),
    ({"segments": [7]}, "snapshot['segments'][0] must be a dict"),
    ({"segments": [{"address": 0, "total_size": 0, "blocks": []}]}, "snapshot['segments'][0] has no 'device'"),
    ({"segments": [{"device": 0, "address": 0, "blocks": []}]}, "has no 'total_size'"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 1}]}, "has no 'blocks'"),
    ({"segments": [{"device": "0", "address": 0, "total_size": 1, "blocks": []}]},
     "snapshot['segments'][0]['device'] must be a non-negative int, got str"),
    ({"segments": [{"device": 0, "address": -1, "total_size": 1, "blocks": []}]}, "['address'] must be a non-negative"),
    ({"segments": [{"device": 0, "address": 0, "total_size": True, "blocks": []}]}, "got bool"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 1, "blocks": None}]}, "['blocks'] must be a list"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 1, "blocks": [{"state": "inactive"}]}]},
     "snapshot['segments'][0]['blocks'][0] has no 'size'"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 1, "blocks": [{"size": 1.5, "state": "inactive"}]}]},
     "['size'] must be a non-negative int, got float"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 1, "blocks": [{"size": 1}]}]}, "has no 'state'"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 1, "blocks": [{"size": 1, "state": "half-freed"}]}]},
     "['state'] is 'half-freed'; expected one of active_allocated"),
    ({"segments": [{"device": 0, "address": 0, "total_size": 1, "blocks": [{"size": 2, "state": "inactive"}]}]},
     "snapshot['segments'][0]: its blocks add up to 2 bytes, more than its total_size 1"),
    ({"segments": [], "device_traces": "none"}, "snapshot['device_traces'] must be a list"),
    ({"segments": [], "device_traces": [[5]]}, "snapshot['device_traces'][0][0] must be a dict"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "addr": "0x10"}]]}, "['addr'] must be a non-negative"),
    ({"segments": [], "device_traces": [[{"action": "alloc", "time_us": None}]]}, "['time_us'] must be an int"),
    # Past what a float holds: the message says so without converting it.
    ({"segments": [{"device": 10 ** 400, "address": 0, "total_size": 1, "blocks": []}]},
     "snapshot['segments'][0]['device'] is about 10**400, more than any allocator holds"),
    ({"segments": [{"device": 0, "address": -10 ** 400, "total_size": 1, "blocks": []}]},
     "['address'] must be a non-negative int, got int -about 10**400"),
])
def test_a_malformed_snapshot_is_a_value_error_naming_the_bad_part(snapshot, problem):
    with pytest.raises(ValueError) as error:
        build(snapshot)
    assert problem in str(error.value)


@pytest.mark.parametrize("resident, problem", [
    ([SimpleNamespace(regions=[])], "resident[0] (SimpleNamespace) has no 'checkpoint'"),
    ([SimpleNamespace(checkpoint=3, regions=[])], "resident[0].checkpoint must be a str"),
    ([report("ck", ("", []))], "resident[0].regions[0].region must be a non-empty str"),
    ([report("ck", ("ck::r", [SimpleNamespace(bytes=4, device="cuda:0")]))],
     "resident[0].regions[0].tensors[0] (SimpleNamespace) has no 'address'"),
    ([report("ck", ("ck::r", [tensor(-4, 4)]))], "resident[0].regions[0].tensors[0].address must be a non-negative"),
    ([report("ck", ("ck::r", [tensor(4, 4, device=0)]))], "device must be a str such as 'cuda:0'"),
    ([{"checkpoint": "ck"}], "resident[0] has no 'regions'"),
    (7, "resident must be a list, got int"),
    ([{"checkpoint": "ck", "regions": 3}], "resident[0].regions must be a list, got int"),
    ([{"checkpoint": "ck", "regions": [{"region": "ck::r", "tensors": None}]}],
     "resident[0].regions[0].tensors must be a list, got NoneType"),
])
def test_malformed_resident_data_is_a_value_error_naming_the_bad_part(resident, problem):
    with pytest.raises(ValueError) as error:
        build(two_stream_snapshot(), resident=resident)
    assert problem in str(error.value)


@pytest.mark.parametrize("argument, value, problem", [
    ("device", -1, "device must be a non-negative int"),
    ("segment_bytes", "20", "segment_bytes must be a non-negative int, got str"),
    ("device_free", None, "device_free must be a non-negative int"),
    ("config", 5, "config must be a str"),
    ("num_ooms", 0, "num_ooms must be at least 1"),
    ("device", 2 ** 40, "device=1099511627776 is not a CUDA device index"),
    ("header", [("kind", "oom")], "header must be a dict of the common dump header fields, got list"),
])
def test_bad_observer_figures_are_value_errors(argument, value, problem):
    with pytest.raises(ValueError, match=problem):
        build(two_stream_snapshot(), **{argument: value})


# --- the observer PyTorch calls -----------------------------------------------------------------

def make_observer(tmp_path, snapshot=None, resident=(), **kwargs):
    return _oom.OomObserver(tmp_path, snapshot_fn=lambda: two_stream_snapshot() if snapshot is None else snapshot,
                            resident_fn=lambda: list(resident), **kwargs)


def test_each_oom_writes_its_own_valid_report_that_remat_report_renders(tmp_path, capfd, validate_oom):
    resident = [report("layers.0", ("layers.0::attention", [tensor(SEG_C, 3 * MiB)]))]
    observer = make_observer(tmp_path, resident=resident)
    assert observer(0, 20 * MiB, 80 * GiB, 10 * MiB) is None
    assert observer(0, 2 * MiB, 80 * GiB, 9 * MiB) is None
    files = sorted(tmp_path.glob("oom-*.json"))
    assert len(files) == 2 and [str(f) for f in files] == sorted(observer.dumps)
    assert all(f.name.startswith("oom-") and f"-p{os.getpid()}-d0-" in f.name for f in files)
    assert not list(tmp_path.glob(".remat-*"))  # the atomic write left no temporary file
    docs = [json.loads(f.read_text()) for f in map(pathlib.Path, observer.dumps)]
    assert [d["request"]["segment_bytes"] for d in docs] == [20 * MiB, 2 * MiB]
    for doc in docs:
        validate_oom(doc)
        assert doc["holders"]["by_region"][1] == {"name": "layers.0::attention", "bytes": 4 * MiB, "blocks": 1,
                                                  "saved_bytes": 4 * MiB}
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith("remat: out of memory on device 0 (PyTorch's native allocator): "
                             "tried to allocate 20.00 MiB")
    assert "top holders: <untagged> 12.00 MiB, layers.0::attention 4.00 MiB" in err[0]
    assert err[0].endswith(f"report: {observer.dumps[0]}")

    cli = remat_report()
    rendered = subprocess.run([cli, "oom", observer.dumps[0]], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert "Held by region" in rendered.stdout and "layers.0::attention" in rendered.stdout
    assert "switch region layers.0::attention to recompute" in rendered.stdout
    checked = subprocess.run([cli, "validate", observer.dumps[1]], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_observer_never_raises_into_the_allocator_and_says_why_in_one_line(tmp_path, capfd):
    def broken_snapshot():
        raise RuntimeError("snapshot failed\nsecond line")

    for snapshot_fn in (broken_snapshot, lambda: {"segments": "garbage"}, lambda: None):
        observer = _oom.OomObserver(tmp_path, snapshot_fn=snapshot_fn, resident_fn=list)
        assert observer(0, MiB, GiB, 0) is None
        assert observer("bad device", None, None, None) is None
    assert list(tmp_path.iterdir()) == []
    err = capfd.readouterr().err.splitlines()
    assert len(err) == 6 and all(line.startswith("remat: out of memory on device") for line in err)
    assert "no OOM report written: RuntimeError: snapshot failed second line" in err[0]
    assert "snapshot['segments'] must be a list" in err[2]


def test_bad_resident_data_only_skips_the_attribution(tmp_path, capfd, validate_oom):
    def broken():
        raise RuntimeError("runtime busy")

    for resident_fn in (broken, lambda: [SimpleNamespace(checkpoint="ck")]):
        observer = _oom.OomObserver(tmp_path, snapshot_fn=two_stream_snapshot, resident_fn=resident_fn)
        observer(0, MiB, GiB, 0)
        doc = json.loads(pathlib.Path(observer.dumps[0]).read_text())
        validate_oom(doc)
        assert holders(doc) == [("<untagged>", 16 * MiB, 3, 0)]
    err = capfd.readouterr().err.splitlines()
    assert "(regions not attributed: RuntimeError: runtime busy)" in err[0]
    assert "has no 'regions'" in err[1]


def test_an_observer_for_one_device_ignores_the_others_and_a_detached_one_writes_nothing(tmp_path):
    observer = make_observer(tmp_path, device=1)
    observer(0, MiB, GiB, 0)
    assert observer.dumps == []
    observer(1, MiB, GiB, 0)
    assert len(observer.dumps) == 1 and json.loads(pathlib.Path(observer.dumps[0]).read_text())["device"] == 1
    observer.detach()
    observer.detach()  # twice is fine
    observer(1, MiB, GiB, 0)
    assert len(list(tmp_path.glob("oom-*.json"))) == 1 and not observer.attached
    assert "detached" in repr(observer)


def test_a_report_never_replaces_a_file_already_in_the_directory(tmp_path):
    observer = make_observer(tmp_path)
    observer(0, MiB, GiB, 0)
    first = pathlib.Path(observer.dumps[0])
    number = int(first.stem.rsplit("-", 1)[1])
    taken = first.with_name(first.name.replace(f"-{number}.json", f"-{number + 1}.json"))
    taken.write_text("someone else's")
    observer(0, MiB, GiB, 0)
    assert taken.read_text() == "someone else's" and pathlib.Path(observer.dumps[1]) not in (first, taken)


def test_what_the_runtime_keeps_is_billed_by_storage_address():
    torch = pytest.importorskip("torch")
    if not hasattr(remat._C, "live_checkpoint_reports"):
        pytest.skip("this runtime has no live_checkpoint_reports(): the dump bills everything to <untagged>")
    n = 1024
    x = torch.rand(n, requires_grad=True)
    inside = {}

    def body(t):
        y = remat.region(lambda u: u.exp() * 2.0, "kept", recompute=False)(t)
        inside["reports"] = _oom._live_resident()  # the running checkpoint's own report
        return remat.region(lambda u: u.sin().sum(), "tail")(y)

    loss = remat.checkpoint(region_name="oom.ck")(body)(x)
    assert "oom.ck" in [r.checkpoint for r in inside["reports"]]
    reports = [r for r in _oom._live_resident() if r.checkpoint == "oom.ck"]
    assert len(reports) == 1
    assert _oom._resident_storages(reports, 0) == []  # CPU storages: nothing on cuda:0

    # The same storages as if they lived on cuda:0, each in a block of its own segment.
    moved = [{"checkpoint": r.checkpoint, "regions": [
        {"region": region.region,
         "tensors": [{"address": t.address, "bytes": t.bytes, "device": "cuda:0"} for t in region.tensors]}
        for region in r.regions]} for r in reports]
    storages = {(t.address, t.bytes) for r in reports for region in r.regions for t in region.tensors}
    snapshot = {"segments": [segment(address, [block(address, nbytes)]) for address, nbytes in sorted(storages)]}
    dump = build(snapshot, resident=moved)
    billed = {h["name"]: h for h in dump["holders"]["by_region"]}
    kept = next(region for region in reports[0].regions if region.region == "oom.ck::kept")
    assert billed["oom.ck::kept"]["bytes"] == kept.bytes == billed["oom.ck::kept"]["saved_bytes"] > 0
    assert "<untagged>" not in billed
    assert sum(h["bytes"] for h in billed.values()) == sum(nbytes for _, nbytes in storages)
    loss.backward()
    assert "oom.ck" not in [r.checkpoint for r in _oom._live_resident()]


def test_numbers_no_allocator_holds_are_refused_before_a_dump_remat_report_cannot_read_is_written():
    huge_segment = segment(SEG_A, [block(SEG_A, 8 * MiB)])
    huge_segment["total_size"] = 2 ** 64
    with pytest.raises(ValueError, match=r"snapshot\['segments'\]\[0\]\['total_size'\] is 1.845e\+19, more than any "
                                         r"allocator holds"):
        build({"segments": [huge_segment]})
    oom_event = {"action": "oom", "addr": 0, "size": 10 ** 30, "stream": 0, "frames": []}
    with pytest.raises(ValueError, match="more than"):
        build(two_stream_snapshot(traces=[[oom_event], []]))
    with pytest.raises(ValueError, match=r"segment_bytes is 1.209e\+24, more than any allocator holds"):
        build(two_stream_snapshot(), segment_bytes=2 ** 80)
    # A header nested past Python's recursion limit is checked without recursing.
    deep = {"figure": 2 ** 70}
    for _ in range(5000):
        deep = {"inner": deep}
    with pytest.raises(ValueError, match=r"dump\.inner(\.inner)+\.figure would be 1\.181e\+21"):
        build(two_stream_snapshot(), header=deep)
    # Trace entries whose action is not a string are left out like other unknown actions.
    odd = [{"action": ["alloc"], "addr": 0, "size": 1}, {"action": {"oom": 1}, "size": 1}]
    assert build(two_stream_snapshot(traces=[odd, []]))["last_events"] == []
    # Each figure fits, their sum does not: refused, not written.
    many = [segment(i << 12, [block(i << 12, 2 ** 60)]) for i in range(9)]  # 9 * 2**60 > 2**63 - 1
    with pytest.raises(ValueError, match="more than a 64-bit figure holds"):
        build({"segments": many}, device_limit=2 ** 62)


def test_the_observer_line_names_sizes_past_tebibytes_in_larger_units():
    assert remat._C.format_bytes(2 ** 50) == "1.00 PiB"
    assert remat._C.format_bytes(2 ** 63) == "8.00 EiB"


# --- attaching ----------------------------------------------------------------------------------

def attach_native(path):
    return _oom.attach_oom_observer(path, allocator="native")


def test_a_missing_dump_dir_is_refused_when_attaching(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; create it first"):
        attach_native(tmp_path / "missing")


def test_a_file_as_dump_dir_is_refused_when_attaching(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        attach_native(tmp_path / "file")


def test_an_unwritable_dump_dir_is_refused_when_attaching(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root may write into any directory: let the check see it as the others would
        monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(PermissionError, match="is not writable by this process"):
        attach_native(locked)


def test_bad_arguments_are_refused_when_attaching(tmp_path):
    with pytest.raises(ValueError, match="allocator='pytorch' is not one of 'auto', 'native', 'remat'"):
        _oom.attach_oom_observer(tmp_path, allocator="pytorch")
    with pytest.raises(ValueError, match="contains a NUL character"):
        _oom.attach_oom_observer("a\0b")
    with pytest.raises(TypeError, match="dump_dir must be a str, bytes or os.PathLike"):
        _oom.attach_oom_observer(3)
    with pytest.raises(ValueError, match="is not a CUDA device"):
        _oom.OomObserver(tmp_path, device="cpu")
    with pytest.raises(ValueError, match="device=-2 is negative"):
        _oom.OomObserver(tmp_path, device=-2)
    assert _oom.OomObserver(tmp_path, device="cuda:3").device == 3


def test_the_native_observer_needs_cuda_and_says_so(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the native observer attaches here")
    with pytest.raises(RuntimeError, match="PyTorch's native OOM observer needs CUDA") as error:
        _oom.attach_oom_observer(tmp_path)
    assert "oom_dump_from_snapshot() builds the report anywhere" in str(error.value)


def test_with_cuda_the_observer_is_registered_with_pytorchs_allocator(tmp_path, monkeypatch, validate_oom):
    torch = pytest.importorskip("torch")
    registered = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", registered.append, raising=False)
    monkeypatch.setattr(remat_alloc, "pluggable_allocator_in_use", lambda: False)
    monkeypatch.setattr(_oom, "_native_snapshot", two_stream_snapshot)
    # PyTorch counts the OOM before it calls its observers; with a GPU visible the count would
    # otherwise be read from the real, OOM-free device.
    monkeypatch.setattr(_oom, "_num_ooms", lambda device: 1)
    observer = _oom.attach_oom_observer(tmp_path, device=0)
    assert registered == [observer] and observer.allocator == "native" and "native allocator" in repr(observer)
    registered[0](0, 20 * MiB, 80 * GiB, MiB)  # as PyTorch calls it
    assert len(observer.dumps) == 1
    validate_oom(json.loads(pathlib.Path(observer.dumps[0]).read_text()))


def test_with_another_pluggable_allocator_there_is_no_observer_to_attach(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(remat_alloc, "pluggable_allocator_in_use", lambda: True)
    monkeypatch.setattr(remat_alloc, "is_installed", lambda: False)
    with pytest.raises(RuntimeError, match="a pluggable allocator, which has no OOM observers; install remat's"):
        _oom.attach_oom_observer(tmp_path)
    monkeypatch.setattr(remat_alloc, "is_installed", lambda: True)
    with pytest.raises(RuntimeError, match="it is remat's tagging allocator: pass allocator='auto' or 'remat'"):
        _oom.attach_oom_observer(tmp_path, allocator="native")


def test_the_tagging_allocator_is_found_when_it_is_pytorchs_cuda_allocator(tmp_path):
    assert not remat_alloc.pluggable_allocator_in_use()  # this process keeps PyTorch's own
    # A fresh process: PyTorch cannot put its own allocator back.
    script = textwrap.dedent(f"""
        import remat_alloc, torch
        from torch.cuda import memory
        from remat import _oom
        print(remat_alloc.is_installed())
        memory.change_current_allocator(
            memory.CUDAPluggableAllocator(remat_alloc.library_path(), "remat_alloc", "remat_free"))
        print(remat_alloc.is_installed())
        observer = _oom.attach_oom_observer({str(tmp_path)!r})
        print(observer.allocator)
        observer.detach()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "True", "remat"]


def oom_in_a_fresh_process(script, allocator, validate_oom, timeout):
    """Runs `script`, which prints "raised" when its allocation failed, then a JSON object with the
    observer's allocator and dumps; checks it wrote one valid report under `allocator` and returns
    that report and the object."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "raised"
    result = json.loads(lines[1])
    assert result["allocator"] == allocator and len(result["dumps"]) == 1
    doc = json.loads(pathlib.Path(result["dumps"][0]).read_text())
    validate_oom(doc)
    return doc, result


def test_under_the_tagging_allocator_the_same_call_lists_its_own_report(tmp_path, validate_oom):
    # A fresh process: the host capacity is set before the first tagged tensor.
    script = textwrap.dedent(f"""
        import json, torch, remat, remat_alloc
        from remat import _oom
        remat_alloc.configure("host_capacity_mb:4")
        observer = _oom.attach_oom_observer({str(tmp_path)!r}, allocator="remat")
        with remat.tag_cpu_tensors():
            with remat_alloc.region("held"):
                kept = torch.empty(1 << 20, dtype=torch.uint8)
            try:
                torch.empty(8 << 20, dtype=torch.uint8)
            except torch.OutOfMemoryError:
                print("raised")
        observer.detach()
        print(json.dumps({{"allocator": observer.allocator, "dumps": observer.dumps}}))
    """)
    doc, _ = oom_in_a_fresh_process(script, "remat", validate_oom, timeout=120)
    assert doc["backend"] == "host" and doc["request"]["requested_bytes"] == 8 << 20
    assert "held" in [h["name"] for h in doc["holders"]["by_region"]]


def test_two_observers_on_the_tagging_allocator_each_keep_their_reports_in_their_own_folder(tmp_path):
    # The allocator's report folder is one setting: the first observer's report went into the second
    # one's folder (listed as its own), and after the second detached, the first wrote none
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    script = textwrap.dedent(f"""
        import json, os, torch, remat, remat_alloc
        remat_alloc.configure("host_capacity_mb:4,oom_dump_interval_ms:0")
        a = remat.attach_oom_observer({str(first)!r}, allocator="remat")
        b = remat.attach_oom_observer({str(second)!r}, allocator="remat")
        with remat.tag_cpu_tensors():
            for attempt in range(2):
                try:
                    torch.empty(8 << 20, dtype=torch.uint8)
                except torch.OutOfMemoryError:
                    pass
                if attempt == 0:
                    b.detach()
        a.detach()
        try:
            with remat.tag_cpu_tensors():
                torch.empty(8 << 20, dtype=torch.uint8)
        except torch.OutOfMemoryError:
            pass
        print(json.dumps({{"a": a.dumps, "b": b.dumps}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "REMAT_ALLOC_CONF": "", "REMAT_OOM_DUMP_DIR": ""})
    assert done.returncode == 0, done.stderr
    dumps = json.loads(done.stdout.splitlines()[-1])
    assert len(dumps["a"]) == 2 and all(os.path.dirname(path) == str(first) for path in dumps["a"]), dumps
    assert len(dumps["b"]) == 1 and os.path.dirname(dumps["b"][0]) == str(second), dumps
    assert sorted(p.name for p in first.iterdir()) == sorted(os.path.basename(path) for path in dumps["a"])
    assert [p.name for p in second.iterdir()] == [os.path.basename(dumps["b"][0])]  # none after both detached


def test_whatif_on_a_recording_that_ran_out_of_memory_says_the_failures_are_not_replayed(tmp_path):
    # It showed runs without a failure and no word of the recorded OOMs, and dropped a --conf
    # host_capacity_mb (no caching-pool setting) without a word
    import shutil

    report = os.environ.get("REMAT_REPORT") or shutil.which("remat-report")
    if report is None:
        pytest.skip("remat-report is not built here (REMAT_REPORT unset and not on PATH)")
    trace = tmp_path / "trace.jsonl"
    script = textwrap.dedent(f"""
        import torch, remat, remat_alloc
        remat_alloc.configure("host_capacity_mb:4")
        with remat.tag_cpu_tensors():
            kept = torch.empty(1 << 20, dtype=torch.uint8)
            try:
                torch.empty(8 << 20, dtype=torch.uint8)
            except torch.OutOfMemoryError:
                pass
        remat_alloc.dump_trace({str(trace)!r})
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = subprocess.run([report, "whatif", str(trace), "--conf", "host_capacity_mb:8", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    notes = json.loads(out.stdout)["notes"]
    assert any("the recording ran out of memory 1 time(s)" in note for note in notes), notes
    assert any("host_capacity_mb is not replayed; give the device memory as --capacity" in note for note in notes)


def test_observers_that_allocate_and_fail_or_remove_themselves_leave_the_oom_to_the_caller(tmp_path):
    # An observer whose own allocation fails is not called again for it (that recursion had no
    # end), an observer that removes itself is freed only once it returned, and the caller gets
    # torch.OutOfMemoryError. A fresh process: the host capacity is set before the first tensor.
    script = textwrap.dedent("""
        import torch, remat, remat_alloc
        calls = {"allocating": 0, "one_shot": 0, "own_oom": 0}
        ids = []
        def allocating(event):
            calls["allocating"] += 1
            scratch = torch.empty(1 << 20, dtype=torch.uint8)
            try:
                torch.empty(1 << 30, dtype=torch.uint8)
            except torch.OutOfMemoryError:
                calls["own_oom"] += 1
        def one_shot(event):
            calls["one_shot"] += 1
            remat_alloc.remove_oom_observer(ids[1])
        with remat.tag_cpu_tensors():
            ids.append(remat_alloc.add_oom_observer(allocating))
            ids.append(remat_alloc.add_oom_observer(one_shot))
            for _ in range(2):
                try:
                    torch.empty(100 << 20, dtype=torch.uint8)
                except torch.OutOfMemoryError:
                    print("raised")
            remat_alloc.remove_oom_observer(ids[0])
        print(calls)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, REMAT_ALLOC_CONF=f"host_capacity_mb:64,oom_dump_interval_ms:0,oom_dump_dir:{tmp_path}"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["raised", "raised", "{'allocating': 2, 'one_shot': 1, 'own_oom': 2}"]


def test_on_a_gpu_a_real_oom_writes_a_report_billing_what_a_checkpoint_keeps(tmp_path, validate_oom):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: PyTorch's native allocator has nothing to report here")
    # A fresh process: PyTorch cannot remove an OOM observer.
    script = textwrap.dedent(f"""
        import json, torch, remat
        from remat import _oom
        observer = _oom.attach_oom_observer({str(tmp_path)!r}, device=0)
        torch.cuda.memory._record_memory_history(max_entries=10000)
        x = torch.rand(1 << 20, device="cuda", requires_grad=True)
        body = lambda t: remat.region(lambda u: u.exp(), "kept", recompute=False)(t).sum()
        loss = remat.checkpoint(region_name="gpu.ck")(body)(x)
        too_big = torch.cuda.get_device_properties(0).total_memory + (1 << 30)
        try:
            torch.empty(too_big, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            print("raised")
        print(json.dumps({{"allocator": observer.allocator, "dumps": observer.dumps, "asked": too_big}}))
    """)
    doc, result = oom_in_a_fresh_process(script, "native", validate_oom, timeout=300)
    assert doc["cause"] == "request_exceeds_device" and doc["request"]["rounded_bytes"] >= result["asked"]
    kept = {h["name"]: h for h in doc["holders"]["by_region"]}.get("gpu.ck::kept")
    assert kept is not None and kept["bytes"] >= 4 << 20 and kept["saved_bytes"] == kept["bytes"]
    rendered = subprocess.run([remat_report(), "oom", result["dumps"][0]], capture_output=True, text=True,
                              timeout=60)
    assert rendered.returncode == 0 and "gpu.ck::kept" in rendered.stdout, rendered.stderr


def test_a_second_copy_of_the_allocators_library_is_refused_naming_both(tmp_path):
    # remat's extension links one copy; REMAT_ALLOC_LIBRARY names another file of the same
    # library: observers added through one would never see the other's out-of-memory errors.
    linked = pathlib.Path(remat_alloc.library_path()).resolve()
    copy = tmp_path / "libremat_alloc.so"
    copy.write_bytes(linked.read_bytes())
    packages = os.pathsep.join(str(pathlib.Path(module.__file__).resolve().parents[1]) for module in (remat, remat_alloc))
    env = {**os.environ, "REMAT_ALLOC_LIBRARY": str(copy), "PYTHONPATH": packages}
    load_both = "import remat, remat_alloc; remat_alloc.load()"
    run = subprocess.run([sys.executable, "-c", load_both], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode != 0
    assert "two copies of the allocator's library are loaded in this process" in run.stderr, run.stderr
    assert str(copy) in run.stderr and str(linked) in run.stderr, run.stderr
    # Loaded first, the named copy is the one the extension links (the loader matches its name).
    run = subprocess.run([sys.executable, "-c", "import remat_alloc; remat_alloc.load(); import remat"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr


_REMOVAL_UNDER_CONTENTION = """
import atexit, os, shutil, sys, tempfile, threading, time
dumps = tempfile.mkdtemp()
atexit.register(shutil.rmtree, dumps, True)
os.environ["REMAT_ALLOC_CONF"] = "host_capacity_mb:64,oom_dump_interval_ms:0,oom_dump_dir:" + dumps
import torch, remat, remat_alloc
both_in = threading.Barrier(2, timeout=20)
ids, calls = {}, []
if sys.argv[1] == "mutual":  # t1 inside A removes B while t2 inside B removes A
    def make(other, runs_in):
        def observer(event):
            if threading.current_thread().name == runs_in:
                calls.append(runs_in)
                both_in.wait()
                remat_alloc.remove_oom_observer(ids[other])
        return observer
    ids["A"] = remat_alloc.add_oom_observer(make("B", "t1"))
    ids["B"] = remat_alloc.add_oom_observer(make("A", "t2"))
else:  # a one-shot observer removing itself under a lock the other thread waits for inside it
    lock = threading.Lock()
    def once(event):
        calls.append(threading.current_thread().name)
        both_in.wait()
        with lock:
            if "A" in ids:
                time.sleep(0.1)
                remat_alloc.remove_oom_observer(ids.pop("A"))
    ids["A"] = remat_alloc.add_oom_observer(once)
caught = []
def work():
    with remat.tag_cpu_tensors():
        try:
            torch.empty(100 << 20, dtype=torch.uint8)
        except torch.OutOfMemoryError:
            caught.append(threading.current_thread().name)
threads = [threading.Thread(target=work, name=n) for n in ("t1", "t2")]
[t.start() for t in threads]
[t.join() for t in threads]
work()  # after the removals: no observer is called
print(sorted(caught), sorted(calls))
"""


@pytest.mark.parametrize("scenario", ["mutual", "one_shot_under_lock"])
def test_removing_observers_while_other_threads_are_inside_them_never_waits_for_those_threads(scenario):
    # Removal used to wait for every other thread inside the observer removed: two observers removing
    # each other from two threads, or a one-shot observer removing itself under a lock the other
    # thread waits for inside it, then hung both threads. A fresh process, with a bounded timeout.
    done = subprocess.run([sys.executable, "-c", _REMOVAL_UNDER_CONTENTION, scenario], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "['MainThread', 't1', 't2'] ['t1', 't2']"
