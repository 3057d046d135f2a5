"""Buffers a checkpoint's body changes in place in forward: a step counter, an exponential average,
batch norm's running statistics, spectral norm's vectors. Recompute ran from the values forward
left, so it made other tensors than forward (gradients wrong, silently, as under
torch.utils.checkpoint) and changed the buffers a second time. Recompute now runs from the values
forward read and leaves the buffers as it found them: gradients and buffers bitwise those without
checkpointing."""

import copy
import warnings

import pytest
import torch
import torch.utils.checkpoint

import remat


class Counter(torch.nn.Module):
    """Changes its buffer, then reads it (saved, through the product)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("step", torch.zeros(()))

    def forward(self, x):
        self.step += 1
        return torch.tanh(self.lin(x)) * self.step


class Average(torch.nn.Module):
    """Reads its buffer (a copy of it is saved), then changes it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("average", torch.ones(8))

    def forward(self, x):
        h = self.lin(x)
        out = torch.tanh(h * self.average.clone())
        with torch.no_grad():
            self.average.mul_(0.9).add_(0.1 * h.mean(0))
        return out


class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x)))


class Spectral(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(8, 8))

    def forward(self, x):
        return torch.tanh(self.lin(x))


MODULES = [Counter, Average, Norm, Spectral]


def batch(step):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(step), requires_grad=True)


def train(model, checkpoint, steps=3, loss=lambda y, x: y.pow(2).sum()):
    """Each step's gradients (the input's and the parameters'), then the buffers as the last left them."""
    rows = []
    for step in range(steps):
        x = batch(step)
        y = checkpoint(model, x) if checkpoint else model(x)
        loss(y, x).backward()
        rows.append([x.grad.clone()] + [p.grad.clone() for p in model.parameters()])
        model.zero_grad(set_to_none=True)
    return rows, [b.clone() for b in model.buffers()]


def ours(model, x):
    return remat.checkpoint(region_name="layer")(model)(x)


def torchs(model, x):
    return torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False)


def same(a, b):
    rows_a, buffers_a = a
    rows_b, buffers_b = b
    return all(torch.equal(u, v) for ra, rb in zip(rows_a, rows_b) for u, v in zip(ra, rb)) and \
        all(torch.equal(u, v) for u, v in zip(buffers_a, buffers_b))


def step_both(model, plain, step, about):
    """A step of `model` under a checkpoint and of its copy `plain` without: the inputs, and the
    warnings the checkpointed step gave that mention `about`."""
    x, x_plain = batch(step), batch(step)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ours(model, x).pow(2).sum().backward()
    plain(x_plain).pow(2).sum().backward()
    return x, x_plain, [str(w.message) for w in said if about in str(w.message)]


def made(cls):
    torch.manual_seed(0)
    return cls()


