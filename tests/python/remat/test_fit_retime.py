"""remat.fit re-times its profile from warm steps: the profiled step is a model's first and runs
cold, so the first planned steps at its inputs time their regions' forwards as they run, and later
steps plan from the median of those times (retime_steps, 3 by default; 0 keeps the profiled
times). A region that was slow in the first step only ("a", costly once, as a first call that
loads or compiles something) is priced as the cold step measured it until then: the plan keeps it
and recomputes the steady one ("b"); from the fifth step the plan recomputes "a" instead. Every
step within the budget and every gradient bitwise the same loop's without fit."""

import copy
import time

import pytest
import torch

import fit_loop
import remat

WIDTH = 256
ROWS = 1024
LAYERS = 3
COLD_SECONDS = 0.05    # what region "a" burns in its first forward alone
STEADY_SECONDS = 0.01  # what region "b" burns in every forward


def burn(seconds):
    """Spends `seconds` of this thread's CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


class Layer(torch.nn.Module):
    """Two regions that keep as many bytes each: "a" costly in its first forward only, "b" costly
    in every forward."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(WIDTH, WIDTH)
        self.forwards_of_a = 0

    def slow_first(self, x):
        if self.forwards_of_a == 0:
            burn(COLD_SECONDS)
        self.forwards_of_a += 1
        return torch.tanh(self.a(x))  # keeps its output

    def steady(self, y):
        burn(STEADY_SECONDS)
        return torch.exp(y * 0.5)  # keeps its output

    def forward(self, x):
        return remat.region(self.steady, "b")(remat.region(self.slow_first, "a")(x)) + x


class Model(torch.nn.Module):
    """LAYERS layers, each a checkpoint ("layers.<index>"); twice=True runs the last one twice."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))

    def forward(self, x, twice=False, skip_last=False):
        for index, layer in enumerate(self.layers[:-1] if skip_last else self.layers):
            x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
        if twice:
            x = remat.checkpoint(region_name=f"layers.{LAYERS - 1}")(self.layers[-1])(x)
        return x.square().mean()


def batch(step):
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(step), requires_grad=True)


def region_bytes():
    return ROWS * WIDTH * 4


def loop(budget, steps, retime_steps=3, twice_at=(), skip_last_from=None):
    """`steps` SGD steps of a fresh Block under remat.fit(budget, retime_steps=) (budget None: without
    fit): per step (its measured peak, its gradients as bytes, the regions its plan recomputed), and
    the fit state."""
    rows = []
    with fit_loop.fitted(Model, None) as (model, told):
        if budget is not None:
            remat.fit(model, budget, retime_steps=retime_steps)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(steps):
            x = batch(step)

            def one_step():
                optimizer.zero_grad(set_to_none=True)
                skip_last = skip_last_from is not None and step >= skip_last_from
                model(x, twice=step in twice_at, skip_last=skip_last).backward()
                optimizer.step()

            peak = fit_loop.peak_of(one_step)
            state = getattr(model, "remat_fit", None)
            plan = None if state is None or state.plan is None else state.plan
            recomputed = None if plan is None else sorted(r for r, c in plan.decisions.items() if c == "recompute")
            rows.append((peak, [None if p.grad is None else p.grad.numpy().tobytes() for p in model.parameters()],
                         recomputed))
        state = fit_loop.unfit(model, batch(0))
    return rows, state


@pytest.fixture(scope="module")
def budget():
    """Between the step that saves both regions and the one that recomputes one of them: the
    measured peak of a planned step that saves both (a budget every plan meets) less half a
    region's bytes."""
    rows, _ = loop("1 GiB", 3)
    assert rows[2][2] == []
    return rows[2][0] - region_bytes() // 2


def recomputed_kind(rows):
    """Per step: which region of its layers its plan recomputes ("a" or "b"; None: profiled, or
    both kinds)."""
    kinds = []
    for _, _, recomputed in rows:
        found = {name.rpartition("::")[2] for name in recomputed or ()}
        kinds.append(found.pop() if len(found) == 1 else None)
    return kinds


