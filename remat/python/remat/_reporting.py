"""What a checkpoint keeps for backward, from inside its forward.

The runtime knows everything a checkpoint keeps: the inputs recompute will read again, the
outputs of save regions that something needs, and the tensors autograd saved inside save
regions. The report lists them by region, each storage billed once ("layers.0: 28 B resident
in 2 storage(s)"), with a row per tensor: its name, shape and dtype. Names are `input.<i>`,
`output.<i>` and `saved.<i>` unless a custom autograd Function named what it saves with
remat.save_for_backward(ctx, {"lse": lse, ...}).
"""


import torch

from ._extension import _C
from ._arguments import ArgumentTypeError, name_arg
from ._saved_report import refuse_annotate

__all__ = ["current_memory_report", "format_current_memory_report", "print_current_memory_report",
           "save_for_backward"]


def current_memory_report():
    """The memory report of the checkpoint whose forward runs now (a remat._C.MemoryReport:
    .checkpoint, .bytes, .storages, .regions[].tensors[], .format(), .to_json())."""
    return _C.current_memory_report()


def format_current_memory_report(annotate=None):
    """The current checkpoint's memory report as text (no newline at its end, as torch_remat's).
    `annotate` is refused as format_saved_tensors_report refuses it."""
    refuse_annotate("format_current_memory_report", annotate)
    return _C.current_memory_report().format().rstrip("\n")


def print_current_memory_report(file=None, annotate=None):
    """Prints the current checkpoint's memory report (to sys.stdout unless `file` is given). Call it
    inside the checkpointed function, guarded by `if not remat.is_recomputing():`."""
    refuse_annotate("print_current_memory_report", annotate)
    print(format_current_memory_report(), file=file)


def save_for_backward(ctx, saved):
    """ctx.save_for_backward with names for the memory report: save_for_backward(ctx, {"lse": lse,
    "probs": probs}) in a custom autograd Function's forward. Inside a save region the names label
    the tensors in the report; elsewhere it is ctx.save_for_backward(*saved.values())."""
    if torch.compiler.is_compiling():  # the partitioner decides what is saved; names feed eager reports only
        ctx.save_for_backward(*saved.values())
        return
    if not hasattr(saved, "items"):
        raise TypeError(f"save_for_backward: saved must map names to tensors, got {type(saved).__name__}")
    named = []
    for name, tensor in saved.items():
        name_arg("save_for_backward", "name", name)
        if not name:  # the report's label: as torch_remat, a ValueError
            raise ValueError("save_for_backward: a tensor's name is empty; name each tensor the report is to label, "
                             "such as {\"lse\": lse}")
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(f"save_for_backward: saved[{name!r}] must be a torch.Tensor or None (what "
                                    f"ctx.save_for_backward accepts), got {type(tensor).__name__} {tensor!r:.80}")
        named.append((name, tensor))
    _C.name_saved_tensors(named)
    ctx.save_for_backward(*saved.values())
