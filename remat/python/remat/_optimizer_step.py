"""An optimizer step's memory, predicted before it first runs.

remat.fit measures the optimizer step where it runs after a planned step, and predicts it from
then on. With gradient accumulation the first one runs after a planned micro-batch, so it must be
predicted before that micro-batch's forward: the state it makes (AdamW's two moments, SGD's
momentum) and its transient (a foreach step holds a temporary per parameter at once) are not
allocated yet. The step is run once, on stand-ins: the optimizer found over the model's parameters
(the torch.optim.Optimizer objects whose param_groups hold them, found in one scan of the garbage
collector's objects) is copied with every parameter, gradient and state tensor replaced by
a tensor of the same shape and dtype on the meta device, which allocates nothing and computes
nothing. The copy's step runs under a dispatch mode that counts the bytes of every storage an
operation makes and drops them when the storage is freed: its peak over where it began is the
step's rise, what is left at its end the state it made.

The copy shares nothing it writes with the user's optimizer: its attributes are set in its own
instance dict, never through the class (a wrapper's param_groups property writes into the optimizer
it wraps: accelerate's AcceleratedOptimizer, which transformers.Trainer steps, would have been given
the stand-ins for good). A wrapper, an optimizer holding another in its instance dict, is not
predicted: the optimizer it wraps is (the scan finds it too; a wrapper's step steps the optimizer
it holds, and Lightning's LightningOptimizer stepped the real AdamW so, an optimizer step more than
the job made); one holding another for some of its parameters only (a hybrid) is no wrapper. One
whose param_groups or state is a property of its class otherwise is not predicted at all
(prediction() says why), nor one whose step reaches another optimizer's step: while the copy
steps (without hooks), every optimizer step on that thread that runs torch's step hooks is refused
before it changes anything.

The real step makes the same tensors on the parameters' device: requested bytes equal each
tensor's size. What a kernel allocates and frees inside one operation is not seen; on the CPU that
is the scalars it wraps in tensors, allowed for by a few words (_HOST_KERNEL_SCALARS). Where the copy differs from the real step it is made to allocate no less: a fused
step (one kernel, no temporaries) is run as the for-loop form, which holds temporaries; a foreach
choice left to torch (None) is taken as torch would take it for the real parameters. Scalars kept
on the host (the step counters) stay real tensors: a non-capturable step reads them. An optimizer
whose step cannot run on stand-ins (one that needs a closure, as LBFGS; one that reads a
parameter's values on the host) is not predicted: prediction() says why.

The same run predicts a later step that makes state for parameters that had none (a branch of the
model first given a gradient after the optimizer first stepped, without_state()): the stand-ins
then carry the state there is, which is not made again, and the step's peak over where it begins
holds the new state and the transient of every parameter.
"""

from __future__ import annotations

import collections
import copy
import gc
import inspect
import sys
import threading

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._extension import _C


def optimizers_over(parameters):
    """The torch.optim.Optimizer objects whose param_groups hold any of `parameters`, found in one
    scan of the collector's objects, by type (which runs no code of theirs) and in C++, less the
    wrappers of others (_wraps). Asking the collector for the parameters' referrers instead costs a
    scan per parameter, in effect: 2.8 s with 4000 parameters and two optimizers, where one scan in
    Python took 0.17 s."""
    if not parameters:
        return []
    ids = {id(p) for p in parameters}
    return [o for o in _C.instances_among(gc.get_objects(), torch.optim.Optimizer)
            if _wraps(o) is None and any(id(p) in ids for group in o.param_groups for p in group["params"])]


def _wraps(optimizer):
    """The optimizer `optimizer` wraps, else None: an Optimizer in its instance dict that holds
    every parameter `optimizer` holds (accelerate's AcceleratedOptimizer holds the one it steps as
    `optimizer`, Lightning's LightningOptimizer as `_optimizer`; an optimizer that keeps another for
    some of its parameters, a hybrid, wraps none: its own step is predicted). Read from the dict: no
    property of its runs."""
    for value in getattr(optimizer, "__dict__", {}).values():
        if isinstance(value, torch.optim.Optimizer) and value is not optimizer:
            inner = {id(p) for group in value.param_groups for p in group["params"]}
            if all(id(p) in inner for group in optimizer.param_groups for p in group["params"]):
                return value
    return None


