"""Checkpoints and regions under torch.compile.

The C++ runtime works by running the body a second time in backward; a compiled graph has no
second Python execution to hook into. There is one AOTAutograd trace, and its min-cut
partitioner decides what the backward graph saves and what it recomputes, reading
`node.meta["recompute"]` on each forward node (CheckpointPolicy.MUST_SAVE forbids recomputing a
node; the recompute policies force it). So under compile a checkpoint and its regions become
those tags instead of runtime calls:

- a checkpoint runs its body under a non-reentrant torch.utils.checkpoint, which Dynamo traces as
  the `tag_activation_checkpoint` higher-order op and the partitioner recomputes as a whole:
  everything in a checkpoint is recomputed, as in eager;
- a save region runs its body through the `dynamo_bypassing_wrapper` higher-order op. Dynamo
  inlines the body into the graph as usual (Inductor still fuses it), and the wrapper runs again
  when AOTAutograd traces the graph into aten ops: there the body's nodes are appended to the
  proxy tracer's graph, and the wrapper marks each of them MUST_SAVE. Views cost nothing to
  recompute, so tagging them changes nothing; what is saved are the region's compute results;
- a recompute region needs no tag: the checkpoint around it recomputes it already.

What needs a second Python execution stays eager-only: state hooks and replay channels run in
recompute, verify_recompute compares it, and the memory and trace diagnostics describe the
runtime's frames. Under compile they are left out (state hooks), refused (contexts,
verify_recompute, also when remat.verify_recompute(True) switches it on) or see nothing
(collect_trace, the reports); recompute_needs_tensor is a no-op and
is_recomputing() is False at trace time. The tagging allocator's tags are not visible inside a
compiled graph: snapshots show a compiled checkpoint's memory under the tags in force where the
compiled function was called.

A profile or a plan cannot hold a compiled step either: no region of it runs as such, so none
is measured or chosen for. A checkpoint traced while a profile_regions or use_plan block is open
(Dynamo guards on whether one is) checks when it runs whether one is open on its thread, and is
refused there, before it runs; remat.fit refuses a compiled forward of its model at every step,
before the forward. A compiled forward under no_grad (no checkpoint keeps anything) runs as it is.

A refusal is raised when the compiled function runs, by an operator in its graph, not while
Dynamo traces: an exception raised in traced code reaches the user as Dynamo's own error
with ours in its debug context (fullgraph=True), or makes Dynamo run the frame eagerly, where
the checkpoint no longer knows it was compiled (without fullgraph). The operator is registered
as having an effect, so no graph pass drops it although it returns nothing.
"""

import torch
import torch.utils.checkpoint
from torch._higher_order_ops.wrap import dynamo_bypassing_wrapper
from torch._library.effects import EffectType

from . import _plans
from ._extension import _C

RematError = _C.RematError

__all__ = ["compiled_checkpoint", "compiled_region"]


@torch.library.custom_op("remat::refuse_under_compile", mutates_args=())
def _refuse_under_compile(message: str) -> None:
    raise RematError(message)


@_refuse_under_compile.register_fake
def _(message: str) -> None:
    return None


torch.library._register_effectful_op(_refuse_under_compile._opoverload, EffectType.ORDERED)


@torch.library.custom_op("remat::refuse_planning_under_compile", mutates_args=())
def _refuse_planning_under_compile(message: str, always: bool) -> None:
    """A ValueError, as the plan's and the profile's own: `always` (remat.fit's own message),
    else where a profile_regions or use_plan block is open on the thread running the compiled
    graph (named before the message)."""
    if always:
        raise ValueError(message)
    if _plans.profiling() is not None:
        raise ValueError(f"profile_regions: {message}")
    if getattr(_plans._state, "plans", None):
        raise ValueError(f"use_plan: {message}")


@_refuse_planning_under_compile.register_fake
def _(message: str, always: bool) -> None:
    return None


torch.library._register_effectful_op(_refuse_planning_under_compile._opoverload, EffectType.ORDERED)


def refuse_planning(message):
    """Traced where a compiled step begins that remat.fit was to profile or plan: the compiled
    function raises `message` when it runs, every time, before the step's forward."""
    _refuse_planning_under_compile(message, True)


