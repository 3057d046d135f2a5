#!/usr/bin/env python3
"""The budget solver on 10,000-region profiles of the shapes that are hard for a knapsack: seconds
proportional to bytes (a subset sum, where no bound prunes anything) with bytes of any size, of
page multiples, or of four kinds, and also times with a 3% noise (as real profiles have them),
times unrelated to bytes, and times proportional to bytes plus a constant (strongly correlated).

For each profile: the worst seconds one budget takes through Python's plan() (remat._budget, the
GIL released) and through `remat-report advise --budget B --json` (the process, reading the dump
included), each over budgets at 10%, 30%, 50%, 70% and 90% of the way from the least to
everything saved; the frontier (8 budgets) through both; how many plans were proved optimal; and
the worst budget's time as a share of the one-second goal, and the CLI's against Python's.

    python3 bench/python/budget_solver_bench.py [--module build/python/remat/_budget*.so]
        [--report build/cli/remat-report] [--regions 10000] [--only proportional-any-bytes,...]

Pass an older build's module and remat-report to compare the two side by side.

Then per-op plans (remat._budget.plan_ops: a region saved, recomputed, or recomputed keeping some
ops' outputs) on --regions regions of --ops ops each, at the same budgets: the worst seconds one
budget takes through Python (reading the dump included), how many plans were proved optimal, and
the largest gap a plan not proved leaves to the bound (recompute_seconds over least_recompute_seconds).

Then plans by step peak on a profile of --regions regions of --ops ops with the step's memory (100
regions a checkpoint call): the seconds the dump takes to read, the least peak, and the worst
seconds one peak budget takes by regions alone (plan_by_peak) and per op (plan_by_peak_ops), the
dump read once, at peak budgets 10% to 90% of the way from the least peak to everything saved.

Last, plans by step peak with offload (plan_by_peak_offload) on steps of --offload-regions regions,
2 a checkpoint call: the least peak's seconds, the worst budget's, how many plans were proved, and
each plan's added seconds beside the plan without offload at the same peak budget.
"""

import argparse
import glob
import importlib.machinery
import importlib.util
import json
import pathlib
import random
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
MiB = 1 << 20
SHARES = (0.1, 0.3, 0.5, 0.7, 0.9)


