"""Regions inside a checkpoint: placeholders for what a skipped save region did not keep, early
stop of recompute, no-grad, retain_graph, and how arguments and results cross a checkpoint or
a region (tuples, lists, constants, keyword arguments)."""

import pytest
import torch

import remat


class PlaceholderProbe:
    """y = a save region's output that forward's code never reads; recompute reads it on a path
    forward did not take (remat.is_recomputing()), so it is a placeholder unless marked."""

    def __init__(self, name, mark=False, mark_view=False):
        self.name = name
        self.mark = mark
        self.mark_view = mark_view
        self.seen = None
        self.read = None

    def body(self, x):
        y = remat.region(lambda t: (t * 2.0).t(), "producer", recompute=False)(x)
        if self.mark:
            remat.recompute_needs_tensor(y)
        if self.mark_view:
            remat.recompute_needs_tensor(y.select(0, 1))
        if remat.is_recomputing():
            self.seen = (tuple(y.shape), y.stride(), y.dtype, tuple(y.transpose(0, 1).shape))
            self.read = (y * 5.0).detach()  # reads y's data
        return x.exp().sum()  # exp's saved result makes recompute run the body

    def run(self, x):
        return remat.checkpoint(region_name=self.name)(self.body)(x)


def test_placeholder_has_shape_strides_and_dtype_and_its_views_work():
    probe = PlaceholderProbe("placeholder.meta")
    loss = probe.run(torch.rand(3, 4, requires_grad=True))
    with pytest.raises(RuntimeError, match="^remat placeholder: "):
        loss.backward()
    assert probe.seen == ((4, 3), (1, 4), torch.float32, (3, 4))


def test_reading_a_placeholders_data_names_the_save_region_and_the_fix():
    probe = PlaceholderProbe("probe")
    loss = probe.run(torch.rand(3, 4, requires_grad=True))
    with pytest.raises(remat.RematError) as raised:
        loss.backward()
    assert str(raised.value) == (
        "remat placeholder: recompute read the data of output 0 of save region 'probe::producer', which forward did "
        "not keep; call remat.recompute_needs_tensor(t) on that tensor in forward so its value is persisted")


def test_marking_the_output_persists_its_value_for_recompute():
    x = torch.rand(3, 4, requires_grad=True)
    probe = PlaceholderProbe("placeholder.marked", mark=True)
    probe.run(x).backward()
    assert probe.seen == ((4, 3), (1, 4), torch.float32, (3, 4))  # the persisted value, with its layout
    assert torch.equal(probe.read, (x.detach() * 2.0).t() * 5.0)
    assert torch.equal(x.grad, x.detach().exp())


def test_marking_a_view_persists_its_base():
    x = torch.rand(3, 4, requires_grad=True)
    probe = PlaceholderProbe("placeholder.view", mark_view=True)
    probe.run(x).backward()
    assert torch.equal(probe.read, (x.detach() * 2.0).t() * 5.0)


@pytest.mark.parametrize("shape", ["residual-add", "pointwise", "tuple-output", "inside-a-recompute-region"])
def test_a_save_regions_output_read_by_code_that_recompute_runs_again_is_persisted_by_itself(shape):
    """Code outside save regions runs again in recompute, so what it reads of a save region's
    output in forward is kept: the runtime sees the read, no recompute_needs_tensor needed."""
    def attention(t):
        return (t * 2.0).exp(), t.sin()

    def body(t):
        h, g = remat.region(attention, "attention", recompute=False)(t)
        if shape == "residual-add":
            return remat.region(lambda u: u.tanh(), "mlp")(h + t) + h
        if shape == "pointwise":
            return (h * 3.0).tanh()
        if shape == "tuple-output":
            return remat.region(lambda u: u.tanh(), "mlp")(t) * g
        return remat.region(lambda u: (u * h).tanh(), "mlp")(t)  # h reaches the region through a closure

    def plain(t):
        h, g = (t * 2.0).exp(), t.sin()
        return {"residual-add": lambda: (h + t).tanh() + h, "pointwise": lambda: (h * 3.0).tanh(),
                "tuple-output": lambda: t.tanh() * g, "inside-a-recompute-region": lambda: (t * h).tanh()}[shape]()

    x = torch.rand(3, 4, requires_grad=True)
    remat.checkpoint(region_name=f"persisted.{shape}")(body)(x).pow(2).sum().backward()
    reference = x.detach().clone().requires_grad_()
    plain(reference).pow(2).sum().backward()
    assert torch.equal(x.grad, reference.grad)


