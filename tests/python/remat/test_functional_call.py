"""torch.func.functional_call around checkpoints (MAML's outer step: the model run on weights made
from its parameters and their gradients). A swap for forward alone made recompute in backward read
the module's own parameters again; a swap for backward too made the inner step's recompute, which
the outer backward runs, read the swapped weights: gradients wrong by up to 2.3% of their size,
silently (torch.utils.checkpoint does the same). Recompute now refuses a tensor of another kind
or another parameter where forward read a parameter or a tensor computed before the checkpoint;
the checkpoint's inputs, and the inner step checkpointed with a plain outer step, are as before.
Weights no op saves (a bias; a weight whose input takes no gradient) are seen by the graph edges
recompute's nodes take out of its span against forward's, on any thread. A parameter the body's
function held as recompute began (its modules') is the caller's, with or without the allocator's
tags; a frozen weight or buffer saved in place of forward's is compared by value."""

import contextlib
import functools
import gc
import threading

import pytest
import torch

import remat
from remat._plans import live_checkpoint_bytes


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 32)

    def forward(self, x):
        h = remat.region(lambda t: torch.tanh(self.a(t)), "a")(x)
        return remat.region(lambda t: self.b(t), "b")(h) + x


class Net(torch.nn.Module):
    def __init__(self, checkpointed=True):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.checkpointed = checkpointed

    def forward(self, x):
        for index, block in enumerate(self.blocks):
            x = remat.checkpoint(region_name=f"blocks.{index}")(block)(x) if self.checkpointed else block(x)
        return x.square().mean()


