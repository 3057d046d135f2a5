"""How profile_regions times regions: by default the thread's CPU time on the CPU, so a region that
waits (a 300 ms sleep, longer than the other region takes even on a loaded machine: I/O, a collective, a synchronization) is ranked as cheap to recompute;
timer="wall" (profile_regions and remat.fit) measures wall-clock time, which ranks it as costly, and
the dump says which timer measured it."""

import time

import pytest
import torch

import remat


def step(x):
    def waits(t):
        time.sleep(0.3)
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
    x = torch.randn(64, 64, requires_grad=True)
    with remat.profile_regions(**({} if timer is None else {"timer": timer})) as measured:
        step(x).backward()
    return measured


def test_thread_time_ranks_a_sleeping_region_cheap_and_wall_time_ranks_it_costly():
    thread = profile(None)
    wall = profile("wall")
    assert thread.timer == "thread_time" and wall.timer == "wall_time"
    seconds = {kind: {region.name: region.seconds for region in measured.regions}
               for kind, measured in (("thread", thread), ("wall", wall))}
    assert seconds["thread"]["block::waits"] < 0.05 < 0.3 <= seconds["wall"]["block::waits"], seconds
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


class Sleeps(torch.nn.Module):
    def forward(self, t):
        time.sleep(0.02)
        return t.sin()


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.waits = Sleeps()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.proj(self.waits(x))


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(DecoderLayer() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.sum()


@pytest.mark.parametrize("timer, kind", [(None, "thread_time"), ("wall", "wall_time")])
def test_wrap_decoder_layers_budget_profiles_with_the_timer_given(timer, kind):
    model = remat.wrap_decoder_layers(Decoder(), save=(), layers="layers", budget="1GiB",
                                      **({} if timer is None else {"timer": timer}))
    with remat.tag_cpu_tensors():
        for _ in range(2):  # the first step profiled, the profile closed by the next
            model(torch.randn(8, 16, requires_grad=True)).backward()
    profile = model.remat_fit.latest.profile
    waited = {region.name: region.seconds for region in profile.regions}["layers.0::waits"]
    assert profile.timer == kind and model.remat_fit.timer == (timer or "auto")
    assert (waited >= 0.02) if timer == "wall" else (waited < 0.005), waited
    remat.unfit(model)


def test_wrap_decoder_layers_refuses_a_timer_without_a_budget_and_bad_timers():
    with pytest.raises(TypeError, match=r"wrap_decoder_layers: timer= is how the profiles of budget= time regions"):
        remat.wrap_decoder_layers(Decoder(), layers="layers", timer="wall")
    with pytest.raises(ValueError, match=r"wrap_decoder_layers: timer must be 'auto' .* got 'cpu'"):
        remat.wrap_decoder_layers(Decoder(), layers="layers", budget="1GiB", timer="cpu")


def test_what_watching_a_profiled_regions_ops_costs_is_taken_out_of_its_seconds(monkeypatch):
    """A profiled step's runtime watches the ops in save regions for the checkpoint inputs they read
    (remat/input_reads.hpp) where it measures the step's memory, which costs each op its inputs
    boxed: on a region of 800 small ops, 30% of its seconds. The ops watched are counted per region and their calibrated cost taken
    out of its seconds; the calibration's own checkpoint is in no trace."""
    import remat._profiling as profiling
    from remat._extension import _C

    monkeypatch.setattr(profiling, "_input_read_per_op", None)
    with remat.collect_trace() as trace:
        per_op = profiling.input_read_seconds_per_op()
    assert 0 < per_op < 1e-4 and trace.entries == []

    watched = []
    take = _C.take_ops_watched_in_save_regions
    monkeypatch.setattr(_C, "take_ops_watched_in_save_regions", lambda: watched.append(take()) or watched[-1])

    def tiny_ops(t):
        for _ in range(100):
            t = t.sin()
        return t

    def seconds(cost):
        monkeypatch.setattr(profiling, "_input_read_per_op", cost)
        x = torch.randn(8, 8, requires_grad=True)
        with remat.tag_cpu_tensors(), remat.profile_regions() as measured:  # the step's memory measured: watched
            remat.checkpoint(region_name="block")(lambda t: remat.region(tiny_ops, "ops")(t))(x).sum().backward()
        return measured.regions[0].seconds

    assert seconds(0.0) > 0
    assert 100 <= watched[-1] < 1000  # the region's 100 sins, and what saving their inputs runs
    assert seconds(1.0) == 0.0  # all of it taken out (the cost stands in for one far above the region's time)
