"""A model whose recompute region changes its input in place (ReLU(inplace=True) as a region) or
whose region's output is changed in place after it returns (h += x) is profiled, planned and fitted.
A profile saves every region; the runtime runs such a region again in recompute instead of
skipping it (skipped, recompute would miss the change or make it twice), and the profile marks it
"must_recompute", with the region whose output it changes, so that every plan recomputes them.
Gradients are bitwise those without checkpointing, in the profiled step and under each plan; what
the checkpoints keep is at most the plan's kept_bytes, the step peak at most the budget and 3% over
the prediction; remat-report advise makes the same plans; remat.fit trains such a model under a
budget. A region that changes a tensor made before the checkpoint is still refused, naming it. A
grouped plan (group=True, advise --group) whose pattern stands for a region that must be saved and
one that must be recomputed is refused naming both; planned by region, the step runs."""

import json
import re
import subprocess

import pytest
import torch

import remat
from remat._plans import live_checkpoint_bytes

import fit_loop
from test_step_peak_plans import remat_report

WIDTH, BATCH, LAYERS = 32, 512, 4


class Layer(torch.nn.Module):
    """lin -> act (ReLU(inplace=True), changing lin's output) or h += x -> out -> mlp."""

    def __init__(self, in_place_input):
        super().__init__()
        self.lin, self.out = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.up, self.down = torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Linear(4 * WIDTH, WIDTH)
        self.act = torch.nn.ReLU(inplace=True)
        self.in_place_input = in_place_input

    def forward(self, x, plain=False):
        region = (lambda fn, name, recompute=True: fn) if plain else remat.region
        h = region(self.lin, "lin")(x)
        if self.in_place_input:
            h = region(self.act, "act")(h)  # changes its input in place
        else:
            h += x  # changes the output of region 'lin' in place
        h = region(self.out, "out", recompute=False)(h)
        return region(lambda t: self.down(self.up(t).cos()) + t, "mlp")(h)


class Model(fit_loop.CheckpointedLayers):
    def __init__(self, in_place_input, checkpointed=True):
        super().__init__([Layer(in_place_input) for _ in range(LAYERS)], checkpointed)


def batch(step=0):
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(step), requires_grad=True)


def rerun_regions(in_place_input):
    """The regions every plan must recompute, by layer, and a part of why."""
    lin = ("lin", "its output 0 is changed in place after it returns")
    return dict([lin, ("act", "it changes its input 0 in place")] if in_place_input else [lin])


class Fixture:
    """A model, its gradients without checkpointing, and the profile of one checkpointed step."""

    def __init__(self, in_place_input):
        torch.manual_seed(0)
        self.model = Model(in_place_input)
        self.x = batch()
        self.model.checkpointed = False
        self.model(self.x).backward()
        self.reference = self.grads()
        self.model.checkpointed = True
        with remat.profile_regions() as profile:
            self.model(self.x).backward()
        self.profiled_bitwise = self.bitwise()  # nothing held past this: the planned steps begin as the profiled one
        self.profile = profile

    def grads(self):
        out = [t.grad.clone() for t in list(self.model.parameters()) + [self.x]]
        for t in list(self.model.parameters()) + [self.x]:
            t.grad = None
        return out

    def bitwise(self):
        return all(torch.equal(got, want) for got, want in zip(self.grads(), self.reference))


@pytest.fixture(params=[True, False], ids=["relu_inplace_region", "add_into_region_output"])
def fixture(request):
    with remat.tag_cpu_tensors():
        yield Fixture(request.param), request.param


def test_the_profile_marks_the_regions_recompute_runs_again_and_its_step_is_bitwise(fixture):
    f, in_place_input = fixture
    assert f.profiled_bitwise
    doc = json.loads(f.profile.to_json())
    marked = {r["name"]: r["must_recompute"] for r in doc["regions"] if "must_recompute" in r}
    expected = rerun_regions(in_place_input)
    assert sorted(marked) == sorted(f"layers.{i}::{name}" for i in range(LAYERS) for name in expected)
    for name, reason in marked.items():
        assert expected[name.split("::")[1]] in reason, (name, reason)
        assert "recompute runs it again" in reason
    assert all("must_save" not in r for r in doc["regions"])
    plan = f.profile.plan(f.profile.all_saved_bytes)
    assert "recompute (must be recomputed: it" in plan.format()


