"""remat.fit where layers are frozen or unfrozen during training (gradual unfreezing, a frozen
backbone trained later): the parameters that require gradients decide what a step keeps for
backward and the gradients it makes, so fit learns apart for each set of frozen parameters. Steps
measured as the fit tests measure them (fit_loop: CPU tensors counted in tag_cpu_tensors())."""

import torch

import remat
import fit_loop

WIDTH = 64


def make_model():
    return fit_loop.CheckpointedLayers([fit_loop.Layer(WIDTH) for _ in range(4)])


def set_frozen(model, frozen):
    for index, layer in enumerate(model.layers):
        layer.requires_grad_(index not in frozen)


def train(budget, frozen_by_step):
    """Steps with the first layers frozen as `frozen_by_step` says (a tuple of layer indices per
    step); per step: (measured peak, fit's prediction, gradients as bytes); the warnings; fit's state."""
    rows = []
    with fit_loop.fitted(make_model, budget) as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step, frozen in enumerate(frozen_by_step):
            set_frozen(model, frozen)
            x = torch.randn(8, 32, WIDTH, generator=torch.Generator().manual_seed(step))
            peak = fit_loop.peak_of(lambda: (optimizer.zero_grad(set_to_none=True), model(x).backward(),
                                             optimizer.step()))
            grads = [None if p.grad is None else p.grad.numpy().tobytes() for p in model.parameters()]
            state = getattr(model, "remat_fit", None)
            rows.append((peak, None if state is None else state.predicted_peak_bytes, grads))
        state = fit_loop.unfit(model, x)
    return rows, fit_loop.messages(told, "remat.fit"), state


def budget_midway():
    """The middle of the range plans cover for the model with no layer frozen, from a profile of
    one step with the optimizer's state there (as in the steps planned)."""
    with fit_loop.fitted(make_model, None) as (model, _):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(8, 32, WIDTH, generator=torch.Generator().manual_seed(0))
        model(x).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with remat.profile_regions() as profile:
            model(x).backward()
            optimizer.step()
        least, everything = profile.least_peak_bytes(), profile.step_peak_bytes
    assert least < everything
    return (least + everything) // 2


def test_unfrozen_layers_are_profiled_again_and_later_steps_keep_the_budget():
    # Profiled with two layers frozen (they keep nothing for backward and make no gradient), then
    # unfrozen: the step planned from that profile went 39% over the budget and every later step was
    # refused, at a budget the same model never frozen meets at every planned step
    schedule = [(0, 1)] * 4 + [()] * 4
    budget = budget_midway()
    plain, _, _ = train(None, schedule)
    rows, told, state = train(budget, schedule)
    assert [grads for *_, grads in rows] == [grads for *_, grads in plain]  # bitwise
    assert rows[4][1] is None, rows[4]  # profiled again as the layers were unfrozen
    said = [message for message in told if "the parameters that require gradients changed" in message]
    assert len(said) == 1 and "(12 required none in the steps before, 0 now)" in said[0], told
    for peak, predicted, _ in rows[1:4] + rows[5:]:
        assert peak <= predicted <= budget and predicted <= peak * 1.03, (peak, predicted, budget)
    assert state.profiled_steps == 2


def test_layers_frozen_in_turn_plan_each_way_from_a_profile_of_their_own():
    schedule = [(0, 1), (0, 1), (), (), (0, 1), (), (0, 1), ()]
    budget = budget_midway()
    plain, _, _ = train(None, schedule)
    rows, told, state = train(budget, schedule)
    assert [grads for *_, grads in rows] == [grads for *_, grads in plain]
    assert state.profiled_steps == 2  # one per set of frozen layers, learned apart and taken back
    assert len([message for message in told if "require gradients changed" in message]) == 1, told
    for peak, predicted, _ in rows[1:2] + rows[3:]:
        assert peak <= predicted <= budget and predicted <= peak * 1.03, (peak, predicted, budget)
