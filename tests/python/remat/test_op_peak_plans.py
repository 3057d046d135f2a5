"""Per-op plans by step peak: profile_regions(ops=True) with the step's tensors counted lists, for
each op a plan may keep, the storages it made; profile.plan(peak_bytes=B, ops=True) picks, per
region, save, recompute or recompute keeping ops so that the predicted step peak, what the kept
ops hold from forward to backward included, is within B. At 5 peak budgets from the least to
everything saved the step under the plan peaks within B and at most at the prediction, which is
at most 3% above it; gradients are bitwise those without checkpointing; remat-report advise
--peak B --ops makes the same plan with the same prediction."""

import json
import os
import pathlib
import subprocess

import pytest
import torch

import remat

import fit_loop

REPO = pathlib.Path(__file__).resolve().parents[3]
WIDTH = 128
ROWS = 256
LAYERS = 12


def block(x, w1, w2):
    h = remat.region(lambda t: torch.tanh(t @ w1), "attn")(x)
    return remat.region(lambda t: (torch.sigmoid(t @ w2) * t).sin(), "mlp")(h)


def model(x, weights):
    for layer in range(LAYERS):
        x = remat.checkpoint(region_name=f"layers.{layer}")(block)(x, weights[2 * layer], weights[2 * layer + 1])
    return x.square().sum()


def plain(x, weights):
    for layer in range(LAYERS):
        h = torch.tanh(x @ weights[2 * layer])
        x = (torch.sigmoid(h @ weights[2 * layer + 1]) * h).sin()
    return x.square().sum()


def matmuls_dear(profile):
    """The profile with every matmul priced far above the other ops (measured times are noise at
    this size), so that plans keep matmul outputs where the peak leaves room for them."""
    doc = json.loads(profile.to_json())
    for region in doc["regions"]:
        for op in region["ops"]:
            op["seconds"] = 1.0 if op["op"] == "aten::mm" else 1e-3
        region["seconds"] = sum(op["seconds"] for op in region["ops"]) + 1e-3
        region["op_overhead_seconds"] = 1e-5
    return remat.RegionProfile(json.dumps(doc))


@pytest.fixture(scope="module")
def step():
    """(profile, x, weights, reference gradients), made inside tag_cpu_tensors(), which the tests
    enter again to run steps (the tensors stay counted)."""
    with remat.tag_cpu_tensors():
        generator = torch.Generator().manual_seed(5)
        weights = [(torch.randn(WIDTH, WIDTH, generator=generator) / 16).requires_grad_() for _ in range(2 * LAYERS)]
        x = torch.randn(ROWS, WIDTH, generator=generator, requires_grad=True)
        plain(x, weights).backward()
        reference = [t.grad.clone() for t in [x, *weights]]
        clear_gradients(x, weights)
        with remat.profile_regions(ops=True) as measured:
            model(x, weights).backward()
        clear_gradients(x, weights)
        yield matmuls_dear(measured), x, weights, reference


def clear_gradients(x, weights):
    for t in [x, *weights]:
        t.grad = None


