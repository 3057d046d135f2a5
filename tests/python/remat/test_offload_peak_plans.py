"""Plans by step peak that offload: profile.plan(peak_bytes=B, host_budget_bytes=H) picks save,
recompute or offload per region so that the predicted step peak on the device is within B and the
offloaded bytes within H. On the CPU the offloader's host copies are host memory like every
tensor, counted by the same allocator under phase `offloaded`; the device peak a plan predicts
leaves them out, and so does the measure here: the step's requested bytes replayed from the
allocator's trace without the blocks in phase `offloaded` (the same as memory_stats()'s peak
where nothing is offloaded, which the tests check too)."""

import json
import math
import os
import subprocess
import tempfile

import pytest
import torch

import remat
import remat_alloc
from test_offload_plans import model, plain, with_bandwidth
from test_step_peak_plans import readme_model, readme_plain, remat_report

_trace_entries = [1 << 18]


def _snapshot(directory):
    path = os.path.join(directory, "snapshot.json")
    remat_alloc.dump_snapshot(path, 0)
    with open(path) as f:
        return json.load(f)


def device_peak(step):
    """(the step's peak requested bytes without host copies, its peak with them)."""
    _trace_entries[0] ^= 1  # a new trace size starts an empty trace
    remat_alloc.configure(f"trace_entries:{_trace_entries[0]}")
    with tempfile.TemporaryDirectory() as directory:
        before = _snapshot(directory)
        remat_alloc.reset_peak_stats()
        step()
        whole = remat_alloc.memory_stats()["requested_bytes_peak"]
        after = _snapshot(directory)
    assert after["trace"]["dropped"] == 0
    on_host = [tag["phase"] == "offloaded" for tag in after["tags"]]
    live = {block["address"]: (block["requested_size"], block["tag"])
            for segment in before["segments"] for block in segment["blocks"] if block["state"] == "active_allocated"}
    current = sum(requested for requested, tag in live.values() if not on_host[tag])
    peak = current
    for event in after["trace"]["events"]:
        if event["action"] == "alloc":
            live[event["address"]] = (event.get("requested", 0), event["tag"])
            current += 0 if on_host[event["tag"]] else event.get("requested", 0)
        elif event["action"] == "free_requested":
            requested, tag = live.pop(event["address"])
            current -= 0 if on_host[tag] else requested
        elif event["action"] == "retag":
            requested, tag = live[event["address"]]
            current += requested * ((not on_host[event["tag"]]) - (not on_host[tag]))
            live[event["address"]] = (requested, event["tag"])
        peak = max(peak, current)
    return peak, whole


@pytest.fixture(scope="module")
def readme():
    """The README's model profiled with its tensors counted: (x, reference gradient, profile with
    copies priced next to nothing, so offload is the cheapest way down)."""
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        x = torch.randn(64, 256, requires_grad=True)
        readme_plain(x).backward()
        reference = x.grad.clone()
        x.grad = None
        with remat.profile_regions() as profile:
            readme_model(x).backward()
        x.grad = None
    return x, reference, with_bandwidth(profile, 1e15)


def run_step(x, plan):
    x.grad = None
    with remat.use_plan(plan):
        readme_model(x).backward()


def test_offload_plans_peak_within_the_budget_and_the_prediction_on_the_device(readme):
    x, reference, profile = readme
    everything = sum(profile.offload_bytes.values())
    host_budget = everything // 2
    least = profile.least_peak_bytes(host_budget_bytes=host_budget)
    assert least < profile.least_peak_bytes()  # offload lowers the floor recompute alone reaches
    rows, offloading = [], 0
    with remat.tag_cpu_tensors():
        plain_plan = profile.plan(peak_bytes=profile.step_peak_bytes)
        measured, whole = device_peak(lambda: run_step(x, plain_plan))
        assert measured == whole == profile.step_peak_bytes  # the measure, where nothing is offloaded
        for i in range(5):
            budget = least + (profile.step_peak_bytes - least) * i // 4
            plan = profile.plan(peak_bytes=budget, host_budget_bytes=host_budget)
            assert plan.peak_bytes <= budget and plan.host_bytes <= host_budget and plan.exact
            assert profile.predict_peak(plan) == plan.peak_bytes
            measured = max(device_peak(lambda: run_step(x, plan))[0] for _ in range(2))
            assert torch.equal(x.grad, reference)
            assert measured <= budget, (budget, plan.peak_bytes, measured, plan.decisions)
            assert measured <= plan.peak_bytes * 1.03, (budget, plan.peak_bytes, measured, plan.decisions)
            if plan.offloaded:
                offloading += 1
                assert 0 < plan.offloader.stats()["peak_host_bytes"] <= plan.host_bytes <= host_budget
            rows.append((budget, plan.peak_bytes, measured, plan.host_bytes))
    assert offloading >= 3, rows
    # Each plan is the fastest within its peak: never slower than the plan without offload.
    for budget, *_ in rows[1:]:
        with_offload = profile.plan(peak_bytes=budget, host_budget_bytes=host_budget)
        assert with_offload.recompute_seconds <= profile.plan(peak_bytes=budget).recompute_seconds + 1e-12


