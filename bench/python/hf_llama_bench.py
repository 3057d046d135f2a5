#!/usr/bin/env python3
"""Activation checkpointing on a Hugging Face Llama, every variant on the same weights and input
in one run: no checkpointing, transformers' own per-layer torch.utils.checkpoint, selective
activation checkpointing (SAC) saving attention, torch_remat 0.2.2 (optional), and remat with
attention saved or everything recomputed; on a GPU also torch.autograd.graph.save_on_cpu and
remat with attention saved and what the checkpoints keep offloaded (remat.CpuOffload, prefetch
1 and 2).

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
On a GPU (--device cuda, the headline table: --dtype bfloat16 --sequence 2048 and a model
shaped like a real one) memory is PyTorch's own count of allocated bytes
(torch.cuda.memory_allocated, the native caching allocator, or remat_alloc's with --allocator
remat), time is the device time between CUDA events around forward and backward, and gradients
are compared by their largest absolute difference (bf16 kernels need not be bitwise across
variants). --compile runs every variant under torch.compile (--compile-backend, default
inductor); a variant that fails to compile or run says so in its row instead of stopping the run.

torch_remat (--torch-remat) comes from a throwaway venv, never the project's requirements:

    python3 -m venv --system-site-packages /tmp/tr-venv
    /tmp/tr-venv/bin/pip install --no-deps torch-remat==0.2.2

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/hf_llama_bench.py [--rounds 7] [--torch-remat]
    (with --torch-remat, run it with /tmp/tr-venv/bin/python3)
"""

import argparse
import contextlib
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


def under_save_on_cpu(model):
    """PyTorch's own offload: everything autograd saves copied to pinned host memory, nothing recomputed."""
    forward = model.forward

    def offloaded(*args, **kwargs):
        with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
            return forward(*args, **kwargs)

    model.forward = offloaded


def variants(torch_remat, device="cpu"):
    """[(label, setup(model))]. The offload rows only on a GPU: on the CPU host memory is the
    device's, so they would only move bytes from one count to the same one."""
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
    if device == "cuda":
        rows += [("save_on_cpu, nothing recomputed", under_save_on_cpu)]
        rows += [(f"remat, attention saved, CpuOffload prefetch {n}",
                  lambda model, n=n: remat.wrap_decoder_layers(model, save=("self_attn",),
                                                               offload=remat.CpuOffload(prefetch=n)))
                 for n in (1, 2)]
    return rows


class CpuMeter:
    """Requested bytes through remat's tagging allocator made the CPU allocator, thread CPU time."""

    name = "CPU"

    def step(self):
        return remat.tag_cpu_tensors()

    def reset(self):
        remat_alloc.reset_peak_stats()

    def allocated(self):
        return remat_alloc.memory_stats()["requested_bytes"]

    def peak(self):
        return remat_alloc.memory_stats()["requested_bytes_peak"]

    def start(self):
        self._elapsed, self._started = 0.0, time.thread_time()

    def pause(self):
        self._elapsed += time.thread_time() - self._started

    def resume(self):
        self._started = time.thread_time()

    def seconds(self):
        return self._elapsed + time.thread_time() - self._started


class CudaMeter:
    """Allocated bytes as the CUDA allocator in use counts them, device time between CUDA events."""

    def __init__(self, allocator):
        self.name = f"CUDA ({torch.cuda.get_device_name()}), {allocator} allocator"
        self._remat = allocator == "remat"
        self._device = torch.cuda.current_device()

    def step(self):
        return contextlib.nullcontext()

    def reset(self):
        torch.cuda.synchronize()
        if self._remat:
            remat_alloc.reset_peak_stats(self._device)
        else:
            torch.cuda.reset_peak_memory_stats()

    def allocated(self):
        if self._remat:
            return remat_alloc.memory_stats(self._device)["allocated_bytes"]
        return torch.cuda.memory_allocated()

    def peak(self):
        torch.cuda.synchronize()
        if self._remat:
            return remat_alloc.memory_stats(self._device)["allocated_bytes_peak"]
        return torch.cuda.max_memory_allocated()

    def start(self):
        self._spans = []
        self.resume()

    def pause(self):
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._spans[-1].append(end)

    def resume(self):
        begin = torch.cuda.Event(enable_timing=True)
        begin.record()
        self._spans.append([begin])

    def seconds(self):
        self.pause()
        self._spans[-1][1].synchronize()
        return sum(begin.elapsed_time(end) for begin, end in self._spans) / 1e3


def make_meter(parser, device, allocator):
    """The meter for --device and --allocator; installs remat's allocator first when asked."""
    if device == "cpu":
        if allocator == "remat":
            parser.error("--allocator: CPU tensors always go through remat's tagging allocator here")
        return CpuMeter()
    if allocator == "remat":
        remat_alloc.install()  # before the first CUDA allocation
    if not torch.cuda.is_available():
        sys.exit(f"{parser.prog}: --device cuda: no CUDA device is visible")
    return CudaMeter(allocator)


def train_step(model, ids, meter, after_forward=lambda: None):
    """(seconds, kept bytes, peak bytes, loss, gradients, after_forward()) of one forward and
    backward; after_forward runs between them, outside the time (budget_bench measures what
    checkpoints keep)."""
    model.zero_grad(set_to_none=True)
    with meter.step():
        meter.reset()
        before = meter.allocated()
        meter.start()
        loss = model(input_ids=ids, labels=ids).loss
        meter.pause()
        probed = after_forward()
        allocated_after_forward = meter.allocated()
        meter.resume()
        loss.backward()
        seconds = meter.seconds()
        peak = meter.peak()
        loss = loss.detach().clone()
    remat.collect_trace()  # keeps the runtime's trace log from growing across rounds
    grads = [p.grad.clone() for p in model.parameters()]
    return seconds, allocated_after_forward - before, peak - before, loss, grads, probed