@pytest.mark.parametrize("cls", MODULES, ids=lambda c: c.__name__)
def test_recompute_runs_from_the_buffers_forward_read(cls):
    model = made(cls)
    plain = train(copy.deepcopy(model), None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: the first forward keeps every buffer
        checkpointed = train(copy.deepcopy(model), ours)
    assert same(checkpointed, plain)
    # torch.utils.checkpoint recomputes from the changed buffers: the case is one that shows
    assert not same(train(copy.deepcopy(model), torchs), plain)


@pytest.mark.parametrize("cls", [Counter, Norm, Spectral], ids=lambda c: c.__name__)
def test_each_recompute_of_a_call_runs_from_forward_values(cls):
    """A gradient penalty's backward through the first backward's graph recomputes the call twice."""
    def penalty(y, x):
        loss = y.pow(2).sum()
        grad, = torch.autograd.grad(loss, x, create_graph=True)
        return loss + grad.square().sum()

    model = made(cls)
    assert same(train(copy.deepcopy(model), ours, loss=penalty), train(copy.deepcopy(model), None, loss=penalty))


def test_a_retained_graph_recomputes_from_forward_values_each_time():
    model = made(Counter)
    x = batch(0)
    y = ours(model, x).sum()
    y.backward(retain_graph=True)
    first = x.grad.clone()
    y.backward()
    assert torch.equal(x.grad, 2 * first)
    assert model.step.item() == 1  # changed by forward alone

    plain = made(Counter)
    x_plain = batch(0)
    plain(x_plain).sum().backward()
    assert torch.equal(first, x_plain.grad)


def test_a_recompute_that_stops_before_the_write_leaves_the_buffer_as_it_found_it():
    """Recompute stops once every saved tensor exists: a count changed after the last of them is
    not changed again, and the value forward read, put in for recompute, is taken back."""
    class Late(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            out = torch.tanh(self.lin(x))  # the last tensor saved
            self.calls += 1
            return out * 2  # a graph node after it, so recompute stops at it

    model = made(Late)
    assert same(train(copy.deepcopy(model), ours), train(copy.deepcopy(model), None))
    checkpointed = copy.deepcopy(model)
    train(checkpointed, ours, steps=4)
    assert checkpointed.calls.item() == 4


def test_a_save_region_that_changes_a_buffer_gives_recompute_the_values_it_left():
    """Recompute skips a save region: the buffer it changed takes the values forward left after
    it, which the code after it reads."""
    class Staged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.register_buffer("scale", torch.ones(()))

        def stage(self, x):
            self.scale.mul_(1.5)
            return torch.tanh(self.a(x))

        def forward(self, x):
            h = remat.region(self.stage, "stage", recompute=False)(x)  # (outside a checkpoint: its body)
            return torch.sigmoid(self.b(h) * self.scale)

    model = made(Staged)
    assert same(train(copy.deepcopy(model), ours), train(copy.deepcopy(model), None))


def test_checkpoints_that_change_one_shared_buffer_each_recompute_from_their_own_forward():
    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
            self.register_buffer("depth", torch.zeros(()))

        def forward(self, x, checkpointed=False):
            def layer(h, lin):
                self.depth += 1
                return torch.tanh(lin(h)) * self.depth.clone()  # (saved itself, the next layer's change is refused)

            for index, lin in enumerate(self.lins):
                x = remat.checkpoint(region_name=f"lins.{index}")(layer)(x, lin) if checkpointed else layer(x, lin)
            return x

    model = made(Stack)
    assert same(train(copy.deepcopy(model), lambda m, x: m(x, checkpointed=True)), train(copy.deepcopy(model), None))


def test_a_closure_over_the_whole_model_learns_per_checkpoint_which_buffers_change():
    """Each checkpoint's function holds every layer (a closure over the model); each changes its own
    layer's vectors only: what one checkpoint left alone is still kept for the one that changes it."""
    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(8, 8))
                                            for _ in range(3))

        def forward(self, x, checkpointed=False):
            for index in range(3):
                def block(h, index=index):
                    return torch.tanh(self.lins[index](h))
                x = remat.checkpoint(region_name=f"blocks.{index}")(block)(x) if checkpointed else block(x)
            return x

    model = made(Blocks)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpointed = train(copy.deepcopy(model), lambda m, x: m(x, checkpointed=True))
    assert same(checkpointed, train(copy.deepcopy(model), None))


def test_a_buffer_first_changed_by_a_later_forward_is_said_once_then_kept():
    """A buffer forwards left alone is not copied; the first forward that changes it is said (that
    call's recompute reads the changed value), and from the next call on recompute is exact."""
    class Warmup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("seen", torch.zeros(()))
            self.counting = False

        def forward(self, x):
            if self.counting:
                self.seen += 1
            return torch.tanh(self.lin(x)) * (1 + self.seen)

    model = made(Warmup)
    plain = copy.deepcopy(model)
    for step, counting in enumerate([False, False, True, True, True]):
        model.counting = plain.counting = counting
        x, x_plain, told = step_both(model, plain, step, "changed the buffer 'seen'")
        assert len(told) == (1 if step == 2 else 0), told
        if step == 2:
            assert "this call's recompute reads the changed value" in told[0]
            assert not torch.equal(x.grad, x_plain.grad)
        else:
            assert torch.equal(x.grad, x_plain.grad)
    assert torch.equal(model.seen, plain.seen)


def test_a_buffer_left_alone_in_eval_mode_is_kept_when_training_changes_it():
    """What a module's forwards do to a buffer is learned per mode: eval forwards with gradients on
    leave batch norm's statistics alone, training ones change them."""
    model = made(Norm)
    plain = copy.deepcopy(model)
    for step, training in enumerate([False, False, True, True]):
        model.train(training)
        plain.train(training)
        x, x_plain = batch(step), batch(step)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ours(model, x).pow(2).sum().backward()
        plain(x_plain).pow(2).sum().backward()
        assert torch.equal(x.grad, x_plain.grad)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), plain.buffers()))


def test_buffers_replaced_between_steps_are_the_ones_kept():
    model = made(Counter)
    plain = copy.deepcopy(model)
    for step in range(4):
        if step == 2:
            model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
        x, x_plain = batch(step), batch(step)
        ours(model, x).pow(2).sum().backward()
        plain(x_plain).pow(2).sum().backward()
        assert torch.equal(x.grad, x_plain.grad)
    assert torch.equal(model.step, plain.step)


