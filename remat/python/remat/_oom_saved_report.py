"""The saved-tensors report where no loss is at hand: in an out-of-memory observer.

An allocator's out-of-memory callback gets a device and byte counts, not the loss whose graph
the saved-tensors report walks. discover_autograd_roots() finds roots in the live object graph
instead (every live tensor with a grad_fn: over-complete on purpose, since the report counts
each node and storage once), and format_oom_saved_tensors_report() builds the report from them:
the live checkpoints and the saves outside them (the output head, the loss). oom_observer is
the ready callback that prints it, with torch_remat's signature. For the JSON dumps and tagged
tables a production job keeps, attach remat.attach_oom_observer instead (or as well).
"""

import gc
import sys
import traceback
import warnings

import torch

from ._saved_report import format_saved_tensors_report, refuse_annotate

__all__ = ["discover_autograd_roots", "format_oom_saved_tensors_report", "oom_observer"]


def discover_autograd_roots():
    """Every live tensor with a grad_fn (fake tensors left out): roots for the saved-tensors
    report when there is no loss to pass. Scans the garbage collector's objects, so it is meant
    for rare moments such as an out-of-memory handler."""
    roots = []
    with warnings.catch_warnings():  # isinstance on some deprecated module objects warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and not isinstance(obj, torch._subclasses.FakeTensor) \
                        and obj.grad_fn is not None:
                    roots.append(obj)
            except Exception:  # an object whose isinstance or attribute access raises is no root
                continue
    return roots


def format_oom_saved_tensors_report(annotate=None):
    """The saved-tensors report over discover_autograd_roots(), as text. `annotate` is refused as
    format_saved_tensors_report refuses it (its rows carry allocation sites already)."""
    refuse_annotate("format_oom_saved_tensors_report", annotate)
    return format_saved_tensors_report(roots=discover_autograd_roots())


def oom_observer(device, alloc, device_alloc, device_free):
    """An out-of-memory observer (torch._C._cuda_attach_out_of_memory_observer(remat.oom_observer))
    that prints the failing request and the saved-tensors report to stderr. It never raises: the
    allocator raises the out-of-memory error as soon as it returns, and a failure here is
    printed instead of hiding that error."""
    try:
        sys.stderr.write(f"CUDA out of memory on device {device}: requested {alloc} B (device_alloc={device_alloc} B, "
                         f"device_free={device_free} B). What is saved for backward:\n")
        sys.stderr.write(format_oom_saved_tensors_report())
        sys.stderr.write("\n")
    except Exception:
        print("remat.oom_observer: the saved-tensors report failed:", file=sys.stderr)
        traceback.print_exc()
