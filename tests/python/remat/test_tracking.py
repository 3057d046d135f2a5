"""remat.track(model, optimizer) on the CPU under tag_cpu_tensors(): parameters and buffers
re-tagged in place by module path, gradients and optimizer state as they are made, activations
by the module that produced them, temporaries, inputs; untrack restores the tags before; the bad
inputs a user sends first (track before tag_cpu_tensors, twice, two optimizers, tied weights, a
parameter freed while tracked, modules added after track)."""

import gc

import pytest
import torch

import remat
import remat_alloc


class Block(torch.nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)
        self.register_buffer("scale", torch.ones(width))

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) * self.scale


class Net(torch.nn.Module):
    def __init__(self, width=64, tied=False):
        super().__init__()
        self.embed = torch.nn.Embedding(100, width)
        self.block = Block(width)
        self.head = torch.nn.Linear(width, 100, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.block(self.embed(ids)))


def category_of(tensor):
    return remat_alloc.block_category(tensor.untyped_storage().data_ptr())


@pytest.fixture
def tagged():
    with remat.tag_cpu_tensors():
        yield


def step(model, optimizer, ids):
    optimizer.zero_grad(set_to_none=True)
    loss = model(ids).float().logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    return loss


def ids():
    return torch.randint(0, 100, (4, 8), generator=torch.Generator().manual_seed(0))


def test_parameters_buffers_gradients_and_optimizer_state_get_their_category_and_name(tagged):
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    weight_ptr = model.block.up.weight.untyped_storage().data_ptr()
    with remat.track(model, optimizer):
        # re-tagged in place: the same storage, now a parameter named by its module path
        assert model.block.up.weight.untyped_storage().data_ptr() == weight_ptr
        assert category_of(model.block.up.weight) == ("parameter", "block.up.weight")
        assert category_of(model.block.scale) == ("parameter", "block.scale")
        step(model, optimizer, ids())
        assert category_of(model.block.up.weight.grad) == ("gradient", "block.up.weight")
        state = optimizer.state[model.block.down.weight]
        assert category_of(state["exp_avg"]) == ("optimizer_state", "block.down.weight")
        assert category_of(state["exp_avg_sq"]) == ("optimizer_state", "block.down.weight")
        # the whole model's memory is accounted for by category, none left over
        held = remat_alloc.category_bytes()
        param_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
        param_bytes += sum(b.untyped_storage().nbytes() for b in model.buffers())
        assert held["parameter"] >= param_bytes
        assert held["gradient"] >= sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
        assert held["optimizer_state"] >= 2 * sum(p.untyped_storage().nbytes() for p in model.parameters())
    # untracked: the tags from before are back, the optimizer's state is a plain dict again
    assert category_of(model.block.up.weight) == ("none", "")
    assert category_of(model.block.up.weight.grad)[0] != "gradient"
    assert type(optimizer.state[model.block.down.weight]) is dict


def test_activations_are_named_by_the_module_that_made_them_and_temporaries_by_the_module_running(tagged):
    model = Net()
    seen = {}

    def peek(module, args, output):
        seen["up"] = category_of(output)

    with remat.track(model):
        handle = model.block.up.register_forward_hook(peek)
        out = model(ids())
        handle.remove()
        # relu saves its output for backward; the output of `up` is saved by relu's caller too
        assert seen["up"][1] == "block.up"
        assert category_of(model.block.up(torch.zeros(1, 64)))[0] == "temporary"
        kept = remat_alloc.category_bytes()
        assert kept["activation"] > 0
        out.float().sum().backward()
    assert remat_alloc.category()[0] == "none"  # backward's end clears the category


def test_inputs_are_tagged_as_inputs(tagged):
    model = Net()
    batch = ids()
    with remat.track(model):
        model(batch)
        assert category_of(batch) == ("input", "input")


def test_track_before_tag_cpu_tensors_says_how_to_fix_it():
    model = Net()
    with pytest.raises(remat_alloc.RematError, match=r"enter remat.tag_cpu_tensors\(\) first, create the model"):
        remat.track(model)


def test_a_model_built_before_tag_cpu_tensors_is_refused_with_its_parameter_names():
    model = Net()
    with remat.tag_cpu_tensors():
        with pytest.raises(remat_alloc.RematError, match=r"7 parameters and buffers .*embed.weight.*were not allocated by remat's allocator"):
            remat.track(model)
        # nothing is left hooked: a forward runs without tracking
        model(ids())
        assert remat_alloc.category() == ("none", "")


