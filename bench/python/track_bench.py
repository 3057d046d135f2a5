#!/usr/bin/env python3
"""What remat.track(model, optimizer) costs a training step: Hugging Face Llamas (small random
configs; no download) trained with AdamW on the CPU under remat.tag_cpu_tensors(), each model
and optimizer stepped untracked and tracked in alternation, so machine load hits both alike. Time
is the CPU time of the thread that runs the step (forward, backward, optimizer step; one intra-op
thread), the median per-round ratio tracked / untracked over --rounds rounds of --steps steps.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        OMP_NUM_THREADS=1 python3 bench/python/track_bench.py [--models tiny,small] [--rounds 9] [--steps 3]

--noop-hooks measures, in place of tracking, a no-op Python forward pre-hook and forward hook
on every module: what PyTorch's module hook dispatch alone costs the step (where remat is
imported tracking puts no hooks on modules; its C++ TrackCall is each module's call instead).

tiny is the proof test's model (tests/python/remat/test_tracking_llama.py: hidden 64, 2 layers,
batch 2 x 32, vocab 256), a step of a few milliseconds where Python's own work is most of it and
tracking's per-call hooks weigh the most; small is hf_llama_bench.py's (hidden 256, 4 layers,
batch 4 x 128, vocab 2048). --hidden, --layers, ... give one model of your own instead.
"""

import argparse
import contextlib
import statistics
import sys
import time

import torch

import remat
import remat_alloc

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    sys.exit("track_bench: transformers is not installed; scripts/install-deps.sh installs it (pip install "
             "transformers)")


def step(model, optimizer, ids):
    optimizer.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


def cpu_seconds(model, optimizer, ids, steps, each):
    """CPU seconds of `steps` steps; each step's also appended to `each`."""
    total = 0.0
    for _ in range(steps):
        start = time.thread_time()
        step(model, optimizer, ids)
        seconds = time.thread_time() - start
        each.append(seconds)
        total += seconds
    return total


def quantile(values, q):
    return sorted(values)[int(q * (len(values) - 1))]


MODELS = {
    "tiny": dict(hidden=64, layers=2, sequence=32, batch=2, vocab=256, heads=4, kv_heads=2),
    "small": dict(hidden=256, layers=4, sequence=128, batch=4, vocab=2048, heads=8, kv_heads=4),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3, help="steps per measurement")
    parser.add_argument("--python-hooks", action="store_true",
                        help="track with remat_alloc's Python hooks, not remat._C's (tracking without remat)")
    parser.add_argument("--noop-hooks", action="store_true",
                        help="instead of tracking: no-op Python forward hooks on every module (the hook dispatch alone)")
    for name in ("hidden", "layers", "sequence", "batch", "vocab", "heads", "kv-heads"):
        parser.add_argument(f"--{name}", type=int, help="a model of your own (the others from small)")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    torch.set_num_threads(1)
    if args.python_hooks:
        remat_alloc._tracking.register_native(None)
    own = {name: getattr(args, name) for name in MODELS["small"] if getattr(args, name) is not None}
    if own:
        measure(dict(MODELS["small"], **own), "own", args)
        return
    for name in args.models.split(","):
        if name not in MODELS:
            parser.error(f"--models: {name!r} is not one of {', '.join(MODELS)}")
        measure(MODELS[name], name, args)


@contextlib.contextmanager
def noop_hooks(model):
    """A no-op forward pre-hook and forward hook (always called, as tracking's were) on every module."""
    def nothing(*args):
        return None

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(nothing))
        handles.append(module.register_forward_hook(nothing, always_call=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def measure(shape, name, args) -> None:
    tracking = (lambda: noop_hooks(model)) if args.noop_hooks else (lambda: remat.track(model, optimizer))
    shape = argparse.Namespace(**shape)
    config = LlamaConfig(hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
                         intermediate_size=688 * shape.hidden // 256,
                         max_position_embeddings=max(64, shape.sequence), use_cache=False)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, shape.vocab, (shape.batch, shape.sequence), generator=torch.Generator().manual_seed(1))
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = ids.clone()
        for _ in range(2):  # warm up: optimizer state, the pool's cache, lazy initialisation
            step(model, optimizer, ids)
        with remat.track(model, optimizer):
            step(model, optimizer, ids)
        ratios, plain_times, tracked_times = [], [], []
        steps = {False: [], True: []}
        for round_index in range(args.rounds):
            order = (False, True) if round_index % 2 == 0 else (True, False)
            seconds = {}
            for tracked in order:
                if tracked:
                    with tracking():
                        step(model, optimizer, ids)  # not timed: collects what track() allocated
                        seconds[True] = cpu_seconds(model, optimizer, ids, args.steps, steps[True])
                else:
                    step(model, optimizer, ids)
                    seconds[False] = cpu_seconds(model, optimizer, ids, args.steps, steps[False])
            plain_times.append(seconds[False] / args.steps)
            tracked_times.append(seconds[True] / args.steps)
            ratios.append(seconds[True] / seconds[False])
        with remat.track(model, optimizer):
            remat_alloc.reset_peak_stats(0)
            step(model, optimizer, ids)
            at_peak = remat_alloc.category_bytes(at_peak=True)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{name}: Llama {shape.layers} layers, hidden {shape.hidden}, vocab {shape.vocab}, {parameters / 1e6:.2f} M "
          f"parameters, batch {shape.batch} x {shape.sequence}, AdamW, CPU, 1 thread, {args.rounds} rounds x "
          f"{args.steps} steps, "
          + ("no-op Python module hooks in place of tracking" if args.noop_hooks else
             "remat_alloc's Python hooks" if args.python_hooks else "remat._C's C++ tracking"))
    print(f"step CPU time untracked {statistics.median(plain_times) * 1e3:.2f} ms, tracked "
          f"{statistics.median(tracked_times) * 1e3:.2f} ms")
    median = statistics.median(ratios)
    print(f"tracked / untracked: median {median:.3f} ({(median - 1) * 100:+.1f}%), "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}; fastest tracked / fastest untracked "
          f"{min(tracked_times) / min(plain_times):.3f} ({(min(tracked_times) / min(plain_times) - 1) * 100:+.1f}%)")
    # Single steps are many, so their lower quantiles are those least slowed by other work on the host.
    low = {q: quantile(steps[True], q) / quantile(steps[False], q) for q in (0.1, 0.25)}
    print("single steps, tracked / untracked at the 10th and 25th percentiles: "
          + ", ".join(f"{ratio:.3f} ({(ratio - 1) * 100:+.1f}%)" for ratio in low.values()))
    total = sum(at_peak.values())
    shares = ", ".join(f"{category} {bytes_ / total * 100:.1f}%" for category, bytes_ in at_peak.items() if bytes_)
    print(f"at the tracked step's peak ({total / 2**20:.2f} MiB allocated): {shares}")


if __name__ == "__main__":
    main()
