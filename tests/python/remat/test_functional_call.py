"""torch.func.functional_call around checkpoints (MAML's outer step: the model run on weights made
from its parameters and their gradients). A swap for forward alone made recompute in backward read
the module's own parameters again; a swap for backward too made the inner step's recompute, which
the outer backward runs, read the swapped weights: gradients wrong by up to 2.3% of their size,
silently (torch.utils.checkpoint does the same). Recompute now refuses a tensor of another kind
or another parameter where forward read a parameter or a tensor computed before the checkpoint;
the checkpoint's inputs, and the inner step checkpointed with a plain outer step, are as before."""

import contextlib

import pytest
import torch

import remat


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


def _plan_text(decisions):
    import json

    return json.dumps({"kind": "remat-plan", "schema_version": 1, "budget_bytes": 0, "base_bytes": 0, "kept_bytes": 0,
                       "recompute_seconds": 0, "decisions": decisions})
