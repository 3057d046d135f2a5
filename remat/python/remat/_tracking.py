"""track(model, optimizer): categories and modules for every byte of a training step, without
annotations. The mechanism is remat_alloc's (remat_alloc._tracking); this module re-exports it
and tells it when a remat checkpoint decides what autograd keeps, so that tracking leaves the
saved-tensor hooks to the checkpoint there (what the checkpoint keeps still reaches tracking's
pack hook, through the pair the checkpoint inherits)."""

from remat_alloc import Tracker, track, untrack
from remat_alloc._tracking import register_checkpoint_probe

from ._extension import _C

register_checkpoint_probe(_C.in_checkpoint)

__all__ = ["track", "untrack", "Tracker"]
