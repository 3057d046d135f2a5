"""Receive buffers of torch.distributed.pipelining stages as rings, or just in time.

A stage of PyTorch 2.11 allocates one buffer set per microbatch and direction at the first
step() and keeps them for every later step. Here each stage's setup allocates one set (its
shapes are the template), and the microbatches share real sets instead:

- ring: the sets of the plan's ring, each microbatch in the slot the plan gives it. At each
  receive the slot's previous holder must have finished with it (the ownership guard), the
  slot's version counter is bumped (so that autograd refuses a stale saved tensor of the
  previous holder instead of reading new data), and the microbatch gets a fresh autograd
  leaf over the slot's storage (no .grad or hook carried from one microbatch to the next).
- just_in_time: a set allocated at each receive and dropped once its last reader is done.

What a stage sends on, or hands to a stage on the same rank, is copied where it shares a
ring slot's storage (a stage that returns its input, a gradient that passes through), since
the slot is received into again while such a send can still be in flight.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

import remat_alloc

from . import _torch_internals as internals
from ._torch_internals import HANDED_B, RAN_B, RAN_F, RAN_I, RAN_W, SENT_B, SENT_F

__all__ = ["RecvSlotInUse", "SchedulePool", "FORWARD", "BACKWARD"]

FORWARD, BACKWARD = "F", "B"
_NAMES = {FORWARD: "activation (F)", BACKWARD: "gradient (B)"}


def _received(direction: str):
    """What a stage receives forward is its input; a gradient received backward is backward's scratch."""
    return remat_alloc.categorized("input" if direction == FORWARD else "temporary", "recv")
_MODES = ("ring", "shared_ring", "just_in_time")


class RecvSlotInUse(RuntimeError):
    """A receive slot handed to a microbatch while its previous holder still needs it."""


class _Ring:
    """Buffer sets shared by the microbatches of one or more stages in one direction."""

    def __init__(self, size: int, direction: str, tag_stage: int, storages: set):
        self.size = size
        self.storages = storages  # the data pointers of every ring's storage on this rank
        self.direction = direction
        self.tag_stage = tag_stage
        self.template: Optional[tuple] = None  # ((shape, dtype, device), ...) of one set
        self.sets: list = []  # sets[slot]: one tensor per received input
        self.holders: list = [None] * size  # (receiver, microbatch) holding each slot
        self.members: list = []  # the receivers that took their slots from it
        self.dissolved = False  # a stage sharing it received other shapes: each took its own ring

    def accepts(self, template: tuple) -> bool:
        """Allocates the sets for the first template offered; True where `template` is that one."""
        if self.dissolved:
            return False
        if self.template is None:
            self.template = template
            for slot in range(self.size):
                with remat_alloc.recv_slot(self.tag_stage, self.direction, slot), _received(self.direction):
                    tensors = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in template]
                self.sets.append(tensors)
                self.storages.update(t.untyped_storage().data_ptr() for t in tensors)
        return self.template == template

    def dissolve(self) -> None:
        """A shared ring one of whose stages receives other shapes: the stages that took it take
        their own rings instead (sized for themselves, never larger than the shared one), and its
        sets are freed. Only while the stages set up their buffers, before anything is received."""
        self.dissolved = True
        for member in self.members:
            member.ring, member.slots = member._own_ring, member._own_slots
            member.ring.accepts(member.template)
            member.ring.members.append(member)
        for tensors in self.sets:
            self.storages.difference_update(t.untyped_storage().data_ptr() for t in tensors)
        self.members, self.sets, self.template = [], [], None


