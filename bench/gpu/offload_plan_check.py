#!/usr/bin/env python3
"""Offload as a planned choice on a GPU under remat_alloc.install(): one profiled step, then the
step's measured peak (requested bytes) and time for every region saved, every region recomputed,
the best plan without offload and the best plan with offload at the same device budget (and a
host budget holding every region), and the same two per op (a recomputed region may keep chosen
ops' outputs), each with gradients bitwise those without checkpointing and the offloading plans
within their host budget. Then plans by step peak at one peak budget (--peak-share
of the way from the least peak a plan with offload reaches to everything saved), without offload
where one fits, with it, and per op with it: on a GPU the step's measured peak on the device within the budget and
at most 3% over the prediction. One line a check, a table of the rows, exit 1 when any check
fails. Times are the median of --rounds steps, each row against all-saved measured in the same run.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/gpu/offload_plan_check.py [--cpu] [--rounds 5]

--cpu: the same checks on narrow tensors on the host, counted inside tag_cpu_tensors(): a dry run
where there is no GPU (on the CPU nothing leaves "the device" and copies do not overlap compute, so
its figures say nothing of a GPU's).
"""

import argparse
import contextlib
import statistics
import sys
import time

import torch

import remat_alloc

parser = argparse.ArgumentParser()
parser.add_argument("--cpu", action="store_true", help="a dry run on the host")
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--share", type=float, default=0.3,
                    help="the device budget: base_bytes plus this share of what saving every region adds")
parser.add_argument("--peak-share", type=float, default=0.3,
                    help="the peak budget: the least peak with offload plus this share of the way to all saved")
args = parser.parse_args()
DEVICE = "cpu" if args.cpu else "cuda"
if DEVICE == "cuda":
    remat_alloc.install()
import remat  # noqa: E402

SCALE = 1 if DEVICE == "cuda" else 16  # the host run's tensors are this many times narrower
WIDTH, ROWS = 2048 // SCALE, 8192 // SCALE
failures = []


def check(ok, what):
    print(f"[{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        failures.append(what)


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def make_weights():
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(WIDTH, WIDTH, generator=generator) / WIDTH ** 0.5).to(DEVICE).requires_grad_()
            for _ in range(2 * args.layers)]


def block(x, w1, w2):
    h = remat.region(lambda t: torch.tanh(t @ w1), "attn")(x)
    return remat.region(lambda t: (torch.sigmoid(t @ w2) * t).sin(), "mlp")(h)


def model(x, weights):
    for index in range(args.layers):
        x = remat.checkpoint(region_name=f"layers.{index}")(block)(x, weights[2 * index], weights[2 * index + 1])
    return x.square().mean()


def plain(x, weights):
    for index in range(args.layers):
        h = torch.tanh(x @ weights[2 * index])
        x = (torch.sigmoid(h @ weights[2 * index + 1]) * h).sin()
    return x.square().mean()


def main():
    weights = make_weights()
    x = torch.randn(ROWS, WIDTH, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(1))
    x.requires_grad_()
    expected = torch.autograd.grad(plain(x, weights), [x, *weights])
    with remat.profile_regions(ops=True) as profile:
        model(x, weights).backward()
    copy = profile.host_copy
    print(f"profile on {DEVICE}: {len(profile.regions)} regions, base {profile.base_bytes} B, all saved "
          f"{profile.all_saved_bytes} B; copies {copy['to_host_bytes_per_second'] / 1e9:.2f} GB/s to the host, "
          f"{copy['to_device_bytes_per_second'] / 1e9:.2f} GB/s back")
    budget = profile.base_bytes + int(args.share * (profile.all_saved_bytes - profile.base_bytes))
    host_budget = sum(profile.offload_bytes.values())
    rows = [("all saved", profile.plan(budget_bytes=profile.all_saved_bytes)),
            ("all recomputed", profile.plan(budget_bytes=profile.base_bytes)),
            ("best plan, no offload", profile.plan(budget_bytes=budget)),
            ("best plan with offload", profile.plan(budget_bytes=budget, host_budget_bytes=host_budget)),
            ("per op, no offload", profile.plan(budget_bytes=budget, ops=True)),
            ("per op with offload", profile.plan(budget_bytes=budget, ops=True, host_budget_bytes=host_budget))]

    def run(plan):
        with remat.use_plan(plan):
            loss = model(x, weights)
        return torch.autograd.grad(loss, [x, *weights])

    results = {}
    for label, plan in rows:
        run(plan)  # once untimed: the host pool and caches warm
        times, peaks = [], []
        for _ in range(args.rounds):
            synchronize()
            remat_alloc.reset_peak_stats(0)
            start = time.perf_counter()
            grads = run(plan)
            synchronize()
            times.append(time.perf_counter() - start)
            peaks.append(remat_alloc.memory_stats(0)["requested_bytes_peak"])
            bitwise = all(torch.equal(got, want) for got, want in zip(grads, expected))
            del grads
        results[label] = (statistics.median(times), max(peaks))
        check(bitwise, f"{label}: gradients bitwise those without checkpointing")
        if plan.offloaded:
            stats = plan.offloader.stats()
            check(stats["peak_host_bytes"] <= plan.host_budget_bytes,
                  f"{label}: host bytes at most {stats['peak_host_bytes']} within the host budget "
                  f"{plan.host_budget_bytes} ({len(plan.offloaded)} regions offloaded)")
    base_time = results["all saved"][0]
    print(f"{'row':<24} {'kept B':>12} {'host B':>12} {'peak B':>12} {'step ms':>9} {'vs saved':>8} "
          f"{'model s':>9}")
    for label, plan in rows:
        seconds, peak = results[label]
        print(f"{label:<24} {plan.kept_bytes:>12} {plan.host_bytes:>12} {peak:>12} {seconds * 1e3:>9.2f} "
              f"{seconds / base_time:>7.2f}x {plan.recompute_seconds:>9.4g}")
    plans = dict(rows)
    for better, than in (("best plan with offload", "best plan, no offload"), ("per op with offload", "per op, no offload"),
                         ("per op with offload", "best plan with offload")):
        check(plans[better].recompute_seconds <= plans[than].recompute_seconds + 1e-12,
              f"{better} models {plans[better].recompute_seconds:.4g} s against {plans[than].recompute_seconds:.4g} s "
              f"for {than}")
    if DEVICE == "cuda":
        # What offload leaves on the device: at most what the plan without offload keeps there.
        check(results["best plan with offload"][1] <= results["best plan, no offload"][1] * 1.02,
              "the plan with offload peaks at most 2% over the plan without offload")
    by_peak(profile, x, weights, host_budget, expected)