def test_layers_whose_matmuls_save_their_inputs_peak_within_the_prediction_when_offloaded():
    # Each region's matmul saves its input (the first one the checkpoint's input), and the mlp saves
    # its input twice: offloaded, those go to the host; the weights (leaves) stay.
    width, layers = 64, 4

    with remat.tag_cpu_tensors():
        generator = torch.Generator().manual_seed(7)
        weights = [(torch.randn(width, width, generator=generator) / 8).requires_grad_() for _ in range(2 * layers)]
        x = torch.randn(512, width, generator=torch.Generator().manual_seed(3), requires_grad=True)
        leaves = [x, *weights]
        plain(x, weights).backward()
        reference = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        with remat.profile_regions() as measured:
            model(x, weights).backward()
        profile = with_bandwidth(measured, 1e15)
        host_budget = sum(profile.offload_bytes.values()) // 3
        least = profile.least_peak_bytes(host_budget_bytes=host_budget)
        assert least < profile.step_peak_bytes
        offloading = 0
        for i in range(5):
            budget = least + (profile.step_peak_bytes - least) * i // 4
            plan = profile.plan(peak_bytes=budget, host_budget_bytes=host_budget)

            def step():
                for t in leaves:
                    t.grad = None
                with remat.use_plan(plan):
                    model(x, weights).backward()

            measured_peak = max(device_peak(step)[0] for _ in range(2))
            assert all(torch.equal(t.grad, want) for t, want in zip(leaves, reference))
            assert measured_peak <= budget and measured_peak <= plan.peak_bytes * 1.03, (budget, plan.peak_bytes,
                                                                                          measured_peak, plan.decisions)
            assert plan.host_bytes <= host_budget
            if plan.offloaded:
                offloading += 1
                assert 0 < plan.offloader.stats()["peak_host_bytes"] <= plan.host_bytes
        assert offloading >= 3


def test_a_host_budget_of_0_makes_the_plan_without_offload(readme):
    _, _, profile = readme
    budget = (profile.least_peak_bytes() + profile.step_peak_bytes) // 2
    plan = profile.plan(peak_bytes=budget, host_budget_bytes=0)
    plain = profile.plan(peak_bytes=budget)
    assert plan.offloaded == [] and plan.host_bytes == 0 and plan.host_budget_bytes == 0
    assert plan.decisions == plain.decisions and plan.peak_bytes == plain.peak_bytes


