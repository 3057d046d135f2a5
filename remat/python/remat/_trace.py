"""Which regions each checkpoint saved and which it recomputed.

Every checkpoint forward appends one scope (its name and the decision of each region, in order)
to a bounded per-thread log in the runtime. `with remat.collect_trace() as trace:` takes what
the checkpoints run inside the block logged on this thread: entering drops what was logged
before (or hands it to an enclosing collect_trace, so nested collections see everything their
block ran), leaving moves the block's scopes into `trace`.
"""

import threading

from ._extension import _C

__all__ = ["collect_trace", "trace_scope"]

_collecting = threading.local()  # .stack: the collect_trace blocks entered on this thread, innermost last


def _stack():
    if not hasattr(_collecting, "stack"):
        _collecting.stack = []
    return _collecting.stack


class collect_trace:
    """`with remat.collect_trace() as trace:` collects the save/recompute decisions of every
    checkpoint run inside on this thread; trace.format() prints them, trace.to_json() is the
    `remat-trace` dump, trace.scopes the data (one scope per checkpoint call)."""

    def __init__(self):
        self._trace = _C.RematTrace()
        self._thread = None

    def __enter__(self):
        if self._thread is not None:
            raise RuntimeError("collect_trace: this block is already entered; make a new remat.collect_trace()")
        stack = _stack()
        logged = _C.collect_trace()  # what ran before the block belongs to the enclosing one, if any
        if stack:
            stack[-1]._trace.extend(logged)
        stack.append(self)
        self._thread = threading.get_ident()
        return self

    def __exit__(self, *exc_info):
        stack = _stack()
        if self._thread != threading.get_ident() or not stack or stack[-1] is not self:
            raise RuntimeError("collect_trace: exited on another thread or out of order; collect_trace blocks nest "
                               "on the thread that enters them")
        self._trace.extend(_C.collect_trace())
        stack.pop()
        if stack:
            stack[-1]._trace.extend(self._trace)
        self._thread = None

    def _collected(self):
        if self._thread == threading.get_ident() and _stack()[-1] is self:  # still inside: what ran so far
            self._trace.extend(_C.collect_trace())
        return self._trace

    @property
    def scopes(self):
        return self._collected().scopes

    def format(self):
        """'remat trace: 2 checkpoint(s), 4 region(s)', then 'scope [layers.0]' and a
        '  attention: save' line per region."""
        return self._collected().format()

    def to_json(self):
        return self._collected().to_json()

    def __str__(self):
        return self.format()


def trace_scope(function, name, *, metadata=None):
    """torch_remat's reporting-only scope: function wrapped, its behaviour unchanged. remat's trace
    lists checkpoints and their regions, not scopes below them, so the scope is not shown there
    (use remat.name_scope to qualify region names instead)."""
    if not callable(function):
        raise RuntimeError("trace_scope expects a function as its first argument")
    checked = {"name": name} if metadata is None else {"name": name, "metadata": metadata}
    for what, text in checked.items():
        if not isinstance(text, str):
            raise RuntimeError(f"trace_scope: {what} must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError(f"trace_scope: {what} is empty")
    return function