def by_peak(profile, x, weights, host_budget, expected):
    """Plans by step peak, run as the profile's step ran (backward into .grad)."""
    least = profile.least_peak_bytes(host_budget_bytes=host_budget)
    peak_budget = least + int(args.peak_share * (profile.step_peak_bytes - least))
    rows = [("by peak, with offload", profile.plan(peak_bytes=peak_budget, host_budget_bytes=host_budget)),
            ("by peak, per op, offload", profile.plan(peak_bytes=peak_budget, ops=True, host_budget_bytes=host_budget))]
    if peak_budget >= profile.least_peak_bytes():
        rows.insert(0, ("by peak, no offload", profile.plan(peak_bytes=peak_budget)))
    print(f"peak budget {peak_budget} B (least with offload {least} B, without {profile.least_peak_bytes()} B, "
          f"all saved {profile.step_peak_bytes} B)")
    print(f"{'row':<24} {'predicted B':>12} {'peak B':>12} {'host B':>12} {'step ms':>9} {'exact':>6}")
    leaves = [x, *weights]
    for label, plan in rows:
        def step():
            for t in leaves:
                t.grad = None
            with remat.use_plan(plan):
                model(x, weights).backward()

        step()  # once untimed
        times, peaks = [], []
        for _ in range(args.rounds):
            synchronize()
            remat_alloc.reset_peak_stats(0)
            start = time.perf_counter()
            step()
            synchronize()
            times.append(time.perf_counter() - start)
            peaks.append(remat_alloc.memory_stats(0)["requested_bytes_peak"])
        check(all(torch.equal(t.grad, want) for t, want in zip(leaves, expected)),
              f"{label}: gradients bitwise those without checkpointing")
        print(f"{label:<24} {plan.peak_bytes:>12} {max(peaks):>12} {plan.host_bytes:>12} "
              f"{statistics.median(times) * 1e3:>9.2f} {str(plan.exact):>6}")
        check(plan.peak_bytes <= peak_budget and plan.host_bytes <= host_budget,
              f"{label}: predicted {plan.peak_bytes} B within {peak_budget} B, host {plan.host_bytes} B within "
              f"{host_budget} B")
        if plan.offloaded:
            check(plan.offloader.stats()["peak_host_bytes"] <= plan.host_bytes,
                  f"{label}: host bytes at most {plan.offloader.stats()['peak_host_bytes']} within the plan's")
        if DEVICE == "cuda":  # on the CPU the host copies are counted with the tensors: no device peak to read
            check(max(peaks) <= peak_budget and max(peaks) <= plan.peak_bytes * 1.03,
                  f"{label}: measured peak {max(peaks)} B within the budget and at most 3% over the prediction")
    for t in leaves:
        t.grad = None


with contextlib.nullcontext() if DEVICE == "cuda" else remat.tag_cpu_tensors():
    main()
print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
sys.exit(1 if failures else 0)
