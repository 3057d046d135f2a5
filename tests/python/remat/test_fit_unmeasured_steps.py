"""remat.fit when the profiled step is not one whole training step: a step whose loss is dropped
without backward (a skipped batch), or whose backward raises midway, measured forward alone or
half the backward; its profile is dropped, the user told, and the next step profiled afresh,
so later steps plan from a whole step and peak within the budget. And a training step with the
model in eval mode (grad on, backward called) is planned and measured as any other."""

import gc

import pytest
import torch

import remat

import fit_loop


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        h = remat.region(lambda t: self.attn(t).sin(), "attn")(x)
        return remat.region(lambda t: self.mlp(t).cos(), "mlp")(h)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(4))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
        return x.square().mean()


def batch(step):
    return torch.randn(8, 64, 64, generator=torch.Generator().manual_seed(step))


def train(budget, first_step="whole", steps=4):
    """Steps under fit; the first one whole, its loss dropped ("skipped") or its backward raising
    in layers.1 ("raises"). Returns per step (measured peak, predicted peak), the fit state and
    what fit said."""
    rows = []
    with fit_loop.fitted(Model, budget) as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(steps):
            def one_step():
                optimizer.zero_grad(set_to_none=True)
                loss = model(batch(step))
                if step == 0 and first_step == "skipped":
                    return
                if step == 0 and first_step == "raises":
                    def nan_check(grad):
                        raise RuntimeError("grad is nan")
                    handle = model.layers[1].mlp.weight.register_hook(nan_check)
                    try:
                        with pytest.raises(RuntimeError, match="grad is nan"):
                            loss.backward()
                    finally:
                        handle.remove()
                    del loss  # what of its graph backward did not free (the traceback's frames hold it too)
                    gc.collect()
                    return
                loss.backward()
                optimizer.step()

            peak = fit_loop.peak_of(one_step)
            rows.append((peak, model.remat_fit.predicted_peak_bytes))
        state = fit_loop.unfit(model, batch(0))
    return rows, state, fit_loop.messages(told, "remat.fit")


@pytest.fixture(scope="module")
def whole():
    """A budget halfway from the loop's least peak to everything saved, and the loop at that
    budget with every step whole."""
    _, state, _ = train("1GiB")
    profile = state.latest.profile
    budget = (profile.least_peak_bytes() + profile.step_peak_bytes) // 2
    return budget, train(budget)[0]


@pytest.mark.parametrize("first_step", ["skipped", "raises"])
def test_a_profiled_step_without_its_whole_backward_is_dropped_and_the_next_profiled_afresh(whole, first_step):
    budget, all_whole = whole
    rows, state, told = train(budget, first_step)
    # Planned from the whole step profiled next, as the loop whose steps are all whole is (within 1%)
    for (measured, predicted), (_, planned_whole) in zip(rows[2:], all_whole[1:]):
        assert measured <= predicted <= budget, (measured, predicted, budget)
        assert abs(predicted - planned_whole) <= planned_whole // 100, (predicted, planned_whole)
    assert state.profiled_steps == 1 and state.planned_steps == 2
    why = ("it ran no backward (its loss was dropped: a skipped batch?)" if first_step == "skipped"
           else "its backward raised before it ended")
    assert [m for m in told if "not measured in full" in m] == [
        f"remat.fit: the profiled step was not measured in full: {why}. Its profile is dropped; the next training "
        "step is profiled afresh"]