def test_tracking_twice_is_idempotent_and_picks_up_a_second_optimizer(tagged):
    model = Net()
    first = torch.optim.SGD(model.block.parameters(), lr=0.1, momentum=0.9)
    second = torch.optim.AdamW([model.head.weight, model.embed.weight], lr=1e-3)
    tracker = remat.track(model, first)
    hooks_before = len(tracker._handles)
    assert remat.track(model, second) is tracker
    assert remat.track(model, second) is tracker
    assert len(tracker._handles) == hooks_before + 2  # the second optimizer's step hooks, once
    step(model, first, ids())
    second.step()
    assert category_of(first.state[model.block.up.weight]["momentum_buffer"]) == ("optimizer_state", "block.up.weight")
    assert category_of(second.state[model.head.weight]["exp_avg"]) == ("optimizer_state", "head.weight")
    other = Net()
    with pytest.raises(remat_alloc.RematError, match="already followed by the tracking of another model"):
        remat.track(other, second)
    tracker.untrack()
    remat.untrack(other)


def test_tied_parameters_get_one_category_under_the_first_name(tagged):
    model = Net(tied=True)
    with remat.track(model):
        assert category_of(model.head.weight) == ("parameter", "embed.weight")
        assert category_of(model.embed.weight) == ("parameter", "embed.weight")


def test_a_parameter_freed_while_tracked_is_not_restored_onto_reused_memory(tagged):
    model = Net()
    tracker = remat.track(model)
    old = model.block.down
    model.block.down = torch.nn.Linear(256, 64)
    del old
    gc.collect()
    assert tracker.tracked_storages == 7 - 2  # six parameters and a buffer, less the two freed
    tracker.untrack()
    assert category_of(model.block.up.weight) == ("none", "")


def test_modules_added_after_track_are_tracked_only_when_track_is_called_again(tagged):
    model = Net()
    tracker = remat.track(model)
    model.extra = torch.nn.Linear(64, 64)
    assert category_of(model.extra.weight) == ("none", "")
    remat.track(model)
    assert category_of(model.extra.weight) == ("parameter", "extra.weight")
    tracker.untrack()


def test_bad_arguments_name_the_problem():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        remat.track("model")
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        remat.track(torch.nn.Linear(2, 2), optimizer="adam")
    with pytest.raises(ValueError, match="is not one of none, parameter"):
        remat_alloc.set_category("weights")


class Checkpointed(torch.nn.Module):
    """fc1 a save region (what it saves is kept), fc2 recomputed, inside one remat checkpoint."""

    def __init__(self, width=64):
        super().__init__()
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        def body(h):
            h = remat.region(lambda t: torch.relu(self.fc1(t)), "fc1", recompute=False)(h)
            return remat.region(self.fc2, "fc2")(h)

        return remat.checkpoint(region_name="block")(body)(x)


def test_under_a_remat_checkpoint_what_it_keeps_is_an_activation_and_gradients_are_unchanged(tagged):
    torch.manual_seed(0)
    model = Checkpointed()
    x = torch.rand(8, 64, requires_grad=True)
    model(x).square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with remat.track(model):
        before = remat_alloc.category_bytes(requested=True)["activation"]
        out = model(x)
        kept = remat_alloc.category_bytes(requested=True)["activation"] - before
        # the save region's relu output (8 x 256 floats) is kept, as an activation
        assert kept >= 8 * 256 * 4
        out.square().sum().backward()
    for p, grad in zip(model.parameters(), expected):
        assert torch.equal(p.grad, grad)


def test_a_forward_without_backward_leaves_nothing_behind(tagged):
    model = Net()
    batch = ids()
    before = remat_alloc.memory_stats()["allocated_bytes"]
    with remat.track(model):
        model(batch)  # the graph and what it saved die with the output
    gc.collect()
    assert remat_alloc.memory_stats()["allocated_bytes"] == before


def test_a_tracked_model_and_optimizer_are_freed_when_dropped_without_waiting_for_the_collector(tagged):
    before = remat_alloc.memory_stats()["allocated_bytes"]
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with remat.track(model, optimizer):
        step(model, optimizer, ids())
    del model, optimizer
    assert remat_alloc.memory_stats()["allocated_bytes"] == before  # no gc.collect(): no cycle held it
