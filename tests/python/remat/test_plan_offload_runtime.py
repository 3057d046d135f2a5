"""A plan's offload decisions carried out by the C++ runtime (remat::budget::RegionChoices of a
remat-plan dump given as CheckpointOptions::plan, its offloader remat::plan_offloader) and by the
Python layer (use_plan, which offloads through the plan's own remat.CpuOffload): the same plan,
tests/remat/data/offload_plan.json, on the model of test_offload_plans.py, moves the same bytes to
the host and keeps the same bytes on the device at the step's peak, with gradients bitwise those
without checkpointing. tests/remat/test_plan_offload.cpp asserts the same figures from C++."""

import pathlib

import pytest
import torch

import remat
from remat._extension import _C
from test_offload_peak_plans import device_peak
from test_offload_plans import LAYERS, WIDTH, batch, block, make_weights, model, plain

FIXTURE = pathlib.Path(__file__).resolve().parents[2] / "remat" / "data" / "offload_plan.json"
ROWS = 32
ACTIVATION = ROWS * WIDTH * 4  # bytes of one 32 x 128 float tensor
OFFLOADED = ["layers.0::attn", "layers.0::mlp", "layers.1::attn"]
PREDICTED_PEAK = 901128  # profile.predict_peak(plan) of the profile the fixture's plan was made from


def runtime_model(x, weights, choices):
    """The model with each checkpoint given `choices` as the C++ runtime's plan (no Python plan)."""
    for layer in range(LAYERS):
        x = _C.checkpoint(block, (x, weights[2 * layer], weights[2 * layer + 1]), {}, f"layers.{layer}", [], [],
                          False, None, choices)
    return x.square().sum()


def measured_step(x, weights, forward, offloader, expected):
    """(device peak, whole peak, host bytes after forward) of one step, its gradients checked
    bitwise against `expected` and let go; `offloader()` is the offloader in use (made at the
    step's first offloaded region)."""
    figures = {}

    def step():
        loss = forward()
        stats = offloader().stats()
        # (not shared_tensors: the Python layer also hands the runtime a saved region's outputs,
        # one more save of a tensor already on the host)
        figures["host"] = {key: stats[key] for key in ("resident_host_bytes", "offloaded_bytes", "offloaded_tensors",
                                                       "kept_resident_bytes")}
        figures["grads"] = torch.autograd.grad(loss, [x, *weights])

    peak, whole = device_peak(step)
    for got, want in zip(figures.pop("grads"), expected):
        assert torch.equal(got, want)
    return peak, whole, figures["host"]


def test_the_runtime_and_the_python_layer_carry_out_a_plans_offload_the_same_way():
    text = FIXTURE.read_text()
    plan = remat.load_plan(FIXTURE)
    choices = _C.RegionChoices.from_plan_json(text, str(FIXTURE))
    assert sorted(plan.offloaded) == OFFLOADED
    assert [name for name in plan.decisions if choices.offloads(name)] == sorted(OFFLOADED)
    with remat.tag_cpu_tensors():
        weights = make_weights()
        x = batch().requires_grad_()
        expected = torch.autograd.grad(plain(x, weights), [x, *weights])
        rows = []
        for _ in range(2):  # the offloaders' host pools serve step after step
            def in_python():
                with remat.use_plan(plan):
                    return model(x, weights)

            python = measured_step(x, weights, in_python, lambda: plan.offloader, expected)
            runtime = measured_step(x, weights, lambda: runtime_model(x, weights, choices),
                                    lambda: _C.plan_offloader(choices), expected)
            rows.append((python, runtime))
            # The same tensors to the host, each once: 5 of 32 x 128 floats (test_plan_offload.cpp
            # asserts the same), within the plan's host bytes.
            assert python[2] == runtime[2], rows
            assert runtime[2]["resident_host_bytes"] == runtime[2]["offloaded_bytes"] == 5 * ACTIVATION
            assert runtime[2]["offloaded_bytes"] <= plan.host_bytes <= plan.host_budget_bytes
            # The device peak, beside the reference gradients held, within the peak the profile
            # predicted for the plan (profile.predict_peak(plan) when the fixture was made). The Python
            # layer's peak is one activation above the runtime's with or without offload (it keeps
            # every saved region's output for recompute); offload moves the same bytes in both.
            held = sum(g.nbytes for g in expected)
            for peak, whole, _ in (python, runtime):
                assert peak - held <= PREDICTED_PEAK and peak < whole
            assert python[0] - runtime[0] == ACTIVATION, rows
        assert plan.offloader.stats()["resident_host_bytes"] == 0
        assert _C.plan_offloader(choices).stats()["resident_host_bytes"] == 0
    assert _C.plan_offloader(_C.RegionChoices([("layers.0::attn", False)])) is None
    with pytest.raises(remat._budget.BudgetError, match="offloads 'layers.0::attn', which it recomputes"):
        _C.RegionChoices([("layers.0::attn", True)], ["layers.0::attn"])
