"""track(model, optimizer): categories and modules for every byte of a training step, without
annotations. The mechanism is remat_alloc's (remat_alloc._tracking); this module re-exports it,
tells it when a remat checkpoint decides what autograd keeps (tracking leaves the saved tensors
to the checkpoint there, which names what it keeps an activation itself), and gives it remat._C's
C++ hooks, which do at every module call, saved tensor and gradient what its Python hooks would."""

from remat_alloc import Tracker, track, untrack
from remat_alloc._tracking import register_checkpoint_probe, register_native

from ._extension import _C

register_checkpoint_probe(_C.in_checkpoint)
register_native(_C)

__all__ = ["track", "untrack", "Tracker"]