def test_reads_between_save_regions_are_seen_though_their_bodies_run_unobserved():
    """Save regions' bodies run without the read observer; code between and after them is
    observed again: an input read only there is kept, and so is a save region's output read
    only after the next save region, so recompute gives the gradients of no checkpointing."""
    def body(t, w):
        h = remat.region(lambda u: (u * 2.0).exp(), "first", recompute=False)(t)
        g = remat.region(lambda u: u.sin() * 3.0, "second", recompute=False)(h)
        return ((g * w).tanh() + (h * t).cos()).pow(2).sum()

    def plain(t, w):
        h = (t * 2.0).exp()
        g = h.sin() * 3.0
        return ((g * w).tanh() + (h * t).cos()).pow(2).sum()

    x, w = torch.rand(3, 4, requires_grad=True), torch.rand(4, requires_grad=True)
    remat.checkpoint(region_name="observed.between")(body)(x, w).backward()
    rx, rw = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    plain(rx, rw).backward()
    assert torch.equal(x.grad, rx.grad) and torch.equal(w.grad, rw.grad)


def test_marking_outside_a_checkpoint_or_a_recompute_regions_output_is_a_no_op():
    remat.recompute_needs_tensor(torch.rand(2))  # outside any checkpoint
    x = torch.rand(4, requires_grad=True)

    def body(t):
        h = remat.region(lambda v: v.exp(), "r")(t)
        remat.recompute_needs_tensor(h)  # a recompute region's output: nothing to persist
        return h.sum()

    with remat.tag_cpu_tensors():
        loss = remat.checkpoint(region_name="placeholder.noop")(body)(x)
        assert remat.live_bytes("placeholder.noop::r") == 0
        loss.backward()
    assert torch.equal(x.grad, x.detach().exp())


def test_recompute_runs_no_further_than_the_last_tensor_backward_needs():
    runs = {"a": 0, "b": 0, "c": 0}
    x = torch.rand(8, requires_grad=True)

    def counted(key, fn):
        def run(t):
            runs[key] += 1
            return fn(t)

        return run

    def body(t):
        a = remat.region(counted("a", torch.sin), "a")(t)
        b = remat.region(counted("b", lambda u: u * 2.0), "b")(a)
        c = remat.region(counted("c", lambda u: u + 1.0), "c")(b)
        return c.sum()

    remat.checkpoint(region_name="early-stop")(body)(x).backward()
    # Only sin saves a tensor through the hooks (its input); b and c save none, so recompute stops after a.
    assert runs == {"a": 2, "b": 1, "c": 1}
    assert torch.equal(x.grad, x.detach().cos() * 2.0)


def test_work_after_the_last_needed_tensor_that_builds_no_graph_may_read_a_placeholder():
    tail_runs = []
    x = torch.rand(8, requires_grad=True)

    def body(t):
        # Scaling saves nothing through the hooks, so this save region's output is not persisted.
        scaled = remat.region(lambda u: u * 3.0, "scale", recompute=False)(t)
        out = t.sin()  # the last tensor backward needs
        with torch.no_grad():
            tail_runs.append(remat.is_recomputing())
            assert scaled.sum().item() > 0  # no graph node: recompute runs it and reads a placeholder
        return out

    remat.checkpoint(region_name="early-stop.tail")(body)(x).sum().backward()
    assert tail_runs == [False, True]
    assert torch.equal(x.grad, x.detach().cos())


def test_under_no_grad_a_checkpoint_runs_the_body_once_and_registers_nothing():
    runs = []
    x = torch.rand(4)

    def body(t):
        return remat.region(lambda u: runs.append(1) or u.exp(), "r", recompute=False)(t)

    with torch.no_grad():
        y = remat.checkpoint(region_name="nograd")(body)(x)
    assert runs == [1]
    assert not y.requires_grad
    assert torch.equal(y, x.exp())
    assert remat._C.collect_trace().scopes == []


def test_retain_graph_second_backward_recomputes_again_and_accumulates():
    runs = []
    x = torch.rand(5, requires_grad=True)
    loss = remat.checkpoint(region_name="retain-graph")(lambda t: remat.region(lambda u: runs.append(1) or u.exp().sum(), "r")(t))(x)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    loss.backward()
    assert len(runs) == 3  # forward, then one recompute per backward
    assert torch.equal(first, x.detach().exp())
    assert torch.equal(x.grad, 2.0 * x.detach().exp())


