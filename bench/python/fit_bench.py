#!/usr/bin/env python3
"""remat.fit in a training loop whose sequence length changes every step (dynamic padding): a tiny
Hugging Face Llama (transformers), AdamW, a random length from 32 to 128 tokens at every step,
under a budget a share of the plain loop's highest step peak. The loop runs without fit, then with
fit (each layer wrapped by wrap_decoder_layers), on the same weights and batches, in rounds.

Per round: the steps whose measured peak went over the budget (remat_alloc's requested bytes, CPU
tensors counted under remat.tag_cpu_tensors()), whether every loss equals the plain loop's, and
fit's step time against the plain loop's (wall time of zero_grad, forward, backward and the
optimizer step): over all the steps (profiled steps included), their median, and the first five
steps (the first profile, the first re-plans). Run with one intra-op thread for stable times:

    OMP_NUM_THREADS=1 python3 bench/python/fit_bench.py --rounds 3
"""
import argparse
import gc
import random
import statistics
import time
import warnings

import torch

import remat
import remat_alloc

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as error:
    raise SystemExit(f"fit_bench.py needs transformers ({error}): pip install transformers") from None

LENGTHS = (32, 48, 64, 80, 96, 112, 128)
VOCAB = 512


def run(lengths, budget):
    """The loop over `lengths`, under remat.fit(budget) unless budget is None: (peak, seconds, loss)
    per step."""
    gc.collect()
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=344, vocab_size=VOCAB, max_position_embeddings=512)
    steps = []
    with remat.tag_cpu_tensors(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fit says when it plans again; counted by the table, not printed
        model = LlamaForCausalLM(config)
        model.train()
        if budget is not None:
            remat.wrap_decoder_layers(model)
            remat.fit(model, budget=budget)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step, length in enumerate(lengths):
            ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(step))
            remat_alloc.reset_peak_stats()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            seconds = time.perf_counter() - start
            steps.append((remat_alloc.memory_stats()["requested_bytes_peak"], seconds, loss.item()))
            del loss
        if budget is not None:
            remat.unfit(model)
    return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--share", type=float, default=0.85,
                        help="the budget, as a share of the plain loop's highest step peak (default 0.85)")
    args = parser.parse_args()
    chooser = random.Random(1)
    lengths = [chooser.choice(LENGTHS) for _ in range(args.steps)]
    print(f"{args.steps} steps of 2 x ({', '.join(map(str, lengths[:8]))}, ...) tokens; "
          f"budget {args.share:.2f} of the plain loop's highest step peak")
    for number in range(args.rounds):
        plain = run(lengths, None)
        budget = int(max(peak for peak, _, _ in plain) * args.share)
        fitted = run(lengths, budget)
        over = sum(peak > budget for peak, _, _ in fitted)
        same_losses = all(a[2] == b[2] for a, b in zip(plain, fitted))
        total = sum(s for _, s, _ in fitted) / sum(s for _, s, _ in plain)
        median = statistics.median(s for _, s, _ in fitted) / statistics.median(s for _, s, _ in plain)
        first = sum(s for _, s, _ in fitted[:5]) / sum(s for _, s, _ in plain[:5])
        print(f"round {number + 1}: budget {budget} B, {over} steps over it, losses "
              f"{'equal to' if same_losses else 'NOT equal to'} plain; fit's time against plain: all steps "
              f"{total:.2f}x, median step {median:.2f}x, first 5 steps {first:.2f}x")


if __name__ == "__main__":
    main()
