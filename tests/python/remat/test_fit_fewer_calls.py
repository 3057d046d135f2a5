"""remat.fit when a planned step makes fewer checkpoint calls than the profiled one (layers skipped,
or run without checkpoint as in eval mode): the plan does not cover what ran without checkpoint, so
the step is said to differ, once per count, naming how many calls ran; and nothing is learned from
it for steps that run as profiled, which still run within the budget (never refused for it). And a
profiled micro-batch whose loss is dropped still counts in its cycle of gradient accumulation, where
an eval-mode forward whose loss is dropped (a validation loss with grad on) does not."""

import pytest
import torch

import remat

import fit_loop


class Model(torch.nn.Module):
    """Four checkpointed layers; from layer `plain_from` on, layers run without checkpoint."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(fit_loop.Layer(32) for _ in range(4))
        self.plain_from = 4

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            if index >= self.plain_from:
                x = layer(x, plain=True)
            else:
                x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
        return x.square().mean()


def batch(step):
    return torch.randn(16, 32, 32, generator=torch.Generator().manual_seed(step))


@pytest.fixture(scope="module")
def budget():
    with fit_loop.fitted(Model, None) as (model, _):
        with remat.profile_regions() as profile:
            model(batch(0)).backward()
    del model
    return (profile.least_peak_bytes() + profile.step_peak_bytes) // 2


def test_a_step_with_fewer_checkpoint_calls_is_said_and_does_not_refuse_later_steps(budget):
    rows = []
    with fit_loop.fitted(Model, budget) as (model, told):
        for step, plain_from in enumerate([4, 4, 1, 1, 0, 4, 4]):
            model.plain_from = plain_from

            def one_step():
                model(batch(step)).backward()
                model.zero_grad(set_to_none=True)
            rows.append((plain_from, fit_loop.peak_of(one_step), model.remat_fit.predicted_peak_bytes))
        state = fit_loop.unfit(model, batch(0))
    # Layers run without checkpoint keep everything: over the budget, which no plan covered
    assert all(peak > budget for plain_from, peak, _ in rows if plain_from < 4), (rows, budget)
    # Steps that ran as profiled, before and after them: within their prediction and the budget
    for plain_from, peak, predicted in [rows[1]] + rows[5:]:
        assert peak <= predicted <= budget, (rows, budget)
    assert state.profiled_steps == 1 and state.planned_steps == 6
    assert state.reserve == {}
    said = fit_loop.messages(told, "checkpoint calls")
    # Said in full once per count; each later such step over the budget again, in a line (it was not)
    assert [m.split(" (layers")[0].split(" and peaked")[0] for m in said] == [
        "remat.fit: the last step differs from the profiled one: it made 1 of the 4 checkpoint calls the profiled "
        "step made",
        "remat.fit: the last step again made 1 of the 4 checkpoint calls",
        "remat.fit: the last step differs from the profiled one: it made 0 of the 4 checkpoint calls the profiled "
        "step made"]
    assert all("over the budget of" in m for m in said), said
    assert "(2 such steps over it so far)" in said[1], said


def test_a_dropped_profiled_micro_batch_counts_in_its_cycle(budget):
    with fit_loop.fitted(Model, budget) as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for cycle in range(3):
            for position in range(3):
                loss = model(batch(3 * cycle + position))
                if (cycle, position) == (0, 0):
                    del loss  # a skipped batch: its profile is dropped
                else:
                    (loss / 3).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        state = fit_loop.unfit(model, batch(0))
    assert state.cycle == 3
    assert fit_loop.messages(told, "accumulation count changed") == []
    assert len(fit_loop.messages(told, "not measured in full")) == 1


@pytest.mark.parametrize("forwards", [1, 2], ids=["one forward a step", "two summed"])
def test_a_validation_forward_with_grad_on_and_no_backward_is_no_micro_batch(budget, forwards):
    """model.eval(); model(x) between optimizer steps, without no_grad and without backward: fit
    counted it as a micro-batch, said that the accumulation count changed (2 where 1 before), and
    planned every step as if the optimizer stepped after two; with two forwards summed a step, it
    also took the validation forward for a training step's first, said the inputs changed shape
    and that the later forwards took other inputs."""
    with fit_loop.fitted(Model, budget if forwards == 1 else budget * 2) as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(4):
            sum(model(batch(2 * step + i)) for i in range(forwards)).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            model.eval()
            model(batch(10 + step))  # a validation loss, dropped
            model.train()
        state = fit_loop.unfit(model, batch(0))
    assert state.cycle == 1
    assert fit_loop.messages(told, "accumulation count changed") == []
    assert fit_loop.messages(told, "later training forwards") == []
    assert fit_loop.messages(told, "inputs changed") == []


class DropoutModel(Model):
    """Model with dropout in every layer: in training mode its masks are saved too."""

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = remat.checkpoint(region_name=f"layers.{index}")(
                lambda t, layer=layer: torch.nn.functional.dropout(layer(t), 0.5, self.training))(x)
        return x.square().mean()


def test_a_step_in_another_mode_than_the_profiled_one_differs_from_its_start(budget):
    rows = []
    with fit_loop.fitted(DropoutModel, budget) as (model, told):
        for step in range(5):
            model.train(step > 0)  # profiled in eval mode (dropout off), trained with dropout on
            model.zero_grad(set_to_none=True)
            rows.append((fit_loop.peak_of(lambda: model(batch(step)).backward()),
                         model.remat_fit.predicted_peak_bytes))
        state = fit_loop.unfit(model, batch(0))
    for peak, predicted in rows[1:]:
        assert peak <= budget, (rows, budget)
    assert state.profiled_steps == 1 and state.planned_steps == 4
    assert [m.split(". From")[0] for m in fit_loop.messages(told, "mode")] == [
        "remat.fit: this step differs from the profiled one: the model is in training mode, the profiled step ran "
        "in eval mode"]


def test_a_validation_forward_with_gradients_on_that_no_plan_fits_is_refused_naming_no_grad(budget):
    """model.eval() and a larger validation batch with gradients on (torch.no_grad() forgotten): no
    plan fits it, and the refusal says why none can help such a forward (before, it named a least
    peak as though the checkpoints ran, and where it passed, each such forward over the budget after
    the first was silent)."""
    with fit_loop.fitted(Model, budget) as (model, _):
        for step in range(2):
            model(batch(step)).backward()
            model.zero_grad(set_to_none=True)
        model.eval()
        with pytest.raises(ValueError, match=r"The model is in eval mode with gradients on: a forward with no "
                                             r"backward after it \(a validation loss\) holds its graph for nothing.*"
                                             r"run it under torch.no_grad\(\)"):
            model(torch.cat([batch(9)] * 4))
        model.train()
        fit_loop.unfit(model, batch(0))
