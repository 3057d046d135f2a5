"""Offload as the third choice per region: profile_regions() measures the copy bandwidth and each
region's offload bytes; profile.plan(budget_bytes=, host_budget_bytes=) picks save, recompute or
offload; use_plan carries offload decisions out through remat.CpuOffload. On the CPU a copy does
not overlap compute, so it costs its whole time. Gradients are bitwise those without
checkpointing, and no plan holds more on the host than its host budget."""

import json
import subprocess

import pytest
import torch

import remat
from remat._plans import live_checkpoint_bytes
from test_budget_plans import remat_report, tiny_llamas

WIDTH = 128
LAYERS = 3


def make_weights():
    generator = torch.Generator().manual_seed(7)
    return [(torch.randn(WIDTH, WIDTH, generator=generator) / 8).requires_grad_() for _ in range(2 * LAYERS)]


def block(x, w1, w2):
    h = remat.region(lambda t: torch.tanh(t @ w1), "attn")(x)
    return remat.region(lambda t: (torch.sigmoid(t @ w2) * t).sin(), "mlp")(h)


def model(x, weights):
    for layer in range(len(weights) // 2):
        x = remat.checkpoint(region_name=f"layers.{layer}")(block)(x, weights[2 * layer], weights[2 * layer + 1])
    return x.square().sum()


def plain(x, weights):
    for layer in range(len(weights) // 2):
        h = torch.tanh(x @ weights[2 * layer])
        x = (torch.sigmoid(h @ weights[2 * layer + 1]) * h).sin()
    return x.square().sum()


def batch():
    return torch.randn(32, WIDTH, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def measured():
    weights = make_weights()
    x = batch().requires_grad_()
    with remat.profile_regions() as profile:
        model(x, weights).backward()
    return profile


def with_bandwidth(profile, bytes_per_second):
    """The profile as if its copies ran at `bytes_per_second` each way (the step it recorded kept)."""
    doc = json.loads(profile.to_json())
    doc["host_copy"]["to_host_bytes_per_second"] = doc["host_copy"]["to_device_bytes_per_second"] = bytes_per_second
    edited = remat.RegionProfile(json.dumps(doc))
    edited._shape = profile._shape
    return edited


def test_profile_measures_the_copy_bandwidth_and_each_regions_offload_bytes(measured):
    copy = measured.host_copy
    assert copy["to_host_bytes_per_second"] > 1e6 and copy["to_device_bytes_per_second"] > 1e6
    assert copy["measured_bytes"] >= 1 << 20
    assert set(measured.offload_bytes) == {region.name for region in measured.regions}
    for region in measured.regions:
        # What an offload moves: at least what the region alone keeps, each storage once.
        assert measured.offload_bytes[region.name] >= region.saved_bytes


def test_plan_offloads_where_the_host_budget_and_the_bandwidth_make_it_cheapest(measured):
    everything = sum(measured.offload_bytes.values())
    fast = with_bandwidth(measured, 1e15)   # copies cost next to nothing: cheaper than any recompute
    plan = fast.plan(budget_bytes=measured.base_bytes, host_budget_bytes=everything)
    assert set(plan.offloaded) == {region.name for region in measured.regions}
    assert plan.kept_bytes == measured.base_bytes and plan.host_bytes == everything
    assert plan.recompute_seconds == pytest.approx(plan.offload_seconds) and plan.recompute_seconds < 1e-6
    assert plan.exact
    slow = with_bandwidth(measured, 1.0)     # a byte a second: recompute is cheaper
    plan = slow.plan(budget_bytes=measured.base_bytes, host_budget_bytes=everything)
    assert plan.offloaded == [] and plan.host_bytes == 0
    assert plan.recompute_seconds == pytest.approx(sum(region.seconds for region in measured.regions))
    # On the CPU the whole copy is paid: at the bandwidth that makes one region's copies cost
    # exactly its seconds, offloading it spares nothing.
    region = max(measured.regions, key=lambda r: r.seconds)
    even = 2 * measured.offload_bytes[region.name] / region.seconds
    plan = with_bandwidth(measured, even * 0.5).plan(budget_bytes=measured.base_bytes,
                                                     host_budget_bytes=measured.offload_bytes[region.name])
    assert region.name not in plan.offloaded


def test_plans_never_exceed_the_host_budget(measured):
    fast = with_bandwidth(measured, 1e15)
    everything = sum(measured.offload_bytes.values())
    last = None
    for share in range(0, 11):
        host_budget = everything * share // 10
        plan = fast.plan(budget_bytes=measured.base_bytes + 32 * WIDTH * 4, host_budget_bytes=host_budget)
        assert plan.host_bytes <= host_budget and plan.host_budget_bytes == host_budget
        assert plan.kept_bytes <= plan.budget_bytes
        assert plan.exact
        assert plan.host_bytes == sum(measured.offload_bytes[name] for name in plan.offloaded)
        if last is not None:
            assert plan.recompute_seconds <= last + 1e-12  # more host budget never costs more
        last = plan.recompute_seconds
    # host budget 0: no offload, the plan without a host budget
    plan = fast.plan(budget_bytes=measured.base_bytes + 32 * WIDTH * 4, host_budget_bytes=0)
    plain_plan = fast.plan(budget_bytes=measured.base_bytes + 32 * WIDTH * 4)
    assert plan.offloaded == [] and plan.host_bytes == 0
    assert plan.recompute_seconds == pytest.approx(plain_plan.recompute_seconds)
    assert {name: ("save" if choice == "offload" else choice) for name, choice in plan.decisions.items()} == \
        plain_plan.decisions


@pytest.mark.parametrize("watched", [True, False])
def test_use_plan_offloads_with_gradients_bitwise_those_without_checkpointing(measured, watched):
    weights = make_weights()
    x = batch().requires_grad_()
    expected = torch.autograd.grad(plain(x, weights), [x, *weights])
    fast = with_bandwidth(measured, 1e15)
    if not watched:
        fast._shape = None  # as a plan from a dump: the choices go to the runtime, regions not followed
    everything = sum(measured.offload_bytes.values())
    # The device holds one activation beyond the inputs; half the regions' bytes fit the host.
    plan = fast.plan(budget_bytes=measured.base_bytes + 32 * WIDTH * 4, host_budget_bytes=everything // 2)
    assert plan.offloaded and len(plan.offloaded) < len(plan.decisions)  # some regions stay on the device
    for step in range(3):  # the offloader's host pool is reused across steps
        with remat.use_plan(plan):
            loss = model(x, weights)
        stats = plan.offloader.stats()
        assert 0 < stats["resident_host_bytes"] <= plan.host_bytes <= everything // 2
        assert live_checkpoint_bytes() <= plan.kept_bytes
        grads = torch.autograd.grad(loss, [x, *weights])
        for got, want in zip(grads, expected):
            assert torch.equal(got, want)
        assert plan.offloader.stats()["resident_host_bytes"] == 0


def test_checkpoint_plan_offloads_and_a_step_that_differs_recomputes_instead(measured):
    weights = make_weights()
    fast = with_bandwidth(measured, 1e15)
    everything = sum(measured.offload_bytes.values())
    plan = fast.plan(budget_bytes=measured.base_bytes, host_budget_bytes=everything)
    assert len(plan.offloaded) == len(plan.decisions)
    # checkpoint(plan=): that checkpoint's regions take the plan's choices, offload included.
    x = batch().requires_grad_()
    expected = torch.autograd.grad(plain(x, weights), [x, *weights])
    h = x
    for layer in range(LAYERS):
        h = remat.checkpoint(region_name=f"layers.{layer}", plan=plan)(block)(h, weights[2 * layer],
                                                                               weights[2 * layer + 1])
    assert 0 < plan.offloader.stats()["resident_host_bytes"] <= plan.host_bytes
    for got, want in zip(torch.autograd.grad(h.square().sum(), [x, *weights]), expected):
        assert torch.equal(got, want)
    # A watched step with twice the rows differs from the profiled one: every region recomputes
    # (the least memory) and nothing goes to the host.
    wide = torch.cat([batch(), batch()]).requires_grad_()
    expected = torch.autograd.grad(plain(wide, weights), [wide, *weights])
    with pytest.warns(UserWarning, match="differs from the profiled one"):
        with remat.use_plan(plan):
            loss = model(wide, weights)
    assert plan.offloader.stats()["resident_host_bytes"] == 0
    for got, want in zip(torch.autograd.grad(loss, [wide, *weights]), expected):
        assert torch.equal(got, want)


def test_bad_host_budgets_are_refused_naming_the_fix(measured):
    with pytest.raises(ValueError, match="host_budget_bytes must be 0 or more bytes, got -1"):
        measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes=-1)
    with pytest.raises(ValueError, match="without a unit|unit"):
        measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes="64")
    with pytest.raises(TypeError, match="bool"):
        measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes=True)
    # By step peak: this profile counted no tensors, so it has no step memory to predict a peak from.
    with pytest.raises(ValueError, match="the profile has no step memory"):
        measured.plan(peak_bytes="1 GiB", host_budget_bytes="1 GiB")
    with pytest.raises(ValueError, match=r"ops=True needs per-op figures.*profile_regions\(ops=True\)"):
        measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes="1 GiB", ops=True)
    with pytest.raises(ValueError, match="with peak_bytes= plans regions as measured: drop group=True"):
        measured.plan(peak_bytes="1 GiB", host_budget_bytes="1 GiB", group=True)
    with pytest.raises(TypeError, match="needs one device budget: budget_bytes= .* or peak_bytes="):
        measured.plan(host_budget_bytes="1 GiB")
    with pytest.raises(TypeError, match="needs one device budget.*; both were given"):
        measured.plan(budget_bytes=measured.base_bytes, peak_bytes="1 GiB", host_budget_bytes="1 GiB")
    with pytest.raises(ValueError, match="got -2.0"):
        measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes=-2.0)
    with pytest.raises(ValueError, match="whole number of bytes"):
        measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes=10.5)
    assert measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes=torch.tensor(0)).host_budget_bytes == 0
    # Units as every budget takes them.
    plan = measured.plan(budget_bytes=measured.base_bytes, host_budget_bytes="1 MiB")
    assert plan.host_budget_bytes == 1 << 20
    doc = json.loads(measured.to_json())
    del doc["host_copy"]
    with pytest.raises(ValueError, match="copy bandwidth"):
        remat.RegionProfile(json.dumps(doc)).plan(budget_bytes=measured.base_bytes, host_budget_bytes="1 MiB")


