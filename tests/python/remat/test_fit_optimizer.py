"""remat.fit with an optimizer whose state its first step makes (AdamW): the profiled step's
optimizer.step() is predicted apart from forward and backward. The state it made is allocated
before every later step and counted there once, not again in the optimizer's part of the profile,
and that part is not scaled with the token count. On a model whose step is mostly parameters,
gradients and optimizer state, a budget a little above the measured peak of steps without
checkpointing is accepted at the profiled sequence and at a doubled one, every step's measured
peak stays within it and the predictions hold it within 3%, gradients bitwise those without
checkpointing. (Counting the state twice put the least peak at 3367564 B where steps peak at
2310732 B, and refused a budget of 3100000 B.) State a later optimizer step first makes, for a
branch of the model used from the third step on, is predicted before the step that makes it
(before, that step peaked above its prediction by the branch's moments, and a budget below its
peak was run over instead of refused)."""

import gc
import warnings

import pytest
import torch

import remat
import remat_alloc

WIDTH, BATCH, SEQUENCE, STEPS, LONGER_FROM = 128, 4, 16, 6, 3
BRANCH_WIDTH, BRANCH_FROM = 16, 2


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Linear(WIDTH, WIDTH)
        self.mlp = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = remat.region(lambda t: self.attn(t).sin() + t, "attn")(x)
        return remat.region(lambda t: self.mlp(t).cos() + t, "mlp")(h)


class Model(torch.nn.Module):
    def __init__(self, checkpointed):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(4))
        self.branch = torch.nn.Linear(WIDTH, BRANCH_WIDTH)  # used from `branch_from` on (train())
        self.use_branch = False
        self.checkpointed = checkpointed

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x) if self.checkpointed else layer(x)
        if self.use_branch:
            x = x + self.branch(x[:1, :1]).mean()
        return x.square().mean()


def train(budget, longer_from=LONGER_FROM, branch_from=STEPS, foreach=None, rows=None):
    """AdamW steps (the sequence doubles at `longer_from`, the branch is used from `branch_from`
    on) inside tag_cpu_tensors(): per step (appended to `rows` as each ends) the measured peak,
    fit's prediction (None where profiled or without fit) and the gradients as bytes; and the
    warnings."""
    gc.collect()
    torch.manual_seed(0)
    rows = [] if rows is None else rows
    with remat.tag_cpu_tensors(), warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        model = Model(checkpointed=budget is not None)
        if budget is not None:
            model = remat.fit(model, budget=budget)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
        for step in range(STEPS):
            sequence = SEQUENCE * (2 if step >= longer_from else 1)
            model.use_branch = step >= branch_from
            x = torch.randn(BATCH, sequence, WIDTH, generator=torch.Generator().manual_seed(step), requires_grad=True)
            remat_alloc.reset_peak_stats()
            optimizer.zero_grad(set_to_none=True)
            model(x).backward()
            optimizer.step()
            peak = remat_alloc.memory_stats()["requested_bytes_peak"]
            state = getattr(model, "remat_fit", None)
            rows.append({"peak": peak, "predicted": None if state is None else state.predicted_peak_bytes,
                         "grads": [p.grad.numpy().tobytes() for p in model.parameters() if p.grad is not None]})
        if budget is not None:
            remat.unfit(model)
    return rows, [str(w.message) for w in told]


def test_the_optimizer_state_made_in_the_profiled_step_is_counted_once():
    free, _ = train(None)
    longest = max(row["peak"] for row in free)
    assert longest == max(row["peak"] for row in free[LONGER_FROM:]) > free[0]["peak"]
    budget = longest * 105 // 100
    rows, told = train(budget)  # refused before the fix: the least peak then counted the state twice
    for step, (row, want) in enumerate(zip(rows, free)):
        assert row["peak"] <= budget, (step, row["peak"], budget)
        assert row["grads"] == want["grads"], step  # bitwise those without checkpointing
        if row["predicted"] is not None:  # planned steps: the prediction holds, within 3%
            assert row["peak"] <= row["predicted"] <= budget, (step, row)
            assert row["predicted"] <= row["peak"] * 1.03, (step, row)
    planned = [step for step, row in enumerate(rows) if row["predicted"] is not None]
    assert 1 in planned and LONGER_FROM + 1 in planned, planned
    assert len([message for message in told if "inputs changed shape" in message]) == 1, told