def maml_step(model, x, outer_checkpointed=True, backward_inside=False):
    """An inner step on the first half of x with create_graph=True, the outer loss on the second half
    with the stepped weights: the model's parameters' gradients."""
    model.zero_grad(set_to_none=True)
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(model(x[:16]), list(params.values()), create_graph=True)
    fast = {name: p - 0.5 * g for (name, p), g in zip(params.items(), grads)}
    checkpointed, model.checkpointed = model.checkpointed, outer_checkpointed and model.checkpointed
    try:
        if backward_inside:  # the swap holds through backward too
            with torch.nn.utils.stateless._reparametrize_module(model, fast):
                model(x[16:]).backward()
        else:
            torch.func.functional_call(model, fast, (x[16:],)).backward()
    finally:
        model.checkpointed = checkpointed
    return [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def models():
    torch.manual_seed(0)
    model, plain = Net(), Net(checkpointed=False)
    plain.load_state_dict(model.state_dict())
    return model, plain, torch.randn(32, 32)


@pytest.mark.parametrize("plan", [None, "recompute"], ids=["remat's default", "every region recomputed"])
def test_an_outer_step_through_functional_call_is_refused_rather_than_given_wrong_gradients(models, plan):
    model, _, x = models
    decisions = {f"blocks.{i}::{r}": "recompute" for i in range(2) for r in "ab"}
    with remat.use_plan(remat.load_plan(_plan_text(decisions))) if plan else contextlib.nullcontext():
        with pytest.raises(RuntimeError, match="read a parameter as saved tensor .* where forward read a tensor "
                                               "computed before the checkpoint.*functional_call"):
            maml_step(model, x)


def test_a_swap_in_force_through_the_outer_backward_is_refused_too(models):
    """The outer backward runs the inner step's recompute too, which read the swapped weights (5.9e-4
    off, silently)."""
    model, _, x = models
    with pytest.raises(RuntimeError, match="read a tensor computed before recompute began .* where forward read a "
                                           "parameter"):
        maml_step(model, x, backward_inside=True)


def test_the_inner_step_checkpointed_with_a_plain_outer_step_gives_the_plain_gradients(models):
    model, plain, x = models
    reference = maml_step(plain, x)
    assert all(torch.equal(a, b) for a, b in zip(maml_step(model, x, outer_checkpointed=False), reference))


def test_leaves_swapped_in_for_forward_alone_are_refused_where_the_allocator_tags_them():
    """Weights given as leaves of their own (copies that take a gradient) where recompute reads the
    module's parameters: another parameter. Told from a leaf the body makes (torch.utils.checkpoint's
    placeholder inside a checkpoint: refused while untold) by the phase the allocator tagged each in."""
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        model = Net()
        x = torch.randn(32, 32)
        copies = {name: p.detach().clone().requires_grad_() for name, p in model.named_parameters()}
        with pytest.raises(RuntimeError, match="read another parameter .* where forward read a parameter"):
            torch.func.functional_call(model, copies, (x,)).backward()
        inner = torch.nn.Linear(32, 32)
        body = remat.checkpoint(region_name="outer")(
            lambda t: torch.utils.checkpoint.checkpoint(inner, t, use_reentrant=False).sin())
        x.requires_grad_()
        body(x).sum().backward()
        expected = torch.autograd.grad(inner(x).sin().sum(), x)[0]
        assert torch.equal(x.grad, expected)


def test_ensemble_members_swapped_in_as_views_are_refused_without_tags():
    """Each member's weights views of torch.func.stack_module_state's stacked leaves, swapped in for
    forward alone: recompute read the first model's own (48% off before)."""
    torch.manual_seed(0)
    members = [Net() for _ in range(2)]
    stacked, _ = torch.func.stack_module_state(members)
    x = torch.randn(4, 32)
    loss = sum(torch.func.functional_call(members[0], {k: v[i] for k, v in stacked.items()}, (x,)) for i in range(2))
    with pytest.raises(RuntimeError,
                       match=r"checkpoint 'blocks.1' read (a|another) parameter .*where forward read (another|a) "
                             r"parameter"):
        loss.backward()


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
def test_a_late_binding_closure_over_layers_is_refused_without_tags(bias):
    """`lambda u: layer(u)` in a loop: forward runs each layer, recompute (later) the last one, whose
    weights its own checkpoint's forward read (157-182% off before). A leaf some forward read was
    made before the recompute, unlike one the body makes."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(8, 8, bias=bias) for _ in range(3))
    h = torch.randn(4, 8, requires_grad=True)
    for i, layer in enumerate(layers):
        h = remat.checkpoint(region_name=f"l{i}")(lambda u: torch.tanh(layer(u)))(h)  # noqa: B023
    with pytest.raises(RuntimeError, match=r"recompute of checkpoint 'l1' read (a|another) parameter .*"
                                           r"where forward read (another|a) parameter"):
        h.square().sum().backward()


class Decorated(torch.nn.Module):
    """A layer whose forward is a checkpointed method."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 32)

    @remat.checkpoint(region_name="decorated")
    def forward(self, x):
        return torch.tanh(self.a(x)) + x


_global_layer = None


def _run_the_global_layer(t):
    return _global_layer(t)


def _run_layer(t, layer):
    return layer(t)


class _Trainer:
    """Not a module: holds one, and its method is what the checkpoint runs."""

    def __init__(self, layer):
        self.layer = layer

    def step(self, t):
        return self.layer(t)

    __call__ = step


def _checkpointed_as(form):
    """A layer of two linears and a function running it checkpointed, the checkpoint given the layer
    in `form`."""
    global _global_layer
    if form == "decorated method":
        layer = Decorated()
        return layer, layer
    layer = Block()
    if form == ".call":  # as transformers' gradient checkpointing calls it
        return layer, lambda t: remat.checkpoint(region_name="c").call(layer.__call__, t)
    if form == "keyword argument":
        return layer, lambda t: remat.checkpoint(region_name="c")(_run_layer)(t, layer=layer)
    layers = [torch.nn.Identity(), layer]
    _global_layer = layer
    body = {"module": layer, "bound method": layer.forward, "closure": lambda t: layer(t),
            "partial": functools.partial(Block.forward, layer), "closure over a list": lambda t: layers[1](t),
            "global": _run_the_global_layer, "another object's method": _Trainer(layer).step,
            "another callable object": _Trainer(layer)}[form]
    return layer, remat.checkpoint(region_name="c")(body)


@pytest.mark.parametrize("form", ["module", "bound method", "decorated method", "closure", "partial", ".call",
                                  "closure over a list", "global", "keyword argument", "another object's method",
                                  "another callable object"])
def test_leaf_copies_swapped_in_for_forward_alone_are_refused_without_tags(form):
    """First-order MAML's outer step on detached copies through functional_call, where no allocator
    tags memory and no other forward read the module's parameters: recompute read them (22-32% off
    before). They were the body's module's as recompute began, which a leaf the body makes is not."""
    torch.manual_seed(0)
    layer, run = _checkpointed_as(form)
    copies = {name: (p.detach() * 1.5).requires_grad_() for name, p in layer.named_parameters()}
    with torch.nn.utils.stateless._reparametrize_module(layer, copies):
        loss = run(torch.randn(4, 32)).square().sum()
    with pytest.raises(RuntimeError,
                       match=r"read (a|another) parameter .*\[32.*where forward read (another|a) parameter"):
        loss.backward()


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_a_parameter_assigned_between_forward_and_backward_is_refused(tagged):
    """layer.weight = nn.Parameter(...) after forward: recompute read the new weight where forward read
    the old one, which the plain graph differentiates (wrong gradients, silently, before untagged)."""
    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        torch.manual_seed(0)
        layer = Block()
        loss = remat.checkpoint(region_name="c")(layer)(torch.randn(4, 32)).square().sum()
        layer.b.weight = torch.nn.Parameter(layer.b.weight.detach() * 2)
        with pytest.raises(RuntimeError, match=r"checkpoint 'c' read (a|another) parameter .*where forward read "
                                               r"(another|a) parameter.*a parameter assigned between forward"):
            loss.backward()


class FrozenBetween(torch.nn.Module):
    """A frozen linear between trainable ones: its weight takes no gradient (a frozen backbone's
    under adapter or prompt tuning), its input does, so the matmul saves the weight."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.frozen = torch.nn.Linear(8, 8).requires_grad_(False)

    def forward(self, x):
        return self.frozen(torch.tanh(self.a(x))).tanh()


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_a_frozen_weight_swapped_in_for_forward_alone_is_refused(tagged):
    """Recompute read the module's own frozen weight where forward read the swapped one: no graph
    edge shows it, and `a`'s gradients were 40-42% off, silently, before."""
    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        torch.manual_seed(0)
        layer = FrozenBetween()
        swapped = {"frozen.weight": layer.frozen.weight * 2}
        with torch.nn.utils.stateless._reparametrize_module(layer, swapped):
            loss = remat.checkpoint(region_name="c")(layer)(torch.randn(4, 8)).square().sum()
        with pytest.raises(RuntimeError, match=r"checkpoint 'c' read a frozen weight or buffer \(a tensor that takes "
                                               r"no gradient\) "
                                               r"as saved tensor #\d+ \(float32 \[8, 8\] on cpu\).*"
                                               r"where forward read another, with other values"):
            loss.backward()


@pytest.mark.parametrize("first_kept", [False, True], ids=["first let go", "first kept"])
def test_a_frozen_table_made_again_with_the_same_values_gives_the_plain_gradients(first_kept):
    """A table the module makes again whenever the length changes (positions, a mask): recompute of
    the first call reads the table the third call made, of the same values as the one the first
    call read (kept alive or not), which is no swap; nor is a longer table, of another shape."""

    class Table(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.table, self.made = None, []

        def forward(self, x):
            if self.table is None or self.table.shape[0] != x.shape[0]:
                self.table = torch.arange(x.shape[0], dtype=torch.float32).unsqueeze(1) / 10
                if first_kept:
                    self.made.append(self.table)
            return torch.tanh(self.a(x) * self.table)

    def losses(checkpointed):
        torch.manual_seed(3)
        layer = Table()
        run = remat.checkpoint(region_name="t")(layer) if checkpointed else layer
        xs = [torch.randn(n, 8) for n in (4, 6, 4)]
        outs = [run(x).square().sum() for x in xs]
        for out in outs:  # the first call's backward first, when the module holds the third's table
            out.backward()
        return [p.grad for p in layer.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(losses(True), losses(False)))


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
@pytest.mark.parametrize("how", ["functional_call", "assigned per forward"])
def test_batch_norm_statistics_swapped_in_give_the_plain_gradients(how, tagged):
    """Per-domain running statistics swapped in for forward alone: batch norm in training mode saves
    them, but its gradients never read them (buffers are not compared)."""

    class Net(torch.nn.Module):
        def __init__(self, checkpointed):
            super().__init__()
            self.a, self.norm, self.b = torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)
            self.checkpointed = checkpointed

        def forward(self, x):
            body = lambda t: self.b(torch.relu(self.norm(self.a(t))))  # noqa: E731
            return remat.checkpoint(region_name="n")(body)(x) if self.checkpointed else body(x)

    def statistics(seed):
        generator = torch.Generator().manual_seed(seed)
        return {"norm.running_mean": torch.randn(16, generator=generator) * 0.1,
                "norm.running_var": torch.rand(16, generator=generator) + 0.5}

    def gradients(checkpointed):
        torch.manual_seed(0)
        net, xs = Net(checkpointed).train(), [torch.randn(8, 8) for _ in range(2)]
        if how == "functional_call":
            loss = torch.func.functional_call(net, statistics(1), (xs[0],), strict=False).square().mean()
        else:
            loss = 0
            for seed, x in enumerate(xs):
                net.norm.running_mean, net.norm.running_var = statistics(seed).values()
                loss = loss + net(x).square().mean()
        loss.backward()
        return [p.grad for p in net.parameters()]

    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        assert all(torch.equal(a, b) for a, b in zip(gradients(True), gradients(False)))


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_eval_batch_norm_statistics_replaced_between_forward_and_backward_are_refused(tagged):
    """In eval mode batch norm normalizes by its running statistics, and its gradients read them:
    recompute reading others gave the linear's gradients 50% off, silently."""
    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        torch.manual_seed(0)
        layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).eval()
        loss = remat.checkpoint(region_name="bn")(layer)(torch.randn(4, 8)).square().sum()
        kept = layer[1].running_var
        layer[1].running_var = kept * 4
        with pytest.raises(RuntimeError, match=r"checkpoint 'bn' read a frozen weight or buffer .*where forward read "
                                               r"another, with other values"):
            loss.backward()


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_a_table_of_fixed_capacity_made_again_gives_the_plain_gradients(tagged):
    """A shared position table of fixed size, made anew when a longer batch comes: the first
    micro-batch's recompute reads the new table's first rows, the same as the old one's, which a
    plain layer's graph keeps alive (its other rows differ)."""

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.zeros(16, 8), persistent=False)
            self.filled = 0

        def forward(self, length):
            if length > self.filled:
                table = torch.zeros(16, 8)
                table[:length] = torch.sin(torch.arange(length).float()[:, None] * torch.arange(1, 9).float() / 10)
                self.table, self.filled = table, length
            return self.table[:length]

    class Layer(torch.nn.Module):
        def __init__(self, positions):
            super().__init__()
            self.positions, self.a = positions, torch.nn.Linear(8, 8)

        def forward(self, x):
            return x + torch.tanh(self.a(x) * self.positions(x.shape[0]))

    def gradients(checkpointed):
        torch.manual_seed(0)
        positions = Positions()
        layers = torch.nn.ModuleList(Layer(positions) for _ in range(2))

        def net(x):
            x = layers[0](x)
            return (remat.checkpoint(region_name="l1")(layers[1]) if checkpointed else layers[1])(x).square().sum()

        (net(torch.randn(4, 8)) + net(torch.randn(6, 8))).backward()
        return [p.grad for p in layers.parameters()]

    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        assert all(torch.equal(a, b) for a, b in zip(gradients(True), gradients(False)))


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
def test_parameters_made_in_a_checkpointed_forward_then_swapped_are_refused(tagged):
    """A LazyLinear whose weight the first checkpointed step made (the allocator tags it as made in a
    forward, as a body's own leaf): copies swapped in later through functional_call were 42% off,
    silently, under tags before."""
    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        torch.manual_seed(0)
        layer = torch.nn.Sequential(torch.nn.LazyLinear(8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        run = remat.checkpoint(region_name="lazy")(layer)
        run(torch.randn(4, 8)).sum().backward()  # materializes the weight inside the checkpoint
        copies = {name: (p.detach() * 1.5).requires_grad_() for name, p in layer.named_parameters()}
        with torch.nn.utils.stateless._reparametrize_module(layer, copies):
            loss = run(torch.randn(4, 8)).square().sum()
        with pytest.raises(RuntimeError, match=r"checkpoint 'lazy' read (a|another) parameter .*where forward read "
                                               r"(another|a) parameter"):
            loss.backward()


class Unsaved(torch.nn.Module):
    """A layer whose weight and bias no op saves: its input takes no gradient."""

    def __init__(self, checkpointed=True):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.checkpointed = checkpointed

    def forward(self, x):
        body = lambda u: self.a(u).tanh().square()  # noqa: E731
        return (remat.checkpoint(region_name="c")(body)(x) if self.checkpointed else body(x)).sum()


def unsaved_models():
    torch.manual_seed(2)
    model, plain = Unsaved(), Unsaved(checkpointed=False)
    plain.load_state_dict(model.state_dict())
    return model, plain, torch.randn(4, 8)


def test_fast_weights_no_op_saves_are_refused():
    """MAML's outer step through functional_call on a layer whose input takes no gradient: nothing
    saved is a weight, so only the graph shows recompute reading the parameters (112% off before)."""
    model, _, x = unsaved_models()
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(model(x), list(params.values()), create_graph=True)
    fast = {name: p - 0.5 * g for (name, p), g in zip(params.items(), grads)}
    with pytest.raises(RuntimeError, match=r"checkpoint 'c' read a parameter \(float32 \[8\] on cpu\) as input 0 "
                                           r"of AddmmBackward0, where forward read a tensor computed from it \(the "
                                           r"output of SubBackward0\).*functional_call"):
        torch.func.functional_call(model, fast, (x,)).backward()


def test_leaf_copies_no_op_saves_are_refused_where_the_allocator_tags_them():
    with remat.tag_cpu_tensors():
        model, _, x = unsaved_models()
        copies = {name: (p.detach() * 1.5).requires_grad_() for name, p in model.named_parameters()}
        with pytest.raises(RuntimeError, match=r"read a parameter \(float32 \[8\] on cpu\) as input 0 of "
                                               r"AddmmBackward0, where forward read another parameter"):
            torch.func.functional_call(model, copies, (x,)).backward()


def _on_a_thread(fn):
    """Runs fn on a new thread (as backward runs on a CUDA device's), raising what it raised."""
    raised = []

    def run():
        try:
            fn()
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            raised.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    if raised:
        raise raised.pop()  # leaves no cycle through the list that would keep the graph past the test


def _swap_kept_through_backward_is_refused(model, x, backward):
    """MAML's outer step with the fast weights in force through `backward(loss)`, on the model."""
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(model(x[:16]), list(params.values()), create_graph=True)
    fast = {name: p - 0.5 * g for (name, p), g in zip(params.items(), grads)}
    with torch.nn.utils.stateless._reparametrize_module(model, fast):
        loss = model(x[16:])
        with pytest.raises(RuntimeError, match=r"read a tensor computed before recompute began \(the output of "
                                               r"SubBackward0\) as input 0 of TBackward0, which forward did not read"):
            backward(loss)


def test_a_swap_kept_through_a_backward_on_another_thread_is_refused(models):
    """Sequence numbers count per thread: a backward on another thread (CUDA's device threads) was
    not compared, 1.7% off. The refused recompute's tensors held its checkpoint alive for good before
    it let them go."""
    model, _, x = models
    _swap_kept_through_backward_is_refused(model, x, lambda loss: _on_a_thread(loss.backward))
    # The refused recompute let go of what it made (which held its checkpoint): nothing stays live.
    gc.collect()
    assert live_checkpoint_bytes() == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: backward runs on the device's own thread")
def test_a_swap_kept_through_a_backward_on_cuda_device_threads_is_refused():
    torch.manual_seed(0)
    model = Net().cuda()
    _swap_kept_through_backward_is_refused(model, torch.randn(32, 32, device="cuda"), lambda loss: loss.backward())


def test_fast_weights_of_several_inner_steps_are_refused():
    """Three inner steps, not checkpointed: the parameter is three nodes behind the weight forward
    read (1.85 off)."""
    model, _, x = unsaved_models()
    fast = dict(model.named_parameters())
    model.checkpointed = False
    for _ in range(3):
        grads = torch.autograd.grad(torch.func.functional_call(model, fast, (x,)), list(fast.values()),
                                    create_graph=True)
        fast = {name: p - 0.5 * g for (name, p), g in zip(fast.items(), grads)}
    model.checkpointed = True
    with pytest.raises(RuntimeError, match="where forward read a tensor computed from it"):
        torch.func.functional_call(model, fast, (x,)).backward()


def test_an_outer_step_under_autocast_is_refused(models):
    """Under autocast recompute reads the cast of the parameter the inner step cached, at another op
    than forward read the cast of the fast weight (6.1e-2 off)."""
    model, _, x = models
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="read a parameter .* where forward read a tensor computed from it"):
            maml_step(model, x)


def test_a_weight_computed_again_at_each_forward_gives_the_plain_gradients():
    """Old-style weight_norm recomputes the weight in a pre-hook at each forward: two forwards before
    one backward leave the first's recompute reading the second's weight, computed the same way."""

    class Normed(torch.nn.Module):
        def __init__(self, checkpointed):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(8, 8))
            self.checkpointed = checkpointed

        def forward(self, x):
            body = lambda u: torch.nn.functional.linear(u, self.weight).tanh()  # noqa: E731
            return remat.checkpoint(region_name="c")(body)(x) if self.checkpointed else body(x)

    def step(checkpointed):
        torch.manual_seed(1)
        module = Normed(checkpointed)
        with pytest.warns(FutureWarning):
            torch.nn.utils.weight_norm(module, "weight")
        x = torch.randn(4, 8)
        (module(x) * module(2 * x)).sum().backward()
        return [p.grad for p in module.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(step(True), step(False)))