def test_offload_plans_format_and_round_trip(measured, tmp_path):
    everything = sum(measured.offload_bytes.values())
    plan = with_bandwidth(measured, 1e15).plan(budget_bytes=measured.base_bytes, host_budget_bytes=everything)
    text = plan.format()
    assert f"host: {everything} of {everything} bytes offloaded" in text
    assert text.count("offload") >= len(measured.regions)
    plan.to_json(tmp_path / "plan.json")
    back = remat.load_plan(tmp_path / "plan.json")
    assert back.decisions == plan.decisions and back.offloaded == plan.offloaded
    assert back.host_bytes == plan.host_bytes and back.host_budget_bytes == everything
    with pytest.raises(ValueError, match="the profile has no step memory"):  # counted no tensors
        measured.predict_peak(plan)


def test_advise_makes_the_same_offload_plan_and_validate_accepts_the_dumps(measured, tmp_path):
    report = remat_report()
    fast = with_bandwidth(measured, 1e15)
    fast.to_json(tmp_path / "profile.json")
    everything = sum(measured.offload_bytes.values())
    plan = fast.plan(budget_bytes=measured.base_bytes + 32 * WIDTH * 4, host_budget_bytes=everything // 2)
    plan.to_json(tmp_path / "plan.json")
    for name in ("profile.json", "plan.json"):
        run = subprocess.run([report, "validate", str(tmp_path / name)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
    args = [report, "advise", str(tmp_path / "profile.json"), "--budget", f"{plan.budget_bytes}B",
            "--host-budget", f"{everything // 2}B"]
    run = subprocess.run(args + ["--json"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    advised = json.loads(run.stdout)
    assert advised["decisions"] == plan.decisions and advised["host_bytes"] == plan.host_bytes
    run = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "offload" in run.stdout and "host" in run.stdout
    run = subprocess.run(args[:-2] + ["--host-budget", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "offload" not in run.stdout.split("Regions")[-1]
    run = subprocess.run(args[:-2] + ["--host-budget", "-5"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "--host-budget" in run.stderr


def test_wrap_decoder_layers_carries_out_an_offload_plan_on_a_hugging_face_llama():
    reference, llama = tiny_llamas()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    remat.wrap_decoder_layers(llama)
    with remat.profile_regions() as measured:
        llama(input_ids=ids, labels=ids).loss.backward()
    llama.zero_grad(set_to_none=True)
    everything = sum(measured.offload_bytes.values())
    plan = with_bandwidth(measured, 1e15).plan(budget_bytes=measured.base_bytes, host_budget_bytes=everything // 2)
    assert plan.offloaded and plan.host_bytes <= everything // 2
    remat.wrap_decoder_layers(llama, plan=plan)
    loss = llama(input_ids=ids, labels=ids).loss
    assert 0 < plan.offloader.stats()["resident_host_bytes"] <= plan.host_bytes
    assert live_checkpoint_bytes() <= plan.kept_bytes
    loss.backward()
    assert plan.offloader.stats()["resident_host_bytes"] == 0
    reference(input_ids=ids, labels=ids).loss.backward()
    for (name, p), q in zip(llama.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_a_plan_given_to_checkpoints_recomputes_a_larger_step_rather_than_pass_the_host_budget(measured):
    plan = with_bandwidth(measured, 1e15).plan(budget_bytes=measured.base_bytes,
                                               host_budget_bytes=sum(measured.offload_bytes.values()) // 2)
    assert plan.offloaded
    weights = make_weights()

    def planned(x):
        for layer in range(LAYERS):
            x = remat.checkpoint(region_name=f"layers.{layer}", plan=plan)(block)(
                x, weights[2 * layer], weights[2 * layer + 1])
        return x.square().sum()

    loss = planned(batch().requires_grad_())  # the profiled step: offloaded, within the host budget
    assert 0 < plan.offloader.stats()["resident_host_bytes"] <= plan.host_budget_bytes
    loss.backward()
    for w in weights:
        w.grad = None
    wider = torch.randn(2 * batch().shape[0], WIDTH, generator=torch.Generator().manual_seed(4), requires_grad=True)
    with pytest.warns(UserWarning, match="differs from the profiled one"):
        loss = planned(wider)
    assert plan.offloader.stats()["resident_host_bytes"] == 0  # recomputed instead
    loss.backward()
    reference = [w.detach().clone().requires_grad_() for w in weights]
    plain(wider.detach().requires_grad_(), reference).backward()
    assert all(torch.equal(w.grad, r.grad) for w, r in zip(weights, reference))


def test_grouped_offload_plans_offload_every_region_of_a_pattern_and_advise_makes_the_same(measured, tmp_path):
    fast = with_bandwidth(measured, 1e15)
    everything = sum(measured.offload_bytes.values())
    host_budget = everything // 2
    plan = fast.plan(budget_bytes=measured.base_bytes, host_budget_bytes=host_budget, group=True)
    assert set(plan.decisions) == {"layers.*::attn", "layers.*::mlp"}
    assert len(plan.offloaded) == 1 and plan.exact  # half the host holds one pattern's regions
    pattern = plan.offloaded[0]
    members = [name for name in measured.offload_bytes if remat._budget.matches(pattern, name)]
    assert len(members) == LAYERS
    assert plan.host_bytes == sum(measured.offload_bytes[name] for name in members) <= host_budget
    weights = make_weights()
    x = batch().requires_grad_()
    expected = torch.autograd.grad(plain(x, weights), [x, *weights])
    for _ in range(2):
        with remat.use_plan(plan):
            loss = model(x, weights)
        assert 0 < plan.offloader.stats()["resident_host_bytes"] <= plan.host_bytes
        for got, want in zip(torch.autograd.grad(loss, [x, *weights]), expected):
            assert torch.equal(got, want)
        assert plan.offloader.stats()["resident_host_bytes"] == 0
    # remat-report advise --group --host-budget: the same plan; with --peak, grouping is refused.
    fast.to_json(tmp_path / "profile.json")
    args = [remat_report(), "advise", str(tmp_path / "profile.json"), "--group", "--host-budget", f"{host_budget}B"]
    run = subprocess.run(args + ["--budget", f"{plan.budget_bytes}B", "--json"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    advised = json.loads(run.stdout)
    assert advised["decisions"] == plan.decisions and advised["host_bytes"] == plan.host_bytes
    run = subprocess.run(args + ["--peak", "1GiB"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "drop --group" in run.stderr
