#!/usr/bin/env python3
"""What remat.track(model, optimizer) costs a training step: a Hugging Face Llama (a small random
config, hf_llama_bench.py's by default; no download) trained with AdamW on the CPU under
remat.tag_cpu_tensors(), the same model and optimizer stepped untracked and tracked in
alternation, so machine load hits both alike. Time is the CPU time of the thread that runs the
step (forward, backward, optimizer step; one intra-op thread), the median per-round ratio
tracked / untracked over --rounds rounds of --steps steps each.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        OMP_NUM_THREADS=1 python3 bench/python/track_bench.py [--rounds 9] [--steps 3] [--hidden 256]

--hidden 64 --layers 2 --sequence 32 --batch 2 --vocab 256 --heads 4 --kv-heads 2 is the proof
test's tiny model (tests/python/remat/test_tracking_llama.py), where Python's own overhead is
most of a step and tracking's hooks weigh the most.
"""

import argparse
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


def cpu_seconds(model, optimizer, ids, steps):
    start = time.thread_time()
    for _ in range(steps):
        step(model, optimizer, ids)
    return time.thread_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3, help="steps per measurement")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                         intermediate_size=688 * args.hidden // 256,
                         max_position_embeddings=max(64, args.sequence), use_cache=False)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, args.vocab, (args.batch, args.sequence), generator=torch.Generator().manual_seed(1))
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
        for round_index in range(args.rounds):
            order = (False, True) if round_index % 2 == 0 else (True, False)
            seconds = {}
            for tracked in order:
                if tracked:
                    with remat.track(model, optimizer):
                        seconds[True] = cpu_seconds(model, optimizer, ids, args.steps)
                else:
                    seconds[False] = cpu_seconds(model, optimizer, ids, args.steps)
            plain_times.append(seconds[False] / args.steps)
            tracked_times.append(seconds[True] / args.steps)
            ratios.append(seconds[True] / seconds[False])
        with remat.track(model, optimizer):
            remat_alloc.reset_peak_stats(0)
            step(model, optimizer, ids)
            at_peak = remat_alloc.category_bytes(at_peak=True)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"Llama {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, {parameters / 1e6:.2f} M parameters, batch "
          f"{args.batch} x {args.sequence}, AdamW, CPU, 1 thread, {args.rounds} rounds x {args.steps} steps")
    print(f"step CPU time untracked {statistics.median(plain_times) * 1e3:.2f} ms, tracked "
          f"{statistics.median(tracked_times) * 1e3:.2f} ms")
    median = statistics.median(ratios)
    print(f"tracked / untracked: median {median:.3f} ({(median - 1) * 100:+.1f}%), "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}")
    total = sum(at_peak.values())
    shares = ", ".join(f"{name} {bytes_ / total * 100:.1f}%" for name, bytes_ in at_peak.items() if bytes_)
    print(f"at the tracked step's peak ({total / 2**20:.2f} MiB allocated): {shares}")


if __name__ == "__main__":
    main()
