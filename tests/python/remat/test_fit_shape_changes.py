"""remat.fit with inputs whose shape changes back and forth: a step with no profile of its own plans
from the profile nearest to it (the largest of smaller inputs, scaled up; else the smallest of
larger ones), not from the one made last. A shorter step plans from the longer profile as it is
(it was profiled again, at several times a step's cost, where that profile saving everything fit
the budget), and a longer step is profiled again only from twice the nearest profile's elements
and where every smaller profile, scaled, predicts saving everything within the budget. The loop keeps the last
loss (and with it the last batch and its gradient) until the next forward returns, as a loop that
assigns `loss = model(x)` does: a profile of a step that follows a longer one begins with those
tensors and frees them during its step."""

import pytest
import torch


import fit_loop

WIDTH = 32


class Model(fit_loop.CheckpointedLayers):
    def __init__(self, checkpointed=True):
        super().__init__([fit_loop.Layer(WIDTH) for _ in range(3)], checkpointed)


def batch(step, rows):
    return torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(step), requires_grad=True)


def train(budget, rows_per_step, checkpointed=True):
    """Per step: the measured peak (a profiled step's: its profile's), the gradients, whether it was
    planned, the error it raised; and the warnings and the profiles."""
    rows = []
    with fit_loop.fitted(lambda: Model(checkpointed), budget) as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss = None
        for step, count in enumerate(rows_per_step):
            x = batch(step, count)
            row = {"error": None, "planned": False, "grads": None}

            def one_step():
                nonlocal loss
                optimizer.zero_grad(set_to_none=True)
                try:
                    loss = model(x)
                except ValueError as error:
                    row["error"] = str(error)
                    return
                loss.backward()
                optimizer.step()

            row["peak"] = fit_loop.peak_of(one_step)
            state = getattr(model, "remat_fit", None)
            if row["error"] is None:
                row["grads"] = [p.grad.numpy().tobytes() for p in model.parameters()]
                row["planned"] = state is not None and state.plan is not None
            rows.append(row)
            del x
        state = fit_loop.unfit(model, batch(0, 8))
    profiles = {} if state is None else state.profiles
    for row, count in zip(rows, rows_per_step):
        if budget is not None and row["error"] is None and not row["planned"]:
            row["peak"] = profiles[(((count, WIDTH), torch.float32, "cpu"),)].profile.step_peak_bytes
    return rows, fit_loop.messages(told, "remat.fit"), profiles


@pytest.fixture(scope="module")
def figures():
    """The all-saved peak of a 128-row step after a 64-row one, and the least peak a plan reaches
    at 128 rows (the 128-row step profiled, under a budget every plan meets)."""
    rows, _, profiles = train("1GiB", [64, 128])
    long = profiles[(((128, WIDTH), torch.float32, "cpu"),)]
    return rows[1]["peak"], long.profile.least_peak_bytes()


@pytest.mark.parametrize("rows_per_step", [[64, 128, 32, 128], [64, 32, 128, 128]])
def test_a_longer_step_after_a_shorter_profile_plans_from_the_nearest_profile_within_the_budget(
        figures, rows_per_step):
    all_saved, least = figures
    budget = least + (all_saved - least) // 2  # the 128-row step must recompute some region
    plain, _, _ = train(None, rows_per_step, checkpointed=False)
    rows, told, profiles = train(budget, rows_per_step)
    assert [row["error"] for row in rows] == [None] * len(rows), told
    for step, (row, reference) in enumerate(zip(rows, plain)):
        if step > 0:
            assert row["peak"] <= budget, (step, row["peak"], budget, told)
        assert row["grads"] == reference["grads"], step
    # The 128-row steps are planned (from the 64-row profile scaled by 2), never profiled saving everything;
    # the 32-row step from the 64-row profile as it is
    assert [row["planned"] for row in rows[1:]] == [True, True, True]
    assert sorted(signature[0][0][0] for signature in profiles) == [64]
    scaled = [message for message in told if "-> 128x32" in message]
    assert len(scaled) == 1 and "(64x32 -> 128x32, 2x the elements): saving every region is predicted over" \
        in scaled[0], told


def test_a_step_four_times_the_profiled_one_counts_the_gradients_once():
    """The parameters' gradients keep their size whatever the inputs: a 64-row step planned from a
    16-row profile (4x the elements) counts them once, not 4 times. Scaled whole, the least plan was
    predicted at 801828 bytes where the 64-row step reaches 522376, and a budget halfway from there
    to everything saved was refused before the forward."""
    _, _, profiles = train("1GiB", [16, 64])  # profiled again at 64 rows, with the momentum there
    long = profiles[(((64, WIDTH), torch.float32, "cpu"),)].profile
    least, all_saved = long.least_peak_bytes(), long.step_peak_bytes
    budget = least + (all_saved - least) // 2
    plain, _, _ = train(None, [16, 64, 64], checkpointed=False)
    rows, told, _ = train(budget, [16, 64, 64])
    assert [row["error"] for row in rows] == [None] * 3, told
    assert [row["planned"] for row in rows[1:]] == [True, True]
    for step, (row, reference) in enumerate(zip(rows, plain)):
        if step > 0:
            assert row["peak"] <= budget, (step, row["peak"], budget, told)
        assert row["grads"] == reference["grads"], step
    scaled = [message for message in told if "-> 64x32" in message]
    assert len(scaled) == 1 and "the plan comes from the profile scaled by 4" in scaled[0], told


def test_a_shorter_step_planned_from_a_longer_profile_runs_under_its_plan_not_as_a_step_that_differs(figures):
    """A 64-row step with only the 128-row profile plans from it as it is (what grows with the
    inputs is not taken to shrink with them): its sizes are not the profile's, and that is no
    difference from the profiled step. (Before, the plan's watch compared sizes, so every such
    step was said to differ from the profiled one and recomputed every region from its first
    checkpoint on.)"""
    all_saved, least = figures
    budget = least + (all_saved - least) // 2
    plain, _, _ = train(None, [128, 64, 64, 128], checkpointed=False)
    rows, told, profiles = train(budget, [128, 64, 64, 128])
    assert [row["error"] for row in rows] == [None] * 4, told
    assert [row["planned"] for row in rows[1:]] == [True, True, True]
    for step, (row, reference) in enumerate(zip(rows, plain)):
        if step > 0:
            assert row["peak"] <= budget, (step, row["peak"], budget, told)
        assert row["grads"] == reference["grads"], step
    assert sorted(signature[0][0][0] for signature in profiles) == [128]
    assert not [message for message in told if "differs from the profiled one" in message], told
    shorter = [message for message in told if "-> 64x32" in message]
    assert len(shorter) == 1 and "the plan comes from the profile of the larger inputs as it is" in shorter[0], told