@pytest.mark.parametrize("cached", [False, True], ids=["plain", "cached for forward"])
def test_a_parametrized_weight_gives_the_plain_gradients(cached):
    """A weight a parametrization computes (cached for forward alone: recompute computes it again)."""

    def step(checkpointed):
        torch.manual_seed(4)
        layer = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(8, 8))
        body = lambda u: layer(u).tanh().square()  # noqa: E731
        x = torch.randn(4, 8)
        with torch.nn.utils.parametrize.cached() if cached else contextlib.nullcontext():
            loss = (remat.checkpoint(region_name="c")(body)(x) if checkpointed else body(x)).sum()
        loss.backward()
        return [p.grad for p in layer.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(step(True), step(False)))


def test_leaves_the_body_makes_over_memory_it_did_not_allocate_give_the_plain_gradients():
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        layer, buffer = torch.nn.Linear(8, 8), torch.randn(8)
        x = torch.randn(4, 8, requires_grad=True)

        def body(t):
            return (layer(t) + buffer.detach().requires_grad_()) * t.detach().requires_grad_().sin()

        body(x).square().sum().backward()
        reference = [p.grad.clone() for p in layer.parameters()] + [x.grad.clone()]
        layer.zero_grad()
        x.grad = None
        remat.checkpoint(region_name="c")(body)(x).square().sum().backward()
        assert all(torch.equal(a, b) for a, b in zip([p.grad for p in layer.parameters()] + [x.grad], reference))


