"""profile_regions(): one training step measured, region by region, for budget plans (_plans).

While the block runs, every checkpoint on this thread saves every region, and the profile records
what each region keeps (its saved bytes, each storage once), its forward time (the timer chosen),
what the checkpoints keep with every region recomputed (their inputs: base_bytes), the step's
memory where its tensors are counted (_step_profile), its shape (_step_shape), per-op figures
(ops=True) and what makes a region unsafe to recompute (_op_figures), and the copy bandwidth to
the host (host_copy=True). On the CPU clock, a region's seconds leave out what watching its ops
for the checkpoint inputs they read cost them (input_read_seconds_per_op). A region the runtime
ran again in recompute though saved (it changed its input in place, or its output was changed in
place after it returned) is marked must_recompute: saving it gains nothing. So is, where no reason
to save it was found, one whose output is changed in place after its checkpoint returned (seen as
the call's backward begins), and a watched one the code recomputes that writes outside state (or,
under remat.fit, changes a model buffer: _buffers): its writes happen as the code makes them. A
watched region is must_save where it read a tensor that a later region writes, or that is changed
before the call's backward begins (_op_figures). After the block it is a RegionProfile.

With per-op figures, a checkpoint's last region is priced at what its recompute runs: recompute
stops once the last tensor backward needs is saved again, so the ops at its end after that
(a decoder layer's last projection, whose input its backward keeps and whose output nothing
keeps) never run again; they are left out of its seconds and its ops (OpMeter.recompute_tail),
where a node follows the region in the checkpoint (the runtime stops early only then) and none
of those after it saves a tensor.
"""

from __future__ import annotations

import functools
import json
import time
import weakref

import remat_alloc
import torch

from ._api import checkpoint, region
from ._arguments import flag_arg
from ._extension import _C
from ._offload_plans import measure_host_copy, offload_bytes
from ._kept_ops import keeping_seconds
from ._op_figures import OpMeter, describe_tensor, interception_seconds
from ._plans import NO_REGION_RAN, RegionProfile, _state, block_opened
from ._replay import recording_consults
from ._step_profile import StepRecorder, allocated_before, tensors_in
from ._storage_keys import storage_of
from ._step_shape import StepShape
from ._timing import TIMERS, clock_of, on_gpu, seconds_of, timed, timer_arg
from ._trace import untraced

__all__ = ["profile_regions", "timer_arg", "TIMERS"]

_input_read_per_op = None  # input_read_seconds_per_op(), once calibrated


def input_read_seconds_per_op():
    """What the runtime's watch of a profiled step's ops inside save regions (the checkpoint inputs
    they read: remat/input_reads.hpp) costs an op on the CPU clock; times the ops it watched, it is
    taken out of a region's seconds. Calibrated once per process on a checkpoint whose save region
    runs 50 small ops that need gradients (a sine and a scalar add on a 2x8 tensor, called from
    Python as a model's code calls them: the watch costs an op called from C++ a third less): the
    least of 9 rounds of the region watched less the least of 9 bare, over the ops watched (a
    median of each round's difference read 0 on a loaded machine, where more than half the
    differences were lost in its noise). The calibration's checkpoint is in no trace."""
    global _input_read_per_op
    if _input_read_per_op is None:
        spent = []

        def small_ops(t):
            start = time.thread_time_ns()
            for _ in range(25):
                t = t.sin() + 1.0
            spent.append(time.thread_time_ns() - start)
            return t

        run = checkpoint(region_name="remat.calibration")(lambda t: region(small_ops, "ops", recompute=False)(t))
        bare, watched_runs, ops = [], [], 0
        with untraced(), torch.inference_mode(False), torch.enable_grad():  # watched only where it keeps tensors
            x = torch.ones(2, 8, requires_grad=True)
            for _ in range(9):
                run(x)
                bare.append(spent[-1])
                _C.record_input_reads(True)
                run(x)
                ops = max(ops, _C.take_ops_watched_in_save_regions())
                _C.record_input_reads(False)
                watched_runs.append(spent[-1])
        if not ops:
            return 0.0
        _input_read_per_op = max(0, min(watched_runs) - min(bare)) / ops / 1e9
    return _input_read_per_op


