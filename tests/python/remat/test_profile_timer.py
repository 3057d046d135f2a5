"""How profile_regions times regions: by default the thread's CPU time on the CPU, so a region that
waits (a 20 ms sleep: I/O, a collective, a synchronization) is ranked as cheap to recompute;
timer="wall" (profile_regions and remat.fit) measures wall-clock time, which ranks it as costly, and
the dump says which timer measured it."""

import time

import pytest
import torch

import remat


def step(x):
    def waits(t):
        time.sleep(0.02)
        return t.sin()

    def computes(t):
        for _ in range(20):
            t = (t @ t.T)[:, : t.shape[1]].tanh()
        return t

    def body(t):
        h = remat.region(waits, "waits")(t)
        return remat.region(computes, "computes")(h)

    return remat.checkpoint(region_name="block")(body)(x).sum()


def profile(timer):
    x = torch.randn(128, 128, requires_grad=True)
    with remat.profile_regions(**({} if timer is None else {"timer": timer})) as measured:
        step(x).backward()
    return measured


def test_thread_time_ranks_a_sleeping_region_cheap_and_wall_time_ranks_it_costly():
    thread = profile(None)
    wall = profile("wall")
    assert thread.timer == "thread_time" and wall.timer == "wall_time"
    seconds = {kind: {region.name: region.seconds for region in measured.regions}
               for kind, measured in (("thread", thread), ("wall", wall))}
    assert seconds["thread"]["block::waits"] < 0.005 < 0.02 <= seconds["wall"]["block::waits"], seconds
    assert seconds["wall"]["block::waits"] > seconds["wall"]["block::computes"], seconds
    # With room to save one region, each profile saves what it ranks costlier to recompute
    for measured, saved in ((thread, "block::computes"), (wall, "block::waits")):
        one = max(region.saved_bytes for region in measured.regions)
        plan = measured.plan(budget_bytes=measured.base_bytes + one)
        decisions = plan.decisions
        assert list(decisions.values()).count("save") == 1 and decisions[saved] == "save", (measured.timer, decisions)
        assert plan.recompute_seconds == pytest.approx(
            sum(r.seconds for r in measured.regions if decisions[r.name] == "recompute"))
    assert '"timer":"wall_time"' in wall.to_json().replace(" ", "")


def test_fit_profiles_with_the_timer_given_and_bad_timers_are_refused():
    model = torch.nn.Linear(4, 4)
    assert remat.fit(model, "1GiB", timer="wall").remat_fit.timer == "wall"
    remat.unfit(model)
    with pytest.raises(ValueError, match=r"remat.fit: timer must be 'auto' .* or 'wall' .*, got 'cpu'"):
        remat.fit(model, "1GiB", timer="cpu")
    with pytest.raises(ValueError, match=r"profile_regions: timer must be 'auto' .* got 'perf'"):
        remat.profile_regions(timer="perf")
