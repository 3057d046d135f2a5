"""Steps that differ from the profiled one other than by their inputs' shapes: the same checkpoint
called 3 times instead of once, a data-dependent branch taking the larger path, autocast on only
where the plan is used, a grouped plan whose loop runs 3 times. Under remat.fit (and a use_plan of
a plan from an in-process profile) the runtime notices the first difference, recomputes every
region from there (the least memory), and says so once, naming it; the measured step peak
(remat_alloc.memory_stats()["requested_bytes_peak"], CPU tensors counted inside
remat.tag_cpu_tensors()) stays within the budget where saving everything would not, and gradients
are bitwise those without checkpointing. Also: runtime state no longer carries from one step to
the next (the first step after an all-recompute step peaks as after an all-saved one)."""

import gc
import warnings

import pytest
import torch

import remat
import remat_alloc

import fit_loop

WIDTH = 256


def attn(t):
    return (t * 2).sin()


def mlp(t):
    return (t.repeat(1, 3) * 3).cos()[:, :WIDTH]


def wide(t):
    return (t.repeat(1, 4) * 5).sin()[:, :WIDTH] + t


def layer(x):
    h = remat.region(attn, "attn")(x)
    return remat.region(mlp, "mlp")(h)


def branching_layer(x):
    h = remat.region(attn, "attn")(x)
    if x.mean() > 0.5:  # data-dependent: the larger path
        h = remat.region(wide, "wide")(h)
    return remat.region(mlp, "mlp")(h)


class Net(torch.nn.Module):
    """Two layers, then a 'shared' checkpoint run `calls` times (weights shared, as a loop over one
    block); layers.0 takes a larger path for inputs whose mean is above 0.5."""

    def __init__(self, checkpointed=True):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))
        self.checkpointed = checkpointed
        self.calls = 1

    def forward(self, x):
        x = x * self.scale
        steps = [("layers.0", branching_layer), ("layers.1", layer)] + [("shared", layer)] * self.calls
        for name, body in steps:
            x = remat.checkpoint(region_name=name)(body)(x) if self.checkpointed else body(x)
        return x.sum()


def batch(step, larger_path=False):
    x = torch.randn(64, WIDTH, generator=torch.Generator().manual_seed(step)) * 0.1
    return (x + 1.0 if larger_path else x).requires_grad_()


def run(budget, schedule, *, checkpointed=True):
    """Steps of Net as `schedule` says ((calls, larger path, autocast) per step), under
    remat.fit(budget) (None: none). Per step the measured peak, the gradients as bytes and whether it
    ran profiled; the warnings fit gave; the fit state."""
    rows = []
    with fit_loop.fitted(lambda: Net(checkpointed), budget) as (model, told):
        for step, (calls, larger, autocast) in enumerate(schedule, 1):
            x = batch(step, larger)
            model.calls = calls
            peak = fit_loop.peak_of(lambda: autocast_step(model, x, autocast))
            state = getattr(model, "remat_fit", None)
            rows.append({"peak": peak,
                         "grads": [x.grad.numpy().tobytes(), model.scale.grad.float().numpy().tobytes()],
                         "profiled": state is not None and state.plan is None})
            model.scale.grad = None
            del x
        state = fit_loop.unfit(model, batch(0))  # ends the last step
    return rows, fit_loop.messages(told, "remat"), state


def autocast_step(model, x, autocast):
    """Forward (under CPU autocast to bfloat16, where `autocast`) and backward."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x)
    loss.backward()


def all_saved_peak(calls=1, larger=False, autocast=False):
    """The step's peak with every region saved (a profiled step), as the loop would allocate it."""
    gc.collect()
    torch.manual_seed(0)
    with remat.tag_cpu_tensors():
        model = Net()
        model.calls = calls
        x = batch(1, larger)
        with remat.profile_regions() as profile, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(x).backward()
    return profile


