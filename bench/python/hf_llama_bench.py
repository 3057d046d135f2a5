#!/usr/bin/env python3
"""Activation checkpointing on a Hugging Face Llama, every variant on the same weights and input
in one run: no checkpointing, transformers' own per-layer torch.utils.checkpoint, selective
activation checkpointing (SAC) saving attention, torch_remat 0.2.2 (optional), and remat with
attention saved or everything recomputed.

Memory is counted by remat's tagging allocator, made the CPU allocator for the whole training
step with remat.tag_cpu_tensors(), so every variant is counted alike, in requested bytes (the
tensors' own sizes, not the pool's rounded blocks, so the figures do not depend on how the pool
happened to split its cached blocks): "kept" is what is allocated after forward minus before
it (what waits for backward: saved activations, the logits and loss), "peak" the highest
allocation over forward and backward minus the same baseline (gradients included). Time is the
CPU time of the thread that runs forward and backward (with one intra-op thread, the default,
that is all of the step's work, and other load on the machine barely moves it), the median over
rounds that rotate the order of the variants, as a ratio to no checkpointing. Gradients are
compared with no checkpointing's: "bitwise" when the loss and every parameter gradient are
torch.equal, else the largest absolute difference.

The SAC variants pass torch.utils.checkpoint.create_selective_checkpoint_contexts(policy) as
context_fn through model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=...):
  sac sdpa       saves the attention kernel only: MUST_SAVE for the aten scaled-dot-product
                 kernels (_scaled_dot_product_flash_attention_for_cpu on CPU; the flash,
                 efficient and cudnn kernels on GPU); every other op is recomputed.
  sac attention  saves every op dispatched inside each layer's self_attn module (the q/k/v/o
                 projection matmuls, rotary embedding, views, the kernel): MUST_SAVE while a
                 forward pre-hook / forward hook pair on self_attn says the op is inside it, so
                 attention is not recomputed, as with remat's save region.
torch_remat (--torch-remat) comes from a throwaway venv, never the project's requirements:

    python3 -m venv --system-site-packages /tmp/tr-venv
    /tmp/tr-venv/bin/pip install --no-deps torch-remat==0.2.2

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/hf_llama_bench.py [--rounds 7] [--torch-remat]
    (with --torch-remat, run it with /tmp/tr-venv/bin/python3)
"""

import argparse
import functools
import statistics
import sys
import threading
import time
import warnings

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import remat
import remat_alloc

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    sys.exit("hf_llama_bench: transformers is not installed; scripts/install-deps.sh installs it (pip install "
             "transformers)")

MiB = 1024 * 1024

SDPA_KERNELS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def sdpa_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SDPA_KERNELS else CheckpointPolicy.PREFER_RECOMPUTE


class InsideAttention:
    """Whether the ops dispatched now run inside a self_attn module (forward and recompute)."""

    def __init__(self, model):
        self._local = threading.local()
        for layer in model.model.layers:
            layer.self_attn.register_forward_pre_hook(self._enter)
            layer.self_attn.register_forward_hook(self._exit)

    def _enter(self, module, args):
        self._local.inside = True

    def _exit(self, module, args, output):
        self._local.inside = False

    def policy(self, ctx, op, *args, **kwargs):
        inside = getattr(self._local, "inside", False)
        return CheckpointPolicy.MUST_SAVE if inside else CheckpointPolicy.PREFER_RECOMPUTE