def _stops_in(out, region_out):
    """Whether recompute of the checkpoint stops inside the region when the region is the last
    it recomputes: an autograd node follows the region's outputs (the runtime stops early only
    where forward made a node after the last tensor it dropped), and none of those between them
    and the checkpoint's outputs saves a tensor (nodes made later have higher sequence numbers on
    this thread). False where it cannot tell (no node to start from)."""
    made = [t.grad_fn for t in tensors_in(region_out) if t.grad_fn is not None]
    if not made:
        return False
    after = max(node._sequence_nr() for node in made)
    stack = [t.grad_fn for t in tensors_in(out) if t.grad_fn is not None]
    seen, followed = set(), False
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node._sequence_nr() <= after:
            continue
        if any(attribute.startswith("_raw_saved_") for attribute in dir(node)):
            return False
        followed = True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return followed


def _collective_in(op):
    return (f"it runs a collective ({op}): were ranks to plan it apart, recompute would run it again on some ranks "
            "only, pairing it with another collective of their peers (wrong gradients or a hang); saved, every rank "
            "runs it once")


def _collective_between(checkpoint, op):
    return (f"checkpoint '{checkpoint}' runs a collective ({op}) between its regions, which recompute runs again "
            "wherever a region of the call recomputes: were ranks to plan it apart, some ranks only would run it "
            "again, pairing it with another collective of their peers (wrong gradients or a hang)")