def test_a_buffer_saved_and_then_changed_in_forward_is_still_refused():
    """Saved, then changed: autograd refuses it without checkpointing, and recompute refuses it too
    (the saved tensor's version moved), as before."""
    class Invalid(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("gain", torch.ones(8))

        def forward(self, x):
            out = self.lin(x) * self.gain
            with torch.no_grad():
                self.gain.mul_(0.5)
            return out

    model = made(Invalid)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        copy.deepcopy(model)(batch(0)).sum().backward()
    with pytest.raises(RuntimeError, match="changed by an in-place operation later in the same forward"):
        ours(model, batch(0)).sum().backward()


def test_a_buffer_changed_at_some_steps_only_stays_kept():
    """Once a checkpoint's forward changed a buffer, it is copied at every forward, also after
    forwards that left it alone (an average updated every other step)."""
    class Sometimes(Average):
        def forward(self, x):
            if not self.updating:
                return torch.tanh(self.lin(x) * self.average.clone())
            return super().forward(x)

    model = made(Sometimes)
    plain = copy.deepcopy(model)
    for step in range(6):
        model.updating = plain.updating = step % 2 == 0
        x, x_plain = batch(step), batch(step)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ours(model, x).pow(2).sum().backward()
        plain(x_plain).pow(2).sum().backward()
        assert torch.equal(x.grad, x_plain.grad), step
    assert torch.equal(model.average, plain.average)


@pytest.mark.parametrize("passed", ["list", "dict", "partial keyword"])
def test_modules_given_in_a_container_or_by_a_partial_keyword_are_reached(passed):
    import functools

    def body(h, layers):
        for layer in (layers.values() if isinstance(layers, dict) else layers):
            h = layer(h)
        return h

    model = torch.nn.Sequential(made(Counter), made(Counter))
    plain = copy.deepcopy(model)
    for step in range(3):
        x, x_plain = batch(step), batch(step)
        if passed == "list":
            y = remat.checkpoint(region_name="layers")(body)(x, list(model))
        elif passed == "dict":
            y = remat.checkpoint(region_name="layers")(body)(x, {"a": model[0], "b": model[1]})
        else:
            y = remat.checkpoint(region_name="layers")(functools.partial(body, layers=list(model)))(x)
        y.pow(2).sum().backward()
        plain(x_plain).pow(2).sum().backward()
        assert torch.equal(x.grad, x_plain.grad)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), plain.buffers()))


class Renormalized(torch.nn.BatchNorm1d):
    """Reads its running statistics in training (batch renormalization) and changes them with ops
    that move their version counters, leaving num_batches_tracked alone."""

    def forward(self, x):
        mean, var = x.mean(0), x.var(0, unbiased=False)
        r = ((var + self.eps).sqrt() / (self.running_var + self.eps).sqrt()).detach().clamp(1 / 3, 3)
        d = ((mean - self.running_mean) / (self.running_var + self.eps).sqrt()).detach().clamp(-5, 5)
        with torch.no_grad():
            self.running_mean.mul_(0.9).add_(0.1 * mean)
            self.running_var.mul_(0.9).add_(0.1 * var)
        return ((x - mean) / (var + self.eps).sqrt() * r + d) * self.weight + self.bias


@pytest.mark.parametrize("norm", ["renormalized", "statistics read after"])
def test_running_statistics_a_training_forward_reads_are_as_forward_read_them(norm):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.bn = Renormalized(8) if norm == "renormalized" else torch.nn.BatchNorm1d(8)

        def forward(self, x):
            h = self.bn(self.lin(x))
            return torch.tanh(h if norm == "renormalized" else h * self.bn.running_var.clone())

    model = made(Net)
    assert same(train(copy.deepcopy(model), ours), train(copy.deepcopy(model), None))


