"""remat.track(model, optimizer) on the CPU under tag_cpu_tensors(): parameters and buffers
re-tagged in place by module path, gradients and optimizer state as they are made, activations
by the module that produced them, temporaries, inputs; untrack restores the tags before; the bad
inputs a user sends first (track before tag_cpu_tensors, twice, two optimizers, tied weights, a
parameter freed while tracked, modules added after track)."""

import collections
import gc
import json
import os
import pathlib
import subprocess

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
    assert len(tracker._handles) == hooks_before + 4  # the second optimizer's step and state dict hooks, once
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


def remat_report():
    """The build's remat-report (beside build/python, where remat._C comes from), or REMAT_REPORT."""
    candidates = [os.environ.get("REMAT_REPORT", ""),
                  str(pathlib.Path(remat._C.__file__).resolve().parents[2] / "cli" / "remat-report")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("remat-report is not built (build/cli/remat-report); build the cli target or set REMAT_REPORT")


def test_a_retag_is_a_trace_event_so_the_traces_peak_names_tracked_bytes_by_their_category(tagged, tmp_path):
    report = remat_report()
    model = Net()  # allocated without a category: tracking re-tags it in place
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    param_bytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    param_bytes += sum(b.untyped_storage().nbytes() for b in model.buffers())
    with remat.track(model, optimizer):
        step(model, optimizer, ids())
        remat_alloc.dump_trace(str(tmp_path / "trace.jsonl"))
    events = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()[1:]]
    retags = [e for e in events if e["action"] == "retag"]
    assert len(retags) >= len(list(model.parameters())) + len(list(model.buffers()))
    out = subprocess.run([report, "memory", str(tmp_path / "trace.jsonl"), "--by", "category", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {row["category"]: row for row in json.loads(out.stdout)["memory"]}
    # Every parameter byte is a parameter from its retag on, so at the trace's later peaks too;
    # without the retag events they stayed under the category they were allocated with (none).
    # (Block sizes: each rounded up to 512 bytes.)
    tensors = len(list(model.parameters())) + len(list(model.buffers()))
    assert param_bytes <= rows["parameter"]["live_bytes"] < param_bytes + 512 * tensors
    assert rows["parameter"]["peak_bytes"] >= rows["parameter"]["live_bytes"]
    grads = sum(p.grad.untyped_storage().nbytes() for p in model.parameters())
    assert grads <= rows["gradient"]["live_bytes"] < grads + 512 * tensors  # allocated as backward's temporaries
    assert rows["optimizer_state"]["live_bytes"] >= 2 * grads


def test_gradients_freed_before_the_dump_keep_their_peak_in_the_report(tagged, tmp_path):
    # Gradients are allocated as backward's temporaries and become gradients by a retag alone: with
    # none live at the dump (zero_grad(set_to_none=True)), their category was left out of the trace's
    # report and shown at 0 B peak in the snapshot's, though the allocator counted its peak
    report = remat_report()
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    remat_alloc.reset_peak_stats()  # the peak of these steps, not one an earlier test made
    with remat.track(model, optimizer):
        for _ in range(2):
            step(model, optimizer, ids())
        optimizer.zero_grad(set_to_none=True)
        counted = remat_alloc.category_bytes(at_peak=True)["gradient"]
        remat_alloc.dump_snapshot(str(tmp_path / "snapshot.json"))
        remat_alloc.dump_trace(str(tmp_path / "trace.jsonl"))
    grads = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert counted >= grads
    for dump in ("snapshot.json", "trace.jsonl"):
        out = subprocess.run([report, "memory", str(tmp_path / dump), "--by", "category", "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = {row["category"]: row for row in json.loads(out.stdout)["memory"]}
        assert rows["gradient"]["live_bytes"] == 0 and rows["gradient"]["peak_bytes"] >= grads, (dump, rows)


def test_offloaded_bytes_keep_their_category_and_module_on_the_host(tagged, tmp_path):
    torch.manual_seed(0)
    model = Checkpointed()
    x = torch.rand(8, 64, requires_grad=True)
    off = remat.CpuOffload(min_bytes=0)

    def offloaded_categories():
        remat_alloc.dump_snapshot(str(tmp_path / "snapshot.json"))
        snapshot = json.loads((tmp_path / "snapshot.json").read_text())
        held = {}
        for stat in snapshot["tag_stats"]:
            tag = snapshot["tags"][stat["tag"]]
            if tag["phase"] == "offloaded" and stat["requested_bytes"]["current"]:
                key = (tag.get("category", "none"), snapshot["names"][tag.get("module", 0)])
                held[key] = held.get(key, 0) + stat["requested_bytes"]["current"]
        return held

    with off:
        out = model(x)  # untracked: the host copies have no category, as the tensors they copy
    assert set(offloaded_categories()) == {("none", "")}
    out.square().sum().backward()
    with remat.track(model):
        with off:
            out = model(x)
        held = offloaded_categories()
        resident = off.stats()["resident_host_bytes"]
        assert sum(held.values()) == resident > 0
        # Kept for backward: the save region's relu output, an activation of the model that made it,
        # and the checkpoint's input, the model's input; never the temporary in force at the copy.
        assert held.get(("activation", "Checkpointed"), 0) >= 8 * 256 * 4, held
        assert {category for category, _ in held} <= {"activation", "input"}, held
        out.square().sum().backward()
        assert off.stats()["resident_host_bytes"] == 0


def test_the_c_hooks_name_every_byte_as_the_python_hooks_do_and_what_a_loss_saves_too(tagged, monkeypatch):
    from remat_alloc import _tracking

    assert _tracking._native is not None  # importing remat gives tracking its C++ hooks
    figures = []
    for native in (_tracking._native, None):
        monkeypatch.setattr(_tracking, "_native", native)
        gc.collect()  # what earlier tests left for the collector: the same in both figures
        torch.manual_seed(0)
        model = Net()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with remat.track(model, optimizer) as tracker:
            assert (tracker._native is None) == (native is None)
            step(model, optimizer, ids())
            remat_alloc.reset_peak_stats(0)
            optimizer.zero_grad(set_to_none=True)
            out = model(ids())
            after_forward = remat_alloc.category_bytes(requested=True)
            out.float().logsumexp(-1).mean().backward()
            grad = category_of(model.block.up.weight.grad)
            optimizer.step()
            at_peak = remat_alloc.category_bytes(at_peak=True, requested=True)
            alive = tracker.tracked_storages
        assert remat_alloc.category()[0] == "none"
        assert category_of(model.block.up.weight.grad)[0] != "gradient"  # untrack put the tag back
        figures.append((after_forward, grad, at_peak, alive))
        del model, optimizer, out
        gc.collect()
    # The C++ hooks also name what the loss saves outside the model (the logits logsumexp saves,
    # a temporary of the head for the Python hooks) an activation: the rest is the same.
    (cpp_forward, cpp_grad, cpp_peak, cpp_alive), (py_forward, py_grad, py_peak, py_alive) = figures
    assert (cpp_forward, cpp_grad, cpp_alive) == (py_forward, py_grad, py_alive)
    logits = 4 * 8 * 100 * 4
    assert cpp_peak == dict(py_peak, activation=py_peak["activation"] + logits,
                            temporary=py_peak["temporary"] - logits), (cpp_peak, py_peak)
    assert cpp_forward["activation"] > 0 and cpp_grad == ("gradient", "block.up.weight")


@pytest.mark.parametrize("hooks", ["c++", "python"])
def test_a_saved_tensor_changed_in_place_is_refused_as_autograd_refuses_it(tagged, monkeypatch, hooks):
    from remat_alloc import _tracking

    if hooks == "python":
        monkeypatch.setattr(_tracking, "_native", None)

    class Sigmoid(torch.nn.Module):
        def forward(self, x):
            return torch.sigmoid(x)  # saves its output for backward

    model = Sigmoid()
    x = torch.rand(4, requires_grad=True)
    with remat.track(model):
        y = model(x)
        y.mul_(2)  # changes what backward needs: autograd refuses this without hooks
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        y = model(x)
        y.sum().backward()  # unchanged: the same gradient as without tracking
    s = torch.sigmoid(x.detach())
    assert torch.allclose(x.grad, s * (1 - s))


def test_untrack_clears_the_category_a_backward_that_raised_left_in_force(tagged):
    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("backward failed")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64)
            self.b = torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.b(Fails.apply(self.a(x)))

    model = Model()
    with remat.track(model):
        with pytest.raises(RuntimeError, match="backward failed"):
            model(torch.rand(8, 64)).sum().backward()
    before = remat_alloc.category_bytes()["none"]
    after_untrack = torch.empty(1 << 16)
    assert remat_alloc.category_bytes()["none"] - before == after_untrack.untyped_storage().nbytes()


def test_an_optimizer_checkpoint_saved_while_tracked_loads_with_torch_load_defaults(tagged):
    import io

    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with remat.track(model, optimizer):
        step(model, optimizer, ids())
        saved = optimizer.state_dict()
        # plain dicts and tensors, as untracked: torch.load's weights_only unpickler takes them
        assert {type(value) for value in saved["state"].values()} == {dict}
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optim": saved}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)["optim"]
        assert loaded["param_groups"] == saved["param_groups"]
        assert loaded["state"].keys() == saved["state"].keys()
        for index, state in saved["state"].items():
            assert loaded["state"][index].keys() == state.keys()
            for key, value in state.items():
                assert torch.equal(loaded["state"][index][key], value)
        # the state dict hands out the optimizer's own tensors, which stay its tracked state
        exp_avg = optimizer.state[model.block.up.weight]["exp_avg"]
        assert any(state["exp_avg"] is exp_avg for state in saved["state"].values())
        assert category_of(exp_avg) == ("optimizer_state", "block.up.weight")


def test_optimizer_state_loaded_with_load_state_dict_stays_tracked(tagged):
    import io

    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with remat.track(model, optimizer) as tracker:
        step(model, optimizer, ids())
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        buffer.seek(0)
        checkpoint = torch.load(buffer, weights_only=False)  # outside any module: allocated without a category
        assert category_of(checkpoint["state"][0]["exp_avg"])[0] == "none"
        none_before = remat_alloc.category_bytes(requested=True)["none"]
        optimizer.load_state_dict(checkpoint)  # PyTorch replaces optimizer.state
        state = optimizer.state[model.block.up.weight]
        assert category_of(state["exp_avg"]) == ("optimizer_state", "block.up.weight")
        assert category_of(state["exp_avg_sq"]) == ("optimizer_state", "block.up.weight")
        loaded = sum(v.untyped_storage().nbytes() for s in checkpoint["state"].values() for v in s.values())
        assert remat_alloc.category_bytes(requested=True)["none"] == none_before - loaded
        step(model, optimizer, ids())
        assert category_of(optimizer.state[model.block.up.weight]["exp_avg"]) == ("optimizer_state", "block.up.weight")
        # state replaced some other way: track() again follows the new one
        optimizer.state = collections.defaultdict(dict, {p: dict(s) for p, s in optimizer.state.items()})
        fresh = torch.optim.AdamW(model.parameters(), lr=1e-3).state_dict()  # empty state
        optimizer.state[model.head.weight]["exp_avg"] = torch.zeros(100, 64)
        assert category_of(optimizer.state[model.head.weight]["exp_avg"])[0] != "optimizer_state"
        assert remat.track(model, optimizer) is tracker
        assert category_of(optimizer.state[model.head.weight]["exp_avg"]) == ("optimizer_state", "head.weight")
        optimizer.load_state_dict(fresh)  # an empty state: what the optimizer creates next is tracked
        step(model, optimizer, ids())
        assert category_of(optimizer.state[model.head.weight]["exp_avg"]) == ("optimizer_state", "head.weight")
        tracker.untrack()
    assert type(optimizer.state) is collections.defaultdict
    assert type(optimizer.state[model.head.weight]) is dict
    assert category_of(optimizer.state[model.head.weight]["exp_avg"])[0] != "optimizer_state"


class Stack(torch.nn.Module):
    """Blocks each in a remat checkpoint that keeps only its input: recompute makes the rest."""

    def __init__(self, width=64, depth=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
        return x.square().mean()


@pytest.mark.parametrize("hooks", ["c++", "python"])
def test_what_a_checkpoint_keeps_of_its_inputs_is_an_activation_of_the_module_that_made_it(tagged, monkeypatch, hooks):
    from remat_alloc import _tracking

    if hooks == "python":
        monkeypatch.setattr(_tracking, "_native", None)
    torch.manual_seed(0)
    model = Stack()
    x = torch.rand(8, 64)
    model(x).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    outputs = {}
    handles = [layer.register_forward_hook(lambda module, args, output, index=index: outputs.__setitem__(index, output))
               for index, layer in enumerate(model.layers)]
    with remat.track(model):
        loss = model(x)
        # layers.0 and layers.1 made what checkpoints 1 and 2 keep for recompute; the last block's
        # output is what square() saves
        for index in range(3):
            assert category_of(outputs[index]) == ("activation", f"layers.{index}")
        assert category_of(x) == ("input", "input")
        assert category_of(model.layers[1].up.weight) == ("parameter", "layers.1.up.weight")
        loss.backward()
    for p, grad in zip(model.parameters(), expected):
        assert torch.equal(p.grad, grad)
    outputs.clear()
    model(x)  # untracked: nothing is named
    assert category_of(outputs[0]) == ("none", "")
    for handle in handles:  # the outputs hold graphs that hold the model: nothing left for later tests
        handle.remove()
    outputs.clear()


@pytest.mark.parametrize("hooks", ["c++", "python"])
def test_an_untracked_parameter_a_tracked_forward_saves_keeps_its_tag(tagged, monkeypatch, hooks):
    from remat_alloc import _tracking

    if hooks == "python":
        monkeypatch.setattr(_tracking, "_native", None)
    model = Net()
    with remat.track(model):
        model.block.extra = torch.nn.Linear(64, 64)  # added after track: not tracked
        model.head.weight = torch.nn.Parameter(torch.rand(100, 64))  # replaced after track
        model.block.register_forward_hook(lambda block, args, output: block.extra(output))
        out = model(ids())
        # Linear saves its weight (a view of it) for backward: a parameter, not an activation
        assert category_of(model.block.extra.weight) == ("none", "")
        assert category_of(model.head.weight) == ("none", "")
        assert category_of(model.block.up.weight) == ("parameter", "block.up.weight")
        out.float().sum().backward()
        assert model.block.extra.weight.grad is not None
    assert category_of(model.block.extra.weight) == ("none", "")
    assert category_of(model.head.weight) == ("none", "")


@pytest.mark.parametrize("hooks", ["c++", "python"])
def test_the_users_post_accumulate_grad_hooks_run_beside_tracking_and_after_it(tagged, monkeypatch, hooks):
    # PyTorch keeps one post-accumulate-grad hook per parameter: tracking's own (in C++ where remat
    # is imported) must neither drop the user's hooks from before track nor be replaced by those after.
    from remat_alloc import _tracking

    if hooks == "python":
        monkeypatch.setattr(_tracking, "_native", None)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    weight = model.block.up.weight
    weight.register_post_accumulate_grad_hook(lambda p: calls.append(("before", p.grad is not None)))
    with remat.track(model, optimizer) as tracker:
        if hooks == "c++":
            assert weight._post_accumulate_grad_hooks is not None  # the dict later hooks join
        after = weight.register_post_accumulate_grad_hook(lambda p: calls.append(("after", p.grad is not None)))
        step(model, optimizer, ids())
        assert category_of(weight.grad) == ("gradient", "block.up.weight")
        assert category_of(model.head.weight.grad) == ("gradient", "head.weight")
        assert calls == [("before", True), ("after", True)]
        assert tracker.tracked_storages > 0
    calls.clear()
    step(model, optimizer, ids())  # untracked: the user's hooks still run, the gradient is not re-tagged
    assert [name for name, _ in calls] == ["before", "after"]
    assert category_of(weight.grad)[0] != "gradient"
    after.remove()
    calls.clear()
    step(model, optimizer, ids())
    assert [name for name, _ in calls] == ["before"]


def test_modules_are_tracked_without_hooks_and_a_copy_or_pickle_of_the_model_is_untracked(tagged):
    # Where remat is imported, each module's call goes through TrackCall (its _compiled_call_impl),
    # so PyTorch calls it by its path for modules without hooks; nothing of it survives untrack.
    import copy
    import pickle

    model = Net()
    with remat.track(model):
        for module in model.modules():
            assert not module._forward_pre_hooks and not module._forward_hooks
            assert type(module.__dict__["_compiled_call_impl"]).__name__ == "TrackCall"
        seen = {}
        handle = model.block.up.register_forward_hook(lambda m, a, out: seen.update(up=category_of(out)))
        model(ids())
        handle.remove()
        assert seen["up"][1] == "block.up"  # the user's hook runs inside the module's call
        clone = copy.deepcopy(model)
        restored = pickle.loads(pickle.dumps(model))
        for other in (clone, restored):
            assert all("_compiled_call_impl" not in m.__dict__ for m in other.modules())
            assert torch.equal(other(ids()), model(ids()))
    assert all("_compiled_call_impl" not in m.__dict__ for m in model.modules())


def test_a_forward_that_raises_gives_back_the_category_from_before(tagged):
    class Fails(torch.nn.Module):
        def forward(self, x):
            raise ValueError("forward failed")

    model = Net()
    model.block.up = torch.nn.Sequential(model.block.up, Fails())
    with remat.track(model):
        remat_alloc.set_category("other", "outside")
        with pytest.raises(ValueError, match="forward failed"):
            model(ids())
        assert remat_alloc.category() == ("other", "outside")
        remat_alloc.set_category("none")


def test_a_module_with_its_own_compiled_call_is_tracked_by_hooks_and_keeps_it(tagged):
    # module.compile() sets _compiled_call_impl: such a module is tracked by hooks, its call left as it is.
    model = Net()
    calls = []

    def compiled(*args, **kwargs):
        calls.append(1)
        return type(model.block)._call_impl(model.block, *args, **kwargs)

    model.block._compiled_call_impl = compiled
    seen = {}
    with remat.track(model):
        assert model.block._compiled_call_impl is compiled and model.block._forward_hooks
        handle = model.block.down.register_forward_hook(lambda m, a, out: seen.update(down=category_of(out)))
        out = model(ids())
        handle.remove()
        assert seen["down"][1] == "block.down" and calls == [1]
        out.float().sum().backward()
        assert category_of(model.block.up.weight.grad) == ("gradient", "block.up.weight")
    assert model.block._compiled_call_impl is compiled and not model.block._forward_hooks
    # Compiled after track: not tracked until track is called again, then by hooks.
    with remat.track(model):
        model.block.down._compiled_call_impl = compiled
        assert not model.block.down._forward_hooks
        remat.track(model)
        assert model.block.down._forward_hooks and model.block.down._compiled_call_impl is compiled
    assert not model.block.down._forward_hooks


def test_compiled_autograd_is_refused_with_a_message_and_the_step_runs_without_it(tagged):
    compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")
    if not hasattr(compiled_autograd, "_enable"):
        pytest.skip("this torch has no torch._dynamo.compiled_autograd._enable")
    torch.manual_seed(0)
    model = Net()
    reference = Net()
    reference.load_state_dict(model.state_dict())
    reference(ids()).float().logsumexp(-1).mean().backward()
    with remat.track(model):
        with pytest.raises(NotImplementedError, match="track does not work under compiled autograd"):
            with compiled_autograd._enable(lambda graph: graph):
                model(ids()).float().logsumexp(-1).mean().backward()
        model.zero_grad(set_to_none=True)
        model(ids()).float().logsumexp(-1).mean().backward()  # without it: tracked as ever
        assert category_of(model.block.up.weight.grad) == ("gradient", "block.up.weight")
    assert remat_alloc.category()[0] == "none"
    for param, expected in zip(model.parameters(), reference.parameters()):
        assert torch.equal(param.grad, expected.grad)