def load_budget_module(path):
    loader = importlib.machinery.ExtensionFileLoader("_budget", path)
    spec = importlib.util.spec_from_file_location("_budget", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def profiles(count):
    """(name, [(saved_bytes, seconds)]) for each shape, seeded so every run solves the same ones."""
    rng = random.Random(43)
    kinds = [(64 * MiB, 0.004), (256 * MiB, 0.011), (24 * MiB, 0.0015), (96 * MiB, 0.002)]
    any_bytes = [rng.randint(MiB, 256 * MiB) for _ in range(count)]
    pages = [4096 * rng.randint(256, 65536) for _ in range(count)]
    kind_bytes = [kinds[i % 4][0] for i in range(count)]
    yield "proportional, any bytes", [(b, b * 1e-9) for b in any_bytes]
    yield "proportional, 4 KiB pages", [(b, b * 1e-9) for b in pages]
    yield "proportional, four kinds", [(b, b * 1e-9) for b in kind_bytes]
    yield "four kinds, 3% noise", [(kinds[i % 4][0], kinds[i % 4][1] * rng.gauss(1, 0.03)) for i in range(count)]
    yield "any bytes, 3% noise", [(b, b * 1e-9 * rng.gauss(1, 0.03)) for b in any_bytes]
    yield "unrelated", [(b, rng.uniform(1e-4, 1e-2)) for b in any_bytes]
    yield "proportional plus a constant", [(b, b * 1e-9 + 1e-3) for b in any_bytes]


def op_profiles(count, ops):
    """(name, regions as dumps list them with per-op figures), seeded."""
    rng = random.Random(50)

    def region(i, op_of):
        listed = [op_of(j) for j in range(ops)]
        seconds = sum(s for _, _, s in listed) * 1.05
        saved = sum(b for _, b, _ in listed) // 2
        return {"name": f"layers.{i}::r", "saved_bytes": saved, "seconds": seconds, "op_overhead_seconds": 2e-5,
                "ops": [{"index": 2 * j, "op": name, "bytes": b, "seconds": s}
                        for j, (name, b, s) in enumerate(listed)]}

    def layer_op(j):
        matmul = j % 4 == 0
        return ("aten::mm" if matmul else "aten::mul.Tensor", 4 * MiB, (2e-3 if matmul else 1e-4) * rng.gauss(1, 0.03))

    yield "matmuls and elementwise ops, 3% noise", [region(i, layer_op) for i in range(count)]
    yield "any bytes, unrelated times", [region(i, lambda j: ("aten::mm", rng.randint(1, 64 * MiB),
                                                             rng.uniform(1e-5, 1e-3))) for i in range(count)]
    yield "proportional, any bytes", [region(i, lambda j: ("aten::mm", b := rng.randint(1, 64 * MiB), b * 1e-11))
                                      for i in range(count)]


def step_op_profile(calls, per_call, ops, offload=False):
    """A region_profile dump with per-op figures and the step's memory, as remat.profile_regions(ops=True)
    writes one with the step's tensors counted: `calls` checkpoint calls in a chain, each of `per_call`
    regions in a chain; each region keeps its output and one saved storage and runs `ops` ops (the first
    makes the saved storage, the last the output, the rest a storage each that forward frees). Segments
    as the profile cuts them: each region's entry and exit, the end of forward, each call's backward.
    With `offload`, each region may be offloaded (its kept bytes to the host, at a copy bandwidth of
    1 GB/s each way on the CPU: 2 us a KB, against a region's 0-1 s)."""
    rng = random.Random(46)
    storages, checkpoints, segments, regions, live = [], [], [], [], []
    alive, carried = 0, None

    def storage(size):
        storages.append(size)
        return len(storages) - 1

    def segment(peak, forward=-1, backward=-1):
        segments.append({"peak_bytes": peak, "start_bytes": alive, "live": list(live), "forward": forward,
                         "backward": backward})

    for k in range(calls):
        call = {"name": f"c{k}", "inputs": [] if carried is None else [carried], "kept_inputs": [], "outputs": [],
                "regions": []}
        segment(alive + rng.randrange(100), forward=k)
        for r in range(per_call):
            name = f"c{k}::r{r}"
            output, saved = storage(rng.randint(1, 400)), storage(rng.randint(1, 400))
            step_ops, cost_ops, seconds = [], [], rng.uniform(0, 1)
            for o in range(ops):
                made = saved if o == 0 else output if o == ops - 1 else storage(64 + rng.randrange(256))
                op_seconds = rng.uniform(0, 1e-3)
                seconds += op_seconds
                step_ops.append({"index": o, "outputs": [made]})
                cost_ops.append({"index": o, "op": "aten::mm" if o % 4 == 0 else "aten::mul.Tensor",
                                 "bytes": storages[made], "seconds": op_seconds})
            transient = rng.randrange(200)
            call["regions"].append({"name": name, "kept": [output, saved], "inputs": [] if carried is None else
                                    [carried], "outputs": [output], "transient_bytes": transient, "ops": step_ops})
            regions.append({"name": name, "saved_bytes": storages[output] + storages[saved], "seconds": seconds,
                            "op_overhead_seconds": 1e-5, "ops": cost_ops})
            if offload:
                regions[-1]["offload_bytes"] = storages[output] + storages[saved]
            after = alive + storages[output] + storages[saved]
            segment(after + transient, forward=k)
            alive = after
            segment(alive + rng.randrange(100), forward=k)
            carried = output
        call["outputs"] = [carried]
        checkpoints.append(call)
        live.append(k)
    segment(alive + rng.randrange(300))
    for k in reversed(range(calls)):
        segment(alive + rng.randrange(500), backward=k)
        live.pop()
        alive -= sum(storages[i] for region in checkpoints[k]["regions"] for i in region["kept"])
    step = {"start_bytes": 0, "end_bytes": 0, "peak_bytes": max(s["peak_bytes"] for s in segments),
            "storages": storages, "checkpoints": checkpoints, "segments": segments}
    doc = {"kind": "region-profile", "schema_version": 1, "base_bytes": 0, "regions": regions, "step": step}
    if offload:
        doc["host_copy"] = {"to_host_bytes_per_second": 1e9, "to_device_bytes_per_second": 1e9,
                            "measured_bytes": MiB}
    return json.dumps(doc)


def profile_text(regions):
    return json.dumps({"kind": "region-profile", "schema_version": 1, "base_bytes": 1 << 30,
                       "regions": [{"name": f"layers.{i}::r", "saved_bytes": b, "seconds": s}
                                   for i, (b, s) in enumerate(regions)]})


def timed(call):
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", default=None, help="the remat._budget extension (default: the build tree's)")
    parser.add_argument("--report", default=str(REPO / "build/cli/remat-report"))
    parser.add_argument("--regions", type=int, default=10000)
    parser.add_argument("--only", default="", help="comma-separated profile names (default: all)")
    parser.add_argument("--ops", type=int, default=20, help="ops per region in the per-op profiles (default 20)")
    parser.add_argument("--offload-regions", default="24,240,2400",
                        help="comma-separated region counts of the plans by step peak with offload (2 regions a call)")
    args = parser.parse_args()
    module_path = args.module or glob.glob(str(REPO / "build/python/remat/_budget*.so"))[0]
    budget = load_budget_module(module_path)
    # The dump as the module takes it: read into a Profile (an older module takes the text as it is)
    read = budget.Profile if hasattr(budget, "Profile") else (lambda text: text)
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    print(f"{args.regions} regions; budgets at {', '.join(f'{s:.0%}' for s in SHARES)} of the range; "
          f"module {module_path}, CLI {args.report}\n")
    print("| profile | Python worst s/budget | CLI worst s/budget | CLI / Python | worst vs 1 s goal | "
          "Python frontier s | CLI frontier s | proved optimal |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for name, regions in profiles(args.regions):
            if only and name not in only:
                continue
            text = profile_text(regions)
            path = pathlib.Path(folder) / "profile.json"
            path.write_text(text)
            low = 1 << 30
            high = low + sum(b for b, _ in regions)
            python_times, cli_times, proved = [], [], 0
            for share in SHARES:
                budget_bytes = int(low + share * (high - low))
                seconds, plan = timed(lambda: json.loads(budget.plan(read(text), budget_bytes, False)))
                python_times.append(seconds)
                proved += bool(plan["exact"])
                seconds, run = timed(lambda: subprocess.run(
                    [args.report, "advise", str(path), "--budget", f"{budget_bytes}B", "--json"],
                    capture_output=True, text=True, check=True))
                cli_times.append(seconds)
                if json.loads(run.stdout)["kept_bytes"] != plan["kept_bytes"]:
                    sys.exit(f"{name}: the CLI and Python disagree at {budget_bytes} bytes")
            python_frontier, _ = timed(lambda: budget.frontier(read(text), 8, False))
            cli_frontier, _ = timed(lambda: subprocess.run([args.report, "advise", str(path)], capture_output=True,
                                                           check=True))
            worst = max(python_times + cli_times)
            print(f"| {name} | {max(python_times):.3f} | {max(cli_times):.3f} | "
                  f"{max(cli_times) / max(python_times):.2f}x | {worst:.2f}x | {python_frontier:.3f} | "
                  f"{cli_frontier:.3f} | {proved} of {len(SHARES)} |", flush=True)

    print(f"\nper-op plans: {args.regions} regions x {args.ops} ops\n")
    print("| profile | dump MiB | reading it, s | worst s/budget, dump read each time | solving alone, s/budget | "
          "worst vs 1 s goal | proved optimal | largest gap to the bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, regions in op_profiles(args.regions, args.ops):
        text = json.dumps({"kind": "region-profile", "schema_version": 1, "base_bytes": 1 << 30, "regions": regions})
        low = 1 << 30
        high = low + sum(op["bytes"] for r in regions for op in r["ops"])
        times, proved, gap = [], 0, 1.0
        for share in SHARES:
            budget_bytes = int(low + share * (high - low))
            seconds, plan = timed(lambda: json.loads(budget.plan_ops(read(text), budget_bytes)))
            times.append(seconds)
            proved += bool(plan["exact"])
            if plan["least_recompute_seconds"] > 0:
                gap = max(gap, plan["recompute_seconds"] / plan["least_recompute_seconds"])
        reading, _ = timed(lambda: budget.plan_ops_at(read(text), []))  # the dump read, no plan made
        both, _ = timed(lambda: budget.plan_ops_at(read(text), [int(low + share * (high - low)) for share in SHARES]))
        alone = max(0.0, both - reading) / len(SHARES)
        print(f"| {name} | {len(text) / MiB:.1f} | {reading:.2f} | {max(times):.3f} | {alone:.3f} | {alone:.2f}x | "
              f"{proved} of {len(SHARES)} | {gap:.6f} |", flush=True)

    calls = max(1, args.regions // 100)
    text = step_op_profile(calls, args.regions // calls, args.ops)
    print(f"\nplans by step peak: {calls} checkpoint calls of {args.regions // calls} regions x {args.ops} ops, "
          f"peak budgets at {', '.join(f'{s:.0%}' for s in SHARES)} of the way from the least peak to everything "
          "saved\n")
    print("| dump MiB | reading it, s | least peak, s | by regions, worst s/budget | per op, worst s/budget | "
          "per op vs 1 s goal | per op's recompute vs by regions' |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    reading, profile = timed(lambda: read(text))
    least_seconds, least = timed(lambda: budget.least_peak(profile, False))
    everything = json.loads(text)["step"]["peak_bytes"]
    region_times, op_times, ratios = [], [], []
    for share in SHARES:
        peak = int(least + share * (everything - least))
        seconds, by_regions = timed(lambda: json.loads(budget.plan_by_peak(profile, peak, False)))
        region_times.append(seconds)
        seconds, per_op = timed(lambda: json.loads(budget.plan_by_peak_ops(profile, peak)))
        op_times.append(seconds)
        if max(by_regions["peak_bytes"], per_op["peak_bytes"]) > peak:
            sys.exit(f"a plan by peak is over its peak budget of {peak} bytes")
        if by_regions["recompute_seconds"] > 0:
            ratios.append(per_op["recompute_seconds"] / by_regions["recompute_seconds"])
    print(f"| {len(text) / MiB:.1f} | {reading:.2f} | {least_seconds:.3f} | {max(region_times):.3f} | "
          f"{max(op_times):.3f} | {max(op_times):.2f}x | {min(ratios):.4f}-{max(ratios):.4f} |", flush=True)
    peak_offload_plans(budget, read, [int(n) for n in args.offload_regions.split(",") if n])


def peak_offload_plans(budget, read, region_counts):
    """Plans by step peak with offload (plan_by_peak_offload, least_peak_offload) on steps of 2 regions
    a checkpoint call (a layer's attention and MLP) of 4 ops each, the host holding a third of what the
    regions could offload, at peak budgets 10% to 90% of the way from the least peak to everything saved."""
    print("\nplans by step peak with offload: 2 regions a checkpoint call, host budget a third of the offloadable "
          "bytes\n")
    print("| regions | least peak, s | worst s/budget | proved | added s over the plan without offload, per budget |")
    print("|---:|---:|---:|---:|---|")
    for count in region_counts:
        text = step_op_profile(max(1, count // 2), 2, 4, offload=True)
        profile = read(text)
        host = sum(region["offload_bytes"] for region in json.loads(text)["regions"]) // 3
        least_seconds, least = timed(lambda: budget.least_peak_offload(profile, host))
        everything = json.loads(text)["step"]["peak_bytes"]
        times, proved, ratios = [], 0, []
        for share in SHARES:
            peak = int(least + share * (everything - least))
            seconds, plan = timed(lambda: json.loads(budget.plan_by_peak_offload(profile, peak, host)))
            times.append(seconds)
            if plan["peak_bytes"] > peak or plan["host_bytes"] > host:
                sys.exit(f"a plan by peak with offload is over its budgets ({peak} bytes, {host} on the host)")
            proved += plan["exact"]
            try:
                alone = json.loads(budget.plan_by_peak(profile, peak, False))["recompute_seconds"]
                ratios.append(f"{plan['recompute_seconds']:.3f}/{alone:.3f}")
            except ValueError:  # below every plan's peak without offload
                ratios.append(f"{plan['recompute_seconds']:.3f}/-")
        print(f"| {count} | {least_seconds:.3f} | {max(times):.3f} | {proved} of {len(SHARES)} | {', '.join(ratios)} |",
              flush=True)


if __name__ == "__main__":
    main()