class _Receiver:
    """One stage's receive buffers in one direction.

    mode "ring" (slots from the plan; a shared ring falls back to the stage's own where its
    shapes differ), "just_in_time", or "handoff" (the neighbour is on this rank and hands its
    tensors over; nothing is received, and those tensors are dropped once read).
    """

    def __init__(self, pool: "_StagePool", direction: str, mode: str, ring: Optional[_Ring] = None,
                 slots: Optional[list] = None, own_ring: Optional[_Ring] = None, own_slots: Optional[list] = None):
        self.pool = pool
        self.direction = direction
        self.mode = mode
        self.ring, self.slots = ring, slots
        self._own_ring, self._own_slots = own_ring, own_slots
        self.received: list = []  # per microbatch, its received records (set up by build)
        self.template: tuple = ()
        self.requires_grad: list = []
        self.placeholders: list = []
        self.live: dict = {}  # microbatch -> its slot (ring), or None
        self.live_sets = 0
        self.peak_sets = 0

    @property
    def stage_index(self) -> int:
        return self.pool.stage.stage_index

    def build(self, infos: dict, microbatches: int) -> None:
        """Fills infos[0..M-1] from the one set the stage's own setup made in infos[0]."""
        first = infos[0]
        buffers = [internals.buffer_of(record) for record in internals.received(first)]
        self.template = tuple((tuple(buffer.shape), buffer.dtype, buffer.device) for buffer in buffers)
        self.requires_grad = [buffer.requires_grad for buffer in buffers]
        self.placeholders = [torch.empty(0, dtype=dtype, device=device) for _, dtype, device in self.template]
        if self.mode == "ring":
            if not self.ring.accepts(self.template):
                if self.ring is not self._own_ring:
                    self.ring.dissolve()  # the stages sharing it: each its own ring, as mode "ring" gives
                self.ring, self.slots = self._own_ring, self._own_slots
                self.ring.accepts(self.template)
            self.ring.members.append(self)
        received = set(map(id, internals.received(first)))
        self.received = []  # received[mb]: the received records of microbatch mb, in input order
        for mb in range(microbatches):
            buffers = iter(self._idle_buffers(mb))
            infos[mb] = tuple(internals.with_buffer(record, next(buffers)) if id(record) in received else record
                              for record in first)
            self.received.append(internals.received(infos[mb]))

    def _idle_buffers(self, mb: int) -> list:
        if self.mode == "ring" and self.slots[mb] is not None:
            return self._leaves(self.ring.sets[self.slots[mb]])
        return list(self.placeholders)

    def _leaves(self, tensors: list) -> list:
        if self.direction == BACKWARD:
            return list(tensors)
        return [t.detach().requires_grad_(rg) for t, rg in zip(tensors, self.requires_grad)]

    def _set_buffers(self, mb: int, buffers: list) -> None:
        for record, buffer in zip(self.received[mb], buffers):
            internals.set_buffer(record, buffer)

    def post(self, mb: int) -> None:
        """Called before the receive of `mb` is posted: gives it its buffers."""
        if mb in self.live:
            raise RecvSlotInUse(
                f"remat.pipelining: stage {self.stage_index} receives {_NAMES[self.direction]} microbatch {mb} a "
                "second time in one step; the order differs from the one the pool was planned for: pool the "
                "schedule after its order is final (after _load_csv)")
        if self.mode == "just_in_time":
            with remat_alloc.recv_slot(self.stage_index, self.direction, mb), _received(self.direction):
                buffers = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in self.template]
            if self.direction == FORWARD:
                buffers = [b.requires_grad_(rg) for b, rg in zip(buffers, self.requires_grad)]
            self._set_buffers(mb, buffers)
            self.live[mb] = None
            self.live_sets += 1
            self.peak_sets = max(self.peak_sets, self.live_sets)
            return
        slot = self.slots[mb] if mb < len(self.slots) else None
        if slot is None:
            raise RecvSlotInUse(
                f"remat.pipelining: stage {self.stage_index} receives {_NAMES[self.direction]} microbatch {mb}, "
                "which the plan has it never receive; the order differs from the one the pool was planned for: "
                "pool the schedule after its order is final (after _load_csv)")
        holder = self.ring.holders[slot]
        if holder is not None:
            other, other_mb = holder
            where = f"stage {self.stage_index}" if other is self else f"stage {other.stage_index} (a shared ring)"
            raise RecvSlotInUse(
                f"remat.pipelining: stage {self.stage_index} {_NAMES[self.direction]} receive slot {slot} is handed "
                f"to microbatch {mb} while microbatch {other_mb} of {where} still needs it (not yet run: "
                f"{', '.join(other.pool.missing(other_mb, self.direction))}); receiving into it would overwrite "
                "data still in use. The order run differs from the one the ring was planned for: pool the schedule "
                f"after its order is final (after _load_csv), {self._more_room()}")
        self.ring.holders[slot] = (self, mb)
        tensors = self.ring.sets[slot]
        for tensor in tensors:
            # irecv writes without bumping the version: bump it, so that a saved tensor of the
            # previous holder read later is autograd's "modified by an inplace operation" error.
            torch.autograd.graph.increment_version(tensor)
        self._set_buffers(mb, self._leaves(tensors))
        self.live[mb] = slot

    def _more_room(self) -> str:
        """The advice for an order the ring was not planned for: slack spares a stage's own ring only."""
        if self.ring is self._own_ring:
            return "or give pool_recv_buffers a larger slack (spare sets per ring)"
        return ('or pool with mode="ring" and a slack (a shared ring is the colored minimum of its stages and takes '
                'no spare sets), or with mode="just_in_time"')

    def handed_over(self, mb: int) -> None:
        self.live[mb] = None

    def release(self, mb: int) -> None:
        """The last reader of `mb`'s buffers is done with them."""
        slot = self.live.pop(mb)
        if self.mode == "ring":
            # The leaf keeps its .grad until clear_runtime_states, as stock does: freeing it here
            # measured 5-10% more CPU time per step on the host (malloc returning each to the OS).
            self.ring.holders[slot] = None
            return
        if self.mode == "just_in_time":
            self.live_sets -= 1
        self._set_buffers(mb, list(self.placeholders))

    def reset(self) -> None:
        for mb in list(self.live):
            self.release(mb)
        self.live_sets = 0

    def memory(self) -> dict:
        set_bytes = sum(dtype.itemsize * math.prod(shape) for shape, dtype, _ in self.template)
        if self.mode == "ring":
            sets = self.ring.size
            return {"sets": sets, "bytes": sets * set_bytes, "peak_sets": sets, "peak_bytes": sets * set_bytes}
        return {"sets": 0, "bytes": 0, "peak_sets": self.peak_sets, "peak_bytes": self.peak_sets * set_bytes}


