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


if __name__ == "__main__":
    main()
