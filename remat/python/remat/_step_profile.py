"""The whole step's memory, as profile_regions() measures it for plans by step peak.

The profiled step runs with every region saved. Its allocated bytes, as remat_alloc.memory_stats()
counts them (CPU tensors inside remat.tag_cpu_tensors(), CUDA tensors under
remat_alloc.install()), are cut into segments at every checkpoint's forward entry and exit, at
every region's forward entry and exit, and in backward where each checkpoint's backward begins (a
gradient hook on its outputs) and ends (one on its inputs; where the input is shared, as by
parallel branches, that hook fires only after every branch, so a call's backward also ends where
another one's begins and the runtime no longer holds all it kept; a call whose graph is retained,
backward(retain_graph=True), keeps all it kept after its backward ends: it stays live, and the
next backward begins and ends it again). Each segment keeps its peak, the bytes
allocated when it began, and which checkpoints' kept tensors are alive through it (those whose
forward is done and whose backward is not). What stays allocated through the step (parameters,
optimizer state, the batch, gradients once backward made them) is in every segment's figures as
measured, so the optimizer step's transient counts where the block includes it. The step is also
cut where its backward ends (an autograd engine callback): the segments from there on
(after_backward) ran the optimizer step and what else the loop does before the block ends, which
no plan changes; remat.fit predicts later steps from that part apart (state the optimizer made
there is allocated before every later step, and nothing there scales with the token count).

What each checkpoint keeps is recorded as sets of storages, not added up per region: the
storages each region keeps (its saved tensors and its output), the storages that are its inputs
(a saved region does not keep an input that recompute recreates: the runtime takes it from
recompute; a region's inputs include those of its checkpoint it reads without taking them,
through a closure, which the runtime notes: remat/input_reads.hpp), and the checkpoint's own inputs, each storage with
one identity for the step however many calls take it (followed by a weak reference to PyTorch's
one Python object per storage, for what regions keep too: the runtime hands over the tensors its
report lists) and another for a storage found where a freed one was. Storages held through the
whole step (Python held them when it began and they are alive when it ends: parameters, optimizer
state, a batch the caller keeps) leave every set when the step ends, as do those the step made that
are alive when it ends and that no live checkpoint keeps then (a tensor the model keeps as an
attribute, a cache it builds: held by more than the checkpoints from when they were made), and
what regions save that was allocated outside every checkpoint's
forward and that Python did not hold then (storages only C++ holds: allocated_before): they
stay allocated whatever the plan. A storage the step made (position ids, a mask) or dropped (a
batch handed to the forward alone) is the step's, kept by a checkpoint whose recompute reads it.
The inputs code outside a call's regions reads (body_inputs, noted by the runtime) are kept
wherever the plan recomputes a region of the call: recompute runs that code again. A call's
output that no later call takes counts as held by code outside the checkpoints while the call is
live; where code outside its regions made it (positions a layer hands on with its output), only
until the segment the profiled step freed it in (freed_in: a weak reference's callback says). Of what a region keeps, the storages remat.CpuOffload would
leave on the device (tensors that are not dense, parameters: the runtime's report says which) are
listed apart (offload_kept): a plan that offloads the region still holds them there. With
per-op figures (ops=True), each op a plan may keep lists the storages it made (ops), which a plan
keeping it holds from forward to backward. Of what a
region run under autocast keeps, the casts of leaves (a weight cast to bfloat16: the runtime's
report marks them leaf_cast) are listed apart too (autocast_cached): autocast's cache holds them
until its block ends, so a plan that recomputes the region still holds them until then. A segment
begins where the cache is cleared (autocast_cleared: torch.clear_autocast_cache, which autocast's
exit calls, is wrapped to say so on a thread measuring a step; inside a checkpoint's forward or
backward, where the next segment begins); where the profile saw no clear, they are held until
backward begins, or through it where it began inside the block (autocast_held_in_backward:
autocast's state in the backward's hooks is that of the thread that called backward()), where a
region recomputed after a clear makes its casts again into the cache.
A region the runtime runs again in recompute because it changes its input in place keeps its
saved tensors from forward in the profiled step, so there its backward's first ops ran before
recompute; every plan recomputes it (must_recompute), and recompute then runs first, making the
changed input again beside those ops' temporaries: each backward segment of its checkpoint call
counts that input's bytes above what it measured.
A backward run with create_graph=True (a gradient penalty: torch.autograd.grad(loss, x,
create_graph=True), then a backward through it) makes a graph of its own, which holds what the
backward's formulas read: the tensors the regions' ops saved. Where a plan recomputes a region,
those are recompute's copies, held from its call's backward on until the call keeps nothing more
(its graph was retained: a later backward recomputes again beside them, a later one with
create_graph=True holds its own copies). Such a call lists those backwards (create_graph_backwards:
for each, the segment its own backward began in and the one that whole backward ended in), and
each of its regions what its ops saved (saved: kept less the outputs no op saved and the call's
inputs, which recompute reads as they are; what stays allocated through the step included, as
recompute makes a copy of it).
A plan's step peak is then each segment's measured peak less what the plan's checkpoints do not
keep of what was alive in it, plus, in a checkpoint's backward, the largest forward transient of a
region it recomputes; remat::budget computes it (step_peak.hpp)
from the "step" object of the region-profile dump, so remat-report advise --peak predicts the same.
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
import remat_alloc

from ._extension import _C
from ._memory import tag_cpu_tensors
from ._storage_keys import storage_key, storage_of


def tensors_in(value):
    """The tensors in a value, through lists, tuples (model outputs too) and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def stored_tensors_in(value):
    """The tensors in a value whose storage PyTorch gives (not a sparse one): those a profile
    follows by storage."""
    return (t for t in tensors_in(value) if storage_of(t) is not None)