class _StagePool:
    """One stage's receivers and what its microbatches have run this step."""

    def __init__(self, stage: Any, schedule_pool: "SchedulePool"):
        self.stage = stage
        self.schedule_pool = schedule_pool
        local = schedule_pool.local_stage_indices
        index = stage.stage_index
        self.prev_local = index - 1 in local
        self.next_local = index + 1 in local
        self.forward: Optional[_Receiver] = None
        self.backward: Optional[_Receiver] = None
        self.done: dict = {}  # microbatch -> the actions it has run on this stage this step (bits)

    def finished(self, mb: int, direction: str) -> bool:
        """Whether every reader of `mb`'s buffers in `direction` on this stage has run."""
        done = self.done.get(mb, 0)
        stage = self.stage
        backward_done = done & RAN_B or (done & RAN_I and done & RAN_W)
        if direction == FORWARD:
            return bool(done & RAN_F and (backward_done or not stage.has_backward)
                        and (stage.is_last or self.next_local or done & SENT_F))
        return bool(backward_done and (stage.is_first or self.prev_local or done & SENT_B)
                    and (not self.prev_local or done & HANDED_B))

    def missing(self, mb: int, direction: str) -> list:
        """What must still run on this stage before `mb`'s buffers in `direction` are free (for messages)."""
        done = self.done.get(mb, 0)
        stage = self.stage
        backward = f"B{mb}" if not done & RAN_I else f"W{mb}"
        backward_done = done & RAN_B or (done & RAN_I and done & RAN_W)
        missing = []
        if direction == FORWARD:
            if not done & RAN_F:
                missing.append(f"F{mb}")
            if stage.has_backward and not backward_done:
                missing.append(backward)
            if not stage.is_last and not self.next_local and not done & SENT_F:
                missing.append(f"SEND_F{mb}")
        else:
            if not backward_done:
                missing.append(backward)
            if not stage.is_first and not self.prev_local and not done & SENT_B:
                missing.append(f"SEND_B{mb}")
            if self.prev_local and not done & HANDED_B:
                missing.append(f"the handoff of microbatch {mb}'s input gradient to stage {stage.stage_index - 1}")
        return missing

    def receiver(self, direction: str) -> Optional[_Receiver]:
        return self.forward if direction == FORWARD else self.backward

    # The stage's hooks (_torch_internals.StageHooks).

    def pools(self, direction: str) -> bool:
        return self.receiver(direction) is not None

    def set_up(self, direction: str, infos: dict, microbatches: int) -> None:
        self.receiver(direction).build(infos, microbatches)

    def before_receive(self, direction: str, mb: int) -> None:
        receiver = self.receiver(direction)
        if receiver is not None and receiver.mode != "handoff":
            receiver.post(mb)

    def handed_over(self, direction: str, mb: int) -> None:
        receiver = self.receiver(direction)
        if receiver is not None:
            receiver.handed_over(mb)

    def ran(self, mb: int, action: int) -> None:
        self.done[mb] = self.done.get(mb, 0) | action
        for receiver in (self.forward, self.backward):
            if receiver is not None and mb in receiver.live and self.finished(mb, receiver.direction):
                receiver.release(mb)

    def new_step(self) -> None:
        self.done.clear()
        for receiver in (self.forward, self.backward):
            if receiver is not None:
                receiver.reset()

    def unaliased(self, value: Any) -> Any:
        """`value` with every tensor that shares a ring slot's storage replaced by a copy."""
        storages = self.schedule_pool.ring_storages
        if not storages:
            return value

        def visit(item):
            if isinstance(item, torch.Tensor):
                return item.clone() if item.untyped_storage().data_ptr() in storages else item
            if isinstance(item, tuple):
                return tuple(visit(x) for x in item)
            if isinstance(item, list):
                return [visit(x) for x in item]
            return item

        return visit(value)


