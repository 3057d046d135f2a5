"""Region rules torch_remat defines and remat follows: nesting, structured outputs, several tensors
marked at once, settings that must not change between forward and recompute, name scopes,
placeholders, and a checkpoint decorating a method."""

import collections
import dataclasses
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch

import remat
from remat._plans import live_checkpoint_bytes


def grad_of(body, x):
    leaf = x.detach().clone().requires_grad_(True)
    body(leaf * 1.0).sum().backward()
    return leaf.grad


def checkpointed(name, body):
    return lambda t: remat.checkpoint(region_name=name)(body)(t)


def test_a_save_region_inside_a_save_region_runs_inert_and_claims_no_name():
    def body(t):
        def outer(u):
            inner = remat.region(lambda v: v.sin(), "inner", recompute=False)(u)
            return inner.cos()

        h = remat.region(outer, "outer", recompute=False)(t)
        return remat.region(lambda v: v.exp(), "tail")(h)

    x = torch.rand(4)
    with remat.collect_trace() as trace:
        got = grad_of(checkpointed("nest", body), x)
    assert [r.name for r in trace.scopes[0].regions] == ["outer", "tail"]
    assert torch.allclose(got, grad_of(lambda t: t.sin().cos().exp(), x))


def test_a_save_region_inside_a_recompute_region_keeps_its_own_policy():
    def body(t):
        def outer(u):
            kept = remat.region(lambda v: (v * 2.0).sin(), "kept", recompute=False)(u)
            return kept.cos()

        return remat.region(outer, "outer")(t)

    x = torch.rand(4)
    with remat.collect_trace() as trace:
        got = grad_of(checkpointed("policy", body), x)
    assert [(r.name, r.saved) for r in trace.scopes[0].regions] == [("outer", False), ("kept", True)]
    assert torch.allclose(got, grad_of(lambda t: (t * 2.0).sin().cos(), x))


def test_a_region_may_return_a_torch_return_types_structseq():
    def body(t):
        values, indices = remat.region(lambda u: torch.max(u * 2.0, dim=1), "max", recompute=False)(t)
        return values.sin() + indices.to(values.dtype)

    seen = []

    def body_checking_type(t):
        result = remat.region(lambda u: torch.max(u * 2.0, dim=1), "max", recompute=False)(t)
        seen.append(type(result))
        return result.values.sin() + result.indices.to(result.values.dtype)

    x = torch.rand(3, 4)
    assert torch.allclose(grad_of(checkpointed("structseq", body), x),
                          grad_of(lambda t: torch.max(t * 2.0, dim=1).values.sin(), x))
    grad_of(checkpointed("structseq.type", body_checking_type), x)
    assert seen and all(kind is torch.return_types.max for kind in seen)


@dataclasses.dataclass(frozen=True)
class Routed:
    hidden: torch.Tensor
    experts: int = 4


def test_checkpoints_and_regions_take_and_return_mappings_and_dataclasses_of_tensors():
    """A Hugging Face submodule returns a ModelOutput (an OrderedDict subclass and a dataclass):
    checkpointing one was refused ("must return at least one tensor"); a dataclass argument's
    tensors were not inputs of the checkpoint. Each comes back of its own type, its other fields
    as they were, its tensors those of the checkpoint, gradients as without checkpointing."""
    model_output = pytest.importorskip("transformers.modeling_outputs").BaseModelOutput
    weight = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)

    def body(routed, extra):
        h = remat.region(lambda t: Routed((t @ weight).tanh(), routed.experts + 1), "route")(routed.hidden)
        out = collections.OrderedDict(main=h.hidden * extra["scale"], count=h.experts)
        return model_output(last_hidden_state=out["main"], hidden_states=(h.hidden,)), out

    def loss(result):
        output, mapping = result
        return output.last_hidden_state.sum() + output.hidden_states[0].square().sum() + mapping["main"].sum()

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    extra = {"scale": torch.tensor(2.0)}
    for run in (body, remat.checkpoint(region_name="structured")(body)):
        leaf = x.clone().requires_grad_()
        weight.grad = None
        result = run(Routed(leaf * 1.0), extra)
        assert type(result[0]) is model_output and type(result[1]) is collections.OrderedDict
        assert result[1]["count"] == 5 and result[0].last_hidden_state is result[0]["last_hidden_state"]
        loss(result).backward()
        if run is body:
            expected = (leaf.grad.clone(), weight.grad.clone())
    assert torch.equal(leaf.grad, expected[0]) and torch.equal(weight.grad, expected[1])


