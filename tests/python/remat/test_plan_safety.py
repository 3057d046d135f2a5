"""What a plan must not change: regions whose recompute would not give back what forward gave are
saved by every plan (they draw from a generator of their own, they write into state such as a
BatchNorm's running statistics), and per-op plans keep only ops they can hand back unchanged."""

import contextlib
import copy
import json
import subprocess

import pytest
import torch

import remat
from remat._kept_ops import held_storages
from remat._plans import RegionProfile
from torch.utils._python_dispatch import TorchDispatchMode
from test_budget_plans import remat_report


def _noisy_model():
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    generator = torch.Generator().manual_seed(123)

    def noisy(t):
        return torch.tanh(t @ w) + 0.1 * torch.randn(t.shape, generator=generator)

    def body(x):
        h = remat.region(noisy, "noise", recompute=False)(x)
        return remat.region(lambda t: torch.sin(t @ w), "mlp")(h)

    x0 = torch.randn(4, 16)

    def step(checkpointed=True):
        generator.manual_seed(7)
        w.grad = None
        x = x0.clone().requires_grad_(True)
        y = remat.checkpoint(region_name="k")(body)(x) if checkpointed else body(x)
        y.sum().backward()
        return w.grad.clone()

    return step


def test_a_region_drawing_from_its_own_generator_is_saved_by_every_plan(tmp_path):
    step = _noisy_model()
    reference = step(checkpointed=False)
    with remat.tag_cpu_tensors(), remat.profile_regions() as profile:
        step()
    doc = json.loads(profile.to_json())
    reasons = {r["name"]: r.get("must_save") for r in doc["regions"]}
    assert reasons["k::mlp"] is None
    assert "torch.Generator of its own" in reasons["k::noise"] and "aten::randn" in reasons["k::noise"]
    noise_bytes = next(r.saved_bytes for r in profile.regions if r.name == "k::noise")
    assert noise_bytes > 0

    least = profile.plan(budget_bytes=profile.base_bytes + noise_bytes)
    assert least.decisions == {"k::noise": "save", "k::mlp": "recompute"}
    assert "must be saved" in least.format()
    with remat.use_plan(least):
        assert torch.equal(step(), reference)
    peak_least = profile.plan(peak_bytes=profile.least_peak_bytes())
    assert peak_least.decisions["k::noise"] == "save"
    assert all(point.decisions["k::noise"] == "save" for point in profile.frontier(steps=5))
    assert profile.plan(budget_bytes=profile.base_bytes + noise_bytes, group=True).decisions["k::noise"] == "save"

    # remat-report advise makes the same plan from the dump and says why the region is saved.
    dump = tmp_path / "profile.json"
    profile.to_json(str(dump))
    budget = profile.base_bytes + noise_bytes
    run = subprocess.run([remat_report(), "advise", str(dump), "--budget", f"{budget}B"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "'k::noise' must be saved: it draws from a torch.Generator of its own" in run.stdout
    run = subprocess.run([remat_report(), "advise", str(dump), "--budget", f"{budget}B", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert json.loads(run.stdout)["decisions"] == least.decisions

    # Below what every plan keeps: the error names the region that must be saved and the least budget.
    with pytest.raises(ValueError, match=r"must be saved \('k::noise'\).*smallest budget a plan can meet is "
                                         + str(profile.base_bytes + noise_bytes)):
        profile.plan(budget_bytes=profile.base_bytes + noise_bytes - 1)
    # The figure survives the dump, and an edited plan recomputing the region is refused.
    assert RegionProfile.from_json(profile.to_json()).plan(budget_bytes=profile.base_bytes + noise_bytes).decisions \
        == least.decisions
    edited = json.loads(least.to_json())
    edited["decisions"]["k::noise"] = "recompute"
    for region in edited["regions"]:
        if region["name"] == "k::noise":
            region["decision"] = "recompute"
    with pytest.raises(ValueError, match="recomputes 'k::noise', which must be saved"):
        remat.load_plan(json.dumps(edited))
    # validate takes what the readers take: the schema allows the edit, the plan reader does not.
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    run = subprocess.run([remat_report(), "validate", str(tmp_path / "edited.json")], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "recomputes 'k::noise', which must be saved" in run.stderr, run.stderr
    doubled = json.loads(profile.to_json())
    doubled["regions"].append(dict(doubled["regions"][0]))
    doubled["all_saved_bytes"] += doubled["regions"][0]["saved_bytes"]
    (tmp_path / "doubled.json").write_text(json.dumps(doubled))
    run = subprocess.run([remat_report(), "validate", str(tmp_path / "doubled.json")], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "k::noise" in run.stderr, run.stderr


class _BatchNormLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.bn = torch.nn.BatchNorm1d(16)

    def forward(self, x):
        h = remat.region(lambda t: torch.tanh(self.bn(self.lin(t))), "bn", recompute=False)(x)
        return remat.region(lambda t: torch.sin(self.lin(t)), "mlp")(h)


def test_a_saved_region_updating_batchnorm_statistics_may_be_recomputed_by_a_plan():
    """Such a region was must_save (recompute would update the statistics again); the checkpoint now
    gives them back to recompute as forward read them, so a plan may recompute it, and every plan
    updates them once, as without checkpointing."""
    torch.manual_seed(0)
    model = _BatchNormLayer()
    reference = copy.deepcopy(model)
    x = torch.randn(32, 16)

    def step(m, checkpointed):
        out = remat.checkpoint(region_name="c")(m)(x) if checkpointed else m(x)
        out.square().sum().backward()

    with remat.profile_regions() as profile:
        step(model, True)
    step(reference, False)
    reasons = {r["name"]: r.get("must_save") for r in json.loads(profile.to_json())["regions"]}
    assert reasons == {"c::bn": None, "c::mlp": None}
    least = profile.plan(budget_bytes=profile.base_bytes)
    assert least.decisions == {"c::bn": "recompute", "c::mlp": "recompute"}
    for chosen in (least, profile.plan(budget_bytes=profile.base_bytes + profile.all_saved_bytes)):
        with remat.use_plan(chosen):
            step(model, True)
        step(reference, False)
        assert torch.equal(model.bn.running_mean, reference.bn.running_mean)
        assert torch.equal(model.bn.running_var, reference.bn.running_var)
        assert model.bn.num_batches_tracked.item() == reference.bn.num_batches_tracked.item()
        for ours, theirs in zip(model.parameters(), reference.parameters()):
            assert torch.equal(ours.grad, theirs.grad)


def _reference_and_profile(step):
    """(the gradients of step(checkpointed=False), the profile of step(), its regions by name as the
    dump lists them)."""
    reference = step(checkpointed=False)
    with remat.profile_regions() as profile:
        step()
    return reference, profile, {r["name"]: r for r in json.loads(profile.to_json())["regions"]}


def test_a_region_reading_a_buffer_a_later_region_changes_in_place_is_saved_by_every_plan():
    """A memory bank read by one region and updated in place by a later one: recomputed after the
    step's forward, the reader would read the updated bank. Before, plans recomputed it (the
    profile marked the writer alone) and gradients differed by up to 6.2, without a word."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x0 = torch.randn(6, 8)
    bank, untouched = torch.zeros(8), torch.ones(8)

    def body(t):
        h = remat.region(lambda u: (u + bank).sin(), "read", recompute=False)(t)
        h = remat.region(lambda u: (u * untouched).cos(), "other", recompute=False)(h)

        def write(u):
            with torch.no_grad():
                bank.mul_(0.5).add_(u.mean(0))
            return (u @ w).tanh()

        return remat.region(write, "write", recompute=False)(h)

    def step(checkpointed=True):
        bank.zero_()
        x = x0.clone().requires_grad_()
        y = x
        for index in range(3):
            y = remat.checkpoint(region_name=f"l{index}")(body)(y) if checkpointed else body(y)
        y.square().sum().backward()
        gradients = [x.grad.clone(), w.grad.clone()]
        w.grad = None
        return gradients

    reference, profile, regions = _reference_and_profile(step)
    reasons = {name: region.get("must_save") for name, region in regions.items()}
    for index in range(3):
        assert reasons[f"l{index}::read"] == (f"it reads a (8,) float32 tensor that region 'l{index}::write' later "
                                              "changes in place (aten::mul_.Tensor), so its recompute would read "
                                              "the changed values")
        assert "writes in place into a tensor it did not make" in reasons[f"l{index}::write"]
        assert reasons[f"l{index}::other"] is None  # reads a buffer nothing changes
    least = profile.plan(budget_bytes=profile.base_bytes + sum(
        r.saved_bytes for r in profile.regions if not r.name.endswith("other")))
    assert {name: choice for name, choice in least.decisions.items() if choice == "recompute"} == {
        f"l{index}::other": "recompute" for index in range(3)}
    with remat.use_plan(least):
        assert all(torch.equal(got, want) for got, want in zip(step(), reference))


@pytest.mark.parametrize("captured", ["buffer", "requires grad"])
def test_a_region_reading_a_captured_tensor_changed_before_backward_is_saved_by_every_plan(captured):
    """A region the code saves reads a tensor through the body's closure (a mask, a tensor made
    from a parameter), which the loop changes in place after the forward: the runtime cannot check
    it (docs/python.md), so a plan recomputing the region gave wrong gradients without a word."""
    x0, b0 = torch.randn(6, 8), torch.randn(8)

    def step(checkpointed=True):
        x = x0.clone().requires_grad_()
        p = b0.clone().requires_grad_()
        b = b0.clone() if captured == "buffer" else p * 2.0

        def body(t):
            return remat.region(lambda u: (u * 2).cos(), "m")(
                remat.region(lambda u: (u + b).sin(), "a", recompute=False)(t))

        y = (remat.checkpoint(region_name="c")(body) if checkpointed else body)(x * 1.0)
        with torch.no_grad():
            b.add_(1.0)
        y.sum().backward()
        return [x.grad, p.grad]

    reference, profile, regions = _reference_and_profile(step)
    assert regions["c::a"]["must_save"] == ("it reads a (8,) float32 tensor it did not make, which is changed in "
                                            "place after its forward, before backward, so its recompute would read "
                                            "the changed values")
    assert "must_save" not in regions["c::m"]
    least = profile.plan(budget_bytes=profile.base_bytes + next(r.saved_bytes for r in profile.regions
                                                                 if r.name == "c::a"))
    assert least.decisions == {"c::a": "save", "c::m": "recompute"}
    with remat.use_plan(least):
        got = step()
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(got, reference))


def test_a_region_whose_output_the_caller_changes_after_the_checkpoint_is_recomputed_by_every_plan():
    """The caller scales a region's output in place after the checkpoint returned it: a plan saving
    that region and recomputing the next, which reads the output, kept neither the checkpoint's
    input nor a way to make the output again, and backward refused the plan the profile had made
    ("output 0 of save region 'c::r' was changed in place after forward")."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x0 = torch.randn(6, 8)

    def body(t):
        h = remat.region(lambda u: (u @ w).tanh() * 1.0, "r")(t)
        return h, remat.region(lambda u: (u * 2).sin() @ w, "s")(h)

    def step(checkpointed=True):
        x = x0.clone().requires_grad_()
        h, g = (remat.checkpoint(region_name="c")(body) if checkpointed else body)(x * 1.0)
        h.mul_(3)
        (g.square().sum() + h.square().sum()).backward()
        gradients = [x.grad, w.grad]
        w.grad = None
        return gradients

    reference, profile, regions = _reference_and_profile(step)
    assert regions["c::r"]["must_recompute"] == ("its output 0 is changed in place after the checkpoint returned (an "
                                                 "op such as h.mul_(2)): recompute runs it again")
    assert "must_recompute" not in regions["c::s"]
    for budget in range(profile.base_bytes, profile.base_bytes + profile.all_saved_bytes + 1, 288):
        plan = profile.plan(budget_bytes=budget)
        assert plan.decisions["c::r"] == "recompute"
        with remat.use_plan(plan):
            assert all(torch.equal(got, want) for got, want in zip(step(), reference))


def test_a_region_running_a_backward_inside_its_forward_is_saved_by_every_plan():
    """A gradient penalty inside a region (torch.autograd.grad, create_graph=True): recomputed, the
    region drops what its forward saves as it is saved, so its inner backward has nothing to read.
    Before, the profile let plans recompute it and each such plan was refused in forward."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x0 = torch.randn(6, 8)

    def penalized(u):
        h = torch.tanh(u @ w)
        g, = torch.autograd.grad(h.square().sum(), u, create_graph=True)
        return h * g

    def body(t):
        return remat.region(lambda u: u.sin() @ w, "b")(remat.region(penalized, "a", recompute=False)(t))

    def step(checkpointed=True):
        x = x0.clone().requires_grad_()
        (remat.checkpoint(region_name="c")(body) if checkpointed else body)(x * 1.0).square().sum().backward()
        gradients = [x.grad, w.grad]
        w.grad = None
        return gradients

    reference, profile, regions = _reference_and_profile(step)
    reasons = {name: region.get("must_save") for name, region in regions.items()}
    assert reasons["c::a"].startswith("it runs a backward inside its forward (aten::")
    assert reasons["c::b"] is None
    least = profile.plan(budget_bytes=profile.base_bytes + next(r.saved_bytes for r in profile.regions
                                                                 if r.name == "c::a"))
    assert least.decisions == {"c::a": "save", "c::b": "recompute"}
    with remat.use_plan(least):
        assert all(torch.equal(got, want) for got, want in zip(step(), reference))


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _profile_with_heavy_ops(profile):
    """The profile with every op's time raised well above the rest of its region's, so that a
    per-op plan surely keeps ops (the measured times on a shared machine need not)."""
    doc = json.loads(profile.to_json())
    for region in doc["regions"]:
        region["seconds"] = region["seconds"] * 1000 + 1
        for op in region.get("ops", []):
            op["seconds"] = op["seconds"] * 1000 + 0.1
    return RegionProfile(json.dumps(doc))


def _two_layers(width):
    """A weight and a model of two checkpointed layers (regions attn and mlp) using it, which
    takes a checkpoint plan= of its own."""
    torch.manual_seed(0)
    w = torch.randn(width, width, requires_grad=True)

    def layer(x):
        h = remat.region(lambda t: torch.tanh(t @ w), "attn")(x)
        return remat.region(lambda t: (torch.sigmoid(t @ w) * t).sin(), "mlp")(h)

    def model(x, plan=None):
        for index in range(2):
            x = remat.checkpoint(region_name=f"layers.{index}", plan=plan)(layer)(x)
        return x.sum()

    return w, model


def test_a_per_op_plan_made_in_process_keeps_its_ops_under_use_plan():
    w, model = _two_layers(64)

    x = torch.randn(8, 64, requires_grad=True)
    w.grad = None
    model(x).backward()
    reference = w.grad.clone()
    with remat.profile_regions(ops=True) as profile:
        model(x).backward()
    heavy = _profile_with_heavy_ops(profile)
    heavy._shape = profile._shape  # as made in process: the plan watches the step
    plan = None
    for share in range(1, 8):
        plan = heavy.plan(budget_bytes=heavy.base_bytes + (heavy.all_saved_bytes - heavy.base_bytes) * share // 8,
                          ops=True)
        if plan.kept_ops:
            break
    assert plan.kept_ops and plan._step_watch() is not None

    def run(chosen):
        w.grad = None
        with remat.use_plan(chosen):
            loss = model(x)
            held = sum(held_storages().values())
            counter = _CountMatmuls()
            with counter:
                loss.backward()
        assert torch.equal(w.grad, reference)
        return held, counter.count

    # The plan as made (watched) and as read from its dump (not watched) keep the same ops.
    held, matmuls = run(plan)
    assert held > 0
    assert (held, matmuls) == run(remat.load_plan(plan.to_json()))


def test_per_op_plans_hold_under_autocast():
    torch.manual_seed(0)
    w = torch.randn(32, 32, requires_grad=True)
    x0 = torch.randn(8, 32)

    def body(t):
        h = remat.region(lambda u: torch.tanh(u @ w), "a")(t)
        return remat.region(lambda u: torch.sigmoid(u @ w) * u, "b")(h)

    def step(checkpointed, plan=None):
        w.grad = None
        x = x0.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = x
            for index in range(2):
                out = remat.checkpoint(region_name=f"l{index}", plan=plan)(body)(out) if checkpointed else body(out)
            loss = out.float().sum()
        loss.backward()
        return x.grad.clone(), w.grad.clone()

    reference = step(False)
    with remat.profile_regions(ops=True) as profile:
        step(True)
    assert all(op["op"] != "aten::_to_copy" for ops in profile.ops.values() for op in ops)
    heavy = _profile_with_heavy_ops(profile)
    keeping = 0
    for share in range(1, 8):
        plan = heavy.plan(budget_bytes=heavy.base_bytes + (heavy.all_saved_bytes - heavy.base_bytes) * share // 8,
                          ops=True)
        keeping += bool(plan.kept_ops)
        got = step(True, plan)
        assert all(torch.equal(a, b) for a, b in zip(got, reference)), plan.kept_ops
    assert keeping > 0


def test_ops_whose_output_size_depends_on_the_values_are_never_kept():
    torch.manual_seed(0)
    w = torch.randn(32, 32, requires_grad=True)

    def body(t):
        return remat.region(lambda u: torch.tanh(u @ w)[torch.tanh(u @ w) > 0].sum() * u, "a")(t)

    x = torch.randn(8, 32, requires_grad=True)
    with remat.profile_regions(ops=True) as profile:
        remat.checkpoint(region_name="l")(body)(x).sum().backward()
    names = [op["op"] for op in profile.ops["l::a"]]
    assert "aten::mm" in names
    assert "aten::index.Tensor" not in names and "aten::nonzero" not in names


def test_a_saved_region_nested_in_a_recomputed_one_makes_the_outer_one_saved():
    # The profile plans the outermost region; a plan recomputing it runs the nested one again.
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    generator = torch.Generator()

    def outer(t):
        return remat.region(lambda u: u * (1 + torch.randn(u.shape, generator=generator)), "noise",
                            recompute=False)(torch.tanh(t @ w))

    def body(x):
        return remat.region(lambda t: torch.sin(t @ w), "mlp")(remat.region(outer, "outer")(x))

    x0 = torch.randn(4, 16)

    def step(checkpointed=True):
        generator.manual_seed(7)
        w.grad = None
        x = x0.clone().requires_grad_(True)
        (remat.checkpoint(region_name="k")(body)(x) if checkpointed else body(x)).sum().backward()
        return w.grad.clone()

    reference, profile, regions = _reference_and_profile(step)
    reasons = {name: region.get("must_save") for name, region in regions.items()}
    assert "torch.Generator of its own" in reasons["k::outer"] and reasons["k::mlp"] is None
    outer_bytes = next(r.saved_bytes for r in profile.regions if r.name == "k::outer")
    plan = profile.plan(budget_bytes=profile.base_bytes + outer_bytes)
    assert plan.decisions == {"k::outer": "save", "k::mlp": "recompute"}
    with remat.use_plan(plan):
        assert torch.equal(step(), reference)


@pytest.mark.parametrize("write", ["index", "view", "detach", "unsqueeze"])
def test_a_write_into_outside_state_through_a_view_is_seen(write):
    state = torch.zeros(4, 16)
    writes = {"index": lambda h: state[0].add_(h.sum()), "view": lambda h: state.view(-1).add_(1),
              "detach": lambda h: state.detach().mul_(0.9), "unsqueeze": lambda h: state.unsqueeze(0).add_(1)}

    def body(x):
        def counts(t):
            h = torch.tanh(t)
            writes[write](h.detach())
            return h

        return remat.region(counts, "counts", recompute=False)(x)

    with remat.profile_regions() as profile:
        remat.checkpoint(region_name="k")(body)(torch.randn(4, 16, requires_grad=True)).sum().backward()
    reason = json.loads(profile.to_json())["regions"][0].get("must_save")
    assert reason and "writes in place into a tensor it did not make" in reason


def test_a_plan_copies_and_pickles_after_it_was_used():
    import pickle

    step = _noisy_model()
    with remat.profile_regions() as profile:
        step()
    plan = profile.plan(budget_bytes=profile.all_saved_bytes)
    with remat.use_plan(plan):
        step()
    for copied in (copy.deepcopy(plan), pickle.loads(pickle.dumps(plan))):
        assert copied.decisions == plan.decisions
        with remat.use_plan(copied):
            step()


def test_a_checkpoints_own_plan_inside_use_plan_is_no_layout_error_of_the_outer_plan():
    _, model = _two_layers(32)

    x0 = torch.randn(8, 32)
    with remat.profile_regions() as profile:
        model(x0.clone().requires_grad_(True)).backward()
    recompute_all = profile.plan(budget_bytes=profile.base_bytes)
    save_all = profile.plan(budget_bytes=profile.all_saved_bytes)
    with remat.use_plan(save_all), remat.collect_trace() as trace:  # the checkpoint's own plan wins
        model(x0.clone().requires_grad_(True), plan=recompute_all).backward()
    saved = {f"{scope.name}::{region.name}": region.saved for scope in trace.scopes for region in scope.regions}
    assert saved == {name: False for name in recompute_all.decisions}


def test_a_region_the_code_recomputes_that_updates_batchnorm_statistics_may_be_saved_by_a_plan():
    """A BatchNorm in a region the code recomputes (remat.region's default) updated its statistics
    again in recompute: a plan saving it updated them once, so under remat.fit they depended on the
    budget, and such a region was must_recompute. The checkpoint now gives them back to recompute as
    forward read them: plans save or recompute it, and each updates them once, as without
    checkpointing. A tensor the region writes that is no buffer of a module the checkpoint's function
    reaches (a plain attribute) is not given back: that region stays must_recompute."""
    class Layer(torch.nn.Module):
        def __init__(self, counts):
            super().__init__()
            self.lin, self.bn = torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16)
            self.counts, self.calls = counts, torch.zeros(())

        def norm(self, t):
            if self.counts:
                self.calls.add_(1)
            return torch.tanh(self.bn(self.lin(t)))

        def forward(self, x):
            h = remat.region(self.norm, "bn")(x)
            return remat.region(lambda t: torch.sin(self.lin(t)), "mlp", recompute=False)(h)

    torch.manual_seed(0)
    model = Layer(counts=False)
    x = torch.randn(32, 16)

    def step(m, plan=None, checkpointed=True):
        with remat.use_plan(plan) if plan is not None else contextlib.nullcontext():
            (remat.checkpoint(region_name="c")(m)(x) if checkpointed else m(x)).square().sum().backward()
        return [b.clone() for b in m.buffers()]

    with remat.profile_regions(ops=True) as profile:
        step(copy.deepcopy(model))
    regions = {r["name"]: r for r in json.loads(profile.to_json())["regions"]}
    assert "must_recompute" not in regions["c::bn"] and "must_save" not in regions["c::bn"]
    expected = step(copy.deepcopy(model), checkpointed=False)
    decisions = set()
    for budget in (profile.base_bytes + profile.all_saved_bytes, profile.base_bytes):
        plan = profile.plan(budget_bytes=budget)
        decisions.add(plan.decisions["c::bn"])
        assert all(torch.equal(a, b) for a, b in zip(step(copy.deepcopy(model), plan), expected))
    assert decisions == {"save", "recompute"}

    with remat.profile_regions(ops=True) as profile:
        step(Layer(counts=True))
    regions = {r["name"]: r for r in json.loads(profile.to_json())["regions"]}
    assert regions["c::bn"]["must_recompute"].startswith("it writes in place into a tensor it did not make (aten::")


def test_batchnorm_statistics_pin_no_region_they_are_given_back_to_recompute():
    """A BatchNorm's running statistics, which its training forward writes, counted as what it
    read: one module shared by two checkpoints (the second writing what the first "read") was
    marked must_save and must_recompute at once, and the profile was refused as it closed ("no
    plan can both save and recompute 'c0::bn'"); so was a saved conv+BatchNorm region whose
    output the caller changes in place (ReLU(inplace=True), torchvision style), must_save where
    must_recompute would serve. The statistics are given back to recompute as forward read them
    now: the shared module's regions are not pinned, and the saved one is must_recompute (its
    output changed after its checkpoint returned), as any such region."""
    torch.manual_seed(0)
    lin, bn = torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)

    def body(t):
        return remat.region(lambda u: lin(u).tanh(), "mlp")(remat.region(bn, "bn")(t))

    def shared(checkpointed=True):
        y = torch.randn(6, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
        for index in range(2):
            y = remat.checkpoint(region_name=f"c{index}")(body)(y) if checkpointed else body(y)
        y.square().sum().backward()

    with remat.profile_regions(ops=True) as profile:
        shared()
    regions = {r["name"]: r for r in json.loads(profile.to_json())["regions"]}
    for name in ("c0::bn", "c1::bn"):
        assert "must_save" not in regions[name] and "must_recompute" not in regions[name]

    conv, norm = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)

    def block(checkpointed=True):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
        run = lambda t: remat.region(lambda u: norm(conv(u)), "conv_bn", recompute=False)(t)  # noqa: E731
        y = torch.relu_(remat.checkpoint(region_name="block")(run)(x) if checkpointed else run(x))
        y.square().sum().backward()

    with remat.profile_regions() as profile:
        block()
    region = json.loads(profile.to_json())["regions"][0]
    assert "must_save" not in region and region["must_recompute"].startswith("its output 0 is changed in place")
