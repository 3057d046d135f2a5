"""What the runtime tells a user: the trace of save/recompute decisions, the memory a checkpoint
keeps per region (from inside its forward), the saved-for-backward report, allocation sites,
and dumps written atomically."""

import json
import os

import pytest
import torch

import remat
import remat_alloc
from remat._trace import OpTrace, ScopeTrace

FLOAT = 4


def two_region_block(name, x):
    def body(t):
        y = remat.region(lambda u: u.exp() * 3.0, "attention", recompute=False)(t)
        return remat.region(lambda u: u.sin().sum(), "mlp")(y)

    return remat.checkpoint(region_name=name)(body)(x)


def test_trace_formats_one_scope_line_per_checkpoint_and_one_line_per_region():
    x = torch.rand(8, requires_grad=True)
    two_region_block("before", x)  # ran before the block: not in its trace
    with remat.collect_trace() as trace:
        loss = two_region_block("layers.0", x) + two_region_block("layers.1", x)
    two_region_block("after", x)
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
    doc = json.loads(trace.to_json())
    assert doc["kind"] == "remat-trace"
    assert doc["pid"] == os.getpid()
    assert doc["scopes"][1]["name"] == "layers.1"
    assert doc["scopes"][1]["regions"] == [{"name": "attention", "decision": "save"},
                                           {"name": "mlp", "decision": "recompute"}]
    with remat.collect_trace() as during_backward:
        loss.backward()
    assert during_backward.scopes == []  # recompute records nothing


def test_nested_trace_blocks_each_see_what_ran_inside_them():
    x = torch.rand(8, requires_grad=True)
    with remat.collect_trace() as outer:
        two_region_block("outer.first", x)
        with remat.collect_trace() as inner:
            two_region_block("inner", x)
            assert [s.name for s in inner.scopes] == ["inner"]  # readable while inside
        two_region_block("outer.last", x)
    assert [s.name for s in inner.scopes] == ["inner"]
    assert [s.name for s in outer.scopes] == ["outer.first", "inner", "outer.last"]


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

    loss = remat.checkpoint(region_name="m")(body)(x)
    report = captured["report"]
    assert report.checkpoint == "m"
    assert (report.bytes, report.storages) == (3 * n * FLOAT, 3)
    assert [(r.region, r.bytes, r.storages) for r in report.regions] == [
        ("<inputs>", n * FLOAT, 1),  # the tail region reads x again in recompute
        ("m::kept", 2 * n * FLOAT, 2),  # exp's saved result and the persisted output
    ]
    kept = report.regions[1].tensors
    assert [(t.name, t.shape, t.dtype, t.bytes, t.device) for t in kept] == [
        ("saved.0", [n], "float32", n * FLOAT, "cpu"), ("output.0", [n], "float32", n * FLOAT, "cpu")]
    assert captured["text"] == ("m: 3.00 KiB resident in 3 storage(s)\n"
                                "<inputs>: 1.00 KiB\n"
                                "  1.00 KiB  input.0   (256,)  float32\n"
                                "m::kept: 2.00 KiB\n"
                                "  1.00 KiB  saved.0   (256,)  float32\n"
                                "  1.00 KiB  output.0  (256,)  float32")  # no newline at the end, as torch_remat's
    assert captured["text"] + "\n" == report.format() == str(report)
    doc = json.loads(report.to_json())
    assert doc["kind"] == "memory-report"
    assert (doc["bytes"], doc["storages"]) == (3 * n * FLOAT, 3)
    assert doc["regions"][1]["bytes"] == 2 * n * FLOAT
    assert doc["regions"][1]["tensors"][1]["storage_bytes"] == n * FLOAT
    loss.backward()


