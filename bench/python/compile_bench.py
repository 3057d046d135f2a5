#!/usr/bin/env python3
"""remat under torch.compile, side by side in one run.

1. A 4-layer block stack (attention-like matmuls saved, MLP recomputed): compile time and step
   time of eager remat, compiled remat and compiled torch.utils.checkpoint with a selective
   policy saving the same matmuls (rounds alternate; step time is the median, thread CPU time).
2. Hugging Face Llama (hidden 256, 4 layers, batch 4, sequence 128, float32), the whole model
   compiled: the bytes the partitioned forward graph saves for backward, for no checkpointing, torch.utils.checkpoint per layer, selective activation
   checkpointing saving attention (sdpa), remat with attention saved, remat with everything
   recomputed. Backend aot_eager (the same partitioner Inductor uses).

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/python/compile_bench.py [--rounds 9] [--skip-llama]
"""

import argparse
import functools
import statistics
import time

import torch
import torch.utils.checkpoint as tuc
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch.fx.experimental.symbolic_shapes import hint_int

import remat

WIDTH, LAYERS, BATCH = 256, 4, 64


def block_weights():
    torch.manual_seed(0)
    return [((torch.randn(WIDTH, WIDTH) / 16).requires_grad_(), (torch.randn(WIDTH, 4 * WIDTH) / 16).requires_grad_(),
             (torch.randn(4 * WIDTH, WIDTH) / 32).requires_grad_()) for _ in range(LAYERS)]


def remat_stack(x, weights):
    for i, (wa, w1, w2) in enumerate(weights):
        def body(t, wa=wa, w1=w1, w2=w2):
            h = remat.region(lambda u: torch.softmax(u @ wa, -1) @ wa, "attention", recompute=False)(t) + t
            return remat.region(lambda u: torch.nn.functional.gelu(u @ w1) @ w2, "mlp")(h) + h
        x = remat.checkpoint(region_name=f"layers.{i}")(body)(x)
    return x


def attention_policy():
    """Saves what remat's attention region saves: the softmax and the block's first two matmuls
    (counted apart in forward and in recompute, which call the policy again)."""
    matmuls = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op == torch.ops.aten.mm.default:
            matmuls[ctx.is_recompute] += 1
            if matmuls[ctx.is_recompute] <= 2:
                return tuc.CheckpointPolicy.MUST_SAVE
        if op == torch.ops.aten._softmax.default:
            return tuc.CheckpointPolicy.MUST_SAVE
        return tuc.CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def attention_contexts():
    return tuc.create_selective_checkpoint_contexts(attention_policy())


def sac_stack(x, weights):
    for wa, w1, w2 in weights:
        def body(t, wa=wa, w1=w1, w2=w2):
            h = torch.softmax(t @ wa, -1) @ wa + t
            return torch.nn.functional.gelu(h @ w1) @ w2 + h
        x = tuc.checkpoint(body, x, use_reentrant=False, context_fn=attention_contexts)
    return x


def step_time(step, weights, x, rounds):
    times = []
    for _ in range(rounds):
        started = time.thread_time_ns()
        step(x, weights).pow(2).mean().backward()
        times.append((time.thread_time_ns() - started) / 1e6)
    return statistics.median(times)


def block_stack_table(rounds):
    weights = block_weights()
    x = torch.randn(BATCH, WIDTH, requires_grad=True)
    variants = {"remat, eager": remat_stack, "remat, compiled": torch.compile(remat_stack),
                "torch.utils.checkpoint + SAC, compiled": torch.compile(sac_stack)}
    # Inductor's one-time start-up (imports, worker pools) and its graph cache would go to
    # whichever variant compiles first: pay the first before measuring, switch the second off.
    torch._inductor.config.fx_graph_cache = False
    torch.compile(lambda t: (t * 2).sin())(torch.randn(4))
    compile_ms = {}
    for name, step in variants.items():  # the first call compiles
        started = time.perf_counter()
        step(x, weights).pow(2).mean().backward()
        compile_ms[name] = (time.perf_counter() - started) * 1e3
    samples = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(step_time(variants[name], weights, x, 1))
    base = statistics.median(samples["remat, eager"])
    print(f"{LAYERS}-layer block stack, width {WIDTH}, batch {BATCH}, float32 CPU; step: thread CPU time, median of "
          f"{rounds} alternating rounds; first call: wall time including compilation\n")
    print("| variant | first call (ms) | step (ms) | step vs eager remat |")
    print("|---|---:|---:|---:|")
    for name in names:
        step = statistics.median(samples[name])
        print(f"| {name} | {compile_ms[name]:.0f} | {step:.1f} | {step / base:.2f}x |")
    print()