def allocated_before(resident):
    """Whether a tensor a checkpoint's report lists (a _C.ResidentTensor) was allocated outside
    every checkpoint's forward, by its storage's allocation tag: a frozen parameter's weight that a
    linear layer saves, a buffer, a constant the model holds. The checkpoint keeps a reference, but
    recomputing its regions frees none of it: it stays allocated whatever the plan, as parameters
    that take a gradient do (which the report leaves out). False where the tag is not known (no
    remat allocator returned the storage): counted as kept, as before."""
    phase = _C.allocation_phase(resident.address)
    return phase is not None and phase != "forward"


def _casts_cached():
    """Whether autocast is on, with its cast cache, in this thread: a cast of a leaf made now (a
    weight cast to bfloat16) stays in the cache until the autocast block ends."""
    return torch.is_autocast_cache_enabled() and any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda"))


_measuring = {}  # thread -> the StepRecorder measuring a step on it
_clear_autocast_cache = None  # torch.clear_autocast_cache as torch defines it, once wrapped


def _watch_autocast_clears():
    """Wraps torch.clear_autocast_cache (once) so that a step measured on the thread clearing its
    cache marks where: autocast's __exit__ calls it as its outermost block ends, freeing the casts
    the cache held. A clear on a thread measuring no step only clears, as before."""
    global _clear_autocast_cache
    if _clear_autocast_cache is not None:
        return
    _clear_autocast_cache = torch.clear_autocast_cache

    @functools.wraps(_clear_autocast_cache)
    def clear_autocast_cache():
        recorder = _measuring.get(threading.get_ident())
        if recorder is not None:
            recorder.autocast_cleared()
        _clear_autocast_cache()

    torch.clear_autocast_cache = clear_autocast_cache


def _bytes_of(gradient):
    return 0 if gradient is None else gradient.numel() * gradient.element_size()


def _storages_held():
    """Weak references to the storages of the tensors Python holds now, by (device, address): what
    was allocated before a step (parameters, optimizer state, the batch). One still alive when the
    step ends stayed allocated through it whatever the plan; one the step drops (a batch handed to
    the forward alone) is the step's, as what the step made (position ids, a mask) is."""
    held = {}
    # By type, not isinstance: some objects warn when asked their __class__
    for obj in _C.instances_among(gc.get_objects(), torch.Tensor):
        if issubclass(type(obj), FakeTensor):
            continue  # a compiled graph's stand-in (no data: asked its address, it warns of a bug)
        try:
            storage = obj.untyped_storage()
            if storage.nbytes() > 0:
                held[(str(obj.device), storage.data_ptr())] = weakref.ref(storage)
        except Exception:  # no storage: sparse, a subclass, a lazy module's uninitialized parameter, a fake tensor
            continue
    return held


# The lists of storages in a checkpoint call's record and its regions'
_STORAGE_SETS = frozenset({"inputs", "kept_inputs", "body_inputs", "outputs", "kept", "offload_kept", "autocast_cached"})