class SchedulePool:
    """The receivers of one rank's stages of a schedule, built from a plan."""

    def __init__(self, layout: Any, plan: dict, mode: str):
        if mode not in _MODES:
            raise ValueError(f"remat.pipelining: mode {mode!r} is not one of {', '.join(map(repr, _MODES))}")
        self.layout = layout
        self.plan = plan
        self.mode = mode
        self.local_stage_indices = {stage.stage_index for stage in layout.stages}
        self.stage_pools = [_StagePool(stage, self) for stage in layout.stages]
        self.rings: list = []
        self.ring_storages: set = set()  # what a send or handoff must not share with a slot
        entries = {(e["stage"], e["direction"]): e for e in plan["entries"]}
        shared = {(r["direction"], s): (r, i) for r in plan["shared"] if r["rank"] == layout.rank
                  for i, s in enumerate(r["stages"])}
        shared_rings: dict = {}
        for stage_pool in self.stage_pools:
            index = stage_pool.stage.stage_index
            for direction, handoff, attribute in ((FORWARD, stage_pool.prev_local, "forward"),
                                                  (BACKWARD, stage_pool.next_local, "backward")):
                entry = entries[(index, direction)]
                if entry["received"] == 0:
                    if handoff:
                        setattr(stage_pool, attribute, _Receiver(stage_pool, direction, "handoff"))
                    continue
                if mode == "just_in_time":
                    setattr(stage_pool, attribute, _Receiver(stage_pool, direction, "just_in_time"))
                    continue
                own_ring = self._ring(entry["ring_size"], direction, index)
                own_slots = self._slots(entry)
                ring, slots = own_ring, own_slots
                if mode == "shared_ring" and (direction, index) in shared:
                    group, position = shared[(direction, index)]
                    key = (direction, tuple(group["stages"]))
                    if key not in shared_rings:
                        shared_rings[key] = self._ring(group["min_slots"], direction, group["stages"][0])
                    ring, slots = shared_rings[key], group["slots"][position]
                setattr(stage_pool, attribute,
                        _Receiver(stage_pool, direction, "ring", ring, slots, own_ring, own_slots))

    def _ring(self, size: int, direction: str, tag_stage: int) -> _Ring:
        ring = _Ring(size, direction, tag_stage, self.ring_storages)
        self.rings.append(ring)
        return ring

    def _slots(self, entry: dict) -> list:
        # NeMo's closed form aliases microbatch m to set m % K; elsewhere the plan's coloring.
        if self.plan["closed_form_used"] and entry.get("closed_form_safe") and entry["ring_size"] == min(
                entry["closed_form_ring"], entry["received"]):
            return [None if slot is None else mb % entry["ring_size"] for mb, slot in enumerate(entry["slots"])]
        return entry["slots"]

    def install(self) -> None:
        installs = [internals.wrap_stage(stage_pool.stage, stage_pool) for stage_pool in self.stage_pools]
        for install in installs:
            install()

    def memory(self) -> list:
        """Per receiving stage (or shared ring) and direction: sets and bytes held, and the peak."""
        rows, seen = [], {}
        for stage_pool in self.stage_pools:
            for receiver in (stage_pool.forward, stage_pool.backward):
                if receiver is None or receiver.mode == "handoff":
                    continue
                figures = receiver.memory()
                if receiver.mode == "ring" and id(receiver.ring) in seen:
                    seen[id(receiver.ring)]["stages"].append(receiver.stage_index)
                    continue
                row = {"stages": [receiver.stage_index], "direction": receiver.direction, **figures}
                if receiver.mode == "ring":
                    seen[id(receiver.ring)] = row
                rows.append(row)
        return rows
