"""What the runtime tells a user: the trace of save/recompute decisions, the memory a checkpoint
keeps per region (from inside its forward), the saved-for-backward report, allocation sites,
and dumps written atomically."""

import json
import os

import pytest
import torch

import remat
import remat_alloc

FLOAT = 4


def two_region_block(name, x):
    def body(t):
        y = remat.region(lambda u: u.exp() * 3.0, "attention", recompute=False)(t)
        return remat.region(lambda u: u.sin().sum(), "mlp")(y)

    return remat.checkpoint(body, x, region_name=name)


def test_trace_formats_one_scope_line_per_checkpoint_and_one_line_per_region():
    x = torch.rand(8, requires_grad=True)
    loss = two_region_block("layers.0", x) + two_region_block("layers.1", x)
    trace = remat.collect_trace()
    assert trace.format() == ("remat trace: 2 checkpoint(s), 4 region(s)\n"
                              "scope [layers.0]\n"
                              "  attention: save\n"
                              "  mlp: recompute\n"
                              "scope [layers.1]\n"
                              "  attention: save\n"
                              "  mlp: recompute\n")
    assert str(trace) == trace.format()
    assert [(s.name, [(r.name, r.saved) for r in s.regions]) for s in trace.scopes] == [
        ("layers.0", [("attention", True), ("mlp", False)]), ("layers.1", [("attention", True), ("mlp", False)])]
    assert remat.collect_trace().scopes == []  # collecting clears
    doc = json.loads(trace.to_json())
    assert doc["kind"] == "remat-trace"
    assert doc["pid"] == os.getpid()
    assert doc["scopes"][1]["name"] == "layers.1"
    assert doc["scopes"][1]["regions"] == [{"name": "attention", "decision": "save"},
                                           {"name": "mlp", "decision": "recompute"}]
    loss.backward()
    assert remat.collect_trace().scopes == []  # recompute records nothing


def test_memory_report_lists_what_the_checkpoint_keeps_per_region_with_exact_bytes():
    n = 256
    x = torch.rand(n, requires_grad=True)
    captured = {}

    def body(t):
        y = remat.region(lambda u: u.exp() * 3.0, "kept", recompute=False)(t)
        out = remat.region(lambda u, v: (u * v).sum(), "tail")(y, t)
        captured["report"] = remat.current_memory_report()
        captured["text"] = remat.format_current_memory_report()
        return out

    loss = remat.checkpoint(body, x, region_name="m")
    report = captured["report"]
    assert report.checkpoint == "m"
    assert [(r.region, r.bytes, r.storages) for r in report.regions] == [
        ("<inputs>", n * FLOAT, 1),  # the tail region reads x again in recompute
        ("m::kept", 2 * n * FLOAT, 2),  # exp's saved result and the persisted output
    ]
    kept = report.regions[1].tensors
    assert [(t.name, t.shape, t.dtype, t.bytes) for t in kept] == [("output 0", [n], "Float", n * FLOAT),
                                                                    ("saved 0", [n], "Float", n * FLOAT)]
    assert captured["text"] == ("memory kept for backward by checkpoint [m]: 3.00 KiB\n"
                                "  <inputs>: 1.00 KiB in 1 storage(s)\n"
                                "    input 0  [256]  Float\n"
                                "  m::kept: 2.00 KiB in 2 storage(s)\n"
                                "    output 0  [256]  Float\n"
                                "    saved 0  [256]  Float\n")
    assert captured["text"] == report.format() == str(report)
    doc = json.loads(report.to_json())
    assert doc["kind"] == "memory-report"
    assert doc["regions"][1]["bytes"] == 2 * n * FLOAT
    assert doc["regions"][1]["tensors"][1]["storage_bytes"] == n * FLOAT
    loss.backward()


