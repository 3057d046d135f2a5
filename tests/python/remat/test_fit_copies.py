"""A fitted model among the other models of a training job: copy.deepcopy of it (an EMA or teacher
copy) is a model of its own, fitted with the same budget from a profile of its own, whether copied
before its first step or while its profiled step is still open; checkpoints of other code that run
between a fitted model's steps (another model's validation, a second model trained beside it) run
as they would without fit; pickling a fitted model is refused naming the fix. Everything bitwise
against the same loop without fit."""

import copy
import pickle

import pytest
import torch

import fit_loop

WIDTH = 64


def make_model(checkpointed=True):
    return fit_loop.CheckpointedLayers([fit_loop.Layer(WIDTH) for _ in range(3)], checkpointed)


def batch(step):
    return torch.randn(4, 16, WIDTH, generator=torch.Generator().manual_seed(step))


def ema_loop(budget, copy_at):
    """4 SGD steps of the model with an EMA copy (made before step `copy_at`, 0: before any) updated
    after each, and the EMA's eval output after each: (losses, EMA outputs, EMA parameters, the model,
    the EMA, fit's warnings)."""
    with fit_loop.fitted(make_model, budget) as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        ema = copy.deepcopy(model) if copy_at == 0 else None
        losses, outputs = [], []
        for step in range(4):
            if step == copy_at:
                ema = copy.deepcopy(model)
            optimizer.zero_grad(set_to_none=True)
            loss = model(batch(step))
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            if ema is None:
                continue
            with torch.no_grad():
                for kept, live in zip(ema.parameters(), model.parameters()):
                    kept.mul_(0.9).add_(live, alpha=0.1)
                ema.eval()
                outputs.append(ema(batch(100 + step)))
                ema.train()
        parameters = [p.detach().clone() for p in ema.parameters()]
        fit_loop.unfit(model, batch(0))
    return losses, outputs, parameters, model, ema, fit_loop.messages(told, "remat")


@pytest.mark.parametrize("copy_at", [0, 1], ids=["before-the-first-step", "while-the-profile-is-open"])
def test_an_ema_copy_of_a_fitted_model_is_its_own_model_and_the_loop_is_bitwise(copy_at):
    plain = ema_loop(None, copy_at)
    losses, outputs, parameters, model, ema, told = ema_loop("1 GiB", copy_at)
    assert all(torch.equal(a, b) for a, b in zip(losses, plain[0]))
    assert len(outputs) == len(plain[1]) > 0 and all(torch.equal(a, b) for a, b in zip(outputs, plain[1]))
    assert all(torch.equal(a, b) for a, b in zip(parameters, plain[2]))
    state = ema.remat_fit
    assert state.model is ema and state.budget == 1 << 30 and state.profiled_steps == 0  # it never trained
    assert told == [], told


def test_a_training_step_on_a_copy_of_a_fitted_model_trains_the_copy_alone():
    with fit_loop.fitted(make_model, "1 GiB") as (model, _):
        model(batch(0)).backward()  # profiled; its profile stays open until the next step
        student = copy.deepcopy(model)
        model.zero_grad(set_to_none=True)
        student(batch(1)).backward()
        assert all(p.grad is not None for p in student.parameters())
        assert all(p.grad is None for p in model.parameters())
        assert student.remat_fit.profiled_steps == 1 and model.remat_fit.profiled_steps == 1
        model(batch(2)).backward()  # the original's second step: planned from its own profile
        assert model.remat_fit.plan is not None and model.remat_fit.planned_steps == 1


def test_other_models_checkpoints_between_a_fitted_models_steps_run_as_without_fit():
    def loop(budget):
        with fit_loop.fitted(make_model, budget) as (model, _):
            torch.manual_seed(1)
            other = make_model()  # checkpoints too, not fitted
            optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, other)]
            results = []
            for step in range(3):
                for net, optimizer in zip((model, other), optimizers):
                    optimizer.zero_grad(set_to_none=True)
                    net(batch(step)).backward()  # the other model trains inside the fitted one's step
                    optimizer.step()
                with torch.no_grad():
                    other.eval()
                    results.append(other(batch(50 + step)))  # its validation, under no_grad
                    other.train()
            state = fit_loop.unfit(model, batch(0))
            results += [p.detach().clone() for p in (*model.parameters(), *other.parameters())]
        return results, state

    plain, _ = loop(None)
    fitted, state = loop("1 GiB")
    assert all(torch.equal(a, b) for a, b in zip(fitted, plain))
    assert state.profiled_steps == 1 and state.planned_steps == 2


def test_pickling_a_fitted_model_is_refused_naming_state_dict_and_unfit():
    import io

    with fit_loop.fitted(make_model, "1 GiB") as (model, _):
        for step in range(2):
            for save in (pickle.dumps, lambda m: torch.save(m, io.BytesIO())):
                with pytest.raises(TypeError, match=r"remat.fit: a fitted model \(CheckpointedLayers\) cannot be "
                                                    r"pickled .*state_dict\(\), or call remat.unfit\(model\)"):
                    save(model)
            model(batch(step)).backward()
        fit_loop.unfit(model, batch(0))
        restored = pickle.loads(pickle.dumps(model))
        assert torch.equal(restored(batch(7)), model(batch(7)))


class Casting(torch.nn.Module):
    """The layers run in their parameters' dtype, the batch cast to it: a step's inputs are the
    same whichever dtype the model was made."""

    def __init__(self):
        super().__init__()
        self.inner = make_model()

    def forward(self, x):
        return self.inner(x.to(self.inner.layers[0].attn.weight.dtype)).float()


def test_a_model_made_bfloat16_after_it_was_fitted_is_profiled_again_once_then_planned():
    # Its steps differ from the float32 profile (the regions' dtypes): the first recomputes every
    # region from there; the parameters take half the bytes they took in the profile, and saving
    # everything, estimated at the profile's step scaled so, is within the budget: the next step is
    # profiled again, and the ones after run planned, as profiled.
    with fit_loop.fitted(Casting, "1 GiB") as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(6):
            if step == 2:
                model.to(torch.bfloat16)
            optimizer.zero_grad(set_to_none=True)
            model(batch(step)).backward()
            optimizer.step()
        state = fit_loop.unfit(model, batch(0))
    assert state.profiled_steps == 2 and len(state.diverged_peaks) == 1, (state.profiled_steps, state.diverged_peaks)
    assert state.planned_steps == 4  # steps 2 (float32), 3 (the one that differed), 5 and 6 (the second profile's)
    assert any("differs from the profiled one" in message and "bfloat16" in message
               for message in fit_loop.messages(told, "remat.fit")), told
