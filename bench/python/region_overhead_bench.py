#!/usr/bin/env python3
"""What checkpoints and regions cost when nothing is recomputed, per region call, on a tiny
Hugging Face Llama (so that the step's own ops are small and the wrappers' work shows).

Every decoder layer is a checkpoint with four regions (input_layernorm, self_attn,
post_attention_layernorm, mlp), run two ways in one run against the same model without
checkpointing: "plan" (wrap_decoder_layers(plan=) with a plan from a profile of this model that
saves every region, as budget_bench's plans run) and "recomputed" for scale (the default
wrapping, attention saved, the rest recomputed). Time is the thread's CPU time of forward and of backward, the
median over rounds that rotate the order of the modes; per region call is (mode - none) /
(layers x 4). Gradients of every mode are checked bitwise against no checkpointing.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/region_overhead_bench.py [--rounds 41] [--layers 8]
"""

import argparse
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_llama_bench as hf  # noqa: E402  (the model)

import remat  # noqa: E402

CHILDREN = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")


def step(model, ids):
    model.zero_grad(set_to_none=True)
    started = time.thread_time_ns()
    loss = model(input_ids=ids, labels=ids).loss
    forward = time.thread_time_ns() - started
    started = time.thread_time_ns()
    loss.backward()
    backward = time.thread_time_ns() - started
    remat.collect_trace()  # keeps the runtime's trace log from growing across rounds
    return forward, backward, loss.detach(), [p.grad.clone() for p in model.parameters()]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--sequence", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--profile", choices=("none", "plan", "recomputed"), default="none",
                        help="instead of timing, run this mode's steps under cProfile and print the top entries")
    args = parser.parse_args()
    torch.set_num_threads(1)
    shape = argparse.Namespace(hidden=args.hidden, layers=args.layers, batch=args.batch, sequence=args.sequence, vocab=args.vocab,
                               heads=4, kv_heads=2, device="cpu")
    config, weights, ids = hf.model_of(shape)

    def fresh():
        model = hf.LlamaForCausalLM(config)
        model.load_state_dict(weights)
        return model.train()

    profiled = remat.wrap_decoder_layers(fresh())  # attention saved, the other children recomputed
    step(profiled, ids)
    with remat.profile_regions() as profile:
        profiled(input_ids=ids, labels=ids).loss.backward()
    plan = profile.plan(budget_bytes=profile.all_saved_bytes)
    if len(profile.regions) != args.layers * len(CHILDREN) or any(plan.recompute_of(r.name) is not False for r in profile.regions):
        sys.exit("the plan at every region's bytes should save all of them")
    models = {
        "none": fresh(),
        "plan": remat.wrap_decoder_layers(fresh(), plan=plan),
        "recomputed": remat.wrap_decoder_layers(fresh()),
    }
    regions = args.layers * len(CHILDREN)
    if args.profile != "none":
        import cProfile
        import pstats
        model = models[args.profile]
        for _ in range(3):
            step(model, ids)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.rounds):
            step(model, ids)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(60)
        return

    modes = list(models)
    reference = step(models["none"], ids)
    for mode in modes[1:]:
        _, _, loss, grads = step(models[mode], ids)
        equal = torch.equal(loss, reference[2]) and all(torch.equal(a, b) for a, b in zip(grads, reference[3]))
        if not equal:
            sys.exit(f"{mode}: gradients differ from no checkpointing")
    samples = {mode: ([], []) for mode in modes}
    for round_index in range(args.rounds + 2):  # two warm-up rounds
        for mode in modes[round_index % len(modes):] + modes[:round_index % len(modes)]:
            forward, backward, _, _ = step(models[mode], ids)
            if round_index >= 2:
                samples[mode][0].append(forward)
                samples[mode][1].append(backward)
    us = {mode: (statistics.median(f) / 1e3, statistics.median(b) / 1e3) for mode, (f, b) in samples.items()}
    none_f, none_b = us["none"]
    print(f"{args.layers} layers x {len(CHILDREN)} regions, hidden {args.hidden}, sequence {args.sequence}; median of "
          f"{args.rounds} rounds (thread CPU time); gradients of every mode bitwise those without checkpointing\n")
    print(f"{'mode':<12}{'forward us':>12}{'backward us':>13}{'step':>8}{'fwd us/region':>15}{'bwd us/region':>15}")
    for mode in modes:
        f, b = us[mode]
        print(f"{mode:<12}{f:>12.1f}{b:>13.1f}{(f + b) / (none_f + none_b):>7.2f}x"
              f"{(f - none_f) / regions:>15.1f}{(b - none_b) / regions:>15.1f}")


if __name__ == "__main__":
    main()
