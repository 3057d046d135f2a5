"""Per-op figures: each ATen op a region runs, measured in the profiled step.

While profile_regions() measures a region's forward, a TorchDispatchMode (below autograd, so it
sees the ATen ops autograd runs, matmuls and elementwise ops alike) numbers every op the region
runs and times it with the thread's CPU time (CUDA events on a GPU). An op whose output a plan
could keep while the region recomputes is listed with its index, its name ("aten::mm",
"aten::add.Tensor"), its outputs' bytes (each storage once) and its time: functional ops whose
outputs are new storages. Not listed: ops that write into a tensor (in-place, out=), ops whose
outputs are views of their inputs (nothing to keep, nothing to spare; not numbered either: the
runtime's saved-tensor hooks run some, differently in a saved region and a recomputed one), random
ops (keeping one would skip its draw in recompute and move every later draw of the region), and
ops whose output a later op of the region writes into (`q = x @ w; q.mul_(0.5)`: kept, recompute
would have to run it again, so a plan keeping it would keep its bytes and spare nothing; the
runtime runs it again all the same, remat/kept_ops.hpp).

The same watch finds what makes a region unsafe to recompute (in every region whose code saves
it, and with per-op figures in every region): an op that draws from a torch.Generator of the
region's own (recompute would draw other numbers; the RNG state hooks restore the default
generators only), or one that writes in place into a tensor the region did not make, its inputs
aside and the buffers the checkpoint gives back to recompute as forward read them (a cache, a
buffer of a module its function does not reach: recompute would write it again; writes_outside,
which profile_regions makes must_save where the code saves the region and must_recompute where
the code recomputes it, so the writes happen as the code makes them), or one run by
a backward inside the region's forward (torch.autograd.grad for a gradient penalty: recomputed,
the region drops what that backward reads as it is saved). It also notes what the region's ops
read that it did not make, and tells each write into outside state: profile_regions marks a
region that read a tensor a later region writes in place (a memory bank) too, since its recompute
would read the changed values. A plan saves such a region (the profile's "must_save"). A write
into an input is the runtime's to judge: it runs a saved region that changed its input again in
recompute (the profile's "must_recompute").

The ops at a region's end that its recompute never runs are found from the same watch
(recompute_tail): recompute stops once the last tensor backward needs is saved again, and an op
saves its inputs before it runs, so after the last op whose output the checkpoint keeps for
backward, the last op that reads a tensor made before those ops (the one that may save it) and
every op after it do not run. profile_regions applies it to a checkpoint's last region alone,
where no later region can need more, and only where recompute stops inside it (a node follows
the region, and none after it saves a tensor).

Watching ops costs time of its own: the mode's time around each op, and what a mode that only
passes ops on costs per op (calibrated once per process on a tiny op), are taken out of the
region's seconds. What carrying out kept ops costs a run of the region (_kept_ops.keeping_seconds:
a cost per run and one per op it runs, calibrated likewise) is its op_overhead_seconds, which a
plan that keeps ops of it pays in forward and again in recompute (remat/budget/op_plan.hpp).
"""

from __future__ import annotations

import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._extension import _C
from ._storage_keys import storage_key, storage_of

__all__ = ["OpMeter", "op_name", "keepable", "numbered", "interception_seconds", "describe_tensor"]

_interception = None  # seconds one op costs under a mode that only passes it on


def op_name(func):
    """The op's name as plans write it: "aten::mm", "aten::add.Tensor"."""
    schema = func._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


_keepable = {}
_views = {}


def is_view(func):
    """Whether the op returns views of its inputs and writes nothing (detach, view, transpose):
    such ops are not numbered. They cost nothing to run again, and the runtime's own saved-tensor
    hooks run some (detach) while autograd saves a tensor, so their count differs between a saved
    region and a recomputed one."""
    known = _views.get(func)
    if known is None:
        schema = func._schema
        known = (not schema.is_mutable and bool(schema.returns)
                 and all(r.alias_info is not None for r in schema.returns))
        _views[func] = known
    return known



_numbered = {}