def test_a_host_budget_of_0_with_a_unit_is_0_in_python_and_in_advise(readme, tmp_path):
    # "0 B" and "0GiB" mean no offload, as 0 does; a device budget of zero is still refused.
    _, _, profile = readme
    budget = (profile.least_peak_bytes() + profile.step_peak_bytes) // 2
    plain = profile.plan(peak_bytes=budget, host_budget_bytes=0)
    for zero in ("0 B", "0GiB"):
        plan = profile.plan(peak_bytes=budget, host_budget_bytes=zero)
        assert plan.offloaded == [] and plan.host_budget_bytes == 0 and plan.decisions == plain.decisions
    with pytest.raises(ValueError, match="zero bytes"):
        profile.plan(peak_bytes="0 B")
    path = tmp_path / "profile.json"
    profile.to_json(path)
    advised = []
    for zero in ("0", "0B", "0 GiB"):
        run = subprocess.run([remat_report(), "advise", str(path), "--peak", f"{budget}B", "--host-budget", zero,
                              "--json"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        advised.append(json.loads(run.stdout)["decisions"])
    assert advised == [plain.decisions] * 3


def test_a_peak_below_every_plan_with_that_host_budget_names_the_least(readme):
    _, _, profile = readme
    host_budget = sum(profile.offload_bytes.values())
    least = profile.least_peak_bytes(host_budget_bytes=host_budget)
    assert profile.plan(peak_bytes=least, host_budget_bytes=host_budget).peak_bytes == least
    with pytest.raises(ValueError, match=rf"the least any plan reaches is .* \({least} bytes\) with a host budget of "
                                         rf"{host_budget} bytes"):
        profile.plan(peak_bytes=least - 1, host_budget_bytes=host_budget)


def test_bad_host_budgets_with_a_peak_are_refused_naming_the_fix(readme):
    _, _, profile = readme
    peak = profile.step_peak_bytes
    with pytest.raises(ValueError, match="host_budget_bytes must be 0 or more bytes, got -1"):
        profile.plan(peak_bytes=peak, host_budget_bytes=-1)
    with pytest.raises(ValueError, match="host_budget_bytes must be a whole number of bytes, got the float nan"):
        profile.plan(peak_bytes=peak, host_budget_bytes=math.nan)
    with pytest.raises(ValueError, match="no unit"):
        profile.plan(peak_bytes=peak, host_budget_bytes="64")
    with pytest.raises(TypeError, match="needs one device budget"):
        profile.plan(host_budget_bytes="1 MiB")
    with pytest.raises(ValueError, match="drop group=True"):
        profile.plan(peak_bytes=peak, host_budget_bytes="1 MiB", group=True)
    with pytest.raises(ValueError, match="drop group=True"):
        profile.least_peak_bytes(host_budget_bytes="1 MiB", group=True)
    with pytest.raises(ValueError, match="host_budget_bytes must be 0 or more bytes"):
        profile.least_peak_bytes(host_budget_bytes=-5)
    doc = json.loads(profile.to_json())
    del doc["host_copy"]
    no_copy = remat.RegionProfile(json.dumps(doc))
    with pytest.raises(ValueError, match="needs the copy bandwidth"):
        no_copy.plan(peak_bytes=peak, host_budget_bytes="1 MiB")
    with pytest.raises(ValueError, match="needs the copy bandwidth"):
        no_copy.least_peak_bytes(host_budget_bytes="1 MiB")


def test_advise_peak_with_a_host_budget_makes_the_same_plan_and_prediction(readme, tmp_path):
    _, _, profile = readme
    path = tmp_path / "profile.json"
    profile.to_json(path)
    host_budget = sum(profile.offload_bytes.values()) // 2
    least = profile.least_peak_bytes(host_budget_bytes=host_budget)
    for i in range(5):
        budget = least + (profile.step_peak_bytes - least) * i // 4
        run = subprocess.run([remat_report(), "advise", str(path), "--peak", f"{budget}B", "--host-budget",
                              f"{host_budget}B", "--json"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        advised, plan = json.loads(run.stdout), profile.plan(peak_bytes=budget, host_budget_bytes=host_budget)
        assert advised["decisions"] == plan.decisions
        assert advised["peak_bytes"] == plan.peak_bytes and advised["host_bytes"] == plan.host_bytes
    run = subprocess.run([remat_report(), "advise", str(path), "--peak", f"{least - 1}B", "--host-budget",
                          f"{host_budget}B"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and f"({least} bytes) with a host budget of {host_budget} bytes" in run.stderr
    run = subprocess.run([remat_report(), "advise", str(path), "--host-budget", "1MiB"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0 and "--host-budget needs --budget" in run.stderr
    run = subprocess.run([remat_report(), "advise", str(path), "--peak", f"{least}B", "--host-budget", "1MiB", "--svg",
                          str(tmp_path / "peak.svg")], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "--svg draws plans without offload" in run.stderr
    assert not (tmp_path / "peak.svg").exists()
    text = profile.plan(peak_bytes=least, host_budget_bytes=host_budget).format()
    assert text.startswith(f"step peak: {least} bytes predicted, within {least}") and "host: " in text
    plan = profile.plan(peak_bytes=profile.step_peak_bytes, host_budget_bytes=host_budget)
    plan.to_json(tmp_path / "plan.json")
    # The profile names what the offloader leaves on the device (the mlp's output, a slice)
    assert any(region.get("offload_kept") for call in json.loads(profile.to_json())["step"]["checkpoints"]
               for region in call["regions"])
    for name in ("plan.json", "profile.json"):
        run = subprocess.run([remat_report(), "validate", str(tmp_path / name)], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
    back = remat.load_plan(tmp_path / "plan.json")
    assert (back.peak_bytes, back.host_bytes, back.decisions) == (plan.peak_bytes, plan.host_bytes, plan.decisions)