def test_recompute_needs_tensor_takes_several_tensors_and_refuses_non_tensors():
    def body(t):
        a = remat.region(lambda u: u.sin(), "a", recompute=False)(t)
        b = remat.region(lambda u: u.cos(), "b", recompute=False)(t)
        remat.recompute_needs_tensor(a, b)
        return remat.region(lambda u, v: u * v, "product")(a, b)

    x = torch.rand(5)
    assert torch.allclose(grad_of(checkpointed("many", body), x), grad_of(lambda t: t.sin() * t.cos(), x))
    with pytest.raises(RuntimeError, match="expects Tensor arguments, got int"):
        remat.recompute_needs_tensor(torch.rand(2), 3)


def test_a_recompute_setting_that_changes_in_recompute_is_refused():
    def body(t):
        h = remat.region(lambda u: u.sin(), "flip", recompute=remat.is_recomputing())(t)
        return (h * t).sum()

    y = remat.checkpoint(region_name="flips")(body)(torch.rand(3, requires_grad=True) * 1.0)
    with pytest.raises(remat.RematError, match="region 'flips::flip' ran with recompute=False in forward but "
                                               "recompute=True in recompute"):
        y.backward()


def test_a_region_returning_a_leaf_that_requires_grad_is_refused():
    def body(t):
        return remat.region(lambda u: torch.zeros(3, requires_grad=True), "alloc")(t) + t

    with pytest.raises(remat.RematError, match="region 'leaf::alloc' returned a leaf tensor that requires grad"):
        remat.checkpoint(region_name="leaf")(body)(torch.rand(3, requires_grad=True))


def test_name_scopes_qualify_region_names_so_one_block_can_run_twice():
    def sub_block(t):
        return remat.region(lambda u: u.sin(), "attn", recompute=False)(t)

    def body(t):
        for index in range(2):
            with remat.name_scope(f"block.{index}"):
                with remat.name_scope("inner"):
                    t = sub_block(t)
        return t

    x = torch.rand(3)
    with remat.collect_trace() as trace:
        got = grad_of(checkpointed("scoped", body), x)
    assert [r.name for r in trace.scopes[0].regions] == ["block.0/inner/attn", "block.1/inner/attn"]
    assert torch.allclose(got, grad_of(lambda t: t.sin().sin(), x))
    with pytest.raises(ValueError, match="the prefix is empty"):
        with remat.name_scope(""):
            pass


def test_a_name_scope_around_a_checkpoint_call_names_its_regions_in_forward_and_recompute():
    def block(t):
        h = remat.region(lambda u: u.sin(), "attn", recompute=False)(t)
        return remat.region(lambda u: u.cos() * 2, "mlp")(h)

    x = torch.rand(3, requires_grad=True)
    with remat.collect_trace() as trace:
        with remat.name_scope("model"):
            y = remat.checkpoint(region_name="layers.0")(block)(x)
        y.sum().backward()  # recompute runs here, outside the scope
    assert [r.name for r in trace.scopes[0].regions] == ["model/attn", "model/mlp"]
    torch.testing.assert_close(x.grad, -2 * x.detach().sin().sin() * x.detach().cos())
    assert remat._api._qualified_name("attn") == "attn"  # recompute put the caller's scopes back


def test_is_placeholder_tells_a_skipped_outputs_stand_in_from_real_tensors():
    seen = []

    def body(t):
        h = remat.region(lambda u: u * 2.0, "producer", recompute=False)(t)
        seen.append(remat.is_placeholder(h))
        seen.append(remat.is_placeholder(h[0]))  # a view of a placeholder is one too
        return remat.region(lambda u: u.sin(), "consumer", recompute=False)(h)

    remat.checkpoint(region_name="ph")(body)(torch.rand(3, requires_grad=True) * 1.0).sum().backward()
    # Forward: real. Recompute does not run (nothing was dropped), so no placeholder appears.
    assert seen == [False, False]
    assert not remat.is_placeholder(torch.rand(2))
    with pytest.raises(TypeError, match="expected a Tensor, got list"):
        remat.is_placeholder([1])


