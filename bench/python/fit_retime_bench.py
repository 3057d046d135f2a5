#!/usr/bin/env python3
"""remat.fit's plans priced from the profiled step alone against plans re-timed from warm steps,
on the Hugging Face Llama of hf_llama_bench.py.

remat.fit profiles a model's first training step, which runs cold; by default its first planned
steps (retime_steps=3) time their regions' forwards and later steps plan from those times. As in
a training job, the profiled step here is the process's first: per budget a fresh process fits the
model and runs its profiled step, 3 timed steps and one more, and hands back the plan of the first
planned step (the profiled step's times) and of the last (re-timed). Budgets are step peaks over
the step's start, from the least a plan reaches to just below everything saved (a
profile_regions() profile of a warm model gives the range).

This process then runs both plans (wrap_decoder_layers(plan=)) and the model without
checkpointing in rounds that rotate their order: per budget, the regions each plan recomputes,
what each profile prices them at, the measured step time against no checkpointing (median over
rounds of each round's ratio; CPU time of forward and backward), re-timed against profiled
(likewise), and any step whose peak went over its budget.

    OMP_NUM_THREADS=1 PYTHONPATH=build/python:allocator/python \\
        REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so python3 bench/python/fit_retime_bench.py
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_llama_bench as hf  # noqa: E402  (the model, the meter and the training step)

import remat  # noqa: E402

MiB = 1024 * 1024
TIMED_STEPS = 3  # remat.fit's retime_steps here


def recomputed(plan):
    return sorted(name for name, choice in plan.decisions.items() if choice == "recompute")


def short(names):
    """Region names without the model's prefix: "0::mlp" for model.layers.0::mlp."""
    return ", ".join(name.replace("model.layers.", "").replace("model.", "") for name in names) or "none"


def step(model, ids, meter):
    """(CPU seconds, peak over the start) of a forward and backward; the step begins with the
    weights and the batch alone (every model's gradients are dropped after its step)."""
    meter.reset()
    before = meter.allocated()
    meter.start()
    model(input_ids=ids, labels=ids).loss.backward()
    seconds = meter.seconds()
    peak = meter.peak() - before
    model.zero_grad(set_to_none=True)
    remat.collect_trace()  # keeps the runtime's trace log from growing across rounds
    return seconds, peak


def fit_in_this_process(args, over_start, out):
    """The child's part: the model fitted at `over_start` bytes over its step's start, its first
    steps run; writes both plans and both profiles' region seconds to `out`."""
    meter = hf.CpuMeter()
    config, weights, ids = hf.model_of(args)
    warnings.simplefilter("ignore")  # fit says where its profiled step (everything saved) goes over
    with meter.step():
        model = hf.LlamaForCausalLM(config)
        model.load_state_dict(weights)
        model.train()
        remat.wrap_decoder_layers(model, budget=meter.allocated() + over_start, retime_steps=TIMED_STEPS)
        state = model.remat_fit
        step(model, ids, meter)  # profiled
        cold_plan, cold_profile = None, None
        for _ in range(TIMED_STEPS + 1):
            step(model, ids, meter)
            if cold_plan is None:
                cold_plan, cold_profile = state.plan, state.latest.profile
        assert state.latest.warm and state.profiled_steps == 1
        seconds = {}
        for kind, profile in (("cold", cold_profile), ("warm", state.latest.profile)):
            seconds[kind] = {region.name: region.seconds for region in profile.regions}
        doc = {"cold": cold_plan.to_json(), "warm": state.plan.to_json(), "seconds": seconds}
    pathlib.Path(out).write_text(json.dumps(doc))