_predicting = threading.local()  # .active: a copy steps on stand-ins on this thread


def _refuse_other_steps(optimizer, args, kwargs):
    """A global optimizer step pre-hook, the first of them while a copy steps on stand-ins: the
    copy's own step runs without hooks, so any step that reaches one on that thread is another
    optimizer's, a real one (a wrapper's step stepping the optimizer it holds), refused before it
    changes anything. Steps on other threads go on."""
    if getattr(_predicting, "active", False):
        raise RuntimeError(f"its step steps another optimizer ({type(optimizer).__name__}), which would change the "
                           "model's parameters")


_refusal = None  # the handle of _refuse_other_steps, once registered


def _refusing_other_steps():
    """_refuse_other_steps registered, and put first of the global step pre-hooks (a user's hook
    registered earlier would see the refused step first otherwise)."""
    global _refusal
    hooks = getattr(sys.modules["torch.optim.optimizer"], "_global_optimizer_pre_hooks", None)  # (PyTorch's own)
    if _refusal is None or (hooks is not None and _refusal.id not in hooks):  # (removed by hand: again)
        _refusal = register_optimizer_step_pre_hook(_refuse_other_steps)
    if hooks is not None:
        hooks.move_to_end(_refusal.id, last=False)


def _class_property(optimizer, name):
    """Whether the class of `optimizer` defines `name` as a descriptor that takes assignments (a
    property, which may read and write another object)."""
    return hasattr(inspect.getattr_static(type(optimizer), name, None), "__set__")


class _StorageCount(TorchDispatchMode):
    """Counts the bytes of the storages made while it is on (other than `existing`, those of the
    stand-ins it began with), until each is freed: those operations make, and those made outside
    any (torch.tensor(1.0)) where an operation first takes them."""

    def __init__(self, host, existing):
        super().__init__()
        self.host = host  # host storages count too (the parameters are on the CPU)
        self.existing = existing  # keys of the storages there before
        self._live = {}  # storage key -> (weak reference, bytes)
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves((args, kwargs, out)):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage._cdata
                counted = storage.device.type == "meta" or (self.host and storage.device.type == "cpu")
                if counted and key not in self.existing and key not in self._live:
                    self._live[key] = (StorageWeakRef(storage), storage.nbytes())
        self.peak = max(self.peak, self.live_bytes())
        return out

    def live_bytes(self):
        self._live = {k: v for k, v in self._live.items() if not v[0].expired()}
        return sum(size for _, size in self._live.values())


# A CPU kernel wraps the scalars it is given in 0-dim tensors inside the operation, where no
# dispatch mode sees them (AdamW's step on CPU parameters: 12 bytes at once); the scalars of one
# operation at a time, a few words at most. On a GPU they are host memory, not counted.
_HOST_KERNEL_SCALARS = 32


def _stand_in(tensor):
    """A meta tensor for one on the device; 0-dim tensors (host step counters) stay real copies."""
    if tensor.dim() == 0 and tensor.device.type == "cpu":
        return tensor.detach().clone()
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")


def _resolved_foreach(optimizer, group):
    """The foreach choice torch makes for the real parameters where the group leaves it to torch."""
    from torch.optim.optimizer import _default_to_fused_or_foreach
    _, foreach = _default_to_fused_or_foreach(group["params"], group.get("differentiable", False), use_fused=False)
    return foreach