def test_views_made_again_for_backward_give_the_plain_gradients():
    """A sharded parameter's views made again between forward and backward (FSDP's flat parameter)
    hold the same values: not a swap."""

    def step(checkpointed):
        torch.manual_seed(3)
        flat = torch.nn.Parameter(torch.randn(72))
        layer = torch.nn.Linear(8, 8)
        x = torch.randn(4, 8)

        def views():
            del layer.weight, layer.bias
            layer.weight, layer.bias = flat[:64].view(8, 8), flat[64:]

        views()
        body = lambda u: layer(u).tanh().square()  # noqa: E731
        loss = (remat.checkpoint(region_name="c")(body)(x) if checkpointed else body(x)).sum()
        views()
        loss.backward()
        return flat.grad

    assert torch.equal(step(True), step(False))


def test_a_cached_weight_shared_by_checkpoints_gives_the_plain_gradients():
    """A recurrent cell's parametrized weight, cached for forward alone: recompute computes it again
    from the parameter that computed each checkpoint's input too (which recompute is given, not
    computed again)."""

    class Symmetric(torch.nn.Module):
        def forward(self, w):
            return w.triu() + w.triu(1).transpose(-1, -2)

    def step(checkpointed):
        torch.manual_seed(5)
        cell = torch.nn.Linear(8, 8)
        torch.nn.utils.parametrize.register_parametrization(cell, "weight", Symmetric())
        body = lambda u: torch.tanh(cell(u))  # noqa: E731
        h = torch.randn(4, 8)
        with torch.nn.utils.parametrize.cached():
            for t in range(3):
                h = remat.checkpoint(region_name=f"t{t}")(body)(h) if checkpointed else body(h)
        h.square().sum().backward()
        return [p.grad for p in cell.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(step(True), step(False)))


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
@pytest.mark.parametrize("side", ["auxiliary head", "outside weight", "probe never used"])
def test_side_branches_of_the_body_give_the_plain_gradients(side, tagged):
    """What the body computes beside its output (an auxiliary loss kept in a list, through a head of
    its own or a weight computed once per step outside; a probe kept for logging that backward never
    reaches) is recomputed too, reading what forward's side branch read."""

    def step(checkpointed):
        torch.manual_seed(6)
        layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        head, table = torch.nn.Linear(8, 5), torch.nn.Embedding(5, 8)
        x, y = torch.randn(4, 8), torch.randint(0, 5, (4,))
        classifier = torch.nn.functional.normalize(table.weight, dim=-1)
        aside = []

        def body(u, layer):
            h = torch.tanh(layer(u))
            if side == "auxiliary head":
                aside.append(torch.nn.functional.cross_entropy(head(h), y))
            elif side == "outside weight":
                aside.append(torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, classifier), y))
            else:
                aside.append(head(h).softmax(-1).square().mean().detach())
            return h * 2

        h = x
        for i, layer in enumerate(layers):
            f = lambda u, layer=layer: body(u, layer)  # noqa: E731
            h = remat.checkpoint(region_name=f"b{i}")(f)(h) if checkpointed else f(h)
        (h.square().sum() + sum(a for a in aside if a.requires_grad)).backward()
        return [p.grad for m in (layers, head, table) for p in m.parameters() if p.grad is not None]

    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        checkpointed, plain = step(True), step(False)
    assert len(checkpointed) == len(plain) > 0
    assert all(torch.equal(a, b) for a, b in zip(checkpointed, plain))