def check_within_budget_told_once(case, schedule, budget, differs):
    plain, _, _ = run(None, schedule, checkpointed=False)
    rows, told, state = run(budget, schedule)
    assert len(told) == 1 and f"remat.fit: this step differs from the profiled one: {differs}" in told[0], told
    for step, row in enumerate(rows, 1):
        assert row["peak"] <= budget, (case, step, row["peak"], budget)
        assert row["grads"] == plain[step - 1]["grads"], (case, step)  # bitwise
    assert all(peak <= budget for peak in state.diverged_peaks) and state.diverged_peaks, state.diverged_peaks
    return rows, state


def test_the_same_checkpoint_called_3_times_instead_of_once_recomputes_from_the_second_call():
    small, large = all_saved_peak(1), all_saved_peak(3)
    budget = (small.step_peak_bytes + large.step_peak_bytes) // 2
    # The plan saves everything (the profiled step fits), so the 3-call step would peak at `large`
    assert large.step_peak_bytes > budget >= small.step_peak_bytes
    schedule = [(1, False, False), (1, False, False), (3, False, False), (3, False, False), (1, False, False)]
    rows, state = check_within_budget_told_once("calls", schedule, budget,
                                                "checkpoint 'shared' ran twice where the profiled step ran it once")
    assert not rows[1]["profiled"] and rows[1]["peak"] == small.step_peak_bytes  # everything saved
    assert len(state.diverged_peaks) == 2


def test_a_data_dependent_branch_taking_the_larger_path_recomputes_from_the_region_the_profile_did_not_run():
    small, large = all_saved_peak(larger=False), all_saved_peak(larger=True)
    budget = (small.step_peak_bytes + large.step_peak_bytes) // 2
    assert large.step_peak_bytes > budget >= small.step_peak_bytes
    schedule = [(1, False, False), (1, False, False), (1, True, False), (1, False, False), (1, True, False)]
    check_within_budget_told_once("branch", schedule, budget, "region 'layers.0::wide' ran where the profiled step "
                                                              "ran 'layers.0::mlp'")


class LinearNet(torch.nn.Module):
    """Layers of two Linear regions, whose weights autocast casts to bfloat16: the casts are what
    saved regions keep beside the activations under autocast."""

    def __init__(self, checkpointed=True):
        super().__init__()
        self.linears = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(8))
        self.checkpointed = checkpointed

    def layer(self, index, x):
        first, second = self.linears[2 * index], self.linears[2 * index + 1]
        h = remat.region(lambda t: first(t).sin(), "attn")(x)
        return remat.region(lambda t: second(t).cos() + t, "mlp")(h)

    def forward(self, x):
        for index in range(4):
            body = lambda t, index=index: self.layer(index, t)  # noqa: E731
            x = remat.checkpoint(region_name=f"layers.{index}")(body)(x) if self.checkpointed else body(x)
        return x.float().square().mean()


LINEAR_BATCH = 128


def run_linear(budget, autocast_from, steps=4, *, checkpointed=True):
    rows = []
    with fit_loop.fitted(lambda: LinearNet(checkpointed), budget) as (model, told):
        for step in range(1, steps + 1):
            x = torch.randn(LINEAR_BATCH, WIDTH, generator=torch.Generator().manual_seed(step), requires_grad=True)
            peak = fit_loop.peak_of(lambda: autocast_step(model, x, step >= autocast_from))
            rows.append({"peak": peak,
                         "grads": [p.grad.numpy().tobytes() for p in model.parameters()] + [x.grad.numpy().tobytes()]})
            model.zero_grad(set_to_none=True)
            del x
        state = fit_loop.unfit(model, torch.zeros(LINEAR_BATCH, WIDTH))  # ends the last step
    return rows, fit_loop.messages(told, "remat"), state


