"""Recompute state hooks: snapshot at checkpoint entry and after each save region, restored at
the matching points in recompute, and the state backward had put back afterwards; with the
RNG in a hook, dropout gives bitwise the gradients it gives without checkpointing."""

import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import remat
from transformer_block import Block, assert_bitwise_equal, gradients


def dropout_reference(block, x):
    """Gradients of the block with dropout 0.3 and no checkpointing, from seed 7."""
    torch.manual_seed(7)
    block.forward(x, dropout=0.3).pow(2).sum().backward()
    return gradients(block, x)


def run_dropout_checkpoint(block, x, name, hooks):
    torch.manual_seed(7)

    def body(t):
        y = remat.region(block.attention, "attention", recompute=False)(t)
        return remat.region(lambda u: block.mlp(u, 0.3), "mlp")(y)

    out = remat.checkpoint(region_name=name, recompute_state_hooks=hooks)(body)(x)
    torch.rand(3)  # the caller moves the generator on before backward
    out.pow(2).sum().backward()
    return gradients(block, x)


class TorchRngHook(remat.RecomputeStateHook):
    """The CPU generator's state through PyTorch's Python API."""

    def snapshot(self):
        return torch.get_rng_state()

    def restore(self, state):
        torch.set_rng_state(state)


def test_dropout_with_cpu_rng_state_hook_gives_bitwise_equal_gradients():
    block = Block()
    x = torch.randn(2, 6, 16, requires_grad=True)
    expected = dropout_reference(block, x)
    actual = run_dropout_checkpoint(block, x, "hooks.dropout.native", [remat.cpu_rng_state_hook()])
    assert_bitwise_equal(actual, expected)


def test_dropout_with_a_python_state_hook_subclass_gives_bitwise_equal_gradients():
    block = Block()
    x = torch.randn(2, 6, 16, requires_grad=True)
    expected = dropout_reference(block, x)
    actual = run_dropout_checkpoint(block, x, "hooks.dropout.python", [TorchRngHook()])
    assert_bitwise_equal(actual, expected)


def test_without_a_hook_dropout_in_recompute_draws_a_different_mask():
    block = Block()
    x = torch.randn(2, 6, 16, requires_grad=True)
    expected = dropout_reference(block, x)
    actual = run_dropout_checkpoint(block, x, "hooks.dropout.none", [])
    assert not torch.equal(actual[8], expected[8])  # w1 sees a different mask


def test_the_cuda_rng_hook_beside_the_cpu_one_changes_nothing_on_the_cpu_and_leaves_cuda_uninitialized():
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialized in this process already")
    block = Block()
    x = torch.randn(2, 6, 16, requires_grad=True)
    expected = dropout_reference(block, x)
    actual = run_dropout_checkpoint(block, x, "hooks.dropout.cpu-and-cuda",
                                    [remat.cpu_rng_state_hook(), remat.cuda_rng_state_hook()])
    assert_bitwise_equal(actual, expected)
    assert not torch.cuda.is_initialized()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dropout_on_cuda_with_the_cuda_rng_state_hook_gives_bitwise_equal_gradients():
    x = torch.rand(4096, device="cuda", requires_grad=True)

    def body(t):
        return torch.nn.functional.dropout(t.exp(), 0.5, training=True).sin()

    torch.manual_seed(7)
    body(x).sum().backward()
    expected, x.grad = x.grad, None
    torch.manual_seed(7)
    out = remat.checkpoint(region_name="hooks.dropout.cuda", recompute_state_hooks=[remat.cuda_rng_state_hook()])(body)(x)
    torch.rand(3, device="cuda")  # the caller moves the generator on before backward
    out.sum().backward()
    assert torch.equal(x.grad, expected)