@pytest.mark.parametrize("tagged", [False, True], ids=["untagged", "tagged"])
@pytest.mark.parametrize("leaf", ["fresh bias", "probe kept", "parameter each call", "scalar", "feature kept"])
def test_leaves_the_body_makes_and_keeps_give_the_plain_gradients(leaf, tagged):
    """Leaves the body makes over new memory, let go or kept (a probe in a list, a module attribute,
    a parameter made at each call) are other leaves in recompute, rightly: not swapped weights."""

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.kept = []

        def forward(self, u):
            h = self.a(u)
            if leaf == "fresh bias":
                h = h + torch.full((8,), 0.5, requires_grad=True)
            elif leaf == "probe kept":
                self.kept.append(torch.zeros_like(h, requires_grad=True))
                h = h + self.kept[-1]
            elif leaf == "parameter each call":
                self.extra = torch.nn.Parameter(torch.ones(8))
                h = h + self.extra
            elif leaf == "scalar":
                h = h - torch.tensor(0.3, requires_grad=True)
            else:
                self.feature = h.detach().clone().requires_grad_()
                h = self.feature.relu()
            return self.b(torch.tanh(h))

    def step(checkpointed):
        torch.manual_seed(7)
        layers = torch.nn.ModuleList(Layer() for _ in range(2))
        h = torch.randn(4, 8)
        for i, layer in enumerate(layers):
            h = remat.checkpoint(region_name=f"l{i}")(layer)(h) if checkpointed else layer(h)
        h.square().sum().backward()
        return [p.grad for layer in layers for p in (*layer.a.parameters(), *layer.b.parameters())]

    with remat.tag_cpu_tensors() if tagged else contextlib.nullcontext():
        checkpointed, plain = step(True), step(False)
    assert [g is None for g in checkpointed] == [g is None for g in plain]  # a detached feature: a's take none
    assert all(a is None or torch.equal(a, b) for a, b in zip(checkpointed, plain))


def _plan_text(decisions):
    import json

    return json.dumps({"kind": "remat-plan", "schema_version": 1, "budget_bytes": 0, "base_bytes": 0, "kept_bytes": 0,
                       "recompute_seconds": 0, "decisions": decisions})
