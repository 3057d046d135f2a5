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
runtime's frames. Under compile they are refused (state hooks, contexts, verify_recompute) or
see nothing (collect_trace, the reports); recompute_needs_tensor is a no-op and
is_recomputing() is False at trace time. The tagging allocator's tags are not visible inside a
compiled graph: snapshots show a compiled checkpoint's memory under the tags in force where the
compiled function was called.
"""

import torch
import torch.utils.checkpoint
from torch._higher_order_ops.wrap import dynamo_bypassing_wrapper

from ._extension import _C

RematError = _C.RematError

__all__ = ["compiled_checkpoint", "compiled_region"]

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


def compiled_checkpoint(checkpoint, fn, args, kwargs):
    """A checkpoint traced by Dynamo: its body under a non-reentrant torch.utils.checkpoint.

    State hooks are not needed there (the partitioner never recomputes random ops, so dropout
    keeps forward's mask) and are left out; a context_fn (selective activation checkpointing)
    is torch.utils.checkpoint's own and passes through; replay channels and verify_recompute,
    which need recompute to run the Python body again, are refused."""
    global _tracing_checkpoint
    if checkpoint._channels or checkpoint._verify:
        raise RematError(f"checkpoint '{checkpoint.region_name}': contexts (replay channels) and verify_recompute "
                         "need recompute to run the Python body again, which a compiled graph never does; drop them "
                         "under torch.compile, or compile inside the checkpoint instead")
    if _tracing_checkpoint:
        raise RematError(f"checkpoint '{checkpoint.region_name}' is nested inside another checkpoint; checkpoints do "
                         "not nest: use regions inside one checkpoint")
    _tracing_checkpoint = True
    try:
        if checkpoint._context_fn is None:
            return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False,
                                                     **kwargs)
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False,
                                                 context_fn=checkpoint._context_fn, **kwargs)
    finally:
        _tracing_checkpoint = False