def test_a_placeholder_is_reported_as_one_in_recompute():
    seen = []

    def body(t):
        h = remat.region(lambda u: u * 2.0, "producer", recompute=False)(t)
        if remat.is_recomputing():
            seen.append(remat.is_placeholder(h))
        g = t.cos()  # dropped: backward recomputes the body, which stops once g exists
        return g + h  # h is read only after that, so forward does not keep it

    remat.checkpoint(region_name="ph2")(body)(torch.rand(3, requires_grad=True) * 1.0).sum().backward()
    assert seen == [True]


def test_a_checkpoint_decorating_a_method_binds_like_a_method():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        @remat.checkpoint(region_name="method")
        def forward(self, x):
            """Docstring kept."""
            return self.linear(x).relu()

    block = Block()
    x = torch.rand(2, 4, requires_grad=True)
    block(x).sum().backward()
    assert block.linear.weight.grad is not None and x.grad.shape == (2, 4)
    assert Block.forward.__doc__ == "Docstring kept." and Block.forward.__name__ == "forward"


def test_every_public_name_of_torch_remat_is_exported():
    names = ["annotations", "checkpoint", "clear_memory_snapshot_cache", "collect_trace", "current_saved_tensor_info",
             "discover_autograd_roots", "format_current_memory_report", "format_oom_saved_tensors_report",
             "format_saved_tensors_report", "is_placeholder", "is_recomputing", "memory_snapshot_annotate",
             "name_scope", "oom_observer", "print_current_memory_report", "print_saved_tensors_report",
             "recompute_needs_tensor", "RecomputeStateHook", "region", "save_for_backward", "saved_tensors_hooks",
             "SavedTensorInfo", "SavedTensorKind", "trace_scope"]
    assert [name for name in names if not hasattr(remat, name)] == []


def test_the_oom_report_without_a_loss_finds_live_checkpoints_and_the_tail():
    x = torch.rand(4, 3, requires_grad=True)
    y = remat.checkpoint(region_name="layers.0")(
        lambda t: remat.region(lambda u: (u * 2.0).sin(), "attention", recompute=False)(t))(x * 1.0)
    loss = y.exp().sum()  # exp saves its result outside the checkpoint
    assert any(root is loss for root in remat.discover_autograd_roots())
    text = remat.format_oom_saved_tensors_report()
    assert "layers.0" in text and "ExpBackward0" in text
    del loss, y


