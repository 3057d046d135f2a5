"""Which regions each checkpoint saved and which it recomputed, and the trace scopes they ran in.

Every checkpoint forward appends one scope (its name and the decision of each region, in order)
to a bounded per-thread log in the runtime when the forward ends. `with remat.collect_trace() as
trace:` takes what the checkpoints run inside the block logged on this thread: entering hands what
was logged before to an enclosing collect_trace (or drops it), so nested collections see
everything their block ran; leaving moves the block's scopes into `trace`. A `trace_scope`
wrapper drains the log into the innermost block when its function starts and when it returns, so
the checkpoints that finished in between are filed under that scope. A trace scope opened inside
a checkpoint's body also notes how many of that checkpoint's regions had run when it opened and
when it closed; when the checkpoint's scope arrives (its forward has ended by then), the regions
in between are filed under it. The block keeps what ran as a tree (checkpoint scopes from the
runtime, trace scopes around and inside them), from which `entries` (torch_remat's shape: an
OpTrace per region, a ScopeTrace per trace scope) and `format()` are read.
"""

import contextlib
import dataclasses
import functools
import threading

import torch

from ._extension import _C

__all__ = ["OpTrace", "ScopeTrace", "collect_trace", "trace_scope"]

_collecting = threading.local()  # .stack: the collect_trace blocks entered on this thread, innermost last


def _stack():
    if not hasattr(_collecting, "stack"):
        _collecting.stack = []
    return _collecting.stack


@dataclasses.dataclass
class OpTrace:
    """One region a checkpoint ran forward: its name with its name_scope prefixes ("outer/attn"),
    and whether backward recomputes it."""

    name: str
    recompute: bool


@dataclasses.dataclass
class ScopeTrace:
    """One trace_scope call, with the regions and trace scopes reached inside it in forward order."""

    name: str
    metadata: "str | None"
    entries: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _ScopeRun:
    """A trace_scope call as a block records it: the checkpoint scopes and trace scopes inside.
    Opened inside a checkpoint's body, it also holds which checkpoint forward that was
    (CheckpointScope.forward) and the span of that checkpoint's regions it covers."""

    name: str
    metadata: "str | None"
    ran: list = dataclasses.field(default_factory=list)
    forward: "int | None" = None
    start: int = 0
    end: int = 0

    def close(self, position):
        self.end = position[1] if position is not None and position[0] == self.forward else self.start


@dataclasses.dataclass
class _CheckpointRun:
    """A checkpoint's scope with the trace scopes opened directly in its body, in order."""

    scope: object  # the runtime's CheckpointScope
    inside: list


def _op_traces(regions):
    return [OpTrace(region.name, not region.saved) for region in regions]


def _within(regions, runs, start, end):
    """The entries of regions[start:end] with the trace scopes `runs` (opened in the checkpoint's
    body, in order) in their places."""
    entries = []
    cursor = start
    for run in runs:
        entries += _op_traces(regions[cursor:run.start])
        entries.append(ScopeTrace(run.name, run.metadata, _within(regions, run.ran, run.start, run.end)))
        cursor = max(cursor, run.end)
    return entries + _op_traces(regions[cursor:end])


def _entries(ran):
    entries = []
    for item in ran:
        if isinstance(item, _ScopeRun):
            entries.append(ScopeTrace(item.name, item.metadata, _entries(item.ran)))
        elif isinstance(item, _CheckpointRun):
            regions = item.scope.regions
            entries += _within(regions, item.inside, 0, len(regions))
        else:
            entries += _op_traces(item.regions)
    return entries


def _scope_line(pad, scope):
    return pad + scope.name + ("" if scope.metadata is None else f" [{scope.metadata}]")


def _tree_lines(items, indent, children_of, leaf_lines):
    """A tree's lines as format() prints them: each scope (an item children_of gives the children
    of, not None) as its line with its children two spaces further in; leaf_lines(item, indent)
    gives the lines of any other item."""
    lines = []
    for item in items:
        children = children_of(item)
        if children is None:
            lines += leaf_lines(item, indent)
        else:
            lines.append(_scope_line(" " * indent, item))
            lines += _tree_lines(children, indent + 2, children_of, leaf_lines)
    return lines


def _op_lines(op, indent):
    return [f"{' ' * indent}{op.name}: {'recompute' if op.recompute else 'save'}"]


def _format_entries(entries, indent):
    return _tree_lines(entries, indent, lambda entry: entry.entries if isinstance(entry, ScopeTrace) else None,
                       _op_lines)


def _checkpoint_lines(item, indent):
    scope = item.scope if isinstance(item, _CheckpointRun) else item
    return [f"{' ' * indent}scope [{scope.name}]"] + _format_entries(_entries([item]), indent + 2)


def _format_lines(ran, indent):
    """A block's tree as format() prints it: trace scopes outside checkpoints, each checkpoint as
    'scope [NAME]' with its entries under it."""
    return _tree_lines(ran, indent, lambda item: item.ran if isinstance(item, _ScopeRun) else None,
                       _checkpoint_lines)