def test_print_current_memory_report_writes_the_report_as_torch_remat_shows_it(capsys):
    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            probs = t.softmax(0)
            lse = t.logsumexp(0, keepdim=True).expand(3).contiguous()
            remat.save_for_backward(ctx, {"lse": lse, "probs": probs})
            return probs

        @staticmethod
        def backward(ctx, grad):
            lse, probs = ctx.saved_tensors
            return probs * (grad - (grad * probs).sum())

    def body(t):
        probs = remat.region(Softmax.apply, "attn.softmax", recompute=False)(t)
        if not remat.is_recomputing():
            remat.print_current_memory_report()
        return probs.sum()

    remat.checkpoint(region_name="layers.0")(body)(torch.rand(4, requires_grad=True))
    assert capsys.readouterr().out == ("layers.0: 28 B resident in 2 storage(s)\n"
                                       "layers.0::attn.softmax: 28 B\n"
                                       "  12 B  lse    (3,)  float32\n"
                                       "  16 B  probs  (4,)  float32\n")


def test_save_for_backward_refuses_an_empty_name_as_torch_remat_does():
    with pytest.raises(ValueError, match="^save_for_backward: a tensor's name is empty"):
        remat.save_for_backward(None, {"": torch.rand(3)})


def test_save_for_backward_refuses_a_value_that_is_not_a_tensor_naming_its_key():
    class Saves(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            remat.save_for_backward(ctx, {"t": t, "a": 3})
            return t.sin()

        @staticmethod
        def backward(ctx, grad):
            return grad

    message = ("save_for_backward: saved['a'] must be a torch.Tensor or None (what ctx.save_for_backward accepts), "
               "got int 3")
    with pytest.raises(TypeError) as outside:
        remat.save_for_backward(None, {"a": 3})
    assert str(outside.value) == message
    body = lambda t: remat.region(Saves.apply, "r", recompute=False)(t).sum()
    with pytest.raises(RuntimeError) as inside:  # torch_remat raises a RuntimeError: both catch it
        remat.checkpoint(region_name="c")(body)(torch.rand(3, requires_grad=True))
    assert str(inside.value) == message
    assert isinstance(inside.value, TypeError)


def test_memory_report_outside_a_checkpoints_forward_is_a_remat_error():
    message = ("remat.current_memory_report() works only inside a checkpoint's forward; call it from the checkpointed "
               "function (outside recompute: guard it with `if not remat.is_recomputing()`)")
    with pytest.raises(remat.RematError) as raised:
        remat.format_current_memory_report()
    assert str(raised.value) == message
    with pytest.raises(remat.RematError):
        remat.current_memory_report()
    with pytest.raises(remat.RematError):
        remat.print_current_memory_report()


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
        loss = remat.checkpoint(region_name="sited")(body)(x)
        report = captured["report"]
        assert [(r.region, r.bytes, r.storages) for r in report.regions] == [("sited::moe", n * FLOAT, 1)]
        # The output view and exp's saved result share one storage.
        assert [(t.name, t.shape, t.site, t.shares_storage) for t in report.regions[0].tensors] == [
            ("saved.0", [n], "experts", False), ("output.0", [8, 8], "experts", True)]
        assert "  256 B  saved.0   (64,)   float32  @experts\n" in report.format()
        assert "         output.0  (8, 8)  float32  (shares a storage above)  @experts\n" in report.format()
        loss.backward()


def two_layers_and_a_head(x):
    """Two checkpointed layers whose save region keeps two 3x4 float32 tensors each (sin and cos
    save their inputs), then a tanh head that saves its 3x4 result: 240 B in all."""
    h = x.clone()  # x itself, a leaf that requires grad, is the caller's and not billed
    for i in range(2):
        h = remat.checkpoint(region_name=f"layer.{i}")(lambda t: remat.region(lambda u: u.sin().cos(), "block", recompute=False)(t))(h)
    return h.tanh().sum()


@pytest.mark.parametrize("tracking", [False, True], ids=["no-guard", "tracked"])
def test_saved_tensors_report_bills_regions_folded_and_the_rest_by_node(tracking, capsys):
    x = torch.rand(3, 4, requires_grad=True)
    if tracking:
        with remat.track_saved_tensors():
            loss = two_layers_and_a_head(x)
    else:
        loss = two_layers_and_a_head(x)
    report = remat.saved_tensors_report(loss)
    assert (report.total_bytes, report.region_bytes, report.outside_bytes, report.regions) == (240, 192, 48, 2)
    expected = ("saved for backward: 240 B resident -- 2 region(s) 192 B, outside regions 48 B\n"
                "\n"
                "regions:\n"
                "  96 B  x2  layer.0-1  (2 storages each)\n"
                "\n"
                "outside regions: 48 B in 1 storage\n"
                "       48 B  TanhBackward0 (x1)\n"
                "\n"
                "region detail:\n"
                "[x2: layer.0-1]\n"
                "layer.0: 96 B resident in 2 storage(s)\n"
                "layer.0::block: 96 B\n"
                "  48 B  saved.0  (3, 4)  float32\n"
                "  48 B  saved.1  (3, 4)  float32\n")
    assert report.format() == expected
    remat.print_saved_tensors_report(loss)
    assert capsys.readouterr().out == expected
    assert [(g.label, g.bytes, g.count) for g in report.node_groups] == [("TanhBackward0", 48, 1)]
    doc = json.loads(report.to_json())
    assert doc["kind"] == "saved-report"
    assert doc["region_groups"][0]["label"] == "layer.0-1"
    assert doc["region_groups"][0]["bytes"] == 192
    loss.backward()
    assert remat.saved_tensors_report(loss).total_bytes == 0  # backward released everything


def test_saved_tensors_report_walks_the_graph_without_running_recompute():
    x = torch.rand(3, 4, requires_grad=True)
    runs = []

    def body(t):
        runs.append(remat.is_recomputing())
        return remat.region(lambda u: u.sin(), "recomputed")(t).exp()

    loss = remat.checkpoint(region_name="walked")(body)(x).tanh().sum()
    report = remat.saved_tensors_report(loss)
    assert runs == [False]  # reading the graph's saved tensors ran no recompute
    assert report.outside_bytes == 48  # tanh's result; exp's and sin's were dropped by the checkpoint
    assert [g.label for g in report.region_groups] == ["walked"]
    loss.backward()
    assert runs == [False, True]
    assert torch.allclose(x.grad, (1 - x.sin().exp().tanh() ** 2).detach() * (x.sin().exp() * x.cos()).detach())


def test_saved_tensors_report_bills_a_storage_saved_twice_once():
    x = torch.rand(3, 4, requires_grad=True)
    t = x.exp()  # exp saves t, its result
    loss = (t * t).sum() + t.sin().sum()  # mul saves t twice, sin saves t once more
    report = remat.saved_tensors_report(loss)
    assert (report.total_bytes, report.regions) == (48, 0)
    assert remat.saved_report is remat.saved_tensors_report
    with pytest.raises(TypeError, match="^saved_tensors_report: roots must be a tensor \\(the loss\\), tensors, or "
                                        "None, got float$"):
        remat.saved_tensors_report(1.0)


def test_dumps_are_written_atomically_and_parse(tmp_path):
    x = torch.rand(4, requires_grad=True)
    with remat.collect_trace() as trace:
        two_region_block("dumped", x).backward()
    path = tmp_path / "remat-trace.json"
    remat.write_dump(str(path), trace.to_json())
    doc = json.loads(path.read_text())
    assert doc["scopes"][0]["name"] == "dumped"
    assert doc["pid"] == os.getpid()
    assert [p.name for p in tmp_path.iterdir()] == ["remat-trace.json"]  # no temporary file left behind


def test_site_as_a_decorator_and_a_context_manager_tags_what_reports_and_dumps_show():
    @remat.site("experts")
    def experts(t):
        return t.exp()

    def body(t):
        kept = remat.region(experts, "moe", recompute=False)(t)
        with remat.site("router"):
            scores = remat.region(lambda u: u.sin(), "router", recompute=False)(t)
        out = (kept * scores).sum()  # mul saves both outputs: their values stay resident
        captured.append(remat.current_memory_report())
        return out

    captured = []
    x = torch.rand(64, requires_grad=True)
    with remat.tag_cpu_tensors():
        loss = remat.checkpoint(region_name="sites")(body)(x)
        report = captured[0]
        sites = {t.name: t.site for region in report.regions for t in region.tensors if region.region == "sites::moe"}
        assert sites == {"saved.0": "experts", "output.0": "experts"}
        assert {t.site for region in report.regions if region.region == "sites::router" for t in region.tensors} == {
            "router"}
        doc = json.loads(report.to_json())
        assert {t["site"] for region in doc["regions"] for t in region["tensors"]} == {"experts", "router"}
        loss.backward()
    assert experts.__name__ == "experts"
    with pytest.raises(TypeError, match=r"^remat.site\('experts'\): decorates a callable, got int$"):
        remat.site("experts")(3)
    with pytest.raises(ValueError, match="contains a NUL character"):
        remat.site("a\0b")


def test_trace_entries_list_each_region_with_its_name_scope_prefixes_and_recompute_setting():
    x = torch.rand(8, requires_grad=True)
    with remat.collect_trace() as trace:
        with remat.name_scope("model"):
            loss = two_region_block("layers.0", x)
        loss = loss + two_region_block("layers.1", x)
    assert trace.entries == [OpTrace("model/attention", recompute=False), OpTrace("model/mlp", recompute=True),
                             OpTrace("attention", recompute=False), OpTrace("mlp", recompute=True)]
    assert trace.format().startswith("remat trace: 2 checkpoint(s), 4 region(s)\nscope [layers.0]\n"
                                     "  model/attention: save\n")
    loss.backward()
    assert torch.allclose(x.grad, 2 * (x.detach().exp() * 3.0).cos() * x.detach().exp() * 3.0)


def test_trace_scopes_nest_what_ran_inside_them_in_entries_and_format():
    x = torch.rand(8, requires_grad=True)
    layer = remat.trace_scope(two_region_block, "layer", metadata="hidden=8")

    def decoder(t):
        return layer("layers.0", t) + remat.trace_scope(two_region_block, "last")("layers.1", t)

    with remat.collect_trace() as trace:
        first = two_region_block("embed", x)
        loss = remat.trace_scope(decoder, "decoder")(x) + first
    assert trace.entries == [
        OpTrace("attention", recompute=False), OpTrace("mlp", recompute=True),
        ScopeTrace("decoder", None, [
            ScopeTrace("layer", "hidden=8", [OpTrace("attention", recompute=False), OpTrace("mlp", recompute=True)]),
            ScopeTrace("last", None, [OpTrace("attention", recompute=False), OpTrace("mlp", recompute=True)]),
        ]),
    ]
    assert trace.format() == ("remat trace: 3 checkpoint(s), 6 region(s)\n"
                              "scope [embed]\n"
                              "  attention: save\n"
                              "  mlp: recompute\n"
                              "decoder\n"
                              "  layer [hidden=8]\n"
                              "    scope [layers.0]\n"
                              "      attention: save\n"
                              "      mlp: recompute\n"
                              "  last\n"
                              "    scope [layers.1]\n"
                              "      attention: save\n"
                              "      mlp: recompute\n")
    assert [s.name for s in trace.scopes] == ["embed", "layers.0", "layers.1"]  # the dump's data is unchanged
    assert [s["name"] for s in json.loads(trace.to_json())["scopes"]] == ["embed", "layers.0", "layers.1"]
    loss.backward()


def test_trace_scope_records_nothing_in_recompute_or_outside_a_collect_trace_block():
    x = torch.rand(8, requires_grad=True)
    calls = []

    def body(t):
        calls.append(remat.is_recomputing())
        y = remat.region(lambda u: u.exp(), "attention", recompute=True)(t)
        return remat.region(lambda u: u.sin().sum(), "mlp")(y)

    scoped = remat.trace_scope(body, "block")
    loss = remat.checkpoint(region_name="layers.0")(scoped)(x)  # outside any block
    with remat.collect_trace() as during_backward:
        loss.backward()
    assert calls == [False, True]  # the wrapper ran in recompute too
    assert during_backward.entries == []
    assert during_backward.format() == "remat trace: 0 checkpoint(s), 0 region(s)\n"


def test_a_collect_trace_block_inside_a_trace_scope_hands_its_entries_to_that_scope():
    x = torch.rand(8, requires_grad=True)
    seen = {}

    def inspected(t):
        with remat.collect_trace() as inner:
            out = two_region_block("layers.0", t)
        seen["inner"] = inner.entries
        return out

    with remat.collect_trace() as outer:
        remat.trace_scope(inspected, "inspected")(x)
    assert seen["inner"] == [OpTrace("attention", recompute=False), OpTrace("mlp", recompute=True)]
    assert outer.entries == [ScopeTrace("inspected", None, seen["inner"])]


def test_trace_scopes_inside_a_checkpoint_body_hold_the_regions_that_ran_inside_them():
    x = torch.rand(8, requires_grad=True)

    def attention(u):
        q = remat.region(torch.exp, "q", recompute=False)(u)
        return remat.trace_scope(lambda v: remat.region(torch.cos, "softmax")(v), "inner", metadata="heads=2")(q)

    def body(t):
        y = remat.trace_scope(attention, "attn")(t)
        remat.trace_scope(lambda v: v * 1.0, "no regions")(y)
        return remat.region(lambda u: u.sin().sum(), "mlp")(y)

    with remat.collect_trace() as trace:
        embed = two_region_block("embed", x)
        loss = remat.checkpoint(region_name="layers.0")(body)(x) + embed
    assert trace.entries == [
        OpTrace("attention", recompute=False), OpTrace("mlp", recompute=True),
        ScopeTrace("attn", None, [OpTrace("q", recompute=False),
                                  ScopeTrace("inner", "heads=2", [OpTrace("softmax", recompute=True)])]),
        ScopeTrace("no regions", None, []),
        OpTrace("mlp", recompute=True),
    ]
    assert trace.format() == ("remat trace: 2 checkpoint(s), 5 region(s)\n"
                              "scope [embed]\n"
                              "  attention: save\n"
                              "  mlp: recompute\n"
                              "scope [layers.0]\n"
                              "  attn\n"
                              "    q: save\n"
                              "    inner [heads=2]\n"
                              "      softmax: recompute\n"
                              "  no regions\n"
                              "  mlp: recompute\n")
    assert [s.name for s in trace.scopes] == ["embed", "layers.0"]  # the dump's data is unchanged
    loss.backward()
    expected = x.detach().exp().cos().cos() * -x.detach().exp().sin() * x.detach().exp()
    embed_grad = 3.0 * x.detach().exp() * (x.detach().exp() * 3.0).cos()
    assert torch.allclose(x.grad, expected + embed_grad)


def test_a_trace_scope_in_a_checkpoint_whose_forward_raised_is_left_empty_not_given_to_the_next():
    x = torch.rand(8, requires_grad=True)

    def failing(t):
        remat.trace_scope(lambda u: remat.region(torch.exp, "attention")(u), "attn")(t)
        raise ValueError("body failed")

    with remat.collect_trace() as trace:
        with pytest.raises(ValueError, match="body failed"):
            remat.checkpoint(region_name="layers.0")(failing)(x)
        two_region_block("layers.1", x)
    assert trace.entries == [ScopeTrace("attn", None, []), OpTrace("attention", recompute=False),
                             OpTrace("mlp", recompute=True)]


def test_trace_scope_wrapper_keeps_the_functions_name_doc_and_method_binding():
    class Block:
        def __init__(self, scale):
            self.scale = scale

        def forward(self, t):
            """Scales t."""
            return t * self.scale

        forward = remat.trace_scope(forward, "block.forward")

    assert Block.forward.__name__ == "forward"
    assert Block.forward.__doc__ == "Scales t."
    assert Block.forward.__qualname__.endswith("Block.forward")
    with remat.collect_trace() as trace:
        out = Block(3.0).forward(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 3.0))
    assert trace.entries == [ScopeTrace("block.forward", None, [])]


def test_a_region_group_of_one_storage_says_storage():
    x = torch.rand(3, requires_grad=True)
    loss = remat.checkpoint(region_name="one")(
        lambda t: remat.region(lambda u: u.exp(), "keep", recompute=False)(t).sum())(x)
    assert "  12 B  x1  one  (1 storage)\n" in remat.saved_tensors_report(loss).format()
