"""State that recompute must see as forward saw it.

A recompute runs the checkpoint's body a second time, later, from backward. Anything the body
reads besides its inputs (an RNG, a counter) must be put back first. A state hook is any object
with snapshot() and restore(state): the runtime snapshots each hook when the checkpoint starts
and after every save region in forward, restores the matching snapshot before recompute runs
that stretch again, and puts back the state backward had once recompute ends (recompute is a
fork, not a rewind of the program). RecomputeStateHook is an optional base class that documents
the two methods; cpu_rng_state_hook() is the runtime's own for the CPU generator,
cuda_rng_state_hook() keeps the CUDA generators through torch.cuda's state calls, and
generator_state_hook(generator) keeps a torch.Generator of the caller's own.
"""

import torch

from ._extension import _C

__all__ = ["RecomputeStateHook", "cpu_rng_state_hook", "cuda_rng_state_hook", "generator_state_hook"]


class RecomputeStateHook:
    """State that recompute must see as forward saw it (an RNG, a counter): snapshot() at
    checkpoint entry, restore(state) before recompute runs the body again; the state backward
    had is put back afterwards. Subclassing is optional: any object with both methods works."""

    def snapshot(self):
        raise NotImplementedError(f"{type(self).__name__} must define snapshot()")

    def restore(self, state):
        raise NotImplementedError(f"{type(self).__name__} must define restore(state)")


class _NotNeededUnderCompile:
    """What cpu_rng_state_hook() gives under torch.compile, where checkpoints leave state hooks
    out (a compiled graph never recomputes random ops)."""

    def snapshot(self):
        return None

    def restore(self, state):
        pass


def cpu_rng_state_hook():
    """A state hook for the CPU generator (dropout and friends give the same masks in
    recompute)."""
    if torch.compiler.is_compiling():
        return _NotNeededUnderCompile()
    return _C.cpu_rng_state_hook()


class _CudaRngStateHook(RecomputeStateHook):
    """The default generator of every CUDA device; nothing to keep while CUDA is not initialized
    (no CUDA random numbers were drawn)."""

    def snapshot(self):
        return torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None

    def restore(self, state):
        if state is not None:
            torch.cuda.set_rng_state_all(state)


def cuda_rng_state_hook():
    """A state hook for the default generator of every CUDA device (dropout on CUDA tensors gives
    the same masks in recompute); it costs a check while CUDA is not initialized."""
    return _CudaRngStateHook()


class _GeneratorStateHook(RecomputeStateHook):
    def __init__(self, generator):
        self.generator = generator

    def snapshot(self):
        return self.generator.get_state()

    def restore(self, state):
        self.generator.set_state(state)


def generator_state_hook(generator):
    """A state hook for one torch.Generator of the caller's own (`torch.rand(..., generator=g)`,
    a sampler's): the default generators' hooks do not keep it, and nothing warns of its draws."""
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator_state_hook takes a torch.Generator; it was given {type(generator).__name__}")
    return _GeneratorStateHook(generator)


def with_rng_state_hooks(hooks, cpu=False):
    """`hooks` with the CUDA RNG state hook added where it is not among them (and with cpu=True
    the CPU generator's): what a checkpoint runs with under a budget plan, which may recompute a
    region its code saves (and so never needed its random numbers drawn again), so that recompute
    draws forward's masks. The runtime keeps the CPU generator and the CUDA generators of devices
    with a context under a plan itself, for every caller (C++ ones too); this one also covers a
    device whose first use is inside the checkpoint's body, once CUDA is initialized. A
    checkpoint that keeps the RNG state without a plan (.call()'s preserve_rng_state) adds both."""
    hooks = list(hooks)
    if cpu:
        hooks.append(_C.cpu_rng_state_hook())
    if not any(isinstance(hook, _CudaRngStateHook) for hook in hooks):
        hooks.append(_CudaRngStateHook())
    return hooks


def checked_state_hooks(hooks):
    """The hooks as a list, each refused when it lacks snapshot() or restore(state)."""
    if isinstance(hooks, (str, bytes)) or not hasattr(hooks, "__iter__"):
        raise TypeError(f"checkpoint: recompute_state_hooks must be a sequence of hooks, got {type(hooks).__name__}; "
                        "pass recompute_state_hooks=(hook,)")
    hooks = list(hooks)
    for hook in hooks:
        if isinstance(hook, _C.NativeStateHook):
            continue
        for method in ("snapshot", "restore"):
            if not callable(getattr(hook, method, None)):
                raise TypeError(f"checkpoint: recompute_state_hooks: {type(hook).__name__} has no {method}() method; "
                                "a state hook is any object with snapshot() and restore(state)")
    return hooks