class StepRecorder:
    """The segments and storage sets of one profiled step (module docstring)."""

    def __init__(self):
        self.device = self._counted_device()
        self.enabled = self.device is not None
        self._storages = []          # id -> bytes
        self._alive = {}             # (device, data_ptr) -> id, for storages kept until backward
        self._transient = {}         # (device, data_ptr) -> id, seen in this checkpoint call only
        self.checkpoints = []        # per checkpoint call: dict(name, inputs, regions)
        self.segments = []           # dict(peak, start, live, recomputing, always)
        self._live = []              # checkpoint calls whose kept tensors are alive now
        self._recomputing = -1
        self._current = None         # the checkpoint call whose forward runs now
        self._forward = -1           # its number
        self._region_stack = []
        self._begun_calls = set()    # checkpoint calls whose backward began, in any backward
        self._kept_keys = {}         # checkpoint call -> the storages it keeps, by (device, address)
        self._remade_inputs = {}     # checkpoint call -> bytes of the inputs its regions change in place (remade)
        self._awaiting = {}          # checkpoint call -> its backward hook (weakly: alive with its graph), until it runs
        self._backward_began = False
        self._closed = False
        self.start_bytes = 0
        self.peak_bytes = 0
        self.after_backward = None   # the first segment after the last backward ended, or None
        self._end_queued = False
        self._begun = set()          # checkpoint calls whose backward began in the backward running now
        self._ended = set()          # and those whose backward ended in it
        self._retaining = None       # whether the backward running now retains the graph, once known
        self.gradient_bytes = None   # a callable: bytes of the model's gradients now (watch_gradients)
        self.segment_gradients = None  # per segment, those bytes when it began (remat.fit's steps with gradients)
        self.autocast_held_in_backward = False  # the backward began inside the autocast block
        self._gradient_hooks = []  # watch_gradients's, removed when the profile closes
        self._gradients_held = {}  # parameter -> its gradient's bytes when last seen (watch_gradients)
        self.autocast_clears = []  # the segments that begin where autocast's cache was cleared
        self._clear_pending = False  # a clear inside a checkpoint's forward or backward, not yet marked
        self._held_before = {}  # the storages Python held when the step began (_storages_held)
        self._before_ids = {}  # identity -> weak reference to its storage, held when the step began
        self._ids = {}  # id of a storage object -> (weak reference to it, its identity in the step)
        self._id_storage = {}  # identity -> weak reference to its storage object, where one was seen
        self._freed_in = {}  # identity -> the segment in which its storage was freed
        self._kept_at_end = set()  # (device, address) of what live checkpoints keep as the step ends
        self._step_inputs = {}  # checkpoint call -> {storage key: identity} of the tensors it was given
        self._body_reads = {}  # checkpoint call -> those code outside its regions read
        self._saved = {}  # checkpoint call -> per region, the storages its ops saved (what the runtime keeps)
        self._graph_made = {}  # checkpoint call -> [[its backward run with create_graph=True, where that ended], ...]

    @staticmethod
    def _counted_device():
        if torch.cuda.is_available() and torch.cuda.is_initialized() and remat_alloc.is_installed():
            return torch.cuda.current_device()
        if tag_cpu_tensors._entered > 0 and not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return 0
        return None

    def _stats(self):
        return remat_alloc.memory_stats(self.device)

    # --- segments -------------------------------------------------------------------------------

    def begin(self):
        if not self.enabled:
            return
        self._held_before = _storages_held()
        # A window of its own, not reset_peak_stats(): the peak statistics stay the user's.
        self._window = remat_alloc.PeakWindow(self.device)
        self.start_bytes = self._stats()["requested_bytes"]
        self._segment_start = self.start_bytes
        _watch_autocast_clears()
        self._thread = threading.get_ident()
        _measuring[self._thread] = self
        _C.record_input_reads(True)

    def watch_gradients(self, gradient_bytes, parameters=()):
        """Records, per segment, the bytes `gradient_bytes()` gives when it begins: the gradients
        backward has made by then, which a step beginning with them already there does not make
        again (remat.fit predicts such steps, micro-batches of gradient accumulation, from it). A
        segment ends where backward makes each of `parameters`' gradients, so that a segment makes
        at most one: such a step adds it into the one there, which it holds meanwhile."""
        if self.enabled:
            self.gradient_bytes = gradient_bytes
            self.segment_gradients = []
            self._segment_gradients_start = gradient_bytes()
            # A lazy module's parameters are made in its first forward: none is a gradient's yet
            parameters = [p for p in parameters if p.requires_grad and not torch.nn.parameter.is_lazy(p)]
            self._gradients_held = {p: _bytes_of(p.grad) for p in parameters}
            self._gradient_hooks = [p.register_post_accumulate_grad_hook(self._gradient_made) for p in parameters]

    def _gradient_made(self, parameter):
        """Backward made `parameter`'s gradient: the gradients' bytes now are those when the
        segment began and what this one changed (one gradient, not every one counted again: a
        model has thousands)."""
        if self._backward_began:
            held = _bytes_of(parameter.grad)
            now = self._segment_gradients_start + held - self._gradients_held.get(parameter, 0)
            self._gradients_held[parameter] = held
            self.mark(gradients=now)

    def mark(self, peak=None, gradients=None):
        """Ends the segment running now (its peak since the last mark, or `peak` where the caller
        took it) and starts the next (with `gradients` bytes of gradients where the caller knows
        them)."""
        if not self.enabled or self._closed:  # a backward after the profile ended is not measured
            return
        if peak is None:
            peak = self._window.take()
        now = self._stats()["requested_bytes"]
        peak = max(peak, self._segment_start, now)  # at least where it began and where it ends
        self.segments.append({"peak_bytes": peak, "start_bytes": self._segment_start, "live": list(self._live),
                              "forward": self._forward, "backward": self._recomputing})
        self.peak_bytes = max(self.peak_bytes, peak)
        self._segment_start = now
        if self._clear_pending:
            self._clear_pending = False
            self.autocast_clears.append(len(self.segments))
        if self.gradient_bytes is not None:
            self.segment_gradients.append(self._segment_gradients_start)
            if gradients is not None:
                self._segment_gradients_start = gradients
            elif self._backward_began:  # before, no gradient changed (reading them all is O(parameters))
                self._segment_gradients_start = self.gradient_bytes()

    def end(self):
        if not self.enabled:
            return
        self.mark()
        # A graph kept past the step (retain_graph) holds what its checkpoints keep: not a holder of its own
        self._kept_at_end = {(t.device, t.address) for report in _C.live_checkpoint_reports()
                             for region in report.regions for t in region.tensors}
        self.close()
        after = self.after_backward
        # Only where no checkpoint ran after it (another forward, a second backward still to come)
        if after is not None and any(s["live"] or s["forward"] >= 0 or s["backward"] >= 0
                                     for s in self.segments[after:]):
            self.after_backward = None

    def _backward_begun(self, index):
        """Checkpoint call `index`'s backward began: queues the mark where this backward ends
        (once per backward)."""
        self._begun.add(index)
        if not self._end_queued:
            self._end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)

    def _backward_ended(self):
        """The whole backward ended: the calls whose backward began in it keep nothing now, those
        whose inputs take no gradient (the first layer's, say) included."""
        self._end_queued = False
        self.mark()
        for index in self._begun:
            made = self._graph_made.get(index)
            if made and made[-1][1] is None:
                made[-1][1] = len(self.segments)
        self._live = [k for k in self._live if k not in self._begun or self._retained(k)]
        if self._recomputing in self._begun:
            self._recomputing = -1
        self._begun, self._ended, self._retaining = set(), set(), None
        self.after_backward = len(self.segments)

    def _retained(self, index):
        """Whether the runtime still holds all that call `index` kept after its backward in the
        backward running now: its graph is retained (backward(retain_graph=True)), so it keeps them
        until a later backward, which recomputes what a plan does not keep again. Asked of the
        runtime once a backward, for the first call that keeps anything: retain_graph is the whole
        backward's."""
        keys = self._kept_keys.get(index, set())
        if self._retaining is None and keys:
            frames = self._frames_held().get(self.checkpoints[index]["name"], [])
            self._retaining = any(keys <= frame for frame in frames)
        return bool(self._retaining)

    @staticmethod
    def _frames_held():
        """Checkpoint name -> the sets of (device, address) each live checkpoint frame of it holds."""
        held = {}
        for report in _C.live_checkpoint_reports():
            held.setdefault(report.checkpoint, []).append(
                {(t.device, t.address) for region in report.regions for t in region.tensors})
        return held

    def close(self):
        """Closes the peak window (after end(), or for a step abandoned by an exception)."""
        if self.enabled and not self._closed:
            self._closed = True
            self._window.close()
            for hook in self._gradient_hooks:
                hook.remove()
            self._gradient_hooks, self._gradients_held = [], {}
            if _measuring.get(self._thread) is self:
                del _measuring[self._thread]
            if threading.get_ident() == self._thread:
                _C.record_input_reads(False)

    def autocast_cleared(self):
        """Autocast's cache is being cleared on this thread (its outermost block ends): the casts it
        held are freed from here, whatever a plan recomputes, so a segment begins here. Inside a
        checkpoint's forward or backward, whose segments the step model counts (a region's forward
        is its call's segment 2r + 1), the clear is marked where the next segment begins: the casts
        are counted until then."""
        if self.enabled and not self._closed and self.checkpoints:
            self._clear_pending = True
            if self._forward == -1 and self._recomputing == -1:
                self.mark()

    def backward_pending(self):
        """The checkpoint calls whose backward is still to come where the step's backward has not
        begun: forward done, their graph alive (a forward whose loss was dropped has no backward to
        come; once backward began, a call it does not reach, an output the loss does not use, has none)."""
        if self._backward_began:
            return []
        return [self.checkpoints[index]["name"] for index, hook in self._awaiting.items() if hook() is not None]

    @property
    def backward_began(self):
        """Whether a backward reached any checkpoint call of the step."""
        return self._backward_began

    def backward_missing(self):
        """Why the step's backward was not measured, or None: checkpoint calls awaited one and none
        ran (the loss dropped: a skipped batch), or the backward raised before it ended (the engine
        runs the callback that marks its end only on success)."""
        if not self.enabled:
            return None
        if not self._backward_began:
            return "it ran no backward (its loss was dropped: a skipped batch?)" if self._awaiting else None
        if self._end_queued:
            return "its backward raised before it ended"
        return None

    # --- storages -------------------------------------------------------------------------------

    def _held_at_begin(self, identity, key, storage=None):
        """Notes that the storage at `key` (`storage` where known) has `identity`, where Python held
        it when the step began: whether it stays allocated through the step is known at its end."""
        held = self._held_before.get(key)
        if held is not None and held() is not None and (storage is None or held() is storage):
            self._before_ids[identity] = held

    def _stayed(self):
        """The identities of storages no plan keeps or frees: allocated through the whole step (held
        when it began and alive when it ended), or from where the step made them on, held by more
        than the checkpoints (alive when it ended, which no checkpoint keeps then: a tensor the
        model keeps as an attribute, a cache it builds)."""
        stayed = {identity for identity, held in self._before_ids.items() if held() is not None}
        for identity, seen in self._id_storage.items():
            storage = seen()
            if storage is not None and (str(storage.device), storage.data_ptr()) not in self._kept_at_end:
                stayed.add(identity)
        return stayed

    def _storage_id(self, tensor, *, keep):
        """The storage's identity in the step: one for its whole life, whichever calls take it (a
        mask every layer is given), and another for a storage later found at a freed one's address."""
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        known = self._ids.get(id(storage))
        if known is not None and known[0]() is storage:
            self._place(key, known[1], keep)
            return known[1]
        found = self._alive.get(key, self._transient.get(key))
        if found is not None and found in self._id_storage and self._id_storage[found]() is not storage:
            found = None  # that storage was freed and its address is used again
        if found is None:
            self._storages.append(storage.nbytes())
            found = len(self._storages) - 1
            self._held_at_begin(found, key, storage)
        self._place(key, found, keep)
        self._follow(found, storage)
        return found

    def _follow(self, identity, storage):
        """Follows the storage object of `identity` (PyTorch's one Python object per storage, alive
        while the storage is) by a weak reference: whether it was freed, and where."""
        if identity not in self._id_storage:
            self._id_storage[identity] = weakref.ref(storage, functools.partial(self._storage_freed, identity))
        self._ids[id(storage)] = (self._id_storage[identity], identity)

    def _place(self, key, identity, keep):
        """Maps the address `key` to `identity`: among the storages kept until backward where `keep`
        or where it is one already, else among this checkpoint call's."""
        if keep or self._alive.get(key) == identity:
            self._alive[key] = identity
        else:
            self._transient[key] = identity

    def _was_freed(self, identity):
        """Whether the storage `identity` was seen as a tensor and has been freed since."""
        seen = self._id_storage.get(identity)
        return seen is not None and seen() is None

    def _storage_freed(self, identity, _reference):
        """Storage `identity` was freed, in the segment running now (what code outside the
        checkpoints hands on, positions a layer returns with its output, is held until then)."""
        if not self._closed:
            self._freed_in[identity] = len(self.segments)

    def storage_bytes(self):
        return list(self._storages)

    # --- checkpoints and regions (called by profile_regions while the block runs) ---------------

    def checkpoint_forward(self, name, args, kwargs, call):
        if not self.enabled:
            return call(), None
        self._transient = {}
        # Each storage it is given; those allocated through the whole step (parameters, a batch the
        # caller holds) leave every set when the step ends (_stayed): a plan keeps or frees none.
        index = len(self.checkpoints)
        self._step_inputs[index] = {storage_key(t): self._storage_id(t, keep=False)
                                    for t in stored_tensors_in((args, kwargs))}
        record = {"name": name, "inputs": sorted(set(self._step_inputs[index].values())), "kept_inputs": [],
                  "body_inputs": [], "regions": []}
        self.checkpoints.append(record)
        self.mark()
        self._note_reads()  # the code running it: the checkpoint or region around it, if any
        self._body_reads[index] = set()
        outer = self._current, self._forward
        self._current, self._forward = record, index
        try:
            out = call()
            self._note_reads()
        finally:
            self._current, self._forward = outer
        record["body_inputs"] = sorted(self._body_reads.pop(index))
        self.mark()
        return out, index

    def _note_reads(self):
        """Takes the inputs of the checkpoint call running now that ops read since the last take
        (the runtime notes them by storage address): a read inside one of its regions is that
        region's input (a closure's, where the region does not take it), and one outside its
        regions is kept wherever the plan recomputes one of them (recompute runs that code again)."""
        reads = _C.take_input_reads()
        if not reads or self._forward < 0:
            return
        made = {address: identity for (_, address), identity in self._step_inputs.get(self._forward, {}).items()}
        read = {made[address] for address in reads if address in made}
        if len(self._region_stack) == 1:
            self._region_stack[-1]["_inputs"].update(read)
        elif not self._region_stack:
            self._body_reads.setdefault(self._forward, set()).update(read)

    def checkpoint_kept(self, index, reports, tensors, args, kwargs, out, rerun=None):
        """After checkpoint call `index`'s forward: what each region keeps (from the runtime's
        report, whose tensors, in its order, are `tensors`), and the backward hooks that cut its
        backward into its own segment. `rerun`: region -> why the runtime runs it again in recompute
        (the report's rerun_regions); such a region keeps none of its outputs, and one that changes
        its input in place makes that input again in recompute (module docstring)."""
        rerun = rerun or {}
        if index is None:
            return
        storages = [storage_of(t) for t in tensors]  # None for a sparse one
        record = self.checkpoints[index]
        # What its regions keep that was allocated outside every checkpoint's forward and that Python
        # did not hold when the step began (storages only C++ holds) is allocated whatever the plan;
        # what it held then is known when the step ends (_stayed)
        inputs = self._step_inputs.get(index, {})
        held_anyway = {(t.device, t.address) for region in reports for t in region.tensors
                       if (t.device, t.address) not in inputs and (t.device, t.address) not in self._held_before
                       and allocated_before(t)}
        kept_by_region = {}
        saved_by_region = {}  # what its ops saved: not what the runtime keeps of its outputs ("output.N")
        staying = {}  # region -> storages the offloader would leave on the device
        casts = {}  # region -> storages that are casts of leaves (ResidentTensor.leaf_cast)
        listed = iter(storages)
        for region in reports:
            ids = set()
            for t in region.tensors:
                key, storage = (t.device, t.address), next(listed)
                if key in held_anyway:
                    continue
                if key not in self._alive or self._was_freed(self._alive[key]):  # none, or a freed one's
                    found = self._transient.get(key)
                    if found is None or self._was_freed(found):
                        self._storages.append(t.bytes if not t.shares_storage else 0)
                        found = len(self._storages) - 1
                        self._held_at_begin(found, key, storage)
                    self._alive[key] = found
                if storage is not None:
                    self._follow(self._alive[key], storage)
                ids.add(self._alive[key])
                if not t.name.startswith("output."):
                    saved_by_region.setdefault(region.region, set()).add(self._alive[key])
                if not getattr(t, "offloadable", True):
                    staying.setdefault(region.region, set()).add(self._alive[key])
                if t.leaf_cast:
                    casts.setdefault(region.region, set()).add(self._alive[key])
                if not t.shares_storage:
                    self._storages[self._alive[key]] = max(self._storages[self._alive[key]], t.bytes)
            kept_by_region[region.region] = ids
        # (Recompute makes a copy of each but the call's inputs, even of one Python holds through the step)
        given = set(inputs.values())
        self._saved[index] = [sorted(saved_by_region.get(region["name"], set()) - given) for region in record["regions"]]
        self._kept_keys[index] = {(t.device, t.address) for region in reports for t in region.tensors
                                  if (t.device, t.address) not in held_anyway}
        record["kept_inputs"] = sorted(kept_by_region.get("<inputs>", set()) & set(record["inputs"]))
        kept_by_call = set().union(*kept_by_region.values())
        # A call none of whose outputs takes a gradient (a frozen first layer) has no backward: it
        # keeps nothing past its forward, and no plan changes what it holds
        has_backward = any(t.requires_grad for t in tensors_in(out))
        for region in record["regions"]:
            outputs = region.pop("_outputs")
            # A region the runtime runs again in recompute (it changed its input in place, or its
            # output was changed in place after it returned) keeps its saved tensors but none of its
            # outputs, which are freed after forward unless the call keeps them for another region
            # (one that saved it): only those count as kept, and as what its recompute makes again
            kept = set() if not has_backward else outputs & kept_by_call if region["name"] in rerun else outputs
            region["kept"] = sorted(kept_by_region.get(region["name"], set()) | kept)
            if rerun.get(region["name"], "").startswith("it changes its input"):
                self._remade_inputs[index] = self._remade_inputs.get(index, 0) + \
                    sum(self._storages[i] for i in region["_inputs"])
            region["inputs"] = sorted(region.pop("_inputs"))
            region["outputs"] = sorted(outputs)
            if staying.get(region["name"]):
                region["offload_kept"] = sorted(staying[region["name"]])
            if region.get("_ops"):
                region["ops"] = region.pop("_ops")
            # Run under autocast, a cast of a leaf stays in its cache until the autocast block ends
            if region.pop("_casts_cached") and casts.get(region["name"]):
                region["autocast_cached"] = sorted(casts[region["name"]])
        record["outputs"] = sorted({self._storage_id(t, keep=True) for t in stored_tensors_in(out)})
        if has_backward:
            self._live.append(index)
        outputs = [t for t in tensors_in(out) if t.requires_grad]
        inputs = [t for t in tensors_in((args, kwargs)) if t.requires_grad]
        if outputs:
            output_keys = {storage_key(t) for t in stored_tensors_in(out)}

            def backward_begins(grad):
                if index not in self._begun:  # once a backward: a retained graph's next backward begins it again
                    self._awaiting.pop(index, None)
                    if not self._backward_began:
                        # Autocast's state is the thread's where backward() was called
                        self.autocast_held_in_backward = _casts_cached()
                    self._backward_began = True
                    self.mark()
                    if torch.is_grad_enabled():  # backward(create_graph=True)
                        self._graph_made.setdefault(index, []).append([len(self.segments), None])
                    self._end_finished_backwards(index, output_keys)
                    self._begun_calls.add(index)
                    self._recomputing = index
                self._backward_begun(index)
                return grad

            for t in outputs:
                t.register_hook(backward_begins)
            self._awaiting[index] = weakref.ref(backward_begins)

            def backward_ends(grad):
                if index in self._live and index not in self._ended:
                    self.mark()
                    self._ended.add(index)
                    if not self._retained(index):
                        self._live.remove(index)
                    if self._recomputing == index:  # the call before may have begun on the same tensor
                        self._recomputing = -1
                return grad

            for t in inputs:
                t.register_hook(backward_ends)

    def _end_finished_backwards(self, index, outputs):
        """Call `index`'s backward begins: a call whose backward began before and whose inputs are
        not this call's outputs (parallel branches on one input: its input hooks fire only once every
        branch has given its gradient) keeps nothing now where the runtime no longer holds all that it
        kept (its backward ran, in full or in part): it leaves the live calls, so that no plan
        counts its storages as alive here. A call that holds all of it is still to run its backward."""
        others = [k for k in self._live if k != index and k in self._begun_calls
                  and not (self._step_inputs.get(k, {}).keys() & outputs)]
        if not others:
            return
        held = self._frames_held()
        for k in others:
            keys = self._kept_keys.get(k, set())
            if not any(keys <= frame for frame in held.get(self.checkpoints[k]["name"], [])):
                self._live.remove(k)
                if self._recomputing == k:
                    self._recomputing = -1

    def region_forward(self, name, args, call):
        """Runs one region's forward (every region is saved while profiling) and records its
        inputs, its outputs and its forward transient: the peak inside it over what is allocated
        when it returns."""
        if not self.enabled or self._current is None or self._region_stack:
            return call()
        record = {"name": name, "_inputs": {self._storage_id(t, keep=False) for t in stored_tensors_in(args)},
                  "_outputs": set(), "transient_bytes": 0, "_casts_cached": _casts_cached()}
        # the key order the dump writes: name, kept, inputs, outputs, transient_bytes
        self._current["regions"].append(record)
        self.mark()
        self._note_reads()
        self._region_stack.append(record)
        try:
            out = call()
            self._note_reads()
        finally:
            self._region_stack.pop()
        peak = self._window.take()
        record["transient_bytes"] = max(0, peak - self._stats()["requested_bytes"])
        record["_outputs"] = {self._storage_id(t, keep=True) for t in stored_tensors_in(out)}
        self.mark(peak)
        return out

    def op_made(self, index, out):
        """Op `index` of the region running now made `out` (ops=True; the op meter lists it): each
        of its storages takes an identity of its own, which a later region's input or a kept tensor
        at that address then takes. A storage at the address of one taken before is a new one (the
        one before was freed), so a per-op plan keeping two ops counts both."""
        if not self.enabled or not self._region_stack:
            return
        ids = []
        for tensor in stored_tensors_in(out):
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0:
                continue
            key = (str(tensor.device), storage.data_ptr())
            self._alive.pop(key, None)
            self._storages.append(storage.nbytes())
            self._transient[key] = len(self._storages) - 1
            ids.append(self._transient[key])
        self._region_stack[-1].setdefault("_ops", []).append({"index": index, "outputs": sorted(set(ids))})

    def _checkpoints_without(self, stayed):
        """The checkpoint calls' sets without the storages in `stayed`."""
        def without(ids):
            return [i for i in ids if i not in stayed]

        def region_without(region):
            kept = {key: without(value) if key in _STORAGE_SETS else value for key, value in region.items()}
            if "ops" in region:
                kept["ops"] = [dict(op, outputs=without(op["outputs"])) for op in region["ops"]]
            return kept

        return [{key: (without(value) if key in _STORAGE_SETS else
                       [region_without(r) for r in value] if key == "regions" else value)
                 for key, value in call.items()} for call in self.checkpoints]

    def _note_graphs_made(self):
        """Marks each call whose backward ran with create_graph=True, and what its regions' ops saved:
        the graph that backward makes holds recompute's copies of them (module docstring)."""
        for index, made in self._graph_made.items():
            ended = [backward for backward in made if backward[1] is not None]  # (else it raised: refused)
            if ended:
                record = self.checkpoints[index]
                record["create_graph_backwards"] = ended
                for region, saved in zip(record["regions"], self._saved[index]):
                    region["saved"] = saved

    def to_dump(self, end_bytes):
        self._note_graphs_made()
        # A clear marked where the step's last segment ended begins none
        cleared = [s for s in self.autocast_clears if s < len(self.segments)]
        # Freed once the last segment had ended (as the step's last mark was taken): through every segment
        freed_in = [segment if segment < len(self.segments) else -1
                    for segment in (self._freed_in.get(i, -1) for i in range(len(self._storages)))]
        freed = {"freed_in": freed_in} if any(segment >= 0 for segment in freed_in) else {}
        segments = [dict(segment, peak_bytes=segment["peak_bytes"] + self._remade_inputs[segment["backward"]])
                    if segment["backward"] in self._remade_inputs else segment for segment in self.segments]
        return {"start_bytes": self.start_bytes, "end_bytes": end_bytes, "peak_bytes": self.peak_bytes,
                "storages": self.storage_bytes(), **freed, "checkpoints": self._checkpoints_without(self._stayed()),
                "segments": segments,
                **({"autocast_cleared": cleared} if cleared else {}),
                **({"autocast_held_in_backward": True} if self.autocast_held_in_backward else {})}
