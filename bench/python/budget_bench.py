#!/usr/bin/env python3
"""Budget plans on the Hugging Face Llama of hf_llama_bench.py: a region profile of one step, the
plan at 5 budgets from the least the checkpoints can keep to everything saved, each applied with
wrap_decoder_layers(model, plan=plan), against the hand choices (attention saved, everything
recomputed) and torch.compile's own planner (torch._functorch.config.activation_memory_budget).

A second table plans by the step's peak (profile.plan(peak_bytes=)) at 5 peak budgets from the
least any plan reaches to everything saved: each plan's predicted peak beside the peak measured
(the step's own bytes above what it began with), its step time against no checkpointing, and the
torch.compile rows' measured peaks with their time against compile's own uncheckpointed step
(activation_memory_budget 1.0).

For each row: the bytes the plan predicts its checkpoints keep, the bytes they keep measured
after forward (the live checkpoints' saved-tensors reports, each storage once: must be at most
the budget), the step's kept and peak bytes as hf_llama_bench counts them (remat's tagging
allocator as the CPU allocator), and the step's CPU time (median over rounds that rotate the
order of the rows; against no checkpointing, the median of each round's ratio). Every remat
row also checkpoints the final RMSNorm (model.norm, recomputed in backward: it then keeps its
input alone). Each hand choice is followed by the plan at its bytes as the profile counts them,
which must be no slower. The compiled rows run the model without remat under
torch.compile with activation_memory_budget set (its partitioner decides per ATen op from
estimates), at budgets picked so that the step keeps about what remat's plans make it keep; compare
their step kept bytes with the plans' (the checkpoints' bytes do not apply to them). Each compiled
row is its own model compiled by a backend that partitions at that row's budget (the budget is
read when a graph is partitioned), so the compiled rows run in the rotation beside the others.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/budget_bench.py [--rounds 7] [--compile-budgets 0.2,0.45,0.7,1.0]

Per-op plans (--ops, the default): a second profile, profile_regions(ops=True), measures each
region's ATen ops, and at the step bytes of each compiled row below activation_memory_budget 1.0
(what the step keeps less what it keeps beyond the checkpoints with every region recomputed) the
per-op plan (profile.plan(budget_bytes=..., ops=True): a region saved, recomputed, or recomputed
keeping chosen ops' outputs) and the region plan run as rows of their own. The last table sets
each against its baseline in this run: remat's plans against the eager step without
checkpointing, compile's against its own compiled step at activation_memory_budget 1.0.

Also times the solver on 10,000 regions (layers of four kinds, as a real profile has them).
"""

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_llama_bench as hf  # noqa: E402  (the model, the meter and the training step)

import remat  # noqa: E402
from remat import _budget  # noqa: E402
from remat._plans import live_checkpoint_bytes  # noqa: E402

MiB = 1024 * 1024


def wrapped(model, **options):
    """The model as every remat row runs it: each decoder layer a checkpoint
    (remat.wrap_decoder_layers with `options`), and the final RMSNorm one too, recomputed in
    backward: it keeps its input alone (uncheckpointed it keeps its normalized input and its
    output too, 1 MiB here)."""
    model = remat.wrap_decoder_layers(model, **options)
    norm = model.model.norm
    norm.forward = remat.checkpoint(region_name="model.norm")(norm.forward)
    return model


def measure(model, ids, meter):
    """(seconds, checkpoint-kept bytes, step kept bytes, step peak bytes) of one training step."""
    seconds, kept, peak, _, _, by_checkpoints = hf.train_step(model, ids, meter, live_checkpoint_bytes)
    return seconds, by_checkpoints, kept, peak


def against(rounds, base_rounds):
    """The row's step time against the baseline's: the median over rounds of each round's ratio
    (every row runs once a round, so a slower stretch of the machine moves both sides of a ratio)."""
    return statistics.median(r[0] / b[0] for r, b in zip(rounds, base_rounds))


def inductor_at_budget(fraction):
    """A torch.compile backend: Inductor, partitioning forward from backward at
    activation_memory_budget `fraction`. Dynamo keeps each backend's graphs apart, so models
    compiled at several budgets run side by side."""
    from torch._inductor.compile_fx import compile_fx

    def backend(graph, example_inputs):
        with torch._functorch.config.patch(activation_memory_budget=fraction):
            return compile_fx(graph, example_inputs)
    return backend


