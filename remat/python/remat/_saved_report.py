"""Everything kept for backward behind a loss: live checkpoints and the graph outside them.

The report walks the autograd graph behind the loss and reads each node's saved tensors through
its `_saved_*` attributes. Reading one that a checkpoint dropped would run recompute, so the
walk runs under the runtime's peek guard, where such a read raises instead and is skipped: what
checkpoints keep comes from the runtime itself (every live checkpoint's memory report). A
storage is billed once, to a checkpoint first. No guard is needed around the forward;
track_saved_tensors() remains for C++-style tracking of saves the graph walk cannot read.
"""

import threading

import torch

from ._extension import _C

__all__ = ["saved_tensors_report", "format_saved_tensors_report", "print_saved_tensors_report", "saved_report",
           "track_saved_tensors"]


def _is_parameter(tensor):
    """A leaf that requires grad, or a view of one (the weight.t() a matmul saves): resident
    whatever checkpointing does, so not counted as kept for backward."""
    base = tensor._base if tensor._base is not None else tensor
    return base.is_leaf and base.requires_grad


def _tensors_in(value):
    items = value if isinstance(value, (tuple, list)) else [value]
    return [item for item in items if isinstance(item, torch.Tensor) and not _is_parameter(item)]


def _roots_of(roots):
    """The report's roots as a list: a tensor (the loss), tensors, or None (no graph walk)."""
    if roots is None:
        return []
    listed = [roots] if isinstance(roots, torch.Tensor) else list(roots) if hasattr(roots, "__iter__") else None
    if listed is None or not all(isinstance(root, torch.Tensor) for root in listed):
        raise TypeError("saved_tensors_report: roots must be a tensor (the loss), tensors, or None, got "
                        f"{type(roots).__name__}")
    return listed


def _walk(roots):
    """The runtime's record of a walk of the graph behind `roots`: each node's saved tensors
    that the walk could read, and the checkpoints behind it; without roots, every live
    checkpoint."""
    walk = _C.SavedTensorsWalk()
    seen = set()
    stack = [root.grad_fn for root in roots if root.grad_fn is not None]
    if not roots:
        walk.note_live_checkpoints()
    with walk:
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            tensors = []
            for attribute in dir(node):
                if not attribute.startswith("_saved_"):
                    continue
                try:
                    tensors.extend(_tensors_in(getattr(node, attribute)))
                except RuntimeError:  # dropped by a checkpoint, or already freed by a backward
                    continue
            if tensors:
                walk.add_node(node.name(), id(node), tensors)
            stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    return walk


def saved_tensors_report(roots=None):
    """What is kept for backward behind `roots` (the loss, or several tensors; None: every live
    checkpoint, with no graph walk), as a remat._C.SavedReport: .total_bytes, .region_groups,
    .node_groups, .details, .format(), .to_json() for the `saved-report` dump."""
    listed = _roots_of(roots)
    return _C.saved_report(listed[0] if listed else None, _walk(listed))


saved_report = saved_tensors_report  # the name this package used first


def refuse_annotate(function, annotate):
    """torch_remat's reports take `annotate`, a per-tensor labeller; remat's rows name each
    tensor's allocation site from the tagging allocator's tags already, so passing one is refused
    rather than ignored."""
    if annotate is not None:
        raise TypeError(f"{function}: annotate is not supported; remat's rows name each tensor and its allocation "
                        "site (remat.site) from the tagging allocator's tags")


def format_saved_tensors_report(roots=None, annotate=None):
    """saved_tensors_report(roots) as text, with no newline at its end (as torch_remat's);
    `annotate` is refused (see refuse_annotate)."""
    refuse_annotate("format_saved_tensors_report", annotate)
    return saved_tensors_report(roots).format().rstrip("\n")


def print_saved_tensors_report(roots=None, file=None, annotate=None):
    """Prints what is kept for backward behind `roots` (the loss): the total, live checkpoints
    grouped when identical ("96 B  x2  layer.0-1  (2 storages each)"), saves outside checkpoints
    by autograd node ("48 B  TanhBackward0 (x1)"), and one checkpoint's detail per group."""
    refuse_annotate("print_saved_tensors_report", annotate)
    print(format_saved_tensors_report(roots), file=file)


class track_saved_tensors:
    """Records tensors autograd saves outside checkpoints on this thread, for the saved-tensors
    report (which also finds them by walking the graph; this records the saves the walk cannot
    read). Guards may be nested and exited in any order; tracking stays on while any is entered
    on the thread. A guard must exit on the thread that entered it."""

    _thread = threading.local()  # .entered: guards entered on this thread; .guard: the runtime's

    def __init__(self):
        self._lock = threading.Lock()
        self._threads = {}  # thread id -> [thread name, times entered there]

    def __copy__(self):
        raise TypeError("track_saved_tensors guards cannot be copied; make a new remat.track_saved_tensors()")

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __enter__(self):
        here, thread = track_saved_tensors._thread, threading.current_thread()
        if getattr(here, "entered", 0) == 0:
            guard = _C.track_saved_tensors()
            guard.__enter__()
            here.guard, here.entered = guard, 0
        here.entered += 1
        with self._lock:
            self._threads.setdefault(thread.ident, [thread.name, 0])[1] += 1
        return self

    def __exit__(self, *exc_info):
        here, thread = track_saved_tensors._thread, threading.current_thread()
        with self._lock:
            count = self._threads.get(thread.ident)
            if count is None:
                others = [name for name, _ in self._threads.values()]
                if others:
                    raise RuntimeError(
                        f"track_saved_tensors: entered on thread {others[0]!r} and exited on thread "
                        f"{thread.name!r}; tracking is per thread, so it stays on for {others[0]!r} until that "
                        "thread exits the guard")
                raise RuntimeError("track_saved_tensors: exited without being entered (or exited once more than "
                                   "entered)")
            count[1] -= 1
            if count[1] == 0:
                del self._threads[thread.ident]
        here.entered -= 1
        if here.entered == 0:
            guard, here.guard = here.guard, None
            guard.__exit__(None, None, None)