def step_memory(optimizer, with_gradients, host):
    """(peak bytes over where it begins, bytes left at its end) of `optimizer`.step() where the
    parameters in `with_gradients` (a set of ids) have gradients of their own shape and dtype;
    `host`: the parameters are on the CPU, whose bytes the budget counts (the step counters too).
    Raises where the step cannot run on stand-ins."""
    for name in ("param_groups", "state"):
        if _class_property(optimizer, name):
            raise TypeError(f"its {name} is a property of its class, which may be another optimizer's: its step is "
                            "not run on a copy")
    stand_ins = {}
    groups = []
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            proxy = torch.nn.Parameter(_stand_in(p), requires_grad=p.requires_grad)
            if id(p) in with_gradients:
                proxy.grad = _stand_in(p)
            stand_ins[p] = proxy
            params.append(proxy)
        copied = dict(group, params=params)
        if copied.get("fused"):
            copied["fused"], copied["foreach"] = False, False  # the for-loop form holds its temporaries
        elif "foreach" in copied and copied["foreach"] is None:
            copied["foreach"] = _resolved_foreach(optimizer, group)
        groups.append(copied)
    state = collections.defaultdict(dict)
    for p, entries in optimizer.state.items():
        if p in stand_ins:
            state[stand_ins[p]] = {k: _stand_in(v) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                                   for k, v in entries.items()}
    # A copy with its own attributes, set in its instance dict: nothing written through the class
    proxy = object.__new__(type(optimizer))
    vars(proxy).update(vars(optimizer))
    # Neither the user's hooks (per optimizer or global) nor torch's profiler record run for it
    vars(proxy).update(param_groups=groups, state=state, _optimizer_step_pre_hooks=collections.OrderedDict(),
                       _optimizer_step_post_hooks=collections.OrderedDict())
    step = type(optimizer).step
    step = getattr(step, "__wrapped__", step) if getattr(step, "hooked", False) else step
    before = {id(v) for entries in state.values() for v in entries.values()}
    existing = {t.untyped_storage()._cdata for t in tree_leaves((groups, dict(state)))
                if isinstance(t, torch.Tensor)} | {p.grad.untyped_storage()._cdata for p in stand_ins.values()
                                                    if p.grad is not None}
    count = _StorageCount(host, existing)
    _refusing_other_steps()
    _predicting.active = True
    try:
        with count:
            step(proxy)
    finally:
        _predicting.active = False
    made = count.live_bytes()  # the state it made is alive with the copy
    if host:
        # Host scalars the step made as state without an operation (torch.tensor(0.0) step
        # counters): there from the start of the step to its end
        scalars = sum(v.untyped_storage().nbytes() for entries in proxy.state.values() for v in entries.values()
                      if isinstance(v, torch.Tensor) and v.device.type == "cpu" and id(v) not in before
                      and v.untyped_storage()._cdata not in count._live)
        return count.peak + scalars + _HOST_KERNEL_SCALARS, made + scalars
    return count.peak, made


def without_state(optimizers, parameters):
    """The parameters among `parameters` that one of `optimizers` holds without state while it
    holds state for others: its next step with their gradients makes their state (a part of the
    model first given a gradient after the optimizer first stepped). An optimizer that keeps no
    state (SGD without momentum) or has not stepped yet holds none of them."""
    wanted = {id(p) for p in parameters}
    found = []
    for optimizer in optimizers:
        if not any(optimizer.state.values()):
            continue
        found += [p for group in optimizer.param_groups for p in group["params"]
                  if id(p) in wanted and not optimizer.state.get(p)]
    return found


def prediction(parameters, with_gradients, host, optimizers=None):
    """(rise, made, None) of the steps of every optimizer over `parameters` (or of `optimizers`,
    found before) run one after another (each step's peak over the bytes before the first, the state
    all of them made), or (None, None, why) where it cannot be predicted."""
    if optimizers is None:
        optimizers = optimizers_over(parameters)
    if not optimizers:
        return None, None, "no torch.optim.Optimizer holds the model's parameters"
    rise = made = 0
    for optimizer in optimizers:
        try:
            peak, kept = step_memory(optimizer, with_gradients, host)
        except Exception as error:  # noqa: BLE001 - any failure means: not predicted, said why
            return None, None, (f"{type(optimizer).__name__}.step() could not run on stand-in tensors "
                                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
        rise = max(rise, made + peak)
        made += kept
    return rise, made, None