def solver_timing():
    regions = []
    kinds = [(64 << 20, 0.004), (256 << 20, 0.011), (24 << 20, 0.0015), (96 << 20, 0.002)]
    generator = torch.Generator().manual_seed(3)
    noise = (1 + 0.03 * torch.randn(10000, generator=generator)).tolist()
    for layer in range(2500):
        for kind, (nbytes, seconds) in enumerate(kinds):
            regions.append({"name": f"layers.{layer}::r{kind}", "saved_bytes": nbytes,
                            "seconds": seconds * noise[4 * layer + kind]})
    text = json.dumps({"kind": "region-profile", "schema_version": 1, "base_bytes": 1 << 30, "regions": regions})
    all_saved = (1 << 30) + sum(r["saved_bytes"] for r in regions)
    times = []
    for share in (0.2, 0.4, 0.6, 0.8):
        start = time.perf_counter()
        plan = json.loads(_budget.plan(_budget.Profile(text), int((1 << 30) + share * (all_saved - (1 << 30))), False))
        times.append(time.perf_counter() - start)
        assert plan["exact"]
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    hf.add_model_arguments(parser)
    parser.add_argument("--compile-budgets", default="0.2,0.45,0.7,1.0",
                        help="activation_memory_budget values for torch.compile rows ('' for none)")
    parser.add_argument("--ops", action=argparse.BooleanOptionalAction, default=True,
                        help="per-op plans at the compiled rows' step bytes (default on)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--allocator", choices=("native", "remat"), default="native",
                        help="on CUDA: PyTorch's caching allocator, or remat_alloc.install() (default native)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3")
    torch.set_num_threads(1)
    meter = hf.make_meter(parser, args.device, args.allocator)
    dtype = getattr(torch, args.dtype)
    config, weights, ids = hf.model_of(args)

    def fresh():
        model = hf.LlamaForCausalLM(config)
        model.load_state_dict(weights)
        return model.to(device=args.device, dtype=dtype).train()

    profiled = wrapped(fresh())
    measure(profiled, ids, meter)  # warm-up
    profiled.zero_grad(set_to_none=True)
    with meter.step(), remat.profile_regions() as profile:
        profiled(input_ids=ids, labels=ids).loss.backward()
    low, high = profile.base_bytes, profile.all_saved_bytes
    budgets = [low + (high - low) * k // 4 for k in range(5)]

    rows = [("no checkpointing", fresh(), None, None)]
    # Plans by the step's peak at 5 peak budgets from the least any plan reaches to everything
    # saved. Bytes are the step's own, above what it began with (the meter's peak: the weights of
    # every row's model are allocated throughout), as the profile's start bytes make them.
    start = profile.step_start_bytes
    least, most = profile.least_peak_bytes(), profile.step_peak_bytes
    rows_by_peak = []
    for budget in sorted({least + (most - least) * k // 4 for k in range(5)}):
        plan = profile.plan(peak_bytes=budget)
        rows_by_peak.append((f"plan by peak at {(budget - start) / MiB:.2f} MiB", plan, budget - start,
                             plan.peak_bytes - start))
    hand = [("hand: attention saved", ("self_attn",)), ("hand: everything recomputed", ())]
    for label, save in hand:
        rows.append((label, wrapped(fresh(), save=save), None, None))
    for budget in budgets:
        plan = profile.plan(budget_bytes=budget)
        rows.append((f"plan at {budget / MiB:.2f} MiB", wrapped(fresh(), plan=plan), plan, budget))
    # Compiled rows: each model compiled with its own budget (read when its graph is partitioned,
    # at its first step), so that they all run in the rotation beside the eager rows.
    compiled_rows = []  # (label, model, step kept bytes)
    for fraction in [float(f) for f in args.compile_budgets.split(",") if f]:
        model = fresh()
        model.compile(backend=inductor_at_budget(fraction))
        try:
            measure(model, ids, meter)  # compiles under this budget
            step_kept = measure(model, ids, meter)[2]
        except Exception as error:  # noqa: BLE001  (reported in the output instead)
            print(f"torch.compile with activation_memory_budget={fraction}: {type(error).__name__}: {error}")
            continue
        compiled_rows.append((f"torch.compile, activation_memory_budget={fraction}", model, step_kept))

    # Per-op plans at the compiled rows' step bytes: the step keeps the checkpoints' bytes and, beyond
    # them, what it keeps with every region recomputed less base_bytes (logits, loss, the batch).
    matched = []  # (compiled row's label, its step kept bytes, region plan row, per-op plan row)
    if args.ops and compiled_rows:
        recomputed = wrapped(fresh(), save=())
        measure(recomputed, ids, meter)
        beyond = measure(recomputed, ids, meter)[2] - low
        by_ops = wrapped(fresh())
        measure(by_ops, ids, meter)
        by_ops.zero_grad(set_to_none=True)
        with meter.step(), remat.profile_regions(ops=True) as op_profile:
            by_ops(input_ids=ids, labels=ids).loss.backward()
        print(f"per-op profile: {sum(len(ops) for ops in op_profile.ops.values())} keepable ops in "
              f"{len(op_profile.ops)} regions; the step keeps {beyond / MiB:.2f} MiB beyond the checkpoints")
        for label, _, step_kept in compiled_rows:
            if label.endswith("=1.0"):
                continue
            budget = max(low, int(step_kept - beyond))
            plans = [("plan", profile.plan(budget_bytes=budget)),
                     ("per-op plan", op_profile.plan(budget_bytes=budget, ops=True))]
            indices = []
            for kind, plan in plans:
                indices.append(len(rows))
                rows.append((f"{kind} at {label.split(', ')[1]}'s step bytes, {budget / MiB:.2f} MiB",
                             wrapped(fresh(), plan=plan), plan, budget))
            matched.append((label, step_kept, *indices))
        reference = hf.train_step(fresh(), ids, meter)
        checks = []
        for _, _, *indices in matched:
            for index in indices:
                _, _, _, loss, grads, _ = hf.train_step(rows[index][1], ids, meter)
                checks.append(hf.compare((reference[3], reference[4]), loss, grads))
        print(f"plans at the compiled rows' bytes, gradients against no checkpointing: {', '.join(sorted(set(checks)))}\n")

    # The plan at each hand choice's bytes (as the profile counts them: base_bytes and the saved
    # regions'), which must be no slower.
    for label, save in hand:
        kept = low + sum(r.saved_bytes for r in profile.regions if r.name.rsplit("::", 1)[1] in save)
        plan = profile.plan(budget_bytes=kept)
        rows.append((f"plan at {label[6:]}'s {kept / MiB:.2f} MiB", wrapped(fresh(), plan=plan),
                     plan, kept))

    first_by_peak = len(rows)
    for label, plan, budget, _ in rows_by_peak:
        rows.append((label, wrapped(fresh(), plan=plan), None, None))
    for label, model, _ in compiled_rows:
        rows.append((label, model, None, None))

    samples = [[] for _ in rows]
    for round_index in range(args.rounds + 1):
        shift = round_index % len(rows)
        for index in list(range(len(rows)))[shift:] + list(range(len(rows)))[:shift]:
            result = measure(rows[index][1], ids, meter)
            if round_index > 0:
                samples[index].append(result)
    baseline = statistics.median(s[0] for s in samples[0])
    compiled = [(label, rounds) for (label, *_), rounds in zip(rows, samples)][len(rows) - len(compiled_rows):]

    print(f"Llama hidden {args.hidden}, {args.layers} layers, batch {args.batch}, sequence {args.sequence}, {args.dtype}, "
          f"{meter.name}, 1 intra-op thread; torch {torch.__version__}; median of {args.rounds} rounds, rows rotated\n")
    print(f"profile: {len(profile.regions)} regions, timed by {profile.timer}; every region recomputed keeps "
          f"{low / MiB:.2f} MiB, every region saved {high / MiB:.2f} MiB\n")
    clock = "CPU" if args.device == "cpu" else "device"
    print("| row | budget (MiB) | predicted (MiB) | checkpoints keep (MiB) | step kept (MiB) | step peak (MiB) | "
          f"step {clock} time (ms) | vs none |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (label, _, plan, budget), rounds in list(zip(rows, samples))[:first_by_peak] + list(
            zip(rows, samples))[len(rows) - len(compiled):]:
        seconds = statistics.median(r[0] for r in rounds)
        kept = statistics.median(r[1] for r in rounds)
        step_kept = statistics.median(r[2] for r in rounds)
        peak = statistics.median(r[3] for r in rounds)
        within = "" if budget is None or kept <= budget else " OVER BUDGET"
        print(f"| {label}{within} | {'-' if budget is None else f'{budget / MiB:.2f}'} | "
              f"{'-' if plan is None else f'{plan.kept_bytes / MiB:.2f}'} | {kept / MiB:.2f} | {step_kept / MiB:.2f} | "
              f"{peak / MiB:.2f} | {seconds * 1e3:.1f} | {against(rounds, samples[0]):.2f}x |")
    # By step peak: each plan's prediction beside the peak measured, and torch.compile's rows
    # against its own uncheckpointed compiled step (activation_memory_budget 1.0, where measured).
    print(f"\nBy step peak (the step's own bytes, above what was allocated when it began): the least any plan "
          f"reaches {(least - start) / MiB:.2f} MiB, everything saved {(most - start) / MiB:.2f} MiB\n")
    print(f"| row | peak budget (MiB) | predicted peak (MiB) | measured peak (MiB) | step {clock} time (ms) | "
          "vs its own uncheckpointed step |")
    print("|---|---:|---:|---:|---:|---:|")
    eager = [(label, rounds) for (label, *_), rounds in zip(rows, samples)][:1]
    peak_samples = samples[first_by_peak:first_by_peak + len(rows_by_peak)]
    uncompiled = next((rounds for label, rounds in compiled if label.endswith("=1.0")), None)
    for label, rounds in eager:
        peak = statistics.median(r[3] for r in rounds)
        print(f"| {label} | - | - | {peak / MiB:.2f} | {baseline * 1e3:.1f} | 1.00x |")
    for (label, _, budget, predicted), rounds in zip(rows_by_peak, peak_samples):
        seconds = statistics.median(r[0] for r in rounds)
        peak = statistics.median(r[3] for r in rounds)
        over = "" if peak <= budget else " OVER BUDGET"
        print(f"| {label}{over} | {budget / MiB:.2f} | {predicted / MiB:.2f} | {peak / MiB:.2f} | "
              f"{seconds * 1e3:.1f} | {against(rounds, samples[0]):.2f}x |")
    for label, rounds in compiled:
        seconds = statistics.median(r[0] for r in rounds)
        peak = statistics.median(r[3] for r in rounds)
        ratio = "-" if uncompiled is None else f"{against(rounds, uncompiled):.2f}x"
        print(f"| {label} | - | - | {peak / MiB:.2f} | {seconds * 1e3:.1f} | {ratio} |")
    if matched:
        print("\nAt the compiled rows' step bytes, each against its own baseline in this run (remat: the eager step "
              "without checkpointing; compile: its compiled step at activation_memory_budget 1.0):\n")
        print("| compiled row | step kept (MiB) | compile vs own | remat region plan: step kept, vs none | "
              "remat per-op plan: step kept, vs none |")
        print("|---|---:|---:|---:|---:|")
        for label, step_kept, region_index, ops_index in matched:
            rounds = dict(compiled)[label]
            own = against(rounds, uncompiled) if uncompiled else float("nan")
            cells = []
            for index in (region_index, ops_index):
                kept = statistics.median(r[2] for r in samples[index])
                cells.append(f"{kept / MiB:.2f} MiB, {against(samples[index], samples[0]):.2f}x")
            print(f"| {label} | {step_kept / MiB:.2f} | {own:.2f}x | {cells[0]} | {cells[1]} |")
    times = solver_timing()
    print(f"\nsolver, 10,000 regions (four kinds, times with 3% noise), 4 budgets: "
          f"{', '.join(f'{t * 1e3:.0f} ms' for t in times)}, every plan exact")


if __name__ == "__main__":
    main()