def numbered(func):
    """Whether the op takes an index among the region's ops: not a view (is_view), and not a
    dtype or device copy (aten::_to_copy), which autocast runs for a weight in the first region
    that casts it and takes from its cache after, so forward and recompute run different numbers
    of them. Known once per op: the kept-ops modes ask it of every op a region runs."""
    known = _numbered.get(func)
    if known is None:
        known = _numbered[func] = func is not torch.ops.aten._to_copy.default and not is_view(func)
    return known


def keepable(func):
    """Whether a plan may keep the op's outputs: functional, not random, outputs not views, of a
    size that does not depend on the values (aten::nonzero, a boolean mask's index: keeping one
    would keep another size on another batch than the profile measured)."""
    known = _keepable.get(func)
    if known is None:
        schema = func._schema
        known = (not schema.is_mutable and bool(schema.returns)
                 and all(r.alias_info is None for r in schema.returns)
                 and torch.Tag.nondeterministic_seeded not in func.tags
                 and torch.Tag.dynamic_output_shape not in func.tags)
        _keepable[func] = known
    return known


def output_storages(out, inputs):
    """{storage key: bytes} of the op's tensor outputs that are new storages (not its inputs')."""
    if isinstance(out, torch.Tensor):
        out = (out,)
    if not isinstance(out, (tuple, list)):
        return None
    storages = {}
    for tensor in out:
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            return None
        storage = storage_of(tensor)
        if storage is None:  # sparse: no storage to keep
            return None
        key = (str(tensor.device), storage.data_ptr())
        if key in inputs:
            return None
        storages[key] = storage.nbytes()
    return storages


def _written(func, args, kwargs):
    """The tensors the op writes into (in place, out=)."""
    schema = func._schema
    if not schema.is_mutable:
        return []
    written = []
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) and not argument.kwarg_only else kwargs.get(argument.name)
        written.extend(t for t in (value if isinstance(value, (list, tuple)) else (value,))
                       if isinstance(t, torch.Tensor))
    return written


def _output_keys(out):
    return {storage_key(t) for t in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(t, torch.Tensor)} - {None}


def _input_keys(args, kwargs):
    keys = set()
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            keys.add(storage_key(value))
        elif isinstance(value, (list, tuple)):
            keys.update(storage_key(t) for t in value if isinstance(t, torch.Tensor))
    return keys - {None}