def saved_bytes(run):
    """Bytes each partitioned forward graph compiled while `run(backend)` runs saves for
    backward, one figure per graph."""
    per_graph = []

    def partition(joint, joint_inputs, **kwargs):
        forward, backward = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        outputs = next(node for node in forward.graph.nodes if node.op == "output").args[0]
        total = 0
        for node in outputs[kwargs["num_fwd_outputs"]:]:
            value = node.meta.get("val") if hasattr(node, "meta") else None
            if isinstance(value, torch.Tensor) and node.op != "placeholder":  # parameters and inputs are not extra
                total += hint_int(value.numel()) * value.element_size()  # the example size of a symbolic one
        per_graph.append(total)
        return forward, backward

    def backend(graph, example_inputs):
        return aot_module_simplified(graph, example_inputs, fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g,
                                     partition_fn=partition)

    torch._dynamo.reset()
    run(backend)
    torch._dynamo.reset()
    return per_graph


def llama_table():
    import transformers

    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4, vocab_size=2048, use_cache=False)
    config._attn_implementation = "sdpa"
    ids = torch.randint(0, 2048, (4, 128), generator=torch.Generator().manual_seed(1))

    def sdpa_policy(ctx, op, *args, **kwargs):
        attention = op in (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                           torch.ops.aten._scaled_dot_product_efficient_attention.default,
                           torch.ops.aten._scaled_dot_product_flash_attention.default)
        return tuc.CheckpointPolicy.MUST_SAVE if attention else tuc.CheckpointPolicy.PREFER_RECOMPUTE

    def configure(model, variant):
        if variant == "torch.utils.checkpoint per layer":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif variant == "selective activation checkpointing, sdpa saved":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
                "use_reentrant": False,
                "context_fn": functools.partial(tuc.create_selective_checkpoint_contexts, sdpa_policy)})
        elif variant == "remat, attention saved":
            remat.wrap_decoder_layers(model, save=("self_attn",))
        elif variant == "remat, everything recomputed":
            remat.wrap_decoder_layers(model, save=())
        return model

    variants = ["no checkpointing", "torch.utils.checkpoint per layer", "selective activation checkpointing, sdpa saved",
                "remat, attention saved", "remat, everything recomputed"]
    print("Hugging Face Llama, hidden 256, 4 layers, batch 4, sequence 128, float32: bytes the partitioned forward "
          "graphs save for backward (aot_eager)\n")
    # (A decoder layer's own .compile() compiles what runs inside transformers' checkpoint call,
    # not the checkpoint: GradientCheckpointingLayer.__call__ calls it outside the compiled
    # forward, so only the whole model shows what the partitioner saves.)
    print("| variant | saved for backward |")
    print("|---|---:|")
    for variant in variants:
        torch.manual_seed(0)
        model = configure(transformers.LlamaForCausalLM(config).train(), variant)

        def run(backend, model=model):
            torch.compile(model, backend=backend, dynamic=False)(input_ids=ids, labels=ids).loss.backward()

        print(f"| {variant} | {sum(saved_bytes(run)) / 2**20:.2f} MiB |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--skip-llama", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    block_stack_table(args.rounds)
    if not args.skip_llama:
        llama_table()


if __name__ == "__main__":
    main()
