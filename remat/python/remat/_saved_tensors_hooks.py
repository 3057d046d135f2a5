"""Saved-tensor hooks: how what a checkpoint keeps is held, torch_remat's contract.

A checkpoint decides which tensors it keeps: the inputs recompute starts from, the tensors its
save regions save for backward, and the save-region outputs recompute reads. A hook pair changes
only how a kept tensor is held: pack(tensor) returns a payload held in its place (a host copy,
a compressed form, the tensor itself after logging it) and unpack(payload) gives the tensor
back. The runtime calls the pair in C++ where it keeps and takes back a tensor (remat._C
wraps the Python callables), so a checkpoint without hooks pays nothing for them.

Which pair applies, innermost first: a remat.saved_tensors_hooks block entered inside the
checkpoint's body (for the save regions in it), the pair given to checkpoint(saved_tensors_hooks=
...), a remat.saved_tensors_hooks block around the checkpoint call, a torch.autograd.graph
.saved_tensors_hooks pair around it (inherited). The pair the checkpoint is called under also
takes the inputs recompute needs (packed when forward ends, once the body no longer reads them).
Outside checkpoints remat.saved_tensors_hooks is PyTorch's pair for PyTorch's own saves.

current_saved_tensor_info(), called from a pack hook, tells why the tensor is kept (the kind)
and the value capture_context() returned where it was produced: a save region's output is packed
when forward ends, after the block it ran in has exited, and still sees that block's context.
Unpack timing: inputs and save-region outputs are unpacked in recompute, in forward order, as
recompute reaches them; tensors saved for backward when their autograd node runs.
"""

import dataclasses
import enum
import threading

import torch

from ._extension import _C

__all__ = ["SavedTensorKind", "SavedTensorInfo", "saved_tensors_hooks", "current_saved_tensor_info"]


class SavedTensorKind(enum.Enum):
    """Why a checkpoint keeps the tensor being packed."""

    CHECKPOINT_INPUT = enum.auto()  # an input recompute starts from
    BACKWARD = enum.auto()  # saved for backward by an op in a save region (or by PyTorch outside checkpoints)
    SAVE_OUTPUT = enum.auto()  # a save region's output that recompute reads


@dataclasses.dataclass(frozen=True)
class SavedTensorInfo:
    """What current_saved_tensor_info() returns inside a pack hook: the kind, and the value the
    pair's capture_context returned where the tensor was produced (None without one)."""

    kind: SavedTensorKind
    context: object = None


def current_saved_tensor_info():
    """Why the tensor whose pack hook runs now is kept. Raises outside a pack hook."""
    kind, context = _C.current_saved_tensor_info()
    return SavedTensorInfo(SavedTensorKind[kind], context)


class _SavedTensorsHooks:
    """The with block of saved_tensors_hooks(): the pair as this thread's innermost remat pair,
    and outside checkpoints also as PyTorch's pair."""

    __slots__ = ("_hooks", "_entered")

    def __init__(self, hooks):
        self._hooks = hooks
        # Per thread that entered it: [(remat scope, PyTorch's hooks context or None)], innermost
        # last, so one block object shared by threads keeps each thread's entries apart.
        self._entered = {}

    def __enter__(self):
        scope = _C.SavedTensorHooksScope(self._hooks)
        # Inside a checkpoint PyTorch's pair would take every tensor saved under it, and the
        # checkpoint would drop nothing: there the pair is remat's only.
        native = None
        if not _C.in_checkpoint():
            native = torch.autograd.graph.saved_tensors_hooks(self._hooks.native_pack, self._hooks.unpack_hook)
            native.__enter__()
        scope.__enter__()
        self._entered.setdefault(threading.get_ident(), []).append((scope, native))
        return self

    def __exit__(self, *exc_info):
        entered = self._entered.get(threading.get_ident())
        if not entered:
            raise RuntimeError("saved_tensors_hooks: exited on a thread that did not enter it (or exited once more "
                               "than entered); exit the block on the thread that entered it")
        scope, native = entered.pop()
        if not entered:
            del self._entered[threading.get_ident()]
        scope.__exit__(None, None, None)
        if native is not None:
            native.__exit__(*exc_info)
        return False


def saved_tensors_hooks(pack_hook, unpack_hook, *, capture_context=None):
    """Holds what checkpoints keep inside the block through pack_hook(tensor) -> payload and
    unpack_hook(payload) -> tensor (torch.autograd.graph.saved_tensors_hooks' signatures).

    Inside a checkpoint the pair takes what save regions keep (tensors saved for backward, and
    outputs recompute reads); around a checkpoint call it also takes the inputs recompute needs;
    outside checkpoints it is PyTorch's pair. capture_context(), if given, runs where a tensor is
    produced; its value is current_saved_tensor_info().context in the pack. The unpack hook is
    bound to each payload: it may run after the block has exited."""
    pair = _runtime_pair(pack_hook, unpack_hook) if capture_context is None else None
    return _SavedTensorsHooks(pair or _C.SavedTensorHooks(pack_hook, unpack_hook, capture_context))


def _runtime_pair(pack_hook, unpack_hook):
    """The runtime's own pair behind (x.pack, x.unpack) of an object that has one (remat.CpuOffload's
    C++ engine), so the runtime calls it without going through Python; else None."""
    owner = getattr(pack_hook, "__self__", None)
    pair = getattr(owner, "_runtime_pair", None)
    if (pair is not None and getattr(unpack_hook, "__self__", None) is owner
            and getattr(pack_hook, "__name__", None) == "pack" and getattr(unpack_hook, "__name__", None) == "unpack"):
        return pair
    return None


def hooks_pair_arg(where, pair):
    """checkpoint(saved_tensors_hooks=(pack, unpack)) as the runtime's pair (None stays None)."""
    if pair is None:
        return None
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        got = f"{len(pair)} items" if isinstance(pair, (tuple, list)) else type(pair).__name__
        raise TypeError(f"{where}: saved_tensors_hooks must be a (pack_hook, unpack_hook) pair, got {got}")
    return _runtime_pair(*pair) or _C.SavedTensorHooks(*pair)


_top_pytorch_pair = torch._C._autograd._top_saved_tensors_default_hooks


def enclosing_hooks():
    """The pair a checkpoint called here inherits when it has none of its own: None while a
    remat pair is in force (the runtime finds it), else PyTorch's innermost pair, if any."""
    if _C.saved_tensor_hooks_active():
        return None
    top = _top_pytorch_pair(True)
    return None if top is None else _C.SavedTensorHooks(*top)


def torch_checkpoint_around():
    """Whether torch.utils.checkpoint (use_reentrant=False) runs around here, in its forward or
    its recompute: PyTorch's innermost pair is its own."""
    top = _top_pytorch_pair(True)
    return top is not None and getattr(top[0], "__module__", None) == "torch.utils.checkpoint"