class _PassOn(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def interception_seconds():
    """What one op costs under a mode that only passes it on, over the op alone (calibrated once
    per process: the median of 9 rounds of 200 calls of a one-element add)."""
    global _interception
    if _interception is None:
        a, b = torch.ones(1), torch.ones(1)
        rounds = []
        for _ in range(9):
            start = time.thread_time_ns()
            for _ in range(200):
                torch.add(a, b)
            bare = time.thread_time_ns() - start
            with _PassOn():
                start = time.thread_time_ns()
                for _ in range(200):
                    torch.add(a, b)
                watched = time.thread_time_ns() - start
            rounds.append(max(0, watched - bare) / 200 / 1e9)
        _interception = sorted(rounds)[len(rounds) // 2]
    return _interception


def _default_generators():
    generators = {id(torch.default_generator)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        generators.update(id(g) for g in torch.cuda.default_generators)
    return generators


def describe_tensor(tensor):
    return f"a {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')} tensor"


class OpMeter(TorchDispatchMode):
    """Numbers, times and sizes the ops of one region's forward (module docstring), telling
    on_op(index, outputs) of each op it lists (the step's record of what the op made). After the
    block: ops (the keepable ones, as the region-profile dump lists them; figures=True), count
    (the numbered ops), intercepted (every op the mode saw, views and copies included),
    own_seconds (the meter's time around the ops, to take out of the region's), must_save (why
    the region's recompute would not give back what its forward gave, or None), writes_outside
    (why its recompute would write outside state again, or None)."""

    def __init__(self, cuda=False, figures=True, on_op=None, on_outside_write=None):
        super().__init__()
        self._on_op = on_op  # called with (index, outputs) for each op listed in ops
        # called with (tensor, op name) for each write into a tensor the region did not make, its inputs aside
        self._on_outside_write = on_outside_write
        self.reads = {}  # storage key -> weak reference to the storage, of what its ops read that it did not make
        self._read_versions = {}  # id -> (weak reference, version when read) of tensors read that it did not make
        self.ops = []
        self.count = 0
        self.intercepted = 0
        self.own_seconds = 0.0
        self.must_save = None
        self.writes_outside = None  # why its recompute would write outside state again (the first such write)
        self._cuda = cuda
        self._figures = figures
        self._made = set()  # storage keys of what the region's ops made
        self._listed = {}  # storage key -> the entry in ops whose output it is
        self._inputs = set()  # storage keys of the region's inputs (takes_inputs)
        self._defaults = _default_generators()
        self._events = []  # (entry in ops, start event, end event) on CUDA
        self._flow = []  # figures=True: (index or None, input keys, output keys) of each op not a view, in order
        self.records_decisions = False  # whether the region consulted a RecomputeReplay channel recording

    def _check(self, func, args, kwargs):
        """Sets must_save where the op runs in a backward inside the region's forward, draws from a
        generator of its own or writes into a tensor the region did not make (each such write told
        to on_outside_write)."""
        if self.must_save is None and torch._C._current_autograd_node() is not None:
            self.must_save = (f"it runs a backward inside its forward ({op_name(func)} in it: torch.autograd.grad or "
                              ".backward(), as for a gradient penalty), which reads what the forward saved while it "
                              "still runs; recomputed, the region drops that as it is saved")
        generator = kwargs.get("generator")
        if generator is not None and id(generator) not in self._defaults and self.must_save is None:
            self.must_save = (f"it draws from a torch.Generator of its own ({op_name(func)}), which recompute "
                              f"would draw from again")
        for tensor in _written(func, args, kwargs):
            # a sparse tensor (no storage key) cannot be told made here: taken as not
            if storage_key(tensor) in self._made | self._inputs:
                continue
            # (a buffer the checkpoint gives back to recompute as forward read it is written once)
            if self.writes_outside is None and not _C.given_back_to_recompute(tensor):
                self.writes_outside = (f"it writes in place into a tensor it did not make ({op_name(func)} into "
                                       f"{describe_tensor(tensor)}: a cache, a buffer of a module the checkpoint's "
                                       f"function does not reach), which recompute would write again")
            if self._on_outside_write is not None:
                self._on_outside_write(tensor, op_name(func))

    def _note_reads(self, func, args, kwargs):
        """Notes the storages the op reads that the region did not make: a later write into one
        (on_outside_write) makes this region's recompute read other values than its forward did. A
        tensor the op writes is not noted (a BatchNorm's running statistics in training: its output
        does not depend on them)."""
        written = {id(t) for t in _written(func, args, kwargs)} if func._schema.is_mutable else ()
        for value in (*args, *kwargs.values()):
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(tensor, torch.Tensor) or id(tensor) in written:
                    continue
                storage = storage_of(tensor)
                if storage is None:
                    continue
                key = (str(tensor.device), storage.data_ptr())
                if key in self._made:
                    continue
                if key not in self.reads:
                    self.reads[key] = weakref.ref(storage)
                seen = self._read_versions.get(id(tensor))
                if key not in self._inputs and (seen is None or seen[0]() is not tensor):  # (an id used again)
                    self._read_versions[id(tensor)] = (weakref.ref(tensor), tensor._version)

    def __exit__(self, *exc):
        # What it read, as its forward left it: a change the region made itself is no later change
        self._read_versions = {key: (reference, reference()._version)
                               for key, (reference, _) in self._read_versions.items() if reference() is not None}
        return super().__exit__(*exc)

    def changed_since_read(self):
        """A tensor the region's ops read (not one it made, nor an input) whose version changed
        since its forward ended, still alive, or None."""
        for reference, version in self._read_versions.values():
            tensor = reference()
            if tensor is not None and tensor._version != version:
                return tensor
        return None

    def read_before(self, tensor):
        """Whether the region's ops read `tensor`'s storage (not one it made) before now."""
        storage = storage_of(tensor)
        seen = None if storage is None else self.reads.get((str(tensor.device), storage.data_ptr()))
        return seen is not None and seen() is storage

    def _unlist_written(self, func, args, kwargs):
        """Takes out of ops the listed ops whose outputs this op writes into (module docstring)."""
        for tensor in _written(func, args, kwargs):
            entry = self._listed.pop(storage_key(tensor), None)
            if entry is not None and entry in self.ops:
                self.ops.remove(entry)

    def takes_inputs(self, tensors):
        """The region's inputs: a write into one is no write into outside state. The runtime makes
        it again where recompute makes the input again (a saved region then runs again in recompute,
        the profile's "must_recompute"), and refuses it where recompute cannot."""
        self._inputs.update(storage_key(tensor) for tensor in tensors)
        self._inputs.discard(None)

    def _made_by(self, out):
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            key = storage_key(tensor) if isinstance(tensor, torch.Tensor) else None
            if key is not None:
                self._made.add(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        entered = time.thread_time_ns()
        kwargs = kwargs or {}
        self._note_reads(func, args, kwargs)
        if self.must_save is None or (func._schema.is_mutable and (
                self.writes_outside is None or self._on_outside_write is not None)):
            self._check(func, args, kwargs)
        if self._listed and func._schema.is_mutable:
            self._unlist_written(func, args, kwargs)
        self.intercepted += 1
        if not numbered(func) or not self._figures or not keepable(func):
            index = None
            if numbered(func):
                index = self.count
                self.count += 1
            inputs = _input_keys(args, kwargs) if self._figures and not is_view(func) else None
            started = time.thread_time_ns()
            out = func(*args, **kwargs)
            finished = time.thread_time_ns()
            if not is_view(func):  # a view of outside state is no tensor the region made
                self._made_by(out)
                if inputs is not None:
                    self._flow.append((index, inputs, _output_keys(out)))
            self.own_seconds += (started - entered + time.thread_time_ns() - finished) / 1e9
            return out
        index = self.count
        self.count += 1
        inputs = _input_keys(args, kwargs)
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        started = time.thread_time_ns()
        out = func(*args, **kwargs)
        finished = time.thread_time_ns()
        if self._cuda:
            end.record()
        self._made_by(out)
        self._flow.append((index, inputs, _output_keys(out)))
        storages = output_storages(out, inputs)
        if storages:
            entry = {"index": index, "op": op_name(func), "bytes": sum(storages.values()),
                     "seconds": (finished - started) / 1e9}
            self.ops.append(entry)
            self._listed.update(dict.fromkeys(storages, entry))
            if self._on_op is not None:
                self._on_op(index, out)
            if self._cuda:
                self._events.append((entry, start, end))
        self.own_seconds += (started - entered + time.thread_time_ns() - finished) / 1e9
        return out

    def recompute_tail(self, kept):
        """The indices of the numbered ops at the region's end that its recompute does not run,
        where recompute stops inside the region (the caller's to know): `kept` holds the
        storage keys the checkpoint keeps for backward. An op saves its inputs before it runs
        and its outputs after, and recompute stops once the last needed tensor is saved again.
        After the last op whose output is kept, an op reading only what those ops made saves
        nothing (what it would save would be kept), so the last op reading an older tensor is
        the last that may save, before it runs: it and the ops after it do not run. Ops in the
        region that the watch did not see (views) change no storage."""
        last_made = max((position for position, (_, _, outputs) in enumerate(self._flow) if outputs & kept),
                        default=-1)
        made_after, last_reader = set(), None
        for position in range(last_made + 1, len(self._flow)):
            _, inputs, outputs = self._flow[position]
            if inputs - made_after:
                last_reader = position
            made_after |= outputs
        first = last_made + 1 if last_reader is None else last_reader
        return {index for index, _, _ in self._flow[first:] if index is not None}

    def finish(self):
        """The ops' seconds from their CUDA events (after a synchronize), where timed so."""
        for entry, start, end in self._events:
            entry["seconds"] = start.elapsed_time(end) / 1000.0
        self._events.clear()