def test_autocast_only_where_the_plan_is_used_recomputes_every_region():
    # Profiled without autocast, the plan at this budget saves everything; saving everything under
    # autocast keeps the weights' bfloat16 casts too, over the budget
    without, _, _ = run_linear("1GiB", autocast_from=99, steps=2)
    under, _, _ = run_linear("1GiB", autocast_from=1, steps=2)
    budget = without[1]["peak"]
    assert under[1]["peak"] > budget, (under[1]["peak"], budget)
    plain, _, _ = run_linear(None, autocast_from=3, checkpointed=False)
    rows, told, state = run_linear(budget, autocast_from=3)
    assert len(told) == 1 and ("remat.fit: this step differs from the profiled one: autocast is on (bfloat16 on cpu) "
                               "at checkpoint 'layers.0', off in the profiled step") in told[0], told
    for step, row in enumerate(rows, 1):
        assert row["peak"] <= budget, (step, row["peak"], budget)
        assert row["grads"] == plain[step - 1]["grads"], step  # bitwise
    assert len(state.diverged_peaks) == 2


def test_a_step_that_differs_over_the_budget_is_told_and_later_steps_leave_room_for_it():
    small, large = all_saved_peak(1), all_saved_peak(3)
    budget = small.step_peak_bytes + (large.step_peak_bytes - small.step_peak_bytes) // 8
    schedule = [(1, False, False), (1, False, False), (3, False, False), (1, False, False), (3, False, False)]
    plain, _, _ = run(None, schedule, checkpointed=False)
    rows, told, state = run(budget, schedule)
    over = [message for message in told
            if "the last step, which differed from the profiled one" in message and "although" not in message]
    assert rows[2]["peak"] > budget and len(over) == 1, (rows[2]["peak"], budget, told)
    assert f"peaked at {rows[2]['peak'] / 2**20:.2f} MiB ({rows[2]['peak']} bytes)" in over[0]
    assert rows[3]["peak"] <= budget, (rows[3]["peak"], budget)  # planned leaving room
    # The next step of 3 calls runs under that plan, which saves less than the one step 3 ran
    # under: the room was learned there, and its differing part recomputes whatever the plan, so
    # it may take more above the prediction (at most one activation, 64 KiB, here). Over the
    # budget it is said again, with the room it had; else nothing more is said.
    again = [message for message in told if "although its plan left 448.04 KiB (458792 bytes) of room" in message]
    if rows[4]["peak"] > budget:
        assert rows[4]["peak"] <= budget + 64 * 256 * 4 and len(again) == 1, (rows[4]["peak"], budget, told)
    assert len(told) == 2 + len(again), told  # the difference, then the peak over the budget: once each
    assert all(row["grads"] == want["grads"] for row, want in zip(rows, plain))


def test_a_budget_no_step_that_differs_can_meet_raises_before_the_forward():
    small, large = all_saved_peak(1), all_saved_peak(3)
    budget = small.least_peak_bytes() + 1024  # the least peak fits; 3 calls at the least memory do not
    with pytest.raises(ValueError, match=r"remat.fit: no plan keeps this step within the budget .* and a step with "
                                         r"these inputs that differed from the profiled one took .* more"):
        run(budget, [(1, False, False), (1, False, False), (3, False, False), (1, False, False)])


# --- use_plan of a plan from an in-process profile --------------------------------------------------

def looped(x, times):
    for _ in range(times):
        x = remat.checkpoint(region_name="loop")(layer)(x)
    return x.sum()


def test_a_grouped_plans_loop_running_3_times_is_noticed_under_strict_use_plan():
    with remat.tag_cpu_tensors():
        x = torch.randn(64, WIDTH, requires_grad=True)
        plain = x
        for _ in range(3):
            plain = mlp(attn(plain))
        plain.sum().backward()
        reference = x.grad
        x.grad = None
        with remat.profile_regions() as one:
            looped(x, 1).backward()
        x.grad = None
        with remat.profile_regions() as three:
            looped(x, 3).backward()
        x.grad = None
        plan = one.plan(peak_bytes=one.step_peak_bytes, group=True)
        assert set(plan.decisions.values()) == {"save"}  # the plan keeps what 3 calls would keep thrice

        remat_alloc.reset_peak_stats()
        with pytest.warns(UserWarning, match="use_plan: this step differs from the profiled one: checkpoint 'loop' ran "
                                             "twice where the profiled step ran it once") as told:
            with remat.use_plan(plan):  # strict: the pattern's regions are the ones profiled
                looped(x, 3).backward()
        peak = remat_alloc.memory_stats()["requested_bytes_peak"]
        assert len([w for w in told if "use_plan" in str(w.message)]) == 1
        assert torch.equal(x.grad, reference)
        assert peak < three.step_peak_bytes, (peak, three.step_peak_bytes)  # calls 2 and 3 recomputed

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # told once per plan
            x.grad = None
            remat_alloc.reset_peak_stats()
            with remat.use_plan(plan):
                looped(x, 1).backward()  # the profiled step: no difference, its prediction holds
            assert remat_alloc.memory_stats()["requested_bytes_peak"] == plan.peak_bytes
            x.grad = None
            with remat.use_plan(plan):
                looped(x, 3).backward()
        assert torch.equal(x.grad, reference)