class Memory(torch.nn.Module):
    """Reads its buffer, then assigns it anew (a recurrent memory, an average written as
    `self.x = 0.9 * self.x + ...`): the module's attribute holds another tensor after forward."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("memory", torch.zeros(8))

    def forward(self, x):
        y = torch.tanh(self.lin(x) + self.memory)
        self.memory = 0.9 * self.memory + 0.1 * y.detach().mean(0)
        return y


def test_a_buffer_assigned_anew_is_read_by_recompute_as_forward_read_it():
    model = made(Memory)
    plain = train(copy.deepcopy(model), None)
    checkpointed = copy.deepcopy(model)
    assert same(train(checkpointed, ours), plain)
    assert not same(train(copy.deepcopy(model), torchs), plain)
    # The attribute holds what the last forward assigned, not what a recompute made
    assert isinstance(checkpointed._buffers["memory"], torch.Tensor) and "memory" in dict(checkpointed.named_buffers())


def test_a_buffer_assigned_anew_and_changed_in_place_is_given_back_each_recompute():
    """The tensor forward read is changed in place and then replaced; a gradient penalty recomputes
    the call twice and a retained graph's second backward once more."""
    class Both(Memory):
        def forward(self, x):
            self.memory.add_(1.0)
            y = torch.tanh(self.lin(x) * self.memory)
            self.memory = self.memory * 0.5
            return y

    def penalty(y, x):
        loss = y.pow(2).sum()
        grad, = torch.autograd.grad(loss, x, create_graph=True)
        return loss + grad.square().sum()

    model = made(Both)
    assert same(train(copy.deepcopy(model), ours, loss=penalty), train(copy.deepcopy(model), None, loss=penalty))
    checkpointed, x = copy.deepcopy(model), batch(0)
    y = ours(checkpointed, x).sum()
    y.backward(retain_graph=True)
    first = x.grad.clone()
    y.backward()
    assert torch.equal(x.grad, 2 * first)
    plain, x_plain = copy.deepcopy(model), batch(0)
    plain(x_plain).sum().backward()
    assert torch.equal(first, x_plain.grad) and torch.equal(checkpointed.memory, plain.memory)


def test_a_save_region_that_assigns_a_buffer_gives_recompute_what_it_left_there():
    """Recompute skips the save region that replaced the buffer: the code after it reads what
    forward left in the attribute, and after backward it holds what the last forward left."""
    class Staged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.register_buffer("scale", torch.ones(8))

        def stage(self, x):
            h = torch.tanh(self.a(x))
            self.scale = self.scale * 1.5 + h.detach().mean(0)
            return h

        def forward(self, x):
            h = remat.region(self.stage, "stage", recompute=False)(x)
            return torch.sigmoid(self.b(h) * self.scale)

    model = made(Staged)
    assert same(train(copy.deepcopy(model), ours), train(copy.deepcopy(model), None))


def test_a_buffer_assigned_anew_after_the_last_saved_tensor_is_left_as_found():
    """Recompute stops before the assignment: the attribute holds what it held before recompute."""
    class Late(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("seen", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            out = torch.tanh(self.lin(x)) * (self.seen + 1)
            self.seen = self.seen + 1
            return out * 2

    model = made(Late)
    assert same(train(copy.deepcopy(model), ours), train(copy.deepcopy(model), None))
    checkpointed = copy.deepcopy(model)
    train(checkpointed, ours, steps=4)
    assert checkpointed.seen.item() == 4


def test_a_buffer_taken_out_in_forward_is_out_after_recompute():
    """`del self._buffers[name]` in forward: recompute runs with it in, and after it the module has
    no such buffer (it held one set to None, and the next forward failed on it)."""
    class Once(Memory):
        def forward(self, x):
            y = torch.tanh(self.lin(x) + (self.memory if "memory" in self._buffers else 0.0))
            self._buffers.pop("memory", None)
            return y

    model = made(Once)
    assert same(train(copy.deepcopy(model), ours), train(copy.deepcopy(model), None))
    checkpointed = copy.deepcopy(model)
    train(checkpointed, ours, steps=2)
    assert "memory" not in checkpointed._buffers


def test_a_lazy_norm_initializing_its_statistics_in_forward_trains_as_without_checkpointing():
    """LazyBatchNorm1d makes its running statistics in its first forward: recompute put back the
    empty ones forward began with and failed ("size of tensor a (8) must match ... b (0)")."""
    class Lazy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.bn = torch.nn.LazyBatchNorm1d()

        def forward(self, x):
            return torch.tanh(self.bn(self.lin(x)))

    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        assert same(train(made(Lazy), ours), train(made(Lazy), None))
    said = [str(w.message) for w in told if "checkpoint 'layer'" in str(w.message)]
    assert len(said) == 2 and "'running_mean'" in said[0] and "'running_var'" in said[1], said
    assert all("lazy module initializing it" in message for message in said), said


class Momentum(torch.nn.Module):
    """A momentum encoder updated in forward (MoCo's and BYOL's pattern): the target's weights move
    toward the online ones under no_grad, then the target reads them. Recompute ran the update a
    second time and read the weights moved twice: the input's gradient off by 3.5, as under
    torch.utils.checkpoint."""

    def __init__(self, frozen):
        super().__init__()
        self.online, self.target = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.target.requires_grad_(not frozen)

    def forward(self, x):
        with torch.no_grad():
            for online, target in zip(self.online.parameters(), self.target.parameters()):
                target.mul_(0.5).add_(online, alpha=0.5)
        return torch.tanh(self.target(torch.tanh(self.online(x))))


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "trained"])
def test_a_parameter_changed_in_place_in_forward_is_said_once_then_given_back_to_recompute(frozen):
    """Parameters are not copied before a forward changed one (a frozen base model's weights would be
    held twice at the first call): the first call's recompute reads the changed weights, said with
    the fixes; from the second call on recompute reads them as forward did, and every call leaves
    them moved once."""
    model = made(lambda: Momentum(frozen))
    plain = copy.deepcopy(model)
    for step in range(4):
        x, x_plain, told = step_both(model, plain, step, "changed the parameter")
        if step == 0:
            assert len(told) == 2 and "'weight'" in told[0] and "'bias'" in told[1], told
            assert "parameters are not copied before a forward is seen changing them" in told[0], told
            assert "make it a buffer" in told[0], told
            assert not torch.equal(x.grad, x_plain.grad)
        else:
            assert told == [] and torch.equal(x.grad, x_plain.grad), step
            assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), plain.parameters())
                       if p.grad is not None), step
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters())), step
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)


