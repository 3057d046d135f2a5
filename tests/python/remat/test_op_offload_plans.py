"""Per-op plans with a host budget: profile.plan(budget_bytes= or peak_bytes=, ops=True,
host_budget_bytes=H) weighs, per region, save, recompute, recompute keeping chosen ops' outputs and
offload, within the device budget and H. use_plan carries out both in one step: recompute takes the
kept outputs, the offloader holds the offloaded regions on the host. Gradients are bitwise those
without checkpointing; the device keeps at most the plan's kept bytes (by kept bytes) or peaks
within the budget and the prediction (by step peak); remat-report advise --ops --host-budget makes
the same plans."""

import json
import subprocess

import pytest
import torch

import remat
from remat._kept_ops import held_storages
from remat._plans import live_checkpoint_bytes
from test_budget_plans import remat_report
from test_offload_peak_plans import device_peak
from test_offload_plans import with_bandwidth
import test_op_peak_plans as peak_model
from test_op_peak_plans import step  # noqa: F401  (the fixture: the 12-layer model profiled with its step)
from test_op_plans import (LAYERS, assert_gradients_equal, batch, make_weights, matmuls_dear, model, plain, runs,
                           take_gradients)


@pytest.fixture(scope="module")
def measured():
    """The 3-layer model of test_op_plans profiled per op, its matmuls priced dear and its copies
    next to nothing: keeping a matmul's output and offloading both beat recomputing a region."""
    weights = make_weights()
    with remat.profile_regions(ops=True) as profile:
        model(batch(), weights).backward()
    return with_bandwidth(matmuls_dear(profile), 1e15)


def offloaded_bytes(profile, names):
    return sum(profile.offload_bytes[name] for name in names)


def test_a_plan_keeps_ops_where_the_host_budget_runs_out_and_offloads_the_rest(measured):
    attn = [f"layers.{i}::attn" for i in range(LAYERS)]
    host_budget = offloaded_bytes(measured, attn)
    # The device holds the inputs and one activation a layer: no region can be saved whole.
    budget = measured.base_bytes + LAYERS * 8 * 64 * 4
    plan = measured.plan(budget_bytes=budget, ops=True, host_budget_bytes=host_budget)
    assert plan.exact
    assert plan.kept_bytes <= budget and plan.host_bytes <= host_budget
    assert plan.offloaded and plan.kept_ops
    # Every region is offloaded or keeps its matmul: recompute never runs a matmul again.
    assert {name for name, choice in plan.decisions.items() if choice == "save"} == set()
    assert set(plan.offloaded) | set(plan.kept_ops) == set(plan.decisions)
    assert all(ops == [(0, "remat_op_plans::counted_mm")] for ops in plan.kept_ops.values())
    # Faster than either alone: per op without a host budget, or offload by regions alone.
    assert plan.recompute_seconds < measured.plan(budget_bytes=budget, ops=True).recompute_seconds
    assert plan.recompute_seconds < measured.plan(budget_bytes=budget, host_budget_bytes=host_budget).recompute_seconds
    assert remat.load_plan(plan.to_json()).kept_ops == plan.kept_ops
    assert "keeping 1 op(s)" in plan.format() and "offload" in plan.format()

    weights = make_weights()
    x = batch()
    plain(x, weights).backward()
    expected = take_gradients(x, weights)
    for _ in range(2):  # the offloader's host pool is reused across steps
        runs["mm"] = 0
        with remat.use_plan(plan):
            loss = model(x, weights)
            assert live_checkpoint_bytes() <= plan.kept_bytes
            assert 0 < plan.offloader.stats()["resident_host_bytes"] <= plan.host_bytes
            assert sum(held_storages().values()) == 8 * 64 * 4 * len(plan.kept_ops)
            loss.backward()
        assert runs["mm"] == 2 * LAYERS  # forward's alone
        assert plan.offloader.stats()["resident_host_bytes"] == 0 and not held_storages()
        assert_gradients_equal(x, weights, expected)


def test_plans_never_pass_either_budget_and_more_host_budget_never_costs_more(measured):
    everything = sum(measured.offload_bytes.values())
    low, high = measured.base_bytes, measured.all_saved_bytes
    for device_step in range(4):
        budget = low + (high - low) * device_step // 3
        last = None
        for share in range(6):
            host_budget = everything * share // 5
            plan = measured.plan(budget_bytes=budget, ops=True, host_budget_bytes=host_budget)
            assert plan.kept_bytes <= budget and plan.host_bytes <= host_budget
            assert plan.host_bytes == offloaded_bytes(measured, plan.offloaded)
            assert not set(plan.offloaded) & set(plan.kept_ops)
            if last is not None:
                assert plan.recompute_seconds <= last + 1e-9  # the solver's tolerance: 1e-12 of all it weighs
            last = plan.recompute_seconds
        # A host budget of 0 plans as ops=True without one.
        zero = measured.plan(budget_bytes=budget, ops=True, host_budget_bytes=0)
        alone = measured.plan(budget_bytes=budget, ops=True)
        assert zero.offloaded == [] and zero.kept_ops == alone.kept_ops
        assert zero.recompute_seconds == pytest.approx(alone.recompute_seconds)


