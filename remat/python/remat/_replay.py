"""Record and replay of forward decisions across recompute, with NeMo AutoModel's API.

Some work inside a checkpoint is a decision that recompute would reproduce bit for bit but
that costs real time (a frozen router's top-k, a dispatch layout). A channel,
RecomputeReplay(name), lets forward record such decisions and recompute take them back in
order, falling back to computing them when the log runs out (a miss). Each checkpoint call gets
its own RecomputeReplayRecorder, and the binding of a recorder to a channel is per thread. The
channel, its recorders and bindings live in the C++ runtime (remat._C); this module adds
checkpoint_context_fn(), the context factory for torch.utils.checkpoint's context_fn (and
remat.checkpoint's), which composes with another factory such as selective activation
checkpointing's.
"""

import contextlib
import threading
import types

from ._extension import _C
from ._arguments import name_arg

__all__ = ["RecomputeReplay", "RecomputeReplayRecorder", "recording_consults"]

_consults = threading.local()


def recording_consults():
    """How many times code on this thread has consulted a channel bound for recording (current()
    returning a "record" binding, record_or_replay under one). A region whose forward consulted
    one may record a decision that recompute takes back instead of running its ops again, so
    recompute runs fewer ops than forward: per-op plans keep no op of such a region."""
    return getattr(_consults, "count", 0)


def _note(bound):
    if bound is not None and bound[1] == "record":
        _consults.count = recording_consults() + 1
    return bound

RecomputeReplayRecorder = _C.RecomputeReplayRecorder
# NeMo's classes are generic in what they record: `RecomputeReplay[torch.Tensor]` in an
# annotation evaluated at import time must work here too.
RecomputeReplayRecorder.__class_getitem__ = classmethod(types.GenericAlias)


class _Bound:
    """One side of a checkpoint call: binds the call's recorder in `mode` around the inner
    context. Re-enterable, so a second recompute (retain_graph=True) replays again."""

    __slots__ = ("_channel", "_recorder", "_mode", "_inner", "_on_record_exit", "_scopes")

    def __init__(self, channel, recorder, mode, inner, on_record_exit=None):
        self._channel = channel
        self._recorder = recorder
        self._mode = mode
        self._inner = inner
        self._on_record_exit = on_record_exit
        self._scopes = []

    def __enter__(self):
        if self._mode == "replay":
            self._recorder.rewind()
        scope = self._channel.scope(self._recorder, self._mode)
        scope.__enter__()
        try:
            self._inner.__enter__()
        except BaseException:
            scope.__exit__(None, None, None)
            raise
        self._scopes.append(scope)
        return self

    def __exit__(self, *exc_info):
        scope = self._scopes.pop()
        try:
            suppressed = self._inner.__exit__(*exc_info)
            if self._on_record_exit is not None and exc_info[0] is None:
                self._on_record_exit(self._recorder)
        finally:
            scope.__exit__(None, None, None)
        return suppressed


class RecomputeReplay(_C.RecomputeReplay):
    """A named record/replay channel. Where a decision is made, consult current(): under
    "record" record the fresh decision, under "replay" take() the stored one; or let
    record_or_replay(compute) do both. Bind it to checkpoints with
    context_fn=channel.checkpoint_context_fn() (torch.utils.checkpoint or remat.checkpoint) or
    remat.checkpoint(contexts=[channel])."""

    __class_getitem__ = classmethod(types.GenericAlias)

    def __init__(self, name):
        super().__init__(name_arg("RecomputeReplay", "name", name))

    def current(self):
        return _note(super().current())

    def record_or_replay(self, compute):
        self.current()
        return super().record_or_replay(compute)

    def checkpoint_context_fn(self, context_fn=None, *, on_record_exit=None):
        """A context factory for checkpoint(..., context_fn=...) giving every checkpoint call a
        fresh recorder: recorded into in forward, rewound and replayed in recompute. `context_fn`,
        another factory of (forward, recompute) contexts, is entered inside; `on_record_exit(recorder)`
        runs after the forward context exits."""
        if context_fn is not None and not callable(context_fn):
            raise TypeError(f"checkpoint_context_fn: context_fn must be callable or None, got {type(context_fn).__name__}")
        if on_record_exit is not None and not callable(on_record_exit):
            raise TypeError("checkpoint_context_fn: on_record_exit must be callable or None, got "
                            f"{type(on_record_exit).__name__}")

        def context_factory():
            forward, recompute = (context_fn() if context_fn is not None
                                  else (contextlib.nullcontext(), contextlib.nullcontext()))
            recorder = RecomputeReplayRecorder()
            return (_Bound(self, recorder, "record", forward, on_record_exit),
                    _Bound(self, recorder, "replay", recompute))

        return context_factory