def fitted_plans(args, over_start):
    """Runs fit_in_this_process in a fresh process: (cold plan, warm plan, region seconds by profile)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "plans.json")
        command = [sys.executable, __file__, "--child", str(over_start), out, "--hidden", str(args.hidden),
                   "--layers", str(args.layers), "--batch", str(args.batch), "--sequence", str(args.sequence),
                   "--vocab", str(args.vocab), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads)]
        subprocess.run(command, check=True, timeout=600)
        doc = json.loads(pathlib.Path(out).read_text())
    return remat.load_plan(doc["cold"]), remat.load_plan(doc["warm"]), doc["seconds"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--budgets", type=int, default=4, help="peak budgets below everything saved (default 4)")
    parser.add_argument("--child", nargs=2, metavar=("OVER_START", "OUT"), help=argparse.SUPPRESS)
    hf.add_model_arguments(parser)
    args = parser.parse_args()
    if args.rounds < 3 or args.budgets < 1:
        parser.error("--rounds: at least 3; --budgets: at least 1")
    args.device = "cpu"
    torch.set_num_threads(1)
    if args.child:
        return fit_in_this_process(args, int(args.child[0]), args.child[1])
    meter = hf.CpuMeter()
    config, weights, ids = hf.model_of(args)

    def fresh(**options):
        model = hf.LlamaForCausalLM(config)
        model.load_state_dict(weights)
        model.train()
        return remat.wrap_decoder_layers(model, **options) if options else model

    with meter.step():
        probe = fresh(save=("self_attn",))
        step(probe, ids, meter)  # warm
        with remat.profile_regions() as profile:
            probe(input_ids=ids, labels=ids).loss.backward()
        probe.zero_grad(set_to_none=True)
    start = profile.step_start_bytes
    least, most = profile.least_peak_bytes() - start, profile.step_peak_bytes - start
    budgets = [least + (most - least) * k // args.budgets for k in range(args.budgets)]
    fitted = [fitted_plans(args, budget) for budget in budgets]

    with meter.step():
        plain = fresh()
        rows = [(fresh(plan=cold), fresh(plan=warm)) for cold, warm, _ in fitted]
        models = [plain] + [model for pair in rows for model in pair]
        for model in models:
            step(model, ids, meter)  # warm
        times = {id(model): [] for model in models}
        peaks = {id(model): 0 for model in models}
        for round_ in range(args.rounds):
            shift = round_ % len(models)
            for model in models[shift:] + models[:shift]:
                seconds, peak = step(model, ids, meter)
                times[id(model)].append(seconds)
                peaks[id(model)] = max(peaks[id(model)], peak)

    def against(model, base):
        return statistics.median(t / b for t, b in zip(times[id(model)], times[id(base)]))

    print(f"Llama hidden {args.hidden}, {args.layers} layers, batch {args.batch}x{args.sequence}, "
          f"{args.rounds} rounds; no checkpointing {statistics.median(times[id(plain)]) * 1e3:.1f} ms a step")
    print("Recompute as each profile prices it: 'cold' the profiled step's times, 'warm' the re-timed ones.")
    print(f"{'budget':>9} | {'plan from the profiled step':^42} | {'plan re-timed':^42} | re-timed vs")
    print(f"{'':>9} | {'regions':>7} {'cold':>9} {'warm':>9} {'vs plain':>12} |"
          f" {'regions':>7} {'cold':>9} {'warm':>9} {'vs plain':>12} | profiled")
    differences = []
    for budget, (cold, warm, seconds), (by_cold, by_warm) in zip(budgets, fitted, rows):
        cells = []
        for plan, model in ((cold, by_cold), (warm, by_warm)):
            if peaks[id(model)] > budget:
                print(f"  a step of the plan at {budget} bytes over the start peaked {peaks[id(model)] - budget} "
                      "bytes over it")
            names = recomputed(plan)
            prices = [sum(seconds[kind][name] for name in names) * 1e3 for kind in ("cold", "warm")]
            cells.append(f"{len(names):7} {prices[0]:7.2f}ms {prices[1]:7.2f}ms {against(model, plain):11.3f}x")
        print(f"{budget / MiB:5.2f} MiB | {cells[0]} | {cells[1]} | {against(by_warm, by_cold):.3f}x")
        if recomputed(cold) != recomputed(warm):
            differences.append(f"at {budget / MiB:.2f} MiB the profiled times recompute "
                               f"{short(sorted(set(recomputed(cold)) - set(recomputed(warm))))}, the re-timed "
                               f"ones {short(sorted(set(recomputed(warm)) - set(recomputed(cold))))} instead")
    print("\n".join(differences) or "the plans are the same at every budget")


if __name__ == "__main__":
    main()