def test_parameters_no_forward_changes_are_not_copied():
    """A layer's weights, read and never changed in forward, are not given back (no copy held)."""
    model = made(lambda: Momentum(True))
    looked = []

    def body(x):
        looked.append([remat._C.given_back_to_recompute(p) for p in (model.online.weight, model.target.weight)])
        return model(x)

    for step in range(2):
        remat.checkpoint(region_name="layer")(body)(batch(step)).pow(2).sum().backward()
    # forward, recompute (False: not in forward), forward again (the target's weights now kept)
    assert looked[0] == [False, False] and looked[2] == [False, True], looked


def assign_each(model):
    for online, target in zip(model.online.parameters(), model.target.parameters()):
        target.data = target.data * 0.5 + online.data * 0.5


def assign_transposed(model):  # the new data strided otherwise than the old (same bytes)
    for online, target in zip(model.online.parameters(), model.target.parameters()):
        target.data = (target.data.t() * 0.5 + online.data.t() * 0.5).contiguous().t() if target.dim() == 2 else \
            target.data * 0.5 + online.data * 0.5


def assign_from_vector(model):  # each parameter's data a view into one new vector (other bytes, an offset)
    target = torch.nn.utils.parameters_to_vector(model.target.parameters())
    online = torch.nn.utils.parameters_to_vector(model.online.parameters())
    torch.nn.utils.vector_to_parameters(target * 0.5 + online * 0.5, model.target.parameters())


@pytest.mark.parametrize("update", [assign_each, assign_transposed, assign_from_vector], ids=lambda f: f.__name__)
def test_a_parameter_whose_data_forward_assigns_anew_is_given_back_from_the_first_call(update):
    """MoCo's update, `k.data = k.data * m + q.data * (1 - m)` (or vector_to_parameters of the
    average), moves no version counter: recompute ran it again and read the key encoder moved twice
    at every call, without a word (as under torch.utils.checkpoint). The data forward read is held
    as it lay (the assignment leaves it alone) and recompute runs with it: bitwise from the first
    call, nothing said."""
    class Assigned(Momentum):
        def forward(self, x):
            update(self)
            return torch.tanh(self.target(torch.tanh(self.online(x))))

    model = made(lambda: Assigned(True))
    plain = copy.deepcopy(model)
    for step in range(3):
        x, x_plain, told = step_both(model, plain, step, "checkpoint 'layer'")
        assert told == [] and torch.equal(x.grad, x_plain.grad), step
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters())), step
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), plain.parameters())
                   if p.grad is not None), step
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)


def test_a_parameter_changed_in_place_then_assigned_is_said_once_then_given_back():
    """`k.mul_(m)` under no_grad, then `k.data = k.data + ...`: the data forward read was changed in
    place before the assignment, so it is no record of what forward read (held as such, recompute
    ran the change again at every call, unsaid). Taken as changed in place: said at the first call,
    copied from the next."""
    class Both(Momentum):
        def forward(self, x):
            with torch.no_grad():
                for online, target in zip(self.online.parameters(), self.target.parameters()):
                    target.mul_(0.5)
                    target.data = target.data + online.data * 0.5
            return torch.tanh(self.target(torch.tanh(self.online(x))))

    model = made(lambda: Both(True))
    plain = copy.deepcopy(model)
    for step in range(3):
        x, x_plain, told = step_both(model, plain, step, "changed the parameter")
        assert len(told) == (2 if step == 0 else 0) and torch.equal(x.grad, x_plain.grad) == (step > 0), step
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters())), step
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