def test_by_step_peak_the_device_peaks_within_the_budget_and_the_prediction(step):  # noqa: F811
    profile, x, weights, reference = step
    profile = with_bandwidth(profile, 1e15)
    host_budget = sum(profile.offload_bytes.values()) // 3
    least = profile.least_peak_bytes(host_budget_bytes=host_budget)
    most = profile.step_peak_bytes

    def run(plan):
        peak_model.clear_gradients(x, weights)
        with remat.use_plan(plan):
            peak_model.model(x, weights).backward()

    rows = []
    with remat.tag_cpu_tensors():
        for i in range(5):
            budget = least + (most - least) * i // 4
            plan = profile.plan(peak_bytes=budget, ops=True, host_budget_bytes=host_budget)
            assert plan.peak_bytes <= budget and plan.host_bytes <= host_budget
            assert profile.predict_peak(plan) == plan.peak_bytes
            measured = max(device_peak(lambda: run(plan))[0] for _ in range(2))
            row = (budget, plan.peak_bytes, measured, len(plan.kept_ops), len(plan.offloaded))
            assert measured <= budget, row
            assert measured <= plan.peak_bytes * 1.03, row
            assert all(torch.equal(t.grad, want) for t, want in zip([x, *weights], reference)), row
            peak_model.clear_gradients(x, weights)
            if budget >= profile.least_peak_bytes():  # never slower than ops without offload
                assert plan.recompute_seconds <= profile.plan(peak_bytes=budget, ops=True).recompute_seconds + 1e-12
            rows.append(row)
    assert any(kept and offloaded for _, _, _, kept, offloaded in rows), rows  # both at once somewhere
    # Nor than offload without ops (a search of seconds a budget: once, where the plan does both).
    budget = next(budget for budget, _, _, kept, offloaded in rows if kept and offloaded)
    both = profile.plan(peak_bytes=budget, ops=True, host_budget_bytes=host_budget)
    assert both.recompute_seconds < profile.plan(peak_bytes=budget, host_budget_bytes=host_budget).recompute_seconds


def test_advise_makes_the_same_per_op_plans_with_a_host_budget(measured, tmp_path):
    report = remat_report()
    measured.to_json(tmp_path / "profile.json")
    host_budget = sum(measured.offload_bytes.values()) // 2
    budget = measured.base_bytes + LAYERS * 8 * 64 * 4
    plan = measured.plan(budget_bytes=budget, ops=True, host_budget_bytes=host_budget)
    run = subprocess.run([report, "advise", str(tmp_path / "profile.json"), "--budget", f"{budget}B", "--ops",
                          "--host-budget", f"{host_budget}B", "--json"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    advised = json.loads(run.stdout)
    assert advised["decisions"] == plan.decisions and advised["host_bytes"] == plan.host_bytes
    assert {r["name"]: [(op["index"], op["op"]) for op in r["kept_ops"]]
            for r in advised["regions"] if r.get("kept_ops")} == plan.kept_ops
    plan.to_json(tmp_path / "plan.json")
    run = subprocess.run([report, "validate", str(tmp_path / "plan.json")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_bad_input_is_refused_naming_the_fix(measured, tmp_path):
    with pytest.raises(ValueError, match="ops=True keeps ops of regions as measured: drop group=True"):
        measured.plan(budget_bytes=measured.base_bytes, ops=True, group=True, host_budget_bytes="1 MiB")
    doc = json.loads(measured.to_json())
    for region in doc["regions"]:
        region.pop("ops", None)
    without_ops = remat.RegionProfile(json.dumps(doc))
    with pytest.raises(ValueError, match=r"ops=True needs per-op figures.*profile_regions\(ops=True\)"):
        without_ops.plan(budget_bytes=measured.base_bytes, ops=True, host_budget_bytes="1 MiB")
    doc = json.loads(measured.to_json())
    del doc["host_copy"]
    without_copies = remat.RegionProfile(json.dumps(doc))
    with pytest.raises(ValueError, match="copy bandwidth"):
        without_copies.plan(budget_bytes=measured.base_bytes, ops=True, host_budget_bytes="1 MiB")
    assert without_copies.plan(budget_bytes=measured.base_bytes, ops=True, host_budget_bytes=0).offloaded == []
    without_copies.to_json(tmp_path / "no-copies.json")
    run = subprocess.run([remat_report(), "advise", str(tmp_path / "no-copies.json"), "--budget",
                          f"{measured.base_bytes}B", "--ops", "--host-budget", "1MiB"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "--host-budget 1MiB:" in run.stderr and "no copy bandwidth" in run.stderr
    with pytest.raises(ValueError, match="the profile has no step memory"):  # counted no tensors
        measured.plan(peak_bytes="1 GiB", ops=True, host_budget_bytes="1 MiB")
    with pytest.raises(ValueError, match="host_budget_bytes must be 0 or more bytes"):
        measured.plan(budget_bytes=measured.base_bytes, ops=True, host_budget_bytes=-1)