@pytest.mark.parametrize("backward_under_autocast", [False, True])
def test_autocast_during_the_profile_predicts_the_step_peak_within_3_percent(backward_under_autocast):
    """Profiled and run alike under autocast (backward inside it too, where autocast's cache keeps
    the casts until it exits), the plans' predictions hold at 5 budgets."""
    def step(model, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x)
            if backward_under_autocast:
                loss.backward()
        if not backward_under_autocast:
            loss.backward()

    gc.collect()
    torch.manual_seed(0)
    with remat.tag_cpu_tensors():
        model = LinearNet()
        x = torch.randn(LINEAR_BATCH, WIDTH, requires_grad=True)
        with remat.profile_regions() as profile:
            step(model, x)
        least, most = profile.least_peak_bytes(), profile.step_peak_bytes
        # With backward inside autocast the casts stay to the step's end whatever a plan keeps: no
        # plan peaks lower than saving everything, and every region recomputed peaks as predicted
        assert (least == most) if backward_under_autocast else (least < most), (least, most)
        plans = [profile.plan(peak_bytes=least + (most - least) * i // 4) for i in range(5)]
        plans.append(profile.plan(budget_bytes=profile.base_bytes))  # every region recomputed
        for plan in plans:
            budget = plan.peak_budget_bytes or profile.predict_peak(plan)
            plan.peak_bytes = profile.predict_peak(plan)
            model.zero_grad(set_to_none=True)
            x.grad = None
            remat_alloc.reset_peak_stats()
            with remat.use_plan(plan):
                step(model, x)
            measured = remat_alloc.memory_stats()["requested_bytes_peak"]
            assert plan.peak_bytes <= budget
            if backward_under_autocast and plan is plans[-1]:
                # Known gap: every region recomputed inside autocast peaks above the prediction on
                # this model, by what the CPU's bfloat16 kernels allocate (48512 B, 0.8%, on one
                # machine; 65536 B, 1.15%, on an AVX2-only one); remat.fit measures every planned
                # step and plans the next ones lower when one goes over, saying so.
                assert plan.peak_bytes < measured <= plan.peak_bytes * 1.02, (plan.peak_bytes, measured)
                continue
            assert plan.peak_bytes * 0.97 <= measured <= plan.peak_bytes, (budget, plan.peak_bytes, measured)


# --- state carried from one step to the next ------------------------------------------------------------

def test_a_plan_peaks_the_same_after_an_all_recompute_step_as_after_an_all_saved_one():
    """The runtime remembered, by checkpoint name, a call that ran no save region and kept every
    input of that checkpoint's next call: under a plan the next call may save regions whose inputs
    the runtime drops, so a step after an all-recompute step peaked 196608 B higher."""
    def readme(x):
        for index in range(4):
            x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
        return x.sum()

    torch.manual_seed(0)
    with remat.tag_cpu_tensors():
        x = torch.randn(64, WIDTH, requires_grad=True)
        with remat.profile_regions() as profile:
            readme(x).backward()
        all_saved = profile.plan(peak_bytes=profile.step_peak_bytes)
        all_recompute = profile.plan(budget_bytes=profile.base_bytes)
        assert set(all_recompute.decisions.values()) == {"recompute"}
        peaks = {}
        for budget in sorted({profile.least_peak_bytes(), (profile.least_peak_bytes() + profile.step_peak_bytes) // 2}):
            plan = profile.plan(peak_bytes=budget)
            for before in (all_saved, all_recompute):
                x.grad = None
                with remat.use_plan(before):
                    readme(x).backward()
                x.grad = None
                remat_alloc.reset_peak_stats()
                with remat.use_plan(plan):
                    readme(x).backward()
                peaks[(budget, before is all_saved)] = remat_alloc.memory_stats()["requested_bytes_peak"]
            assert peaks[(budget, True)] == peaks[(budget, False)] == plan.peak_bytes, peaks


# --- a plan from another model ----------------------------------------------------------------------

def test_a_peak_plan_from_another_model_is_refused_strict_and_recomputed_with_a_warning_otherwise():
    def other(x):
        for index in range(2):
            x = remat.checkpoint(region_name=f"blocks.{index}")(layer)(x)
        return x.sum()

    with remat.tag_cpu_tensors():
        x = torch.randn(64, WIDTH, requires_grad=True)
        with remat.profile_regions() as profile:
            looped(x, 2).backward()
        plan = profile.plan(peak_bytes=profile.step_peak_bytes)
        x.grad = None
        with pytest.warns(UserWarning, match="use_plan: this step differs from the profiled one: checkpoint 'blocks.0' "
                                             "ran, which the profiled step did not run"):
            with remat.use_plan(plan, strict=False):
                other(x).backward()
        x.grad = None
        with pytest.raises(ValueError, match=r"use_plan: checkpoint 'blocks.0': 2 region\(s\) ran that the plan does "
                                             r"not name: blocks.0::attn, blocks.0::mlp\. The plan was made for another "
                                             r"model layout"):
            with remat.use_plan(plan):
                other(x)  # told once per plan: the refusal alone now


# --- a region whose bytes depend on its data, at the same shapes -----------------------------------

class BranchInsideRegion(torch.nn.Module):
    """Three checkpoints of one region each; inside the region, a branch on the data adds a wider
    path: the same regions run on the same shapes either way, only the bytes differ."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ModuleList(torch.nn.Linear(64, 256) for _ in range(3))
        self.extra = torch.nn.ModuleList(torch.nn.Linear(64, 256) for _ in range(3))
        self.down = torch.nn.ModuleList(torch.nn.Linear(256, 64) for _ in range(3))

    def body(self, index, x):
        h = self.up[index](x).tanh()
        if x.mean() > 0:
            h = h + self.extra[index](x).sin()
        return self.down[index](h) + x

    def forward(self, x):
        for index in range(3):
            region = remat.region(lambda t, i=index: self.body(i, t), "r")
            x = remat.checkpoint(region_name=f"layers.{index}")(region)(x)
        return x.square().mean()


def test_a_branch_inside_a_region_that_saves_more_is_told_when_over_and_later_steps_leave_room():
    # No watch sees such a step before its backward (nothing it can compare differs): its peak,
    # read when backward ends, is over its prediction; over the budget it is said with its figures,
    # and later steps with its inputs plan lower by what it took above the prediction.
    def step_batch(index):
        x = torch.randn(256, 64, generator=torch.Generator().manual_seed(index))
        return x + (0.5 if index % 2 else -0.5)  # the profiled step (index 0) takes the narrow path

    def profiled_peak(wide):
        gc.collect()
        torch.manual_seed(0)
        with remat.tag_cpu_tensors():
            model = BranchInsideRegion()
            with remat.profile_regions() as profile:
                model(step_batch(1 if wide else 0)).backward()
        return profile.step_peak_bytes

    narrow, wide = profiled_peak(False), profiled_peak(True)
    assert wide > narrow * 1.2, (narrow, wide)
    budget = narrow + (wide - narrow) * 9 // 10
    runs = {}
    for fitted_budget in (None, budget):
        with fit_loop.fitted(BranchInsideRegion, fitted_budget) as (model, told):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            rows = []
            for index in range(6):
                x = step_batch(index)
                peak = fit_loop.peak_of(lambda: (optimizer.zero_grad(set_to_none=True), model(x).backward(),
                                                 optimizer.step()))
                rows.append((peak, [None if p.grad is None else p.grad.numpy().tobytes() for p in model.parameters()]))
            fit_loop.unfit(model, step_batch(0))  # ends the last step
        runs[fitted_budget] = rows, fit_loop.messages(told, "remat.fit")
    plain, (rows, told) = runs[None][0], runs[budget]
    assert [grads for _, grads in rows] == [grads for _, grads in plain]  # bitwise
    assert rows[1][0] > budget, (rows[1][0], budget)  # the first wide step: over, and said
    over = [message for message in told if "over the budget" in message]
    assert len(over) == 1 and f"peaked at {rows[1][0] / 2**20:.2f} MiB ({rows[1][0]} bytes)" in over[0], told
    assert all(peak <= budget for peak, _ in rows[2:]), ([peak for peak, _ in rows], budget)
    # Where the room such a step took leaves no plan, the next step raises before its forward, naming it
    tight = (narrow + wide) // 2
    with fit_loop.fitted(BranchInsideRegion, tight) as (model, _):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        with pytest.raises(ValueError, match=r"a step with these inputs that ran the profiled step's checkpoints and "
                                             r"regions on the same shapes peaked .* above its plan's prediction \(what "
                                             r"a region keeps may depend on the data, a branch inside one\)"):
            for index in range(6):
                optimizer.zero_grad(set_to_none=True)
                model(step_batch(index)).backward()
                optimizer.step()


class GradedBranches(BranchInsideRegion):
    """As BranchInsideRegion, with a second wider path where the input's mean is above 1."""

    def __init__(self):
        super().__init__()
        self.wider = torch.nn.ModuleList(torch.nn.Linear(64, 256) for _ in range(3))

    def body(self, index, x):
        h = self.up[index](x).tanh()
        if x.mean() > 0:
            h = h + self.extra[index](x).sin()
        if x.mean() > 1:
            h = h + self.wider[index](x).cos()
        return self.down[index](h) + x


def test_every_step_over_the_budget_is_told_the_last_one_too():
    # A second step over the budget with the same inputs went unsaid (told once per inputs), and
    # a job's last step over it was never said (the check ran at the next step's forward): now each
    # one is, the last where the model is unfitted or the tag_cpu_tensors() guard counting it exits
    def batch(level):
        x = torch.randn(256, 64, generator=torch.Generator().manual_seed(level))
        return x - x.mean() + (-0.5, 0.5, 1.5)[level]  # the path taken: narrow, wide, wider

    def profiled_peak(level):
        gc.collect()
        torch.manual_seed(0)
        with remat.tag_cpu_tensors():
            model = GradedBranches()
            with remat.profile_regions() as profile:
                model(batch(level)).backward()
        return profile.step_peak_bytes

    # Just below the wide step's peak saving everything: it goes over, a wider one later goes over
    # by more than the room left for the wide one
    budget = profiled_peak(1) - 65536
    levels = [0, 0, 1, 1, 2]
    for ending in ("unfit", "guard exit"):
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            gc.collect()
            torch.manual_seed(0)
            with remat.tag_cpu_tensors():
                model = GradedBranches()
                remat.fit(model, budget=budget)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                peaks = []
                for level in levels:
                    x = batch(level)
                    peaks.append(fit_loop.peak_of(lambda: (optimizer.zero_grad(set_to_none=True),
                                                           model(x).backward(), optimizer.step())))
                said = len(fit_loop.messages(told, "over the budget"))
                if ending == "unfit":
                    remat.unfit(model)
            over = [peak for peak in peaks if peak > budget]
            assert len(over) == 2 and peaks[2] > budget and peaks[-1] > budget, (peaks, budget)
            assert said == len(over) - 1, (said, peaks, budget)  # the last: not before its end
            told = fit_loop.messages(told, "over the budget")
            assert len(told) == len(over), told
            assert [f"peaked at {peak / 2**20:.2f} MiB ({peak} bytes)" in message for peak, message in
                    zip(over, told)] == [True] * len(over), (over, told)
