"""What the profiled step ran, and a watch that notices a step that runs something else.

A plan is chosen from one profiled step: it is right for steps that run the same checkpoint calls,
in the same order, each with the same regions, on inputs and outputs of the same shapes and
dtypes, under the same autocast. profile_regions() records that as a StepShape: per checkpoint
call its name, its tensor inputs' (shape, dtype, device), the autocast state, and per top-level
region its name and its inputs' and outputs' (shape, dtype, device).

Under a plan made from such a profile (use_plan, remat.fit), a StepWatch follows each step along
the shape. At the first difference (a checkpoint called more times than profiled or another one,
inputs of another shape or dtype, autocast on where it was off, a region the profiled step did not
run there, a region's outputs of another shape) the step has diverged: every region from there to
the step's end recomputes (the least a checkpoint keeps: its inputs), and the watch reports what
differed once. A region runs in recompute as forward ran it, whatever the watch learned since.
Backward beginning under another autocast state than profiled is reported too, though no choice
can change then (autocast's cache keeps the casts of the weights until its block ends).

A step runs from a checkpoint call to the end of its backward: the watch starts a new step at a
checkpoint call when backward has begun on the outputs of every call since the last start, or when
the caller says so (remat.fit, at every training forward). Outputs that need no gradient (a frozen
first layer given a batch without one) have no backward to wait for: a step of such calls alone
ends once it made as many calls as the profiled step.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

from ._step_profile import tensors_in


def warn_at_user_line(message):
    """Warns at the user's line: the first frame outside remat and torch.nn's module calls."""
    level, frame = 2, sys._getframe(1)
    inside = (os.path.dirname(__file__), os.path.dirname(torch.nn.modules.module.__file__))
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, stacklevel=level)


def _sizes(tensor):
    """The tensor's sizes; a nested tensor's, which PyTorch does not give all of, as its count of parts."""
    if tensor.is_nested:
        return ("nested", tensor.size(0))
    return tuple(tensor.shape)


def _signature(value):
    return tuple((_sizes(t), t.dtype, t.device.type) for t in tensors_in(value))


def _rank_only(signature):
    """A signature compared without sizes: a step planned from a scaled profile has other shapes."""
    return tuple((len(shape), dtype, device) for shape, dtype, device in signature)


def _signature_text(signature):
    if not signature:
        return "no tensors"
    return ", ".join(f"{'x'.join(map(str, shape)) or 'scalar'} {str(dtype).replace('torch.', '')}"
                     for shape, dtype, _ in signature)


def autocast_state():
    """(device type, dtype) of each device type autocast is on for, in this thread."""
    state = []
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            state.append((device, torch.get_autocast_dtype(device)))
    return tuple(state)


def _autocast_text(state):
    if not state:
        return "off"
    return "on (" + ", ".join(f"{str(dtype).replace('torch.', '')} on {device}" for device, dtype in state) + ")"


def _ordinal(n):
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


class _Call:
    __slots__ = ("name", "inputs", "autocast", "regions")

    def __init__(self, name, inputs, autocast):
        self.name = name
        self.inputs = inputs
        self.autocast = autocast
        self.regions = []  # [name, input signature, output signature]


class StepShape:
    """The checkpoint calls of a profiled step and the top-level regions of each (module docstring)."""

    def __init__(self):
        self.calls = []
        self.backward_autocast = None  # autocast_state() where the step's backward began, once it has

    def record_backward(self, out):
        """Records the autocast state where backward begins on `out` (the first call's to begin)."""
        def began(grad):
            if self.backward_autocast is None:
                self.backward_autocast = autocast_state()
            return grad

        for tensor in tensors_in(out):
            if tensor.requires_grad:
                tensor.register_hook(began)

    def record_call(self, name, args, kwargs):
        self.calls.append(_Call(name, _signature((args, kwargs)), autocast_state()))

    def record_region(self, path, args, out):
        if self.calls:
            self.calls[-1].regions.append((path, _signature(args), _signature(out)))


class StepWatch:
    """Follows steps under a plan along the profiled StepShape (module docstring). on_diverge(what)
    is called once per step that diverges, with what differed first."""

    def __init__(self, shape, on_diverge, *, sizes=True):
        self.shape = shape
        self.on_diverge = on_diverge
        self.sizes = sizes  # False: shapes are compared by rank (remat.fit's steps of scaled inputs)
        self.step_calls = 0  # checkpoint calls since begin(): remat.fit's whole step, however it splits
        self.new_step()

    def begin(self):
        """remat.fit's step begins: its checkpoint calls are counted from here (step_calls)."""
        self.new_step()
        self.step_calls = 0

    def same(self, signature, profiled):
        return signature == profiled if self.sizes else _rank_only(signature) == _rank_only(profiled)

    def new_step(self):
        self.diverged = None     # what differed first in this step, or None
        self._calls = 0          # checkpoint calls this step has made
        self._by_name = {}       # checkpoint name -> calls this step made
        self._pending = 0        # calls whose backward has not begun
        self._backward_seen = False  # whether backward has begun in this step

    def _diverge(self, what):
        if self.diverged is None:
            self.diverged = what
            self.on_diverge(what)

    def call(self, name, args, kwargs):
        """A checkpoint call is beginning its forward: the _CallWatch its regions report to."""
        # A new step once backward began on every call's outputs; a call whose outputs need no
        # gradient (a frozen first layer given a batch without one) has none to wait for, and ends
        # the step only where no call of it had a backward and it made the profiled step's calls
        if self._calls > 0 and self._pending == 0 and (self._backward_seen or self._calls >= len(self.shape.calls)):
            self.new_step()
        index = self._calls
        self._calls += 1
        self.step_calls += 1
        self._by_name[name] = self._by_name.get(name, 0) + 1
        self._pending += 1
        expected = self.shape.calls[index] if index < len(self.shape.calls) else None
        if self.diverged is None:
            if expected is None or expected.name != name:
                profiled = sum(call.name == name for call in self.shape.calls)
                if profiled == 0:
                    self._diverge(f"checkpoint '{name}' ran, which the profiled step did not run")
                elif self._by_name[name] > profiled:
                    self._diverge(f"checkpoint '{name}' ran {_ordinal(self._by_name[name])} where the profiled step "
                                  f"ran it {_ordinal(profiled)}")
                else:
                    self._diverge(f"checkpoint '{name}' ran as call {index + 1} of the step, where the profiled step "
                                  f"ran " + (f"'{expected.name}'" if expected else f"only {len(self.shape.calls)} "
                                             "calls"))
            elif expected.autocast != autocast_state():
                self._diverge(f"autocast is {_autocast_text(autocast_state())} at checkpoint '{name}', "
                              f"{_autocast_text(expected.autocast)} in the profiled step")
            else:
                inputs = _signature((args, kwargs))
                if not self.same(inputs, expected.inputs):
                    self._diverge(f"checkpoint '{name}' was called with {_signature_text(inputs)}, the profiled step "
                                  f"with {_signature_text(expected.inputs)}")
        return _CallWatch(self, name, None if expected is None else expected.regions)

    def backward_began(self, name):
        """Backward has begun on the outputs of a call (None: one whose outputs need no gradient).
        Autocast there is compared once per step: autocast's cache keeps its casts alive until
        the autocast block ends, so a backward inside one peaks otherwise."""
        self._pending = max(0, self._pending - 1)
        if name is not None and not self._backward_seen:
            self._backward_seen = True
            profiled = self.shape.backward_autocast
            if profiled is not None and profiled != autocast_state():
                self._diverge(f"backward began with autocast {_autocast_text(autocast_state())} at checkpoint "
                              f"'{name}', {_autocast_text(profiled)} in the profiled step")


class _CallWatch:
    """One checkpoint call's regions, followed along the profiled call's."""

    def __init__(self, watch, name, regions):
        self.watch = watch
        self.name = name
        self.regions = regions
        self._next = 0

    def region(self, path, args):
        """A top-level region is beginning: whether it must recompute (the step has diverged)."""
        watch = self.watch
        if watch.diverged is None:
            index = self._next
            expected = self.regions[index] if self.regions is not None and index < len(self.regions) else None
            if expected is None or expected[0] != path:
                watch._diverge(f"region '{path}' ran where the profiled step ran " +
                               (f"'{expected[0]}'" if expected else "no more regions in that checkpoint call"))
            else:
                inputs = _signature(args)
                if not watch.same(inputs, expected[1]):
                    watch._diverge(f"region '{path}' was called with {_signature_text(inputs)}, in the profiled step "
                                   f"with {_signature_text(expected[1])}")
        self._next += 1
        return watch.diverged is not None

    def region_done(self, path, out):
        watch = self.watch
        index = self._next - 1
        if watch.diverged is None and self.regions is not None and index < len(self.regions):
            outputs = _signature(out)
            if not watch.same(outputs, self.regions[index][2]):
                watch._diverge(f"region '{path}' returned {_signature_text(outputs)}, in the profiled step "
                               f"{_signature_text(self.regions[index][2])}")

    def forward_done(self, out):
        """The call's forward has ended: fewer regions than profiled is a difference too; the call
        counts as pending until backward begins on one of its outputs."""
        watch = self.watch
        if watch.diverged is None and self.regions is not None and self._next < len(self.regions):
            watch._diverge(f"checkpoint '{self.name}' ran {self._next} region(s) where the profiled step ran "
                           f"{len(self.regions)}")
        outputs = [t for t in tensors_in(out) if t.requires_grad]
        if not outputs:
            watch.backward_began(None)
            return
        began = [False]

        def backward_begins(grad):
            if not began[0]:
                began[0] = True
                watch.backward_began(self.name)
            return grad

        for tensor in outputs:
            tensor.register_hook(backward_begins)