def test_memory_report_outside_a_checkpoints_forward_is_a_remat_error():
    message = ("format_current_memory_report() works only inside a checkpoint's forward; call it from the "
               "checkpointed function (outside recompute)")
    with pytest.raises(remat.RematError) as raised:
        remat.format_current_memory_report()
    assert str(raised.value) == message
    with pytest.raises(remat.RematError):
        remat.current_memory_report()


def test_memory_report_names_the_allocation_site_and_views_share_it():
    n = 64
    x = torch.rand(n, requires_grad=True)
    captured = {}

    def experts(t):
        with remat_alloc.site("experts"):
            e = t.exp()
        return e.view(8, 8)  # a view of the exp result

    def body(t):
        y = remat.region(experts, "moe", recompute=False)(t)
        out = remat.region(lambda u: u.sum(), "tail")(y)
        captured["report"] = remat.current_memory_report()
        return out

    with remat.tag_cpu_tensors():
        loss = remat.checkpoint(body, x, region_name="sited")
        report = captured["report"]
        assert [(r.region, r.bytes, r.storages) for r in report.regions] == [("sited::moe", n * FLOAT, 1)]
        # The output view and exp's saved result share one storage.
        assert [(t.name, t.shape, t.site) for t in report.regions[0].tensors] == [("output 0", [8, 8], "experts"),
                                                                                   ("saved 0", [n], "experts")]
        assert "    saved 0  [64]  Float  @experts\n" in report.format()
        loss.backward()


def two_layers_and_a_head(x):
    """Two checkpointed layers whose save region keeps two 3x4 float32 tensors each (sin and cos
    save their inputs), then a tanh head that saves its 3x4 result: 240 B in all."""
    h = x
    for i in range(2):
        h = remat.checkpoint(lambda t: remat.region(lambda u: u.sin().cos(), "block", recompute=False)(t), h,
                             region_name=f"layer.{i}")
    return h.tanh().sum()


def test_saved_report_bills_regions_folded_and_the_rest_by_node():
    x = torch.rand(3, 4, requires_grad=True)
    with remat.track_saved_tensors():
        loss = two_layers_and_a_head(x)
    report = remat.saved_report(loss)
    assert (report.total_bytes, report.region_bytes, report.outside_bytes, report.regions) == (240, 192, 48, 2)
    assert report.format() == ("saved for backward: 240 B resident -- 2 region(s) 192 B, outside regions 48 B\n"
                               "  96 B  x2  layer.0-1  (2 storages each)\n"
                               "  48 B  TanhBackward0 (x1)\n")
    assert [(g.label, g.bytes, g.count) for g in report.node_groups] == [("TanhBackward0", 48, 1)]
    doc = json.loads(report.to_json())
    assert doc["kind"] == "saved-report"
    assert doc["region_groups"][0]["label"] == "layer.0-1"
    assert doc["region_groups"][0]["bytes"] == 192
    loss.backward()
    assert remat.saved_report(loss).total_bytes == 0  # backward released everything


def test_saved_report_bills_a_storage_saved_twice_once():
    x = torch.rand(3, 4, requires_grad=True)
    with remat.track_saved_tensors():
        t = x * 2.0
        loss = (t * t).sum() + t.sin().sum()  # mul saves t twice, sin saves t once more
    report = remat.saved_report(loss)
    assert (report.total_bytes, report.regions) == (48, 0)


def test_saved_report_without_tracking_sees_only_checkpoints():
    x = torch.rand(3, 4, requires_grad=True)
    loss = two_layers_and_a_head(x)
    assert remat.saved_report(loss).total_bytes == 0


def test_dumps_are_written_atomically_and_parse(tmp_path):
    x = torch.rand(4, requires_grad=True)
    two_region_block("dumped", x).backward()
    path = tmp_path / "remat-trace.json"
    remat.write_dump(str(path), remat.collect_trace().to_json())
    doc = json.loads(path.read_text())
    assert doc["scopes"][0]["name"] == "dumped"
    assert doc["pid"] == os.getpid()
    assert [p.name for p in tmp_path.iterdir()] == ["remat-trace.json"]  # no temporary file left behind