class profile_regions:
    """`with remat.profile_regions() as profile:` around one ordinary training step (forward and
    backward) measures every region of every checkpoint called inside on this thread; after the
    block, `profile` is a RegionProfile (profile.regions, profile.base_bytes, profile.plan()).
    Where the step's tensors are counted, a block that ends before the step's backward is a
    ValueError (the step's memory was not measured).

    timer: how a region's forward seconds are measured. "auto": CUDA events on a GPU (the time the
    GPU spent between the region's entry and exit), the thread's CPU time on the CPU (a region that
    sleeps or waits counts only the CPU it used). "wall": wall-clock time (time.perf_counter), on a
    GPU after synchronizing at the region's entry and exit, so a region that waits (I/O, a
    collective, a synchronization) counts what it waited. The dump's "timer" says which:
    cuda_events, thread_time or wall_time.

    ops: also measure each region's ATen ops (output bytes and time), which per-op plans choose
    from (profile.plan(..., ops=True) keeps chosen op outputs of recomputed regions).

    host_copy: also measure the copy bandwidth to host memory and back when the block ends
    (profile.host_copy), which plans with a host budget price offload by; on a GPU the copies need
    a device buffer of up to 64 MiB while they run. remat.fit profiles without it."""

    def __init__(self, *, timer="auto", ops=False, host_copy=True):
        self._timer = timer_arg("profile_regions", timer)
        self._ops = flag_arg("profile_regions", "ops", ops)
        self._host_copy = flag_arg("profile_regions", "host_copy", host_copy)
        self._meters = {}       # region -> [OpMeter of each call]
        # Tensors whose version counters each outermost region's forward is checked against (remat.fit:
        # the model's buffers): a region the code recomputes that changes one is must_recompute
        self._buffers = ()
        self._buffer_writes = {}  # region -> the buffers its forward changed in place, first first
        # region -> those of them its checkpoint does not give back to recompute as forward read them
        self._buffer_writes_kept = {}
        self._saved_by_code = set()  # outermost regions the code saves, or with a region it saves inside
        self._profile = None
        self._depth = 0         # regions being timed, to leave nested ones to the outermost
        self._outer = None      # the outermost region running now, and whether its own meter watches it
        self._outer_watched = False
        self._order = []        # region names in the order they first ran
        self._bytes = {}        # region -> saved bytes, added up over the calls of its checkpoint
        self._offload = {}      # region -> the bytes offloading it would move, likewise
        self._timings = {}      # region -> [seconds or (start event, end event)]
        self._inputs = {}       # storage key -> bytes of checkpoint inputs
        self._kept_keys = set()  # storages earlier checkpoint calls keep (alive until backward)
        self._calls = 0
        self._region_outputs = []  # (name, output) of each outermost region the running checkpoint call ran
        self._call_meters = []  # (name, OpMeter) of each region the running checkpoint call watched
        self._device = "cpu"
        self._step = None
        self._open = False      # entered and not yet exited (counted in _plans.block_open)
        self._must_recompute = {}  # region -> why the runtime ran it again in recompute, saved
        self._changed_outputs = {}  # region -> how its output was changed after its checkpoint returned
        self._read_changed = {}  # region -> why it must be saved: a later region changes what it read in place
        self._collectives = {}  # region -> why it must be saved: it, or code between its checkpoint's regions, runs a collective
        self._between = []  # the collectives the running checkpoint call ran outside its regions

    def __enter__(self):
        if getattr(_state, "session", None) is not None:
            raise RuntimeError("profile_regions: a profile is being measured on this thread already; profile one "
                               "step at a time")
        if getattr(_state, "plans", None):
            raise RuntimeError("profile_regions: a plan is in force on this thread (use_plan); a profile saves every "
                               "region to measure it, which the plan would not apply to: profile outside the use_plan "
                               "block")
        interception_seconds()  # calibrated now: the first mode entered costs the step's first region a second
        input_read_seconds_per_op()
        if self._ops:
            keeping_seconds(0)
        self._step = StepRecorder()
        self._step.begin()
        # The runtime watches checkpoint forwards' ops while it records input reads (the step's
        # memory needs them, and turns them on): the collectives they run too, whether or not that
        # memory is counted
        if not self._step.enabled:
            _C.record_input_reads(True)
        self._shape = StepShape()
        _state.session = self
        self._open = True
        block_opened()
        return self

    def __exit__(self, exc_type, *rest):
        if getattr(_state, "session", None) is self:  # (remat.fit's is in force only in its step's forwards)
            _state.session = None
        if not self._step.enabled:
            _C.record_input_reads(False)
        if self._open:
            self._open = False
            block_opened(False)
        if exc_type is not None:
            self._step.close()
            return False
        pending = self._step.backward_pending()
        if pending:
            self._step.close()
            more = f" and {len(pending) - 1} more checkpoint call(s)" if len(pending) > 1 else ""
            raise ValueError(f"profile_regions: the block ended before the step's backward (checkpoint '{pending[0]}'"
                             f"{more} still to run it), so the step's memory was not measured there and no plan's step "
                             "peak could be predicted: a profile measures one whole training step, so call backward "
                             "(and the optimizer step) inside the with block")
        self._step.end()
        if not self._order:
            raise ValueError("profile_regions: no region of a checkpoint ran inside the block; run one training step "
                             f"of a model whose checkpoints have regions. Where the step had them: {NO_REGION_RAN}")
        regions = []
        forward_seconds = {}  # region -> (its calls, their forward seconds before per-op figures price it)
        for name in self._order:
            seconds = seconds_of(self._timings[name])
            region = {"name": name, "saved_bytes": self._bytes.get(name, 0), "seconds": max(seconds, 0.0)}
            if self._offload.get(name):
                region["offload_bytes"] = self._offload[name]
            writes = None
            if name in self._meters:
                writes = self._add_meters(region, self._meters[name], cuda=self._device.startswith("cuda"),
                                          saved_by_code=name in self._saved_by_code)
            forward_seconds[name] = (len(self._timings[name]), region["seconds"])
            if name in self._meters and self._ops:
                meters = self._meters[name]
                self._add_ops(region, meters, keeping_seconds(sum(m.intercepted for m in meters) / len(meters)))
            if writes is None and name in self._buffer_writes_kept and name not in self._saved_by_code:
                writes = (f"it writes in place into {describe_tensor(self._buffer_writes_kept[name][0])}, a buffer "
                          "of the model its checkpoint does not give back to recompute as forward read it (its "
                          "function does not reach the module), which recompute would write again")
            if name in self._read_changed:
                region.setdefault("must_save", self._read_changed[name])
            if name in self._collectives and name not in self._must_recompute:
                region.setdefault("must_save", self._collectives[name])
            # The runtime's reruns first; what the profile found must yield to must_save (right
            # gradients before writes made as the code makes them; a saved region whose output
            # changed later is the runtime's to run again, where recompute needs it)
            recompute = self._must_recompute.get(name)
            if recompute is None and "must_save" not in region:
                recompute = self._changed_outputs.get(name) if writes is None else (
                    f"{writes}; the code recomputes it (remat.region's default), so every plan does: its writes "
                    "happen as without a plan, whatever the budget (recompute=False makes them happen once)")
            if recompute is not None:
                region["must_recompute"] = recompute
                region.pop("ops", None)  # nothing for a plan to keep: the region runs again whole
                region.pop("op_overhead_seconds", None)
            regions.append(region)
        doc = {"kind": "region-profile", "schema_version": 1, "device_name": self._device,
               "timer": clock_of(self._timer, self._device.startswith("cuda")),
               "base_bytes": sum(self._inputs.values()), "regions": regions}
        if self._host_copy:
            doc["host_copy"] = measure_host_copy(max(self._offload.values(), default=0), self._device)
        if self._step.enabled:
            doc["step"] = self._step.to_dump(remat_alloc.memory_stats(self._step.device)["requested_bytes"])
        self._profile = RegionProfile(json.dumps(doc))
        self._profile._shape = self._shape
        self._profile._forward_seconds = forward_seconds
        # Where backward ended in step.segments (remat.fit predicts the rest apart); not in the dump
        self._profile._after_backward = self._step.after_backward if self._step.enabled else None
        # The model's gradients when each segment began, where remat.fit watched them; not in the dump
        self._profile._segment_gradients = self._step.segment_gradients if self._step.enabled else None
        return False

    def _result(self):
        if self._profile is None:
            raise RuntimeError("profile_regions: the profile is ready after the with block has ended")
        return self._profile

    def __getattr__(self, name):
        # profile.regions, profile.plan(...) and the rest, once the block has ended.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._result(), name)

    # --- called by the runtime's Python layer while the block runs -------------------------------

    def run_checkpoint(self, name, args, kwargs, call):
        if not torch.is_grad_enabled():
            raise RuntimeError(f"profile_regions: checkpoint '{name}' ran with gradients off (torch.no_grad(), "
                               "torch.inference_mode() or eval code): a checkpoint then keeps nothing for backward, "
                               "so the profile would price every region at 0 bytes. Profile an ordinary training step, "
                               "forward and backward with gradients on")
        self._shape.record_call(name, args, kwargs)
        outer_outputs, self._region_outputs = self._region_outputs, []
        outer_meters, self._call_meters = self._call_meters, []
        outer_between, self._between = self._between + _C.take_collectives(), []
        try:
            out, call_index = self._step.checkpoint_forward(name, args, kwargs, call)
            region_outputs, meters, between = self._region_outputs, self._call_meters, self._between
        finally:
            self._region_outputs, self._call_meters, self._between = outer_outputs, outer_meters, outer_between
        between += _C.take_collectives()
        for region_name, _ in region_outputs if between else ():
            self._collectives.setdefault(region_name, _collective_between(name, between[0]))
        self._watch_changes_before_backward(region_outputs, meters, out)
        # Each input storage once: a storage an earlier call keeps is alive until backward (its
        # address is its own), any other is this call's alone (a freed address used again by the
        # next call's input is another storage).
        for tensor in tensors_in((args, kwargs)):
            storage = storage_of(tensor)
            if storage is None:  # sparse: no storage of its own
                continue
            key = (str(tensor.device), storage.data_ptr())
            self._inputs[key if key in self._kept_keys else key + (self._calls,)] = storage.nbytes()
        self._calls += 1
        newest = _C.newest_live_checkpoint(name)  # this call's, where it keeps anything
        report = newest.report if newest is not None else None
        if report is not None:
            for rerun in report.rerun_regions:
                self._must_recompute.setdefault(rerun.region, rerun.reason)
            for region in report.regions:
                self._kept_keys.update((t.device, t.address) for t in region.tensors)
                if region.region not in self._timings:
                    continue
                # Each storage once, and not the checkpoints' inputs (position embeddings every
                # layer takes, say): base_bytes has those whatever the plan; nor what was allocated
                # before the checkpoint ran (a frozen weight), which recompute does not free.
                kept = sum(t.bytes for t in region.tensors
                           if not t.shares_storage and (t.device, t.address) not in self._inputs
                           and not allocated_before(t))
                self._bytes[region.region] = self._bytes.get(region.region, 0) + kept
                self._offload[region.region] = self._offload.get(region.region, 0) + offload_bytes(region.tensors)
        if report is not None and region_outputs and self._ops:
            self._find_tail(region_outputs[-1], report.regions, out)
        reruns = {r.region: r.reason for r in report.rerun_regions} if report is not None else None
        self._step.checkpoint_kept(call_index, report.regions if report is not None else [],
                                   newest.tensors if newest is not None else [], args, kwargs, out, rerun=reruns)
        self._shape.record_backward(out)
        return out

    def _watch_changes_before_backward(self, region_outputs, meters, out):
        """What the call's regions made and read, changed in place before its backward begins (where
        it is found). A region whose output the code changes after the checkpoint returned (`h.mul_(3)`
        on an output it hands on) is must_recompute: the profiled step, which saves every region,
        never recomputes, so the runtime, which runs such a region again in recompute, did not see it;
        and a plan recomputing a later region of the call without it would keep neither what it
        needs to run it again nor a way to. A watched region that read a tensor it did not make,
        changed since (a tensor the body's closure holds, changed before backward), is must_save:
        its recompute would read the changed values."""
        versions = [(name, index, weakref.ref(t), t._version) for name, output in region_outputs
                    for index, t in enumerate(tensors_in(output))]
        began = []

        def backward_begins(grad):
            if not began:
                began.append(True)
                for name, index, tensor, version in versions:
                    if tensor() is not None and tensor()._version != version:
                        self._changed_outputs.setdefault(
                            name, f"its output {index} is changed in place after the checkpoint returned (an op such "
                                  "as h.mul_(2)): recompute runs it again")
                for name, meter in meters:
                    changed = meter.changed_since_read()
                    if changed is not None and name not in self._read_changed:
                        self._read_changed[name] = (f"it reads {describe_tensor(changed)} it did not make, which is "
                                                    "changed in place after its forward, before backward, so its "
                                                    "recompute would read the changed values")
            return grad

        for tensor in tensors_in(out):
            if tensor.requires_grad:
                tensor.register_hook(backward_begins)

    def _find_tail(self, last, regions, out):
        """Marks on the meter of the call's last region the ops its recompute would not run
        (OpMeter.recompute_tail), where recompute stops inside it (_stops_in); else none."""
        name, region_out = last
        meters = self._meters.get(name)
        if not meters or not _stops_in(out, region_out):
            if meters:
                meters[-1].tail = set()
            return
        kept = {(t.device, t.address) for region in regions for t in region.tensors if t.name.startswith("saved.")}
        meters[-1].tail = meters[-1].recompute_tail(kept)

    def op_meter(self, name, own_recompute):
        """The wrapper of a region's body that watches its ops, else None. The outermost region in
        forward (as time_region times it) is watched with ops=True, for each op's figures, or
        where its code saves it, for what would make a plan's recompute of it wrong (a region its
        code recomputes recomputes so anyway). A region its code saves nested in an outermost one
        that is not watched is watched for the outermost's sake: a plan recomputing that one runs
        the nested one again. Watching costs each op a few microseconds, which the outermost
        region's seconds keep in part."""
        if _C.is_recomputing():
            return None
        if not own_recompute:
            self._saved_by_code.add(self._outer if self._depth else name)
        if self._depth == 0:
            self._outer = name
            self._outer_watched = self._ops or not own_recompute
            if not self._outer_watched:
                return None
            meter = OpMeter(cuda=on_gpu(), figures=self._ops,
                            on_op=self._step.op_made if self._ops else None,
                            on_outside_write=functools.partial(self._outside_write, name))
        elif own_recompute or self._outer_watched:
            return None
        else:
            meter = OpMeter(cuda=on_gpu(), figures=False,
                            on_outside_write=functools.partial(self._outside_write, self._outer))
        self._meters.setdefault(self._outer, []).append(meter)
        self._call_meters.append((self._outer, meter))

        def measured_body(body):
            def body_with_meter(*args, **kwargs):
                meter.takes_inputs(tensors_in((args, kwargs)))
                consults = recording_consults()
                with meter:
                    out = body(*args, **kwargs)
                meter.records_decisions = recording_consults() != consults
                return out

            body_with_meter.__qualname__ = getattr(body, "__qualname__", type(body).__name__)
            return body_with_meter

        return measured_body

    def _outside_write(self, writer, tensor, op):
        """Region `writer` writes in place (`op`) into `tensor`, which it did not make (a buffer, a
        cache): a region watched before it that read the tensor would read the changed values in
        recompute, after the step's forward, so a plan saves it (must_save)."""
        for name, meters in self._meters.items():
            if name != writer and name not in self._read_changed and any(m.read_before(tensor) for m in meters):
                self._read_changed[name] = (f"it reads {describe_tensor(tensor)} that region '{writer}' later changes "
                                            f"in place ({op}), so its recompute would read the changed values")

    @staticmethod
    def _add_meters(region, meters, cuda, saved_by_code):
        """What the meters of the region's calls found: why it must be saved (any call's reason)
        and the meters' own time taken out of the region's seconds on the CPU clock. A region that
        writes outside state (a BatchNorm's running statistics) is saved where the code saves it
        and recomputed where the code recomputes it: its writes then happen as the code makes them,
        whatever the budget. Returns why it writes so where the code recomputes it (it must be
        recomputed), or None."""
        reason = next((meter.must_save for meter in meters if meter.must_save), None)
        writes = next((meter.writes_outside for meter in meters if meter.writes_outside), None)
        if reason is None and writes is not None and saved_by_code:
            reason = writes
        if reason is not None:
            region["must_save"] = reason
        count = sum(m.intercepted for m in meters)
        per_op = interception_seconds()
        if not cuda:
            region["seconds"] = max(0.0, region["seconds"] - sum(m.own_seconds for m in meters) - count * per_op)
        return writes if reason is None else None

    @staticmethod
    def _add_ops(region, meters, overhead):
        """The region's per-op figures, each op added up over the calls, which must have run the
        same ops (else the region gets none)."""
        for meter in meters:
            meter.finish()
        first = meters[0]
        if any([(op["index"], op["op"]) for op in m.ops] != [(op["index"], op["op"]) for op in first.ops]
               for m in meters[1:]) or not first.ops or any(m.records_decisions for m in meters):
            return  # a region that records a decision skips the ops making it in recompute
        ops = [dict(op) for op in first.ops]
        for meter in meters[1:]:
            for total, op in zip(ops, meter.ops):
                total["bytes"] += op["bytes"]
                total["seconds"] += op["seconds"]
        region["seconds"] = max(region["seconds"], sum(op["seconds"] for op in ops))
        # The ops no call's recompute runs: not priced, and not for a plan to keep.
        tails = [getattr(meter, "tail", None) for meter in meters]
        tail = set.intersection(*tails) if all(t is not None for t in tails) else set()
        region["seconds"] = max(0.0, region["seconds"] - sum(op["seconds"] for op in ops if op["index"] in tail))
        ops = [op for op in ops if op["index"] not in tail]
        if not ops:
            return
        region["ops"] = ops
        region["op_overhead_seconds"] = overhead

    def time_region(self, name, call, args=()):
        if self._depth > 0 or _C.is_recomputing():
            return call()
        versions = [b._version for b in self._buffers]
        out = self._step.region_forward(name, args, lambda: self._timed_region(name, call))
        written = self._buffer_writes.setdefault(name, [])
        new = [b for b, v in zip(self._buffers, versions) if b._version != v and all(b is not w for w in written)]
        written += new
        if not written:
            del self._buffer_writes[name]
        kept = [b for b in new if not _C.given_back_to_recompute(b)]
        if kept:
            self._buffer_writes_kept.setdefault(name, []).extend(kept)
        self._shape.record_region(name, args, out)
        self._region_outputs.append((name, out))
        return out

    def _timed_region(self, name, call):
        if name not in self._timings:
            self._timings[name] = []
            self._order.append(name)
        cuda = on_gpu()
        self._depth += 1
        try:
            if cuda:
                self._device = f"cuda:{torch.cuda.current_device()}"
            _C.take_ops_watched_in_save_regions()
            self._between += _C.take_collectives()  # run by the checkpoint's code before this region
            out, seconds = timed(self._timer, call)
            ran = _C.take_collectives()
            if ran:
                self._collectives.setdefault(name, _collective_in(ran[0]))
            if not cuda:  # on the CPU clock, watching the region's ops for their reads cost them this
                seconds = max(0.0, seconds - _C.take_ops_watched_in_save_regions() * input_read_seconds_per_op())
            self._timings[name].append(seconds)
        finally:
            self._depth -= 1
        return out