def test_the_plan_recomputes_the_region_warm_steps_time_as_cheap(budget):
    plain, _ = loop(None, 7)
    rows, state = loop(budget, 7)
    assert [r[1] for r in rows] == [r[1] for r in plain]  # bitwise
    # Step 0 profiled; steps 1-3 planned from its cold times (and timed); steps 4-6 re-timed
    assert recomputed_kind(rows) == [None] + ["b"] * 3 + ["a"] * 3
    assert all(peak <= budget for peak, _, _ in rows[1:])
    assert state.profiled_steps == 1 and state.latest.warm and len(state.profiles) == 1
    seconds = {r.name: r.seconds for r in state.latest.profile.regions}
    assert all(seconds[f"layers.{i}::a"] < STEADY_SECONDS / 2 for i in range(LAYERS))
    assert all(STEADY_SECONDS * 0.9 < seconds[f"layers.{i}::b"] < COLD_SECONDS / 2 for i in range(LAYERS))


def test_retime_steps_0_keeps_the_profiled_times(budget):
    rows, state = loop(budget, 6, retime_steps=0)
    assert recomputed_kind(rows) == [None] + ["b"] * 5
    assert not state.latest.warm and state.latest.warm_steps == []


def test_a_step_that_ran_more_checkpoint_calls_is_not_timed(budget):
    # Step 2 calls the last checkpoint again (a difference: every region recomputes from there);
    # the profile is re-timed from steps 1, 3 and 4
    rows, state = loop(budget, 7, twice_at=(2,))
    assert recomputed_kind(rows[3:]) == ["b"] * 2 + ["a"] * 2
    assert state.latest.warm


def test_steps_that_never_run_as_profiled_stop_being_timed(budget):
    # From step 1 every step skips the last layer (fewer checkpoint calls than the profiled step):
    # no step's times count, and after 4 x retime_steps timed steps the profile keeps its times
    rows, state = loop(budget, 15, retime_steps=2, skip_last_from=1)
    assert state.latest.timed_steps == 8 and not state.latest.warm and state.latest.warm_steps == []
    assert state.timing is None


def test_a_region_profiled_at_0_seconds_takes_its_warm_seconds(budget):
    _, state = loop(budget, 2, retime_steps=0)
    profile = state.latest.profile
    calls, seconds = profile._forward_seconds["layers.0::b"]
    profile._forward_seconds["layers.0::a"] = (1, 0.0)
    again = profile._retimed({"layers.0::a": 0.004, "layers.0::b": seconds / 2})
    priced = {region.name: region.seconds for region in again.regions}
    before = {region.name: region.seconds for region in profile.regions}
    assert priced["layers.0::a"] == 0.004 and priced["layers.0::b"] == pytest.approx(before["layers.0::b"] / 2)
    assert priced["layers.1::a"] == before["layers.1::a"]  # not re-timed: as it was
    assert again.step_peak_bytes == profile.step_peak_bytes and again.base_bytes == profile.base_bytes


def test_a_copy_of_a_fitted_model_keeps_its_retime_steps(budget):
    # An EMA or teacher copy is fitted as the original was, retime_steps included
    with fit_loop.fitted(Model, None) as (model, _):
        remat.fit(model, budget, retime_steps=0)
        copied = copy.deepcopy(model)
        assert copied.remat_fit is not model.remat_fit and copied.remat_fit.retime_steps == 0
        remat.fit(model, budget, retime_steps=5)
        assert copy.deepcopy(model).remat_fit.retime_steps == 5


@pytest.mark.parametrize("steps", [-1, True, 1.5, "3", None])
def test_retime_steps_must_be_an_int_of_0_or_more(steps):
    with pytest.raises(ValueError, match=r"retime_steps must be an int of 0 or more .* got"):
        remat.fit(Model(), "1 GiB", retime_steps=steps)


def test_wrap_decoder_layers_takes_retime_steps_with_a_budget_alone():
    with pytest.raises(TypeError, match="retime_steps= is how many planned steps re-time the profiles of budget="):
        remat.wrap_decoder_layers(torch.nn.Module(), retime_steps=2)