def test_tuple_and_list_outputs_come_back_as_the_same_type_with_gradients():
    x = torch.rand(3, requires_grad=True)

    def pair(t):
        return remat.region(lambda u: (u.exp(), u.sin()), "pair")(t)

    def as_list(parts):
        assert isinstance(parts, list)
        return [parts[0].cos(), parts[1].exp()]

    a_b = remat.checkpoint(region_name="io.tuple")(pair)(x)
    parts = remat.checkpoint(region_name="io.list")(as_list)([x, x])
    assert isinstance(a_b, tuple) and len(a_b) == 2
    assert isinstance(parts, list) and len(parts) == 2
    (a_b[0].sum() + a_b[1].sum() + parts[0].sum() + parts[1].sum()).backward()
    got = x.grad

    x_ref = x.detach().clone().requires_grad_(True)
    (x_ref.exp().sum() + x_ref.sin().sum() + x_ref.cos().sum() + x_ref.exp().sum()).backward()
    assert torch.equal(got, x_ref.grad)


def test_tuple_inputs_arrive_as_a_tuple_in_forward_and_in_recompute():
    seen = []
    a = torch.rand(3, requires_grad=True)
    b = torch.rand(3, requires_grad=True)

    def body(pair):
        seen.append(type(pair))
        return (pair[0] * pair[1]).sum()

    remat.checkpoint(region_name="io.tuple-input")(body)((a, b)).backward()
    assert seen == [tuple, tuple]
    assert torch.equal(a.grad, b.detach()) and torch.equal(b.grad, a.detach())


def test_constants_and_keyword_arguments_reach_the_body_in_forward_and_in_recompute():
    seen = []
    x = torch.rand(4, requires_grad=True)

    def body(t, scale, label, nothing, power=1):
        seen.append((scale, label, nothing, power))
        return remat.region(lambda u, k: (u * k).pow(power).sum(), "scaled")(t, scale)

    loss = remat.checkpoint(region_name="io.constants")(body)(x, 2.5, "mode", None, power=3)
    loss.backward()
    assert seen == [(2.5, "mode", None, 3), (2.5, "mode", None, 3)]
    x_ref = x.detach().clone().requires_grad_(True)
    (x_ref * 2.5).pow(3).sum().backward()
    assert torch.equal(x.grad, x_ref.grad)


def test_region_as_a_decorator_by_name_and_with_keywords():
    @remat.region(name="attention", recompute=False)
    def attention(t):
        return t.exp()

    @remat.region("mlp")
    def mlp(t):
        return t.sin().sum()

    x = torch.rand(4, requires_grad=True)
    with remat.collect_trace() as trace:
        loss = remat.checkpoint(region_name="decorated")(lambda t: mlp(attention(t)))(x)
    assert [(s.name, [(r.name, r.saved) for r in s.regions]) for s in trace.scopes] == [
        ("decorated", [("attention", True), ("mlp", False)])]
    assert attention.__name__ == "attention"  # functools.wraps keeps the body's name
    loss.backward()
    assert torch.equal(x.grad, x.detach().exp().cos() * x.detach().exp())


def test_outside_a_checkpoint_a_region_just_runs_its_body():
    x = torch.rand(4, requires_grad=True)
    with remat.collect_trace() as trace:
        y = remat.region(lambda t: t * 2.0, "alone", recompute=False)(x)
    assert torch.equal(y, x.detach() * 2.0)
    assert trace.scopes == []


def test_a_checkpointed_method_binds_to_its_instance_and_keeps_its_name():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        @remat.checkpoint(region_name="layer")
        def block(self, x):
            """The layer's body."""
            return torch.tanh(remat.region(self.linear, "linear", recompute=False)(x)).sin()

    layer = Layer()
    x = torch.randn(4, 8, requires_grad=True)
    layer.block(x * 1.0).sum().backward()
    checkpointed = (layer.linear.weight.grad.clone(), x.grad.clone())
    layer.zero_grad()
    x.grad = None
    Layer.block.__wrapped__(layer, x * 1.0).sum().backward()  # the plain method
    assert torch.equal(checkpointed[0], layer.linear.weight.grad) and torch.equal(checkpointed[1], x.grad)
    assert Layer.block.__name__ == "block" and Layer.block.__doc__ == "The layer's body."
    assert layer.block.__self__ is layer
