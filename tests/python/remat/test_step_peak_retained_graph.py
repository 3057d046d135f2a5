"""Steps with more than one backward over one forward (backward(retain_graph=True), then another):
the retained graph keeps what every checkpoint kept until the last backward, which recomputes
again what a plan does not keep. The profile follows each call through every backward, so plans
by step peak reach below the all-saved peak (before, every checkpoint counted as held by code
outside the checkpoints after the first backward: the least peak was the all-saved one and every
smaller budget was refused), the measured peak stays within the budget and the prediction, and
gradients are bitwise those of the all-saved step. remat.fit plans such a training loop within
budgets it refused before."""

import contextlib
import itertools
import json

import pytest
import torch

import remat

import fit_loop
from test_step_peak_plans import layer, readme_model


def two_losses(x):
    """The README's four layers with a loss after the second and one after the last."""
    outputs = []
    for index in range(4):
        x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
        outputs.append(x)
    return outputs[1].sum(), outputs[3].sum()


def one_loss_twice(x):
    loss = readme_model(x)
    return loss, loss


@pytest.mark.parametrize("losses, retain_last", [(one_loss_twice, False), (two_losses, False), (two_losses, True)],
                         ids=["one loss twice", "a loss midway, then the last", "both retained"])
def test_plans_by_peak_of_a_step_with_two_backwards_hold_their_budget(losses, retain_last):
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        x = torch.randn(64, 256, requires_grad=True)

        def step(plan=None):
            x.grad = None
            with remat.use_plan(plan) if plan is not None else contextlib.nullcontext():
                first, last = losses(x)
                first.backward(retain_graph=True)
                last.backward(retain_graph=retain_last)

        with remat.profile_regions() as profile:
            step()
        reference = x.grad.numpy().tobytes()
        x.grad = None
        least, most = profile.least_peak_bytes(), profile.step_peak_bytes
        # Recomputing frees more than 30% of the all-saved peak (nothing, before)
        assert least < most * 7 // 10, (least, most)
        decisions = set()
        for budget in [least + (most - least) * i // 4 for i in range(5)]:
            plan = profile.plan(peak_bytes=budget)
            assert plan.peak_bytes <= budget
            measured = max(fit_loop.peak_of(lambda: step(plan)), fit_loop.peak_of(lambda: step(plan)))
            assert measured <= plan.peak_bytes * 1.03, (budget, plan.peak_bytes, measured)
            assert x.grad.numpy().tobytes() == reference
            decisions.add(tuple(plan.decisions.values()))
        assert len(decisions) > 2


def test_fit_plans_a_training_loop_with_two_backwards_a_step_within_budgets_it_refused_before():
    x = torch.randn(1024, 64)

    def train(budget):
        with fit_loop.fitted(lambda: fit_loop.CheckpointedLayers([fit_loop.Layer(64) for _ in range(6)]),
                             budget) as (model, told):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

            def step():
                optimizer.zero_grad(set_to_none=True)
                loss = model(x)
                loss.backward(retain_graph=True)
                (loss * 0.5).backward()
                optimizer.step()

            peaks = [fit_loop.peak_of(step) for _ in range(4)]
            gradients = [p.grad.numpy().tobytes() for p in model.parameters()]
            fit_loop.unfit(model, x)
            return peaks, gradients, fit_loop.messages(told, "remat.fit")

    saved_peaks, reference, _ = train("1 GiB")  # every region saved: the profiled step again and again
    # Half the all-saved step's peak (it was refused: the least peak counted was the all-saved one)
    budget = saved_peaks[-1] // 2
    peaks, gradients, told = train(budget)
    assert peaks[0] == saved_peaks[0]  # the profiled step
    assert max(peaks[1:]) <= budget < saved_peaks[-1], (peaks, budget)
    assert gradients == reference
    assert not [m for m in told if "over the budget" in m and "profiled step" not in m], told


def penalty_then_backward(loss, x):
    """A gradient penalty (WGAN-GP, R1): the input's gradient made with create_graph=True, then a
    backward through the loss and the penalty."""
    grad, = torch.autograd.grad(loss, x, create_graph=True)
    (loss + grad.square().sum()).backward()


def penalty_alone(loss, x):
    """A backward through the input's gradient alone (the loss's graph kept, not run again)."""
    grad, = torch.autograd.grad(loss, x, create_graph=True)
    grad.square().sum().backward()


@pytest.mark.parametrize("backwards", [penalty_then_backward, penalty_alone], ids=["penalty and loss", "penalty alone"])
def test_plans_by_peak_of_a_step_with_a_backward_that_creates_a_graph_hold_their_prediction(backwards):
    """The graph a backward run with create_graph=True makes holds what recompute made there (what
    the regions' ops saved) until the later backward; before, plans that recompute peaked up to
    20% above their prediction (3866700 B measured, 3211340 B predicted for the least)."""
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        x = torch.randn(64, 256, requires_grad=True)

        def step(plan=None):
            x.grad = None
            with remat.use_plan(plan) if plan is not None else contextlib.nullcontext():
                backwards(readme_model(x), x)

        with remat.profile_regions() as profile:
            step()
        reference = x.grad.numpy().tobytes()
        least, most = profile.least_peak_bytes(), profile.step_peak_bytes
        assert least < most * 9 // 10, (least, most)  # recompute still lowers the peak
        for budget in [least + (most - least) * i // 4 for i in range(5)]:
            plan = profile.plan(peak_bytes=budget)
            assert plan.peak_bytes <= budget
            measured = max(fit_loop.peak_of(lambda: step(plan)), fit_loop.peak_of(lambda: step(plan)))
            assert measured <= plan.peak_bytes * 1.03, (budget, plan.peak_bytes, measured)
            assert x.grad.numpy().tobytes() == reference


class ReadmeLayers(torch.nn.Module):
    """The README's four layers (elementwise regions) with a learned scale in front."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(256))

    def forward(self, x):
        return readme_model(x * self.scale)


def test_fit_keeps_a_training_loop_with_a_gradient_penalty_within_its_budget():
    """Every planned step of a loop with a gradient penalty peaks within the budget, and none is
    said to have gone over it (before: the first planned step went over, and later ones planned
    lower by what it went over)."""
    torch.manual_seed(1)
    x = torch.randn(64, 256, requires_grad=True)

    def train(budget):
        with fit_loop.fitted(ReadmeLayers, budget) as (model, told):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

            def step():
                optimizer.zero_grad(set_to_none=True)
                x.grad = None
                penalty_then_backward(model(x), x)
                optimizer.step()

            peaks = [fit_loop.peak_of(step) for _ in range(4)]
            gradients = [p.grad.numpy().tobytes() for p in model.parameters()]
            fit_loop.unfit(model, x.detach())
            return peaks, gradients, fit_loop.messages(told, "remat.fit")

    with fit_loop.fitted(ReadmeLayers, None) as (model, _):
        with remat.profile_regions() as profile:
            penalty_then_backward(model(x), x)
    saved_peaks, reference, _ = train("1 GiB")
    budget = (profile.least_peak_bytes() + saved_peaks[-1]) // 2
    peaks, gradients, told = train(budget)
    assert max(peaks[1:]) <= budget < saved_peaks[-1], (peaks, budget)
    assert gradients == reference
    assert not [m for m in told if "over the budget" in m and "profiled step" not in m], told


class UpDown(torch.nn.Module):
    """A block whose region "up" saves nothing (repeat, scale) and whose region "down" saves up's
    output (a linear reads it): where up recomputes and down is saved, down's backward reads
    recompute's copy of it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(256, 64)

    def forward(self, x):
        y = remat.region(lambda t: t.repeat(1, 4) * 3, "up")(x)
        return remat.region(lambda u: torch.tanh(self.linear(u)), "down")(y)


@pytest.mark.parametrize("penalties", [1, 2], ids=["gradient-norm penalty", "two penalties"])
def test_the_prediction_bounds_a_penalty_on_parameter_gradients_whatever_the_plan_recomputes(penalties):
    """Gradients w.r.t. parameters with create_graph=True: the graph holds recompute's copy of an
    input a saved region read (27% over the prediction before), and a second such backward holds
    copies of its own (8.5-50% over). Every plan of the 16 over four blocks' "up" and "down": the
    measured peak at most the prediction (+3%), gradients bitwise those of the profiled step."""
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        blocks = torch.nn.ModuleList([UpDown() for _ in range(2)])
        params = list(blocks.parameters())
        x = torch.randn(1024, 64)

        def step(plan=None):
            for p in params:
                p.grad = None
            with remat.use_plan(plan) if plan is not None else contextlib.nullcontext():
                h = x
                for index, block in enumerate(blocks):
                    h = remat.checkpoint(region_name=f"blocks.{index}")(block)(h)
                loss = h.square().mean()
                penalty = 0
                for number in range(penalties):
                    grads = torch.autograd.grad(loss * (number + 1), params, create_graph=True, retain_graph=True)
                    penalty = penalty + sum(g.square().sum() for g in grads)
                (loss + penalty).backward()

        with remat.profile_regions() as profile:
            step()
        reference = [p.grad.numpy().tobytes() for p in params]
        names = [region.name for region in profile.regions]
        for choices in itertools.product(["save", "recompute"], repeat=len(names)):
            plan = remat.load_plan(json.dumps({"kind": "remat-plan", "schema_version": 1, "budget_bytes": 0,
                                               "base_bytes": 0, "kept_bytes": 0, "recompute_seconds": 0,
                                               "decisions": dict(zip(names, choices))}))
            predicted = profile.predict_peak(plan)
            measured = max(fit_loop.peak_of(lambda: step(plan)), fit_loop.peak_of(lambda: step(plan)))
            assert measured <= predicted * 1.03, (choices, predicted, measured)
            assert [p.grad.numpy().tobytes() for p in params] == reference, choices