def compare(reference, loss, grads):
    ref_loss, ref_grads = reference
    if torch.equal(loss, ref_loss) and all(torch.equal(g, r) for g, r in zip(grads, ref_grads)):
        return "bitwise"
    diff = max([(loss - ref_loss).abs().item()] + [(g - r).abs().max().item() for g, r in zip(grads, ref_grads)])
    return f"max abs diff {diff:.2e}"


def add_model_arguments(parser):
    """The Llama's shape and its batch, as the benchmarks over this model take them."""
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    parser.add_argument("--kv-heads", type=int, default=4, help="key/value heads (default 4)")


def model_of(args):
    """The Llama of the arguments' shape (sdpa attention): its config, its first weights (seed 0)
    and a batch of token ids on args.device."""
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, intermediate_size=688 * args.hidden // 256, vocab_size=args.vocab,
                         max_position_embeddings=max(256, args.sequence), use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    weights = LlamaForCausalLM(config).state_dict()
    ids = torch.randint(0, args.vocab, (args.batch, args.sequence), generator=torch.Generator().manual_seed(1))
    return config, weights, ids.to(args.device)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds (median; default 7, at least 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    add_model_arguments(parser)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1: CPU time is the step's)")
    parser.add_argument("--torch-remat", action="store_true", help="include torch_remat 0.2.2 (must be importable)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--allocator", choices=("native", "remat"), default="native",
                        help="on CUDA: PyTorch's caching allocator, or remat_alloc.install() (default native)")
    parser.add_argument("--compile", action="store_true", help="run every variant under torch.compile")
    parser.add_argument("--compile-backend", default="inductor")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds: at least 5 for a median")
    meter = make_meter(parser, args.device, args.allocator)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    torch_remat = None
    if args.torch_remat:
        try:
            import torch_remat
        except ImportError as error:
            sys.exit(f"hf_llama_bench: --torch-remat: torch_remat is not importable ({error}); install it into a "
                     "throwaway venv: python3 -m venv --system-site-packages /tmp/tr-venv && /tmp/tr-venv/bin/pip "
                     "install --no-deps torch-remat==0.2.2, and run this script with /tmp/tr-venv/bin/python3")

    config, weights, ids = model_of(args)

    rows = variants(torch_remat, args.device)
    models = []
    for _, setup in rows:
        model = LlamaForCausalLM(config)
        model.load_state_dict(weights)
        model.to(device=args.device, dtype=dtype)
        model.train()
        setup(model)
        if args.compile:
            model.compile(backend=args.compile_backend)
        models.append(model)

    samples = [[] for _ in rows]  # (seconds, kept, peak) per measured round
    checks = [None] * len(rows)
    failures = [None] * len(rows)  # why a variant stopped (compile or run error)
    reference = None
    for round_index in range(args.warmup + args.rounds):
        shift = round_index % len(rows)
        for index in list(range(len(rows)))[shift:] + list(range(len(rows)))[:shift]:
            if failures[index] is not None:
                continue
            try:
                seconds, kept, peak, loss, grads, _ = train_step(models[index], ids, meter)
            except Exception as error:  # a variant that cannot run here is reported in its row
                failures[index] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
                models[index].zero_grad(set_to_none=True)
                continue
            if index == 0 and reference is None:
                reference = (loss, grads)
            if round_index >= args.warmup:
                samples[index].append((seconds, kept, peak))
            if checks[index] is None and reference is not None:
                checks[index] = (loss, grads)
    if failures[0] is not None:
        sys.exit(f"hf_llama_bench: no checkpointing, the baseline, {failures[0]}")

    baseline = statistics.median(s for s, _, _ in samples[0])
    compiled = f", torch.compile(backend={args.compile_backend})" if args.compile else ", eager"
    print(f"Llama hidden {args.hidden}, {args.layers} layers, {args.heads} heads ({args.kv_heads} kv), intermediate {config.intermediate_size}, "
          f"vocab {args.vocab}, batch {args.batch}, sequence {args.sequence}, {args.dtype}, {meter.name}{compiled}, "
          f"sdpa attention; transformers {sys.modules['transformers'].__version__}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} intra-op thread(s); median of {args.rounds} rounds (after {args.warmup} "
          "warm-up), variants rotated each round\n")
    clock = "device" if args.device == "cuda" else "CPU"
    print(f"| variant | kept fwd->bwd (MiB) | peak over step (MiB) | step {clock} time (ms) | time vs none | "
          "gradients vs none |")
    print("|---|---:|---:|---:|---:|---|")
    for index, (label, _) in enumerate(rows):
        if failures[index] is not None or checks[index] is None:
            print(f"| {label} | - | - | - | - | {failures[index] or 'no measured round'} |")
            continue
        rounds = samples[index]
        seconds = statistics.median(s for s, _, _ in rounds)
        kept = statistics.median(k for _, k, _ in rounds)
        peak = statistics.median(p for _, _, p in rounds)
        print(f"| {label} | {kept / MiB:.2f} | {peak / MiB:.2f} | {seconds * 1e3:.1f} | {seconds / baseline:.2f}x | "
              f"{compare(reference, *checks[index])} |")


if __name__ == "__main__":
    main()