def enable_torch_checkpoint(model, **checkpoint_kwargs):
    """transformers' own per-layer torch.utils.checkpoint (non-reentrant, its default)."""
    kwargs = {"use_reentrant": False, **checkpoint_kwargs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_enable: a deprecated alias in 5.x
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def enable_torch_remat(model, torch_remat):
    """torch_remat 0.2.2 per layer through the same hook transformers uses, attention a save
    region whose output is kept (the residual add reads it outside any region)."""
    for index, layer in enumerate(model.model.layers):
        make = torch_remat.checkpoint(region_name=f"model.layers.{index}")

        def checkpoint_function(function, *args, _make=make, **kwargs):
            if isinstance(function, functools.partial):  # transformers passes partial(forward, self, **kwargs)
                args, kwargs, function = function.args + args, {**function.keywords, **kwargs}, function.func
            return _make(function)(*args, **kwargs)

        attention = layer.self_attn
        inner = attention.forward

        def saved_attention(*args, _inner=inner, **kwargs):
            output = torch_remat.region(_inner, "self_attn", recompute=False)(*args, **kwargs)
            torch_remat.recompute_needs_tensor(output[0])
            return output

        attention.forward = saved_attention
        layer._gradient_checkpointing_func = checkpoint_function
        layer.gradient_checkpointing = True


def variants(torch_remat):
    """[(label, setup(model))]."""
    rows = [
        ("no checkpointing", lambda model: None),
        ("torch.utils.checkpoint per layer", enable_torch_checkpoint),
        ("sac sdpa", lambda model: enable_torch_checkpoint(
            model, context_fn=functools.partial(create_selective_checkpoint_contexts, sdpa_policy))),
        ("sac attention", lambda model: enable_torch_checkpoint(
            model, context_fn=functools.partial(create_selective_checkpoint_contexts, InsideAttention(model).policy))),
    ]
    if torch_remat is not None:
        rows.append(("torch_remat 0.2.2, attention saved", lambda model: enable_torch_remat(model, torch_remat)))
    rows += [
        ("remat, attention saved", lambda model: remat.wrap_decoder_layers(model, save=("self_attn",))),
        ("remat, all recomputed", lambda model: remat.wrap_decoder_layers(model, save=())),
    ]
    return rows


def train_step(model, ids):
    """(seconds, kept bytes, peak bytes, loss, gradients) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    with remat.tag_cpu_tensors():
        remat_alloc.reset_peak_stats()
        before = remat_alloc.memory_stats()["requested_bytes"]
        started = time.thread_time()
        loss = model(input_ids=ids, labels=ids).loss
        after_forward = remat_alloc.memory_stats()["requested_bytes"]
        loss.backward()
        seconds = time.thread_time() - started
        peak = remat_alloc.memory_stats()["requested_bytes_peak"]
        loss = loss.detach().clone()
    remat.collect_trace()  # keeps the runtime's trace log from growing across rounds
    grads = [p.grad.clone() for p in model.parameters()]
    return seconds, after_forward - before, peak - before, loss, grads


def compare(reference, loss, grads):
    ref_loss, ref_grads = reference
    if torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref_grads)):
        return "bitwise"
    diff = max([(loss - ref_loss).abs().item()] + [(g - r).abs().max().item() for g, r in zip(grads, ref_grads)])
    return f"max abs diff {diff:.2e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds (median; default 7, at least 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1: CPU time is the step's)")
    parser.add_argument("--torch-remat", action="store_true", help="include torch_remat 0.2.2 (must be importable)")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 for a median")
    torch.set_num_threads(args.threads)

    torch_remat = None
    if args.torch_remat:
        try:
            import torch_remat
        except ImportError as error:
            sys.exit(f"hf_llama_bench: --torch-remat: torch_remat is not importable ({error}); install it into a "
                     "throwaway venv: python3 -m venv --system-site-packages /tmp/tr-venv && /tmp/tr-venv/bin/pip "
                     "install --no-deps torch-remat==0.2.2, and run this script with /tmp/tr-venv/bin/python3")

    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=8,
                         num_key_value_heads=4, intermediate_size=688 * args.hidden // 256, vocab_size=args.vocab,
                         max_position_embeddings=max(256, args.sequence), use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    weights = LlamaForCausalLM(config).state_dict()
    ids = torch.randint(0, args.vocab, (args.batch, args.sequence), generator=torch.Generator().manual_seed(1))

    rows = variants(torch_remat)
    models = []
    for _, setup in rows:
        model = LlamaForCausalLM(config)
        model.load_state_dict(weights)
        model.train()
        setup(model)
        models.append(model)

    samples = [[] for _ in rows]  # (seconds, kept, peak) per measured round
    checks = [None] * len(rows)
    reference = None
    for round_index in range(args.warmup + args.rounds):
        shift = round_index % len(rows)
        for index in list(range(len(rows)))[shift:] + list(range(len(rows)))[:shift]:
            seconds, kept, peak, loss, grads = train_step(models[index], ids)
            if index == 0 and reference is None:
                reference = (loss, grads)
            if round_index >= args.warmup:
                samples[index].append((seconds, kept, peak))
            if checks[index] is None and reference is not None:
                checks[index] = (loss, grads)
    verdicts = [compare(reference, *check) for check in checks]

    baseline = statistics.median(s for s, _, _ in samples[0])
    print(f"Llama hidden {args.hidden}, {args.layers} layers, 8 heads (4 kv), intermediate {config.intermediate_size}, "
          f"vocab {args.vocab}, batch {args.batch}, sequence {args.sequence}, float32, CPU, sdpa attention; "
          f"transformers {sys.modules['transformers'].__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op thread(s); median of {args.rounds} rounds (after {args.warmup} "
          "warm-up), variants rotated each round\n")
    print("| variant | kept fwd->bwd (MiB) | peak over step (MiB) | step CPU time (ms) | time vs none | "
          "gradients vs none |")
    print("|---|---:|---:|---:|---:|---|")
    for (label, _), rounds, verdict in zip(rows, samples, verdicts):
        seconds = statistics.median(s for s, _, _ in rounds)
        kept = statistics.median(k for _, k, _ in rounds)
        peak = statistics.median(p for _, _, p in rounds)
        print(f"| {label} | {kept / MiB:.2f} | {peak / MiB:.2f} | {seconds * 1e3:.1f} | {seconds / baseline:.2f}x | "
              f"{verdict} |")


if __name__ == "__main__":
    main()