def _drain():
    """Files what the runtime logged since the last drain under the innermost block's open scope."""
    logged = _C.collect_trace()
    stack = _stack()
    if stack:
        stack[-1]._add_logged(logged)


@contextlib.contextmanager
def untraced():
    """Runs the block's checkpoints into no trace (the runtime's own, run to calibrate a cost):
    what ran before it goes to the enclosing collect_trace block, if any, as it would; what the
    block runs is logged and dropped."""
    _drain()
    enclosing = _stack()
    _collecting.stack = []
    try:
        yield
    finally:
        _C.collect_trace()
        _collecting.stack = enclosing


class collect_trace:
    """`with remat.collect_trace() as trace:` collects the save/recompute decisions of every
    checkpoint run inside on this thread, and the trace_scope calls around them; trace.entries
    lists them as torch_remat does, trace.format() prints them, trace.to_json() is the
    `remat-trace` dump, trace.scopes the data (one scope per checkpoint call)."""

    def __init__(self):
        self._trace = _C.RematTrace()
        self._ran = []  # checkpoint scopes and _ScopeRuns outside any trace scope, in forward order
        self._open = []  # the _ScopeRuns being run, outermost first
        self._thread = None

    def _add(self, ran, trace):
        self._current().extend(ran)
        self._trace.extend(trace)

    def _add_logged(self, logged):
        """Files checkpoint scopes from the runtime: the trace scopes their bodies opened are the
        last ones filed, carrying the same forward number; they move inside the checkpoint."""
        current = self._current()
        for scope in logged.scopes:
            inside = len(current)
            while inside and isinstance(current[inside - 1], _ScopeRun) and current[inside - 1].forward == scope.forward:
                inside -= 1
            if inside == len(current):
                current.append(scope)
            else:
                current[inside:] = [_CheckpointRun(scope, current[inside:])]
        self._trace.extend(logged)

    def _current(self):
        return self._open[-1].ran if self._open else self._ran

    def _enter_scope(self, name, metadata, position):
        scope = _ScopeRun(name, metadata)
        if position is not None:
            scope.forward, scope.start = position
        self._current().append(scope)
        self._open.append(scope)
        return scope

    def __enter__(self):
        if self._thread is not None:
            raise RuntimeError("collect_trace: this block is already entered; make a new remat.collect_trace()")
        _drain()  # what ran before the block belongs to the enclosing one, if any
        _stack().append(self)
        self._thread = threading.get_ident()
        return self

    def __exit__(self, *exc_info):
        stack = _stack()
        if self._thread != threading.get_ident() or not stack or stack[-1] is not self:
            raise RuntimeError("collect_trace: exited on another thread or out of order; collect_trace blocks nest "
                               "on the thread that enters them")
        _drain()
        stack.pop()
        if stack:
            stack[-1]._add(self._ran, self._trace)
        self._thread = None

    def _collected(self):
        if self._thread == threading.get_ident() and _stack()[-1] is self:  # still inside: what ran so far
            _drain()
        return self

    @property
    def scopes(self):
        return self._collected()._trace.scopes

    @property
    def entries(self):
        """An OpTrace per region and a ScopeTrace per trace_scope call, in forward order; a region
        run inside a trace scope is in that ScopeTrace's entries."""
        return _entries(self._collected()._ran)

    def format(self):
        """'remat trace: 2 checkpoint(s), 4 region(s)', then 'scope [layers.0]' and a
        '  attention: save' line per region; a trace scope is a line 'NAME' or 'NAME [METADATA]'
        with what ran inside it indented two more spaces."""
        self._collected()
        if all(isinstance(item, _C.CheckpointScope) for item in self._ran):
            return self._trace.format()
        header = self._trace.format().split("\n", 1)[0]
        return "\n".join([header] + _format_lines(self._ran, 0)) + "\n"

    def to_json(self):
        return self._collected()._trace.to_json()

    def __str__(self):
        return self.format()


def trace_scope(function, name, *, metadata=None):
    """torch_remat's reporting-only scope: `function` wrapped, its behaviour unchanged. While a
    collect_trace block collects on this thread (and not in recompute), each call is listed in the
    trace as a scope holding the checkpoints that ran inside it."""
    if not callable(function):
        raise RuntimeError("trace_scope expects a function as its first argument")
    checked = {"name": name} if metadata is None else {"name": name, "metadata": metadata}
    for what, text in checked.items():
        if not isinstance(text, str):
            raise RuntimeError(f"trace_scope: {what} must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError(f"trace_scope: {what} is empty")

    @functools.wraps(function)
    def scoped(*args, **kwargs):
        if torch.compiler.is_compiling() or not _stack() or _C.is_recomputing():
            return function(*args, **kwargs)
        _drain()
        block = _stack()[-1]
        run = block._enter_scope(name, metadata, _C.forward_position())
        try:
            return function(*args, **kwargs)
        finally:
            _drain()
            run.close(_C.forward_position())
            block._open.pop()

    return scoped