def test_per_op_figures_mark_no_region_must_save_and_a_per_op_plan_keeps_no_op_of_the_marked_ones(fixture):
    f, in_place_input = fixture
    with remat.profile_regions(ops=True) as profile:
        f.model(f.x).backward()
    assert f.bitwise()
    doc = json.loads(profile.to_json())
    marked = [r for r in doc["regions"] if "must_recompute" in r]
    assert len(marked) == LAYERS * len(rerun_regions(in_place_input))
    assert all("ops" not in r for r in marked) and all("must_save" not in r for r in doc["regions"])
    assert any("ops" in r for r in doc["regions"])
    plan = profile.plan((profile.base_bytes + profile.all_saved_bytes) // 2, ops=True)
    assert not any(name in plan.kept_ops for name in (r["name"] for r in marked))
    with remat.use_plan(plan):
        f.model(f.x).backward()
    assert f.bitwise()


def test_plans_by_kept_bytes_recompute_the_marked_regions_keep_within_and_are_bitwise(fixture):
    f, in_place_input = fixture
    low, high = f.profile.plan(f.profile.base_bytes).kept_bytes, f.profile.all_saved_bytes
    budgets = [low + (high - low) * i // 4 for i in range(5)]
    seen = set()
    for budget in budgets:
        plan = f.profile.plan(budget)
        for i in range(LAYERS):
            for name in rerun_regions(in_place_input):
                assert plan.decisions[f"layers.{i}::{name}"] == "recompute"
        seen.add(tuple(sorted(plan.decisions.items())))
        with remat.use_plan(plan):
            loss = f.model(f.x)
            kept = live_checkpoint_bytes()
            loss.backward()
        assert kept <= plan.kept_bytes <= budget, (budget, plan.kept_bytes, kept)
        assert f.bitwise(), budget
    assert len(seen) > 1  # the budgets made different plans


def test_plans_by_step_peak_peak_within_the_budget_and_the_prediction_and_are_bitwise(fixture):
    f, _ = fixture
    least = f.profile.least_peak_bytes()
    most = f.profile.plan(peak_bytes=10 * f.profile.step_peak_bytes).peak_bytes  # the fastest plan's peak
    assert least < most
    for budget in [least + (most - least) * i // 4 for i in range(5)]:
        plan = f.profile.plan(peak_bytes=budget)
        assert plan.peak_bytes <= budget

        def run_step():  # begins as the profiled step did, without gradients
            for t in list(f.model.parameters()) + [f.x]:
                t.grad = None
            with remat.use_plan(plan):
                f.model(f.x).backward()

        measured = max(fit_loop.peak_of(run_step), fit_loop.peak_of(run_step))
        assert f.bitwise(), budget
        assert measured <= budget, (budget, plan.peak_bytes, measured)
        assert measured <= plan.peak_bytes * 1.03, (budget, plan.peak_bytes, measured)


@pytest.mark.parametrize("change", ["output after it returns", "its own input"])
def test_a_region_recompute_runs_again_is_predicted_as_every_plan_runs_it(change):
    """The runtime runs such a region again in recompute. It keeps none of its outputs from forward
    (they are made again), so the profile does not count them among what the region keeps (before,
    every plan recomputing it was predicted to free bytes the step never held: with 4 layers each
    plan peaked 3 activations above its prediction). One that changes its input in place keeps its
    saved tensors from forward in the profiled step, so its backward began there before recompute;
    under every plan recompute runs first and makes that input again beside its backward's
    temporaries, which the profile now counts (before, each plan peaked one activation above its
    prediction). Every plan by step peak at most its prediction, to the byte, and bitwise."""
    torch.manual_seed(0)
    layers = [(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)) for _ in range(LAYERS)]
    parameters = [p for pair in layers for linear in pair for p in linear.parameters()]

    def layer(x, a, c, plain=False):
        region = (lambda fn, name: fn) if plain else remat.region
        h = region(lambda t: a(t).sin(), "attn")(x)
        if change == "its own input":
            return region(lambda t: c(t.mul_(0.5)).cos(), "mlp")(h * 1.0) + h
        h2 = region(lambda t: c(t).cos(), "mlp")(h)
        h2.mul_(0.5)  # changes the output of region 'mlp' in place after it returns
        return h2 + h

    def step(x, plain=False):
        for i, (a, c) in enumerate(layers):
            body = lambda t, a=a, c=c: layer(t, a, c, plain)
            x = body(x) if plain else remat.checkpoint(region_name=f"layers.{i}")(body)(x)
        x.square().mean().backward()

    def grads():
        out = [p.grad.clone() for p in parameters]
        for p in parameters:
            p.grad = None
        return out

    with remat.tag_cpu_tensors():
        x = batch()
        step(x.detach(), plain=True)
        reference = grads()
        with remat.profile_regions() as profile:
            step(x.detach())
        grads()
        assert all("must_recompute" in r for r in json.loads(profile.to_json())["regions"]
                   if r["name"].endswith("::mlp"))
        least, most = profile.least_peak_bytes(), profile.step_peak_bytes
        for budget in [least + (most - least) * i // 4 for i in range(5)]:
            plan = profile.plan(peak_bytes=budget)

            def run_step():
                with remat.use_plan(plan):
                    step(x.detach())

            measured = fit_loop.peak_of(run_step)
            assert all(torch.equal(got, want) for got, want in zip(grads(), reference)), budget
            assert measured <= plan.peak_bytes <= budget, (budget, plan.peak_bytes, measured)


def test_remat_report_advise_makes_the_same_plans(fixture, tmp_path):
    f, _ = fixture
    path = tmp_path / "profile.json"
    f.profile.to_json(path)
    low, high = f.profile.base_bytes, f.profile.all_saved_bytes
    for budget in (low, (low + high) // 2, high):
        plan = f.profile.plan(budget)
        run = subprocess.run([remat_report(), "advise", str(path), "--budget", f"{budget}B", "--json"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["decisions"] == plan.decisions
    peak = f.profile.least_peak_bytes()
    run = subprocess.run([remat_report(), "advise", str(path), "--peak", f"{peak}B", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["decisions"] == f.profile.plan(peak_bytes=peak).decisions
    run = subprocess.run([remat_report(), "advise", str(path), "--budget", f"{high}B"], capture_output=True,
                         text=True, timeout=60)
    assert "must be recomputed: its output 0 is changed in place after it returns" in run.stdout


@pytest.mark.parametrize("in_place_input", [True, False], ids=["relu_inplace_region", "add_into_region_output"])
def test_fit_trains_such_a_model_within_the_budget_bitwise(in_place_input):
    def train(budget, checkpointed=True):
        rows = []
        with fit_loop.fitted(lambda: Model(in_place_input, checkpointed), budget) as (model, told):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            for step in range(1, 5):
                peak, grads = fit_loop.sgd_step(model, optimizer, batch(step))
                state = getattr(model, "remat_fit", None)
                rows.append({"peak": peak, "grads": grads,
                             "predicted": None if state is None or state.plan is None
                             else state.predicted_peak_bytes})
            least = fit_loop.unfit(model, batch(5))
        return rows, least, fit_loop.messages(told, "remat.fit")

    plain, _, _ = train(None, checkpointed=False)
    saved, state, _ = train("1GiB")
    profile = state.latest.profile
    budget = (profile.least_peak_bytes() + max(row["peak"] for row in saved)) // 2
    rows, _, told = train(budget)
    # Said once: the first step, profiled with every region saved, peaks over this budget
    assert len(told) == 1 and "the profiled step (every region saved) peaked at" in told[0], told
    planned = 0
    for step, row in enumerate(rows, 1):
        assert row["grads"] == plain[step - 1]["grads"], step  # bitwise
        if row["predicted"] is not None:
            planned += 1
            assert row["peak"] <= budget, (step, row, budget)
            assert row["peak"] <= row["predicted"], (step, row)
    assert planned >= 2


def test_a_region_changing_a_tensor_made_before_the_checkpoint_is_still_refused():
    buffer = torch.randn(4, WIDTH)  # captured, not made by the checkpoint: recompute would change it twice

    def body(x):
        return x * remat.region(torch.nn.ReLU(inplace=True), "act")(buffer)

    x = torch.randn(4, WIDTH, requires_grad=True)
    with pytest.raises(remat.RematError, match=r"region 'captured::act' changed its input 0 in place \(an op such as "
                                               r"x.relu_\(\)\), a tensor made before the checkpoint ran"):
        with remat.profile_regions():
            remat.checkpoint(region_name="captured")(body)(x).sum().backward()
    with remat.profile_regions() as profile:  # the refused profile left nothing behind: another one runs
        remat.checkpoint(region_name="sin")(lambda t: remat.region(lambda u: u.sin(), "sin")(t))(x).sum().backward()
    assert [r.name for r in profile.regions] == ["sin::sin"]


class ChangedAfterCheckpoint(torch.nn.Module):
    """Layers of lin (recompute) -> out (save: a Linear, then dropout), each checkpoint's output,
    which is out's, changed in place after the checkpoint returns (h = checkpoint(layer)(h);
    h.mul_(1.5)). A plan keeps a saved region's outputs for recompute: the change is seen in
    backward, and recompute runs the region again, remaking its output as forward made it."""

    def __init__(self):
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.outs = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x, plain=False):
        region = (lambda fn, name, recompute=True: fn) if plain else remat.region
        for index, (lin, out) in enumerate(zip(self.lins, self.outs)):
            def layer(t, lin=lin, out=out):
                h = region(lin, "lin")(t)
                return region(lambda u: torch.nn.functional.dropout(out(u), 0.2), "out", recompute=False)(h)

            x = layer(x) if plain else remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
            x.mul_(1.5)
        return x.square().mean()


def test_a_checkpoint_output_changed_after_it_returns_runs_under_every_plan_bitwise():
    torch.manual_seed(0)
    model, x = ChangedAfterCheckpoint(), batch()

    def grads(plain=False):
        torch.manual_seed(1)
        model(x, plain).backward()
        out = [t.grad.clone() for t in [*model.parameters(), x]]
        model.zero_grad(set_to_none=True)
        x.grad = None
        return out

    expected = grads(plain=True)
    with remat.profile_regions() as profile:
        assert all(map(torch.equal, grads(), expected))
    least, most = profile.base_bytes, profile.all_saved_bytes
    saved_outs = set()
    for budget in [least + (most - least) * i // 4 for i in range(5)]:
        plan = profile.plan(budget)
        saved_outs |= {name for name, choice in plan.decisions.items() if name.endswith("::out") and choice == "save"}
        with remat.use_plan(plan):
            assert all(map(torch.equal, grads(), expected)), plan.decisions
    assert saved_outs  # some plan saved a region whose kept output the caller changed


class MixedLayer(torch.nn.Module):
    """A 'norm' region that counts its calls in a tensor it did not make (must be saved: a plain
    attribute, no buffer the checkpoint gives back to recompute) in the first layer, and one whose
    output is changed in place after it returns (must be recomputed) in the others."""

    def __init__(self, counts_calls):
        super().__init__()
        self.lin, self.mlp = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.calls = torch.zeros(())
        self.counts_calls = counts_calls

    def counted(self, t):
        self.calls.add_(1)  # into state the region did not make: recompute would count again
        return self.lin(t)

    def forward(self, x, plain=False):
        region = (lambda fn, name, recompute=True: fn) if plain else remat.region
        if self.counts_calls:
            h = region(self.counted, "norm", recompute=False)(x)
        else:
            h = region(self.lin, "norm")(x)
            h += x
        return region(lambda t: self.mlp(t).cos(), "mlp")(h)


class MixedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(MixedLayer(index == 0) for index in range(LAYERS))

    def forward(self, x, plain=False):
        for index, layer in enumerate(self.layers):
            x = layer(x, plain=True) if plain else remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
        return x.square().mean()


MIXED_PINS = (r"cannot plan by pattern: 'layers\.\*::norm' stands for 'layers\.0::norm', which must be saved \(it "
              r"writes in place into a tensor it did not make .*\), and for 'layers\.1::norm', which must be "
              r"recomputed \(its output 0 is changed in place after it returns.*\), and a pattern makes one choice "
              r"for all its regions; plan each region on its own \(without group=True; remat-report advise without "
              r"--group\)")


def test_a_pattern_whose_regions_must_be_saved_and_recomputed_is_refused_and_plans_by_region_run(tmp_path):
    torch.manual_seed(0)
    model, x = MixedModel(), batch()
    leaves = list(model.parameters()) + [x]

    def step(**kwargs):  # begins as the profiled step did, without gradients
        for t in leaves:
            t.grad = None
        model(x, **kwargs).backward()

    step(plain=True)
    reference = [t.grad.clone() for t in leaves]

    def bitwise():  # the step's gradients against those without checkpointing, none held past this
        return all(torch.equal(t.grad, want) for t, want in zip(leaves, reference))

    with remat.tag_cpu_tensors():
        with remat.profile_regions() as profile:
            step()
        assert bitwise()
        doc = json.loads(profile.to_json())
        pins = {r["name"]: ("save" if "must_save" in r else "recompute") for r in doc["regions"]
                if "must_save" in r or "must_recompute" in r}
        assert pins == {"layers.0::norm": "save", **{f"layers.{i}::norm": "recompute" for i in range(1, LAYERS)}}

        # By pattern no choice serves both: every grouped entry point refuses, naming both regions.
        for refused in (lambda: profile.plan(profile.all_saved_bytes, group=True),
                        lambda: profile.plan(peak_bytes=profile.step_peak_bytes, group=True),
                        lambda: profile.least_peak_bytes(group=True),
                        lambda: profile.frontier(group=True),
                        lambda: profile.frontier(group=True, by="peak")):
            with pytest.raises(ValueError, match=MIXED_PINS):
                refused()

        # By region, each keeps its pin, the plan reads back, and its step is bitwise within the prediction.
        plan = profile.plan(peak_bytes=profile.step_peak_bytes)
        assert plan.decisions["layers.0::norm"] == "save"
        assert all(plan.decisions[f"layers.{i}::norm"] == "recompute" for i in range(1, LAYERS))
        plan.to_json(tmp_path / "plan.json")
        assert remat.load_plan(tmp_path / "plan.json").decisions == plan.decisions

        def planned_step():
            with remat.use_plan(plan):
                step()

        measured = max(fit_loop.peak_of(planned_step), fit_loop.peak_of(planned_step))
        assert bitwise()
        assert plan.peak_bytes <= profile.step_peak_bytes
        assert measured <= profile.step_peak_bytes and measured <= plan.peak_bytes * 1.03, (measured, plan.peak_bytes)

    path = tmp_path / "profile.json"
    profile.to_json(path)
    for args in (["--budget", f"{profile.all_saved_bytes}B"], ["--peak", f"{profile.step_peak_bytes}B"], []):
        run = subprocess.run([remat_report(), "advise", str(path), "--group", *args], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 1, (args, run.returncode, run.stdout, run.stderr)
        assert re.search("--group: " + MIXED_PINS, run.stderr), run.stderr
    run = subprocess.run([remat_report(), "advise", str(path), "--peak", f"{profile.step_peak_bytes}B", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["decisions"] == plan.decisions