def _eager_only_refusal(checkpoint, verify_switched_on):
    """The refusal of the checkpoint's options that need recompute to run the Python body again,
    naming each and its fix; None when it has none."""
    options, fixes = [], []
    if checkpoint._channels:
        options.append("the contexts option (replay channels)")
        fixes.append("drop contexts under torch.compile")
    if checkpoint._verify:
        options.append("verify_recompute=True")
        fixes.append("drop verify_recompute under torch.compile (verify in an eager run)")
    elif checkpoint._verify is None and verify_switched_on:
        options.append("verify_recompute, switched on by remat.verify_recompute(True) around the call,")
        fixes.append("call the compiled function outside remat.verify_recompute(True) (or inside "
                     "remat.verify_recompute(False)), or pass verify_recompute=False to this checkpoint")
    if not options:
        return None
    return (f"checkpoint '{checkpoint.region_name}': {' and '.join(options)} "
            f"{'needs' if len(options) == 1 else 'need'} recompute to run the Python body again, which a compiled "
            f"graph never does; {'; '.join(fixes)}; or compile inside the checkpoint instead: "
            "remat.checkpoint(...)(torch.compile(block))")


# Whether Dynamo is tracing a checkpoint's body now. A module global, not a thread-local or a
# ContextVar: Dynamo traces reads and writes of module globals, in fullgraph mode too.
_tracing_checkpoint = False


def _saved_by_the_partitioner(body):
    """The wrapper dynamo_bypassing_wrapper calls with the region's body: runs it and, when
    AOTAutograd's proxy tracer is recording (the one point where the body's aten nodes exist),
    tags every node the body appended MUST_SAVE."""

    def run(*args, **kwargs):
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        mode = get_proxy_mode()
        if mode is None:  # an eager run of the compiled function's fallback: nothing to tag
            return body(*args, **kwargs)
        graph = mode.tracer.graph
        before = len(graph.nodes)
        result = body(*args, **kwargs)
        for index, node in enumerate(graph.nodes):
            if index >= before and node.op == "call_function":
                node.meta["recompute"] = torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE
        return result

    return run


def compiled_region(body, recompute, args, kwargs):
    """A region traced by Dynamo: a save region's nodes tagged to be saved, anything else
    inlined as it is."""
    if recompute or not _tracing_checkpoint:
        return body(*args, **kwargs)
    return dynamo_bypassing_wrapper(_saved_by_the_partitioner, body, *args, **kwargs)


def compiled_checkpoint(checkpoint, fn, args, kwargs, verify_switched_on, context_fn=None):
    """A checkpoint traced by Dynamo: its body under a non-reentrant torch.utils.checkpoint.

    State hooks are left out: traced whole, the partitioner never recomputes random ops (dropout
    keeps forward's mask); where Dynamo breaks the graph inside the body, torch.utils.checkpoint
    runs eagerly, and it restores the random number generators' states for recompute
    (preserve_rng_state, as a state hook would). A context_fn (selective activation checkpointing)
    is torch.utils.checkpoint's own and passes through; replay channels and verify_recompute
    (given, or switched on by remat.verify_recompute(True): verify_switched_on), which need
    recompute to run the Python body again, are refused when the compiled function runs.
    `context_fn`: one given to checkpoint.call() (transformers' gradient_checkpointing_kwargs), in
    place of the checkpoint's own."""
    global _tracing_checkpoint
    refusal = _eager_only_refusal(checkpoint, verify_switched_on)
    if refusal is not None:
        _refuse_under_compile(refusal)
    if _plans.block_open and torch.is_grad_enabled():
        # Traced while a profile_regions or use_plan block is open on some thread (Dynamo guards
        # on it and on grad mode, so a graph traced with none open, or under no_grad where
        # a checkpoint keeps nothing, has no check, and one is traced again once a block opens):
        # on the thread in the block the compiled checkpoint is refused before it runs, as no
        # region of it would run as such
        _refuse_planning_under_compile(_plans.refused_under_compile(
            f"checkpoint '{checkpoint.region_name}'", "no profile can measure it and no plan can apply to it"), False)
    if _tracing_checkpoint:
        raise RematError(f"checkpoint '{checkpoint.region_name}' is nested inside another checkpoint; checkpoints do "
                         "not nest: use regions inside one checkpoint")
    _tracing_checkpoint = True
    try:
        context_fn = checkpoint._context_fn if context_fn is None else context_fn
        selective = {} if context_fn is None else {"context_fn": context_fn}
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True, **selective,
                                                 **kwargs)
    finally:
        _tracing_checkpoint = False