def test_the_oom_report_after_a_recompute_that_raised_walks_what_recompute_made_without_crashing():
    """An error in recompute (an OOM there, in production) leaves tensors recompute made held by its
    traceback; the report the OOM observer writes walks their graph, whose saved tensors recompute
    kept no data for: a segmentation fault before, now a node the walk skips. Run apart, so that a
    crash fails this test alone."""
    script = textwrap.dedent("""
        import torch, remat

        def body(t):
            h = t.sin() * t.sin()
            if remat.is_recomputing():
                h = torch.cat([h, h])  # another shape in recompute: recompute raises
            return h.exp()

        x = torch.randn(4, requires_grad=True)
        try:
            remat.checkpoint(region_name="layers.0")(body)(x).sum().backward()
        except RuntimeError as error:
            held = error  # its traceback holds what recompute made
        text = remat.format_oom_saved_tensors_report()
        assert "saved for backward" in text, text
        print("report written")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "report written" in run.stdout, run.stderr[-2000:]


def test_a_checkpoint_returning_a_tuple_subclass_gives_back_that_type():
    class Pair(tuple):
        pass

    x = torch.rand(3, requires_grad=True)
    out = remat.checkpoint(region_name="pair")(lambda t: Pair((t.sin(), t.cos())))(x * 1.0)
    assert type(out) is Pair
    (out[0] + out[1]).sum().backward()
    assert torch.allclose(x.grad, x.detach().cos() - x.detach().sin())


def test_trace_scope_wraps_without_changing_behaviour_and_checks_its_text():
    def double(t):
        return t * 2.0

    scoped = remat.trace_scope(double, "double", metadata="x2")
    assert torch.equal(scoped(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(ValueError, match="name is empty"):
        remat.trace_scope(double, "")
    with pytest.raises(RuntimeError, match="metadata must be a str, got int"):
        remat.trace_scope(double, "double", metadata=3)
    with pytest.raises(RuntimeError, match="expects a function"):
        remat.trace_scope("double", "double")


class CountingProducer(torch.autograd.Function):
    """x * 3 that counts its forward runs (recompute runs it again)."""

    runs = 0

    @staticmethod
    def forward(ctx, x):
        CountingProducer.runs += 1
        return x * 3.0

    @staticmethod
    def backward(ctx, grad):
        return grad * 3.0


def test_a_save_region_saving_a_view_of_an_input_recompute_recreates_does_not_keep_it():
    # The save region's linear-like op saves a slice of its input; the input is a recompute
    # region's output, so recompute, which runs anyway (sin's input is dropped), makes it again:
    # forward keeps nothing for it (as torch_remat), backward takes the slice from the recomputed
    # input. (Where nothing else is recomputed it is kept instead: test_budget_plans.)
    reports = []

    def consumer(y):
        head = y[:, :2]
        out = head.exp()  # exp saves its result, kept as usual
        w = head * y[:, 2:]  # mul saves both views of y: taken from y in recompute
        return out + w

    def body(t):
        y = remat.region(CountingProducer.apply, "producer")(t.sin())
        result = remat.region(consumer, "consumer", recompute=False)(y)
        if not remat.is_recomputing():
            reports.append(remat.format_current_memory_report())
        return result

    CountingProducer.runs = 0
    x = torch.rand(3, 4)
    got = grad_of(checkpointed("ferry", body), x)
    assert CountingProducer.runs == 2  # forward, and recompute recreating y
    expected = grad_of(lambda t: (lambda y: y[:, :2].exp() + y[:, :2] * y[:, 2:])(t.sin() * 3.0), x)
    assert torch.allclose(got, expected)
    # Kept by the save region: exp's result only (3x2 floats), not y or its views.
    assert "ferry::consumer: 24 B" in reports[0]


@pytest.mark.parametrize("widen, producer_runs", [(1, 1), (3, 2)])
def test_where_nothing_else_is_recomputed_a_ferried_input_is_kept_unless_that_keeps_more(widen, producer_runs):
    # Recompute would run only to make y again for the consumer (the producer saves nothing): y is
    # kept instead, as autograd keeps it without the checkpoint, where that keeps no more than
    # recompute needs to make it (the input, 3x4 floats); a y three times as wide is made again.
    runs = []

    def producer(u):
        runs.append(remat.is_recomputing())
        return u.repeat(1, widen) * 3.0  # saves nothing

    def body(t):
        y = remat.region(producer, "producer")(t)
        return remat.region(lambda v: v * v, "consumer", recompute=False)(y)  # mul saves y

    leaf = torch.rand(3, 4, requires_grad=True)
    out = remat.checkpoint(region_name="ferry")(body)(leaf * 1.0)
    kept = live_checkpoint_bytes()
    out.sum().backward()
    assert len(runs) == producer_runs
    assert kept == 3 * 4 * 4 * (widen if producer_runs == 1 else 1)  # y, or the input
    plain = leaf.detach().clone().requires_grad_(True)
    body(plain * 1.0).sum().backward()  # outside a checkpoint regions are their bodies
    assert torch.equal(leaf.grad, plain.grad)


def test_an_input_recompute_recreates_with_another_layout_is_a_clear_error():
    class Drifting(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if remat.is_recomputing():
                return torch.repeat_interleave(x * 3.0, 2)[::2]  # same values, other strides
            return x * 3.0

        @staticmethod
        def backward(ctx, grad):
            return grad * 3.0

    def body(t):
        y = remat.region(Drifting.apply, "producer")(t.sin())  # sin's input dropped: recompute runs
        return remat.region(lambda u: u[:1] * u[1:], "consumer", recompute=False)(y)  # mul saves both views

    y = remat.checkpoint(region_name="drift")(body)(torch.rand(2, requires_grad=True) * 1.0)
    with pytest.raises(remat.RematError, match="gave input 0 of save region 'drift::consumer' a different layout"):
        y.sum().backward()


def test_wrappers_made_per_call_keep_their_functions_name_doc_module_and_attributes():
    def attention(t):
        """Attention's doc."""
        return t.sin()

    attention.layer_index = 3
    for wrapper in (remat.region(attention, "attn", recompute=False), remat.checkpoint(region_name="c")(attention)):
        assert wrapper.__wrapped__ is attention
        assert (wrapper.__name__, wrapper.__qualname__) == ("attention", attention.__qualname__)
        assert (wrapper.__doc__, wrapper.__module__, wrapper.layer_index) == ("Attention's doc.", __name__, 3)
        assert str(inspect.signature(wrapper)) == "(t)"
        with pytest.raises(AttributeError, match="no attribute 'missing'"):
            wrapper.missing
    assert type(remat.region(attention, "attn")).__doc__.startswith("fn as a region")


def test_forward_runs_on_the_callers_own_arguments_and_recompute_on_a_copy():
    """Layers appending an auxiliary loss to a list they are given (a mixture of experts' load
    balancing): forward ran on a copy of the list once it held a tensor, so the caller saw the
    first layer's loss alone (loss and gradients wrong without a word). Recompute appends to a copy."""
    weights = [torch.randn(4, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def layer(h, aux, weight):
        out = (h @ weight).tanh()
        aux.append(out.square().mean())
        return out

    def step(checkpointed):
        leaves = [w.clone().requires_grad_() for w in weights]
        h, aux = torch.ones(2, 4), []
        for index, weight in enumerate(leaves):
            run = remat.checkpoint(region_name=f"layers.{index}")(layer) if checkpointed else layer
            h = run(h, aux, weight)
        (h.sum() + sum(aux)).backward()
        return len(aux), [w.grad for w in leaves]

    plain_count, plain_grads = step(False)
    count, grads = step(True)
    assert count == plain_count == 3
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))


@pytest.mark.parametrize("start", [[], ["tag"], {}])
def test_recompute_changes_a_copy_of_a_container_that_holds_no_tensor(start):
    """A list (or dict) given with no tensor in it was handed to recompute itself: the layer's
    recompute, which reaches the append, appended to the caller's list again (3 layers, 4 losses
    after backward, 5 for a list holding a string), as under torch.utils.checkpoint."""
    weight = torch.randn(8, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)

    def layer(x, aux):
        loss = (x @ weight).square().mean()  # before the output: recompute runs it again
        aux.append(loss) if isinstance(aux, list) else aux.setdefault(f"loss{len(aux)}", loss)
        return (x @ weight).sin()

    aux = type(start)(start)
    h = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    for index in range(3):
        h = remat.checkpoint(region_name=f"layers.{index}")(layer)(h, aux)
    losses = [v for v in (aux if isinstance(aux, list) else aux.values()) if isinstance(v, torch.Tensor)]
    assert len(losses) == 3
    (h.sum() + sum(losses)).backward()
    assert len(aux) == len(start) + 3
    assert weight.grad is not None


def test_a_dict_subclass_that_refuses_changes_and_holds_no_tensor_is_handed_to_recompute_as_it_is():
    """A frozen config (a dict subclass whose __setitem__ raises): copied for recompute, its copy
    refused the items set back, and backward failed ("FrozenDict is immutable")."""

    class FrozenDict(dict):
        def __setitem__(self, key, value):
            raise TypeError("FrozenDict is immutable")

    weight = torch.randn(8, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    config = FrozenDict(scale=0.5)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    remat.checkpoint(region_name="layers.0")(lambda t, c: (t @ weight * c["scale"]).sin())(x, config).sum().backward()
    expected = torch.autograd.grad((x @ weight * 0.5).sin().sum(), weight)[0]
    assert torch.equal(weight.grad, expected)