def test_a_plan_recomputing_a_saved_dropout_region_on_the_cpu_is_bitwise_and_makes_no_cuda_context():
    """Under a plan the runtime keeps the CPU generator and the CUDA generators of devices that have
    a context: a step on CPU tensors draws forward's mask again and never starts CUDA (on a GPU
    machine: no context on any device). In a process of its own, where nothing used CUDA before."""
    script = textwrap.dedent("""
        import torch
        import remat
        from transformer_block import Block, gradients

        block = Block()
        x = torch.randn(2, 6, 16, requires_grad=True)

        def step(plan=None):
            def body(t):
                y = remat.region(block.attention, "attention")(t)
                return remat.region(lambda u: block.mlp(u, 0.3), "mlp", recompute=False)(y)
            torch.manual_seed(7)
            out = remat.checkpoint(region_name="planned.dropout", plan=plan)(body)(x)
            torch.rand(3)  # the caller moves the generator on before backward
            out.pow(2).sum().backward()
            return gradients(block, x)

        torch.manual_seed(7)
        block.forward(x, dropout=0.3).pow(2).sum().backward()
        expected = gradients(block, x)
        with remat.profile_regions() as profile:
            step()
        plan = profile.plan(budget_bytes=profile.base_bytes)
        assert plan.recompute_of("planned.dropout::mlp"), plan.format()
        actual = step(plan)
        assert all(torch.equal(a, e) for a, e in zip(actual, expected)), "gradients differ"
        assert not torch.cuda.is_initialized(), "CUDA was initialized"
        if torch.cuda.is_available():
            contexts = [torch._C._cuda_hasPrimaryContext(d) for d in range(torch.cuda.device_count())]
            assert not any(contexts), f"a CUDA context was created: {contexts}"
        print("ok")
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=__file__.rsplit("/", 1)[0])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_rng_hook_leaves_the_generator_where_backward_found_it():
    x = torch.rand(64, requires_grad=True)
    out = remat.checkpoint(region_name="hooks.generator-after", recompute_state_hooks=[remat.cpu_rng_state_hook()])(lambda t: torch.nn.functional.dropout(t.exp(), 0.5, training=True).sum())(x)
    torch.manual_seed(123)
    state_before_backward = torch.get_rng_state()
    out.backward()
    assert torch.equal(torch.get_rng_state(), state_before_backward)


class CounterHook(remat.RecomputeStateHook):
    """Counts through a shared list so the test sees every snapshot and restore."""

    def __init__(self, state, events):
        self.state = state
        self.events = events

    def snapshot(self):
        self.events.append(f"snapshot {self.state[0]}")
        return self.state[0]

    def restore(self, value):
        self.state[0] = value
        self.events.append(f"restore {value}")


def test_snapshots_at_entry_and_after_save_regions_restore_them_in_recompute_then_put_the_outer_state_back():
    counter = [0]
    events = []
    seen_in_recompute = []
    x = torch.rand(4, requires_grad=True)

    def saved(t):
        counter[0] += 10
        return t * 2.0

    def body(t):
        counter[0] += 1  # 1
        a = remat.region(saved, "saved", recompute=False)(t)
        if remat.is_recomputing():
            seen_in_recompute.append(counter[0])
        counter[0] += 100
        return remat.region(lambda u: u.exp().sum(), "recomputed")(a)

    out = remat.checkpoint(region_name="hooks.counter", recompute_state_hooks=[CounterHook(counter, events)])(body)(x)
    assert counter[0] == 111
    counter[0] = 5000  # state at recompute time, which recompute must leave as it found it
    out.backward()
    assert counter[0] == 5000
    assert seen_in_recompute == [11]  # restored to the state after "saved"
    assert events == ["snapshot 0", "snapshot 11", "snapshot 5000", "restore 0", "restore 11", "restore 5000"]
    assert torch.equal(x.grad, (x.detach() * 2.0).exp() * 2.0)


def test_an_object_with_snapshot_and_restore_works_without_subclassing():
    class Duck:
        def __init__(self):
            self.value = 1
            self.restored = []

        def snapshot(self):
            return self.value

        def restore(self, state):
            self.restored.append(state)
            self.value = state

    duck = Duck()
    x = torch.rand(4, requires_grad=True)
    out = remat.checkpoint(region_name="hooks.duck", recompute_state_hooks=[duck])(lambda t: t.exp().sum())(x)
    duck.value = 2
    out.backward()
    assert duck.restored == [1, 2]  # forward's state for recompute, then backward's back
    assert duck.value == 2


def test_a_subclass_that_defines_no_snapshot_fails_at_checkpoint_entry_naming_itself():
    class Incomplete(remat.RecomputeStateHook):
        pass

    x = torch.rand(4, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"^Incomplete must define snapshot\(\)$"):
        remat.checkpoint(region_name="hooks.incomplete", recompute_state_hooks=[Incomplete()])(lambda t: t.exp().sum())(x)


def test_is_recomputing_is_true_only_while_recompute_runs_the_body():
    seen = []
    x = torch.rand(4, requires_grad=True)

    def body(t):
        seen.append(remat.is_recomputing())
        return t.exp().sum()

    out = remat.checkpoint(region_name="hooks.is-recomputing")(body)(x)
    assert remat.is_recomputing() is False
    out.backward()
    assert seen == [False, True]
    assert remat.is_recomputing() is False


def test_a_recompute_that_draws_random_numbers_without_a_state_hook_is_said_once_per_checkpoint():
    """Without an RNG state hook, dropout in a recomputed region draws other masks in recompute:
    the gradients are not those without checkpointing, and the runtime says so (once per
    checkpoint) instead of leaving it silent. Draws in save regions are not made again, and a
    checkpoint with the hook draws forward's."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    drop = torch.nn.Dropout(0.5)
    x = torch.rand(4, 8, requires_grad=True)

    def body(recompute):
        return lambda t: remat.region(lambda u: drop(lin(u)).tanh(), "mlp", recompute=recompute)(t)

    def said(name, recompute=True, hooks=()):
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            torch.manual_seed(1)
            remat.checkpoint(region_name=name, recompute_state_hooks=hooks)(body(recompute))(x).sum().backward()
            torch.manual_seed(1)
            remat.checkpoint(region_name=name, recompute_state_hooks=hooks)(body(recompute))(x).sum().backward()
        return [str(w.message) for w in told if "drew random numbers" in str(w.message)]

    told = said("drops.unkept")
    assert len(told) == 1 and told[0].startswith(
        "checkpoint 'drops.unkept' drew random numbers in recompute (dropout, or another random op outside its save "
        "regions) and keeps no RNG state"), told
    assert "checkpoint(recompute_state_hooks=...) holding remat.cpu_rng_state_hook()" in told[0]
    assert said("drops.kept", hooks=[remat.cpu_rng_state_hook()]) == []
    assert said("drops.saved", recompute=False) == []


@pytest.mark.parametrize("draws", [1, 623, 624, 625, 1248])
def test_a_recompute_drawing_any_count_of_numbers_is_said_a_whole_turn_of_the_engine_too(draws):
    """The check reads where the CPU engine is, not its whole state: `draws` numbers drawn in
    recompute only (randint below 2**32 takes one 32-bit number an element) are said, 624 and 1248
    among them, which bring the engine back to where it was in a state made anew."""
    calls = []

    def body(t):
        calls.append(1)
        if len(calls) == 2:  # in recompute only
            torch.randint(0, 10, (draws,))
        return t.exp()

    x = torch.rand(8, requires_grad=True)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        remat.checkpoint(region_name=f"draws.{draws}")(body)(x).sum().backward()
    assert len(calls) == 2
    assert sum("drew random numbers" in str(w.message) for w in told) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("made, warned", [("torch.ones(1, device='cuda')", False),
                                          ("torch.rand(1, device='cuda')", True)])
def test_a_recompute_that_first_starts_cuda_warns_only_where_it_draws_there(made, warned):
    """Forward on CPU tensors with no CUDA context; the recompute starts one (a CUDA tensor made
    there). A generator that did not exist at the snapshot drew nothing unless its offset moved:
    no warning for a tensor of ones, one for a random one. In a process of its own, where nothing
    used CUDA before."""
    script = textwrap.dedent(f"""
        import warnings
        import torch
        import remat

        calls = []
        def body(t):
            calls.append(1)
            if len(calls) == 2:  # in recompute only
                {made}
            return t.exp()

        x = torch.rand(8, requires_grad=True)
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            remat.checkpoint(region_name="starts.cuda")(body)(x).sum().backward()
        assert len(calls) == 2 and torch.cuda.is_initialized(), calls
        print(sum("drew random numbers" in str(w.message) for w in told))
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(int(warned)), done.stdout + done.stderr


def test_a_generator_of_the_callers_own_is_kept_by_its_hook():
    """A body drawing from its own torch.Generator: the default generators' hooks leave it alone,
    so recompute drew other numbers (gradients wrong, without a warning); generator_state_hook(g)
    keeps it."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(8, 8, requires_grad=True)

    def body(t):
        noise = torch.rand(t.shape, generator=generator)
        return ((t @ weight) * noise).tanh()

    def gradients(run):
        generator.manual_seed(3)
        weight.grad = None
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        run(x).square().sum().backward()
        return x.grad, weight.grad.clone()

    expected = gradients(body)
    hooked = remat.checkpoint(region_name="noisy", recompute_state_hooks=[remat.generator_state_hook(generator)])
    assert all(torch.equal(a, b) for a, b in zip(gradients(hooked(body)), expected))
    default_only = remat.checkpoint(region_name="noisy2", recompute_state_hooks=[remat.cpu_rng_state_hook()])
    assert not all(torch.equal(a, b) for a, b in zip(gradients(default_only(body)), expected))
    with pytest.raises(TypeError, match="generator_state_hook takes a torch.Generator; it was given int"):
        remat.generator_state_hook(3)