def test_a_budget_below_what_the_optimizer_step_needs_names_the_least_peak():
    free, _ = train(None)
    short = free[1]["peak"]  # a step after the first: the state is there
    rows = []
    try:
        train(short * 90 // 100)
    except ValueError as error:
        rows.append(str(error))
    assert rows and "no plan keeps this step within the budget" in rows[0], rows
    least = int(rows[0].split("Give a budget of at least ")[1].split(" bytes")[0])
    # The least peak counts the state once: about a step's peak without checkpointing, not above it
    # by the state again
    assert short * 0.9 < least <= short * 1.03, (least, short)


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
def test_state_first_made_for_a_branch_used_from_a_later_step_is_predicted(foreach):
    free, _ = train(None, longer_from=STEPS, branch_from=BRANCH_FROM, foreach=foreach)
    without, with_branch = free[BRANCH_FROM - 1]["peak"], free[BRANCH_FROM]["peak"]
    # The branch's first optimizer step makes its state (AdamW's two moments) beside its gradient
    assert with_branch - without >= 3 * sum(p.numel() * 4 for p in Model(False).branch.parameters())
    budget = with_branch * 101 // 100
    rows, told = train(budget, longer_from=STEPS, branch_from=BRANCH_FROM, foreach=foreach)
    for step, (row, want) in enumerate(zip(rows, free)):
        assert row["peak"] <= budget, (step, row["peak"], budget)
        assert row["grads"] == want["grads"], step  # bitwise those without checkpointing
        if step:  # planned: the prediction holds, within 3% (the state counted from before it is made)
            assert row["peak"] <= row["predicted"] <= budget, (step, row)
            assert row["predicted"] <= row["peak"] * 1.03, (step, row)
    assert not [message for message in told if "over the budget" in message], told


def test_a_budget_the_branch_state_leaves_no_room_in_is_refused_before_the_step_that_makes_it():
    free, _ = train(None, longer_from=STEPS, branch_from=BRANCH_FROM)
    budget = free[BRANCH_FROM]["peak"] - 4096  # the optimizer step that makes the branch's state peaks above
    rows = []
    with pytest.raises(ValueError) as refused:
        train(budget, longer_from=STEPS, branch_from=BRANCH_FROM, rows=rows)
    # Refused before the forward of the first planned step, none of which had run over the budget
    assert len(rows) == 1 and rows[0]["peak"] <= budget, (rows, budget)
    message = str(refused.value)
    assert "no plan keeps this step within the budget" in message, message
    assert "makes the optimizer's state for parameters that have none yet" in message, message
    least = int(message.split("Give a budget of at least ")[1].split(" bytes")[0])
    assert free[BRANCH_FROM]["peak"] <= least <= free[BRANCH_FROM]["peak"] * 1.03, (least, free[BRANCH_FROM])


def test_a_fused_optimizer_step_that_leaves_the_version_counters_is_seen():
    """AdamW(fused=True) on the CPU steps without changing the parameters' version counters, by
    which fit saw an optimizer step: every step was then planned as if the first optimizer step
    (predicted on stand-ins, for-loop, with its temporaries) might follow, and a budget 3% above
    the uncheckpointed loop's peak was refused. torch.optim's step hook
    says so now: every step within the budget, gradients bitwise those without checkpointing."""
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

        def forward(self, x):
            h = remat.region(lambda t: torch.relu(self.a(t)), "a")(x)
            return remat.region(lambda t: torch.tanh(self.b(t)) + t, "b")(h)

    def loop(budget):
        with remat.tag_cpu_tensors():
            torch.manual_seed(0)
            layers = torch.nn.ModuleList(Wide() for _ in range(3))

            def run(x):
                for index, layer in enumerate(layers):
                    x = remat.checkpoint(region_name=f"l{index}")(layer)(x) if budget else layer(x)
                return x.square().mean()

            model = torch.nn.Module()
            model.layers, model.forward = layers, run
            model = remat.fit(model, budget=budget) if budget else model
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            rows = []
            for step in range(3):
                x = torch.randn(4, 32, 256, generator=torch.Generator().manual_seed(step))
                remat_alloc.reset_peak_stats()
                optimizer.zero_grad(set_to_none=True)
                model(x).backward()
                optimizer.step()
                rows.append((remat_alloc.memory_stats()["requested_bytes_peak"],
                             [p.grad.numpy().tobytes() for p in model.parameters()]))
            return rows

    free = loop(None)
    budget = max(peak for peak, _ in free) * 103 // 100
    rows = loop(budget)
    assert all(peak <= budget for peak, _ in rows), ([peak for peak, _ in rows], budget)
    assert [grads for _, grads in rows] == [grads for _, grads in free]