def test_plans_by_peak_keeping_ops_peak_within_the_budget_and_the_prediction(step):
    profile, x, weights, reference = step
    least, most = profile.least_peak_bytes(), profile.step_peak_bytes
    assert least < most
    budgets = [least + (most - least) * i // 4 for i in range(5)]

    def run(plan):
        clear_gradients(x, weights)
        with remat.use_plan(plan):
            model(x, weights).backward()

    rows = []
    with remat.tag_cpu_tensors():
        for budget in budgets:
            plan = profile.plan(peak_bytes=budget, ops=True)
            assert plan.peak_bytes <= budget
            assert profile.predict_peak(plan) == plan.peak_bytes
            measured = max(fit_loop.peak_of(lambda: run(plan)), fit_loop.peak_of(lambda: run(plan)))
            row = (budget, plan.peak_bytes, measured, plan.kept_ops)
            assert measured <= budget, row
            assert measured <= plan.peak_bytes <= measured * 1.03, row
            assert all(torch.equal(t.grad, want) for t, want in zip([x, *weights], reference)), row
            clear_gradients(x, weights)  # each step begins as the profiled one did
            rows.append(row)
    # The plans differ across the range, and keep ops where the peak leaves room for them but not
    # for the whole region.
    assert len({json.dumps(sorted(profile.plan(peak_bytes=b, ops=True).decisions.items())) for b in budgets}) > 1
    assert any(kept for _, _, _, kept in rows)
    assert rows[0][1] == least
    assert profile.plan(peak_bytes=most, ops=True).recompute_seconds == 0


def test_keeping_ops_is_faster_than_the_plan_by_regions_alone_at_the_same_peak(step):
    profile = step[0]
    least, most = profile.least_peak_bytes(), profile.step_peak_bytes
    faster = 0
    for i in range(1, 8):
        budget = least + (most - least) * i // 8
        by_ops, by_regions = profile.plan(peak_bytes=budget, ops=True), profile.plan(peak_bytes=budget)
        assert by_ops.recompute_seconds <= by_regions.recompute_seconds + 1e-12
        faster += by_ops.recompute_seconds < by_regions.recompute_seconds - 1e-9
    assert faster > 0


def test_peak_plans_with_ops_refuse_what_they_cannot_plan(step):
    profile = step[0]
    least = profile.least_peak_bytes()
    with pytest.raises(ValueError, match=rf"\({least - 1} bytes\) is below every plan's: the least any plan reaches is "
                                         rf".* \({least} bytes\)"):
        profile.plan(peak_bytes=least - 1, ops=True)
    with pytest.raises(ValueError, match="ops=True keeps ops of regions as measured: drop group=True"):
        profile.plan(peak_bytes=least, ops=True, group=True)
    # Per-op figures from a profile without the step's storages of each op (an older dump).
    doc = json.loads(profile.to_json())
    for call in doc["step"]["checkpoints"]:
        for region in call["regions"]:
            region.pop("ops", None)
    older = remat.RegionProfile(json.dumps(doc))
    with pytest.raises(ValueError, match=r"does not list op \d+ \(aten::mm\) of region 'layers\.0::attn'.*"
                                         r"remat\.profile_regions\(ops=True\)"):
        older.plan(peak_bytes=profile.step_peak_bytes, ops=True)


def test_remat_report_advise_peak_ops_makes_the_same_plan_and_prediction(step, tmp_path):
    report = os.environ.get("REMAT_REPORT") or str(REPO / "build" / "cli" / "remat-report")
    if not os.access(report, os.X_OK):
        pytest.skip("remat-report is not built (build/cli/remat-report); build the cli target or set REMAT_REPORT")
    profile = step[0]
    profile.to_json(tmp_path / "profile.json")
    least, most = profile.least_peak_bytes(), profile.step_peak_bytes
    for budget in (least, (least + most) // 2, most):
        plan = profile.plan(peak_bytes=budget, ops=True)
        out = subprocess.run([report, "advise", str(tmp_path / "profile.json"), "--peak", f"{budget}B", "--ops",
                              "--json"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["decisions"] == plan.decisions
        assert doc["peak_bytes"] == plan.peak_bytes
        kept = {r["name"]: [(op["index"], op["op"]) for op in r["kept_ops"]] for r in doc["regions"] if r.get("kept_ops")}
        assert kept == {name: list(ops) for name, ops in plan.kept_ops.items()}
    text = subprocess.run([report, "advise", str(tmp_path / "profile.json"), "--peak", f"{(least + most) // 2}B",
                           "--ops"], capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    assert "predicted_peak" in text.stdout or "predicted peak" in text.stdout
    refused = subprocess.run([report, "advise", str(tmp_path / "profile.json"), "--ops"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0 and "--ops needs --budget" in refused.stderr
