"""remat.fit: a model's training steps kept within a step-peak budget, in one line.

    model = remat.fit(model, budget="70GiB")        # or wrap_decoder_layers(model, budget="70GiB")

fit() replaces the model's forward on the instance. A training step is what runs from one
training forward (grad on; eval mode too) to the next: forward, backward, the optimizer step
and whatever else the loop does. The first step runs inside remat.profile_regions() (every region
saved; the profile ends when the next training forward begins); every later step runs under
remat.use_plan() with the plan of least recompute time whose predicted step peak is within the
budget (profile.plan(peak_bytes=)). The plan is chosen before each forward, from what is allocated
then: bytes allocated beyond what the profiled step began with (optimizer state made by the first
optimizer.step(), say) stay through the step, so forward and backward must fit in what is left.
The profiled step is cut where its backward ended: what ran after it (the optimizer step) is
predicted apart, as measured, with the state it made counted once (allocated before every later
step), and is never scaled (_Profiled).

A step whose tensor inputs have other shapes than the profiled one (a longer sequence, a larger
batch) never runs on the old plan. It plans from the nearest profile (_nearest_profile: the
largest of smaller inputs, else the smallest of larger ones), not the latest. With r the ratio of
its inputs' elements to that profiled step's (the token count; 1 for fewer), everything forward and
backward held above what the profiled step began with (less what it freed of the last step's:
_Profiled.origin) is taken to scale by r: where r is at least REPROFILE_GROWTH and saving every
region is then predicted within the budget, the step is profiled again (later steps with those
shapes plan from that profile); otherwise the plan comes from the profile scaled so (inputs of
many lengths, dynamic padding, are not each profiled at several times a step's cost). The first
SHAPES_SAID new shapes are said, then one line that later ones are not. Where no plan
fits it raises before the forward, naming the least peak any plan reaches and what it is made
of; the same error comes at the first plan for a budget below what the profile allows. The
parameters' gradients are not scaled (they keep their size whatever the inputs): each segment of
the profile is lowered by the share of the gradients made before it that scaling would add
(_Profiled.planned_for). A region that grows faster than the token count (a causal mask of
sequence x sequence) shows in the scaled step's peak, read when its backward ends: later steps
with those inputs leave room for what it took above its prediction (or, where no plan then fits,
scale by the growth measured), steps of other inputs scaled from that profile scale by the growth
estimated from the lengths measured (_correction), and a step that went over the budget is a
warning naming the measured and predicted peaks, never silent. fit() again on a fitted model (a
new budget) keeps what was learned.

Gradient accumulation (micro-batches, each with its own backward, then optimizer.step()) is a step
per micro-batch. A micro-batch that begins with the gradients there (the second on) is planned from
the profile less, in each segment, the gradients its backward had made by then (recorded as the
profile ran): backward adds into them in place. The gradients of parameters that have none and that
the profiled step's backward did not make (a part of the model used from a later step on) are
counted whole through every step that may make them. While the model has parameters the profiled
step gave no gradient, so are the gradients of the step's inputs that require grad: a part of the
model the profile did not run that reads them makes them as backward begins (where no plan leaves
room for them the step is planned without: such a part may not read the inputs). The optimizer step
is seen as the parameters changing after a step, or as a torch.optim optimizer over them stepping
(a fused step may leave their version counters as they were); `cycle` micro-batches run from one to
the next (a forward whose loss is dropped counts in training mode, a skipped batch, but not in eval
mode, a validation loss with grad on). Its
memory after the backward it follows is measured where it runs after a planned step and predicted,
less the state it made then, after every later cycle's last micro-batch; every micro-batch is
refused before its forward where one after it would not fit (no plan changes it). Before it first
runs (the first cycle, after the profiled micro-batch), it is predicted on stand-ins of the
parameters, the state it makes included (remat._optimizer_step), and every micro-batch of that cycle
is refused where it would not fit after it (optimizer_peak_bytes: that prediction). Where it cannot
be predicted so (no torch.optim.Optimizer holds the parameters, or its step cannot run on
stand-ins), a first run over the budget is said with the figures and why. An optimizer step that
makes state for parameters that have none while the optimizer holds state for others (a part of the
model first given a gradient in a later step) holds what no measured one did: while there are such
parameters, it is predicted on stand-ins after every step (state there made new, the rest as it is)
and checked as above.

A step that differs from the profiled one otherwise (a checkpoint called more times, a region the
profile did not run, inputs of another dtype, autocast on where it was off: remat._step_shape; the
model in another training mode than in the profiled step) recomputes every region from the first
difference and is said once per difference. A step that makes fewer checkpoint calls than the
profiled one ran partly outside the plan: said at its end (once per count), nothing reserved for it. Every planned
step's peak is read when its backward ends: later steps with those inputs plan lower by what a
step that differed took above its prediction, or by what one went over the budget (said once),
and one is profiled again where saving everything is estimated within the budget. A step ends
with its optimizer step (torch.optim's post-step hook), or with its backward where no update
follows: what runs after it before the next step is outside it (_step_peak). A forward whose
backward never ran, followed by another in the step (a skipped loss still referenced), is no
part of what the step is planned as (_held_skipped_graph).

The profiled step is the model's first and runs cold (or beside another load): the first
`retime_steps` steps planned from a profile at its own inputs time each region's forward as it runs
(_timing.RegionTimes), and the profile's seconds are then scaled, region by region, by the median
of those times over its profiled one (_take_times); later steps plan from that profile. The times
of a step that ran other regions, or more calls of them, than the profiled one are dropped (one
that differs stops timing there), and after RETIME_TRIES times retime_steps timed steps the profile
keeps its times. A region the plan offloads is not timed (its copies run inside it): it keeps its
profiled seconds. So does every region where the clock changed (CUDA initialized after the profile).

The profiled step checks each region's forward against the model's buffers' version counters: under
fit the plan chooses for every region, so a region the code recomputes that updates a buffer its
checkpoint does not give back to recompute (one of a module the checkpoint's function does not
reach) is recomputed by every plan. The buffers it does give back (a BatchNorm's running
statistics, as a rule) recompute reads as forward read them and leaves as it found them, so they
are updated once per forward whatever the plan; the copies a recompute makes of them are added to
each prediction (_buffer_copies).

The step's tensors must be counted for the profile to measure the step: CPU tensors inside
remat.tag_cpu_tensors(), CUDA tensors under remat_alloc.install().

A step of several training forwards before one backward (losses summed) is known by every
forward's inputs, in order. Before its first forward only that forward's are known: it is planned
for the later forwards that the last step beginning with the same inputs took (or, for new ones,
the last step's). Where its later forwards take other inputs, it ran outside what was planned:
said at its end (with its peak where over the budget), and steps beginning so are planned for
those from then on. The ratio a step scales a profile by is that of the input grown most, where
both list as many tensors: the longer forward's backward works at its own length.

fit profiles and plans the eager model: a training forward traced by torch.compile (the model
compiled, or a function calling it) would run no region as such, and is refused when the compiled
function runs, at every step, before its forward (UNDER_COMPILE).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import json
import math
import statistics
import weakref

import remat_alloc
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _optimizer_step, _plans, _profiling
from ._compile import refuse_planning
from ._extension import _C
from ._memory import tag_cpu_tensors
from ._offload_plans import host_budget_arg
from ._step_profile import StepRecorder, tensors_in
from ._step_shape import StepWatch, warn_at_user_line
from ._timing import RegionTimes, retime_steps_arg, timer_arg

__all__ = ["fit", "unfit"]

RETIME_STEPS = 3  # fit()'s retime_steps: planned steps timed to re-time a profile
RETIME_TRIES = 4  # a profile is timed in at most this many times retime_steps steps (some may differ)
# A step whose inputs are at least this many times the nearest profile's (by elements) is profiled
# again where saving every region is predicted within the budget; nearer ones plan from that profile
# scaled (inputs of many lengths, dynamic padding, would each be profiled, at several times a step's cost)
REPROFILE_GROWTH = 2.0
SHAPES_SAID = 3  # new input shapes said each; past them one line says that later ones are not
_REGIONLESS_STEPS = 3  # profiled steps in a row that ran no region before the model is refused as having none


def _signature(args, kwargs):
    """(shape, dtype, device) of each tensor input, in order: what makes two steps the same shape."""
    return tuple((tuple(t.shape), t.dtype, str(t.device)) for t in tensors_in((args, kwargs)))


def _elements(signature):
    return sum(math.prod(shape) for shape, _, _ in signature)


def _input_bytes(signature):
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype, _ in signature)


def _ratio(signature, profiled):
    """How many times `profiled`'s inputs a step with `signature` takes: by elements, or by bytes
    where the dtypes grew (float32 -> float64 inputs: each activation twice); 1 for fewer (planned
    as the profiled inputs). Where both list as many tensors, by the one grown most: of two
    forwards summed for one backward, the longer one's backward works at its own length, not the
    step's average."""
    ratios = [_elements(signature) / max(1, _elements(profiled)),
              _input_bytes(signature) / max(1, _input_bytes(profiled))]
    if len(signature) == len(profiled):
        ratios += [_input_bytes((one,)) / max(1, _input_bytes((other,))) for one, other in zip(signature, profiled)]
    return max(1.0, *ratios)


def _stretch(signature, profiled):
    """How many times `profiled`'s the step's inputs are along the dimension grown most (a longer
    sequence at the same token count, a smaller batch of it, stretches what grows with the square of
    the sequence): at least _ratio()'s; where the inputs differ in number or rank, that ratio."""
    ratio = _ratio(signature, profiled)
    if len(signature) != len(profiled) or any(len(a) != len(b) for (a, _, _), (b, _, _) in zip(signature, profiled)):
        return ratio
    return max([ratio] + [new / max(1, old) for (a, _, _), (b, _, _) in zip(signature, profiled)
                          for new, old in zip(a, b)])


def _shapes_text(signature, dtypes=False):
    """"16x32x32, 16": each input's shape, with its dtype where `dtypes` (when they changed)."""
    return ", ".join(("x".join(str(d) for d in shape) or "scalar") + (f" {str(dtype).replace('torch.', '')}"
                                                                       if dtypes else "")
                     for shape, dtype, _ in signature) or "no tensors"


def _bytes_text(count):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.2f} {unit} ({count} bytes)"
    return f"{count} bytes"


def _scaled_origin(ratio, tokens):
    """What a step planned from another profile's inputs plans from, scaled by `ratio` where the
    token count grew `tokens` times."""
    if ratio == 1.0:
        return "profile of the larger inputs as it is"
    if ratio <= tokens:
        return f"profile scaled by {ratio:.3g}, assuming every region scales with the token count"
    return (f"profile scaled by {ratio:.3g} ({tokens:.3g}x the token count, times {ratio / tokens:.3g} as steps scaled "
            "from it grew faster)")


def _tell(message):
    warn_at_user_line(message)


class _Profiled:
    """A profile and the input signature of the step it measured, cut where its backward ended.

    Forward and backward (`planned`: the profile with the step's segments up to there) are what
    a plan changes and what scales with the token count. What ran after backward (the optimizer
    step, zero_grad) no plan changes and nothing in it is taken to scale: it began at
    `after_start` bytes (the gradients backward made, which are not scaled, among them) and
    peaked at `after_peak`. What the step left allocated beyond what it began with
    (`persisted`: the optimizer state its optimizer.step() made, say) is allocated before
    every later step, in what that step begins with: counted there, not again in the
    part after backward, whose measured peak already holds it. Where backward did not end inside
    the profile (or a checkpoint ran after it), the whole step is `planned`, as measured."""

    def __init__(self, profile, signature, made=frozenset(), gradients=0, optimizer_after=False):
        self.training = True  # the model's mode in the profiled step (set by fit when it ends)
        self.model_bytes = 0  # the model's parameters' bytes in the profiled step (set by fit when it ends)
        self.warm_steps = []  # per planned step at these inputs timed so far: region -> forward seconds
        self.timed_steps = 0  # the steps at these inputs that timed their regions (some may not count)
        self.warm = False  # its seconds are those of warm steps (retimed())
        self.profile = profile
        self.signature = signature
        self.made = frozenset(made)  # the parameters whose gradients the step's backward made (names)
        self.gradients = gradients  # their bytes (none of them there at the step's start)
        self.optimizer_after = optimizer_after  # the parameters changed after its backward (an optimizer step)
        # region -> the bytes of the model's buffers its forward changed (FitState._buffer_copies)
        self.buffer_copies = {}
        self.start = profile.step_start_bytes
        self.persisted = max(0, profile.step_end_bytes - self.start)
        self.planned = profile
        self._lowered = {}  # planned_for()'s profiles by the share of each segment's gradients taken off
        self.after_start = self.after_peak = None
        after = profile._after_backward
        grads = profile._segment_gradients
        # The gradients the step's backward made that were still allocated when it ended (read
        # then; an optimizer run inside backward frees each as it steps): its segments held at most those
        self._gradients_kept = grads[after] - grads[0] if after is not None and grads and after < len(grads) else 0
        doc = json.loads(profile.to_json())
        segments = doc["step"]["segments"]
        # What was freed between the forward's end and the backward's start: the last step's
        # tensors a loop held until this forward returned (`loss = model(x)` drops the last loss, its
        # batch and that batch's gradient), allocated at this step's start and no part of it
        backward = next((i for i, s in enumerate(segments) if s.get("backward", -1) != -1), 0)
        before = backward - 1  # the segment from the forward's end on (an autocast block's end cuts it)
        cleared = doc["step"].get("autocast_cleared", [])
        while before > 0 and before in cleared:
            before -= 1
        self.freed = max(0, segments[before]["start_bytes"] - segments[backward]["start_bytes"]) \
            if backward > 0 else 0
        if after is None or not 0 < after < len(segments):
            return
        tail = segments[after:]
        self.after_start = tail[0]["start_bytes"]
        self.after_peak = max(s["peak_bytes"] for s in tail)
        doc["step"]["segments"] = segments[:after]
        if "freed_in" in doc["step"]:  # freed in the part cut off: held through the rest
            doc["step"]["freed_in"] = [s if s < after else -1 for s in doc["step"]["freed_in"]]
        if cleared:
            doc["step"]["autocast_cleared"] = [s for s in cleared if s < after]
            if not doc["step"]["autocast_cleared"]:
                del doc["step"]["autocast_cleared"]
        doc["step"]["peak_bytes"] = max([s["peak_bytes"] for s in segments[:after]] + [self.start])
        doc["step"]["end_bytes"] = self.after_start
        self.planned = _plans.RegionProfile(json.dumps(doc))
        self.planned._shape = profile._shape
        self.planned._segment_gradients = profile._segment_gradients

    def planned_for(self, absent, ratio=1.0):
        """The forward-and-backward profile to plan a step by that is to make `absent` bytes of
        gradients, its inputs `ratio` times the profiled step's (peak() scales what it holds above
        its start by `ratio`).

        A micro-batch of gradient accumulation after the first begins with every gradient there:
        backward adds into each in place, so it does not hold again what the profiled step's
        backward had made by each point. Each segment's figures less the gradients made before it
        began (recorded as the profile ran) bound such a step from above: within a segment, what it
        makes of them is taken as still made (its new gradient is alive while it is added in).

        A step that makes its gradients makes them at their own size, whatever its inputs: scaled as
        they are by `ratio`, those a segment held would count (ratio - 1) times more than it holds
        (a model whose gradients outweigh its activations would be refused steps that fit). So each
        segment is lowered by that share, (ratio - 1) / ratio in sixteenths rounded down, of the
        gradients made before it began, at most those still allocated when backward ended (an
        optimizer run inside backward frees them), and peak() scaling the rest counts them once (a
        sixteenth at most over). With no record, the profile as it is bounds either step."""
        grads = self.profile._segment_gradients
        if not self.gradients or not grads:
            return self.planned
        if not absent:
            return self._lowered_by(1.0, self.gradients)
        # In sixteenths, rounded down (lowered less: on the safe side), so that steps of many lengths
        # share a few profiles, each searched once for its plans
        share = math.floor(16 * (ratio - 1.0) / ratio) / 16
        if share > 0 and self._gradients_kept > 0:
            return self._lowered_by(share, self._gradients_kept)
        return self.planned

    def _lowered_by(self, share, most):
        """The planned profile with each segment's figures less `share` of the gradients made before
        it began (at most `most` bytes of them), rounded down; the last few kept."""
        lowered = self._lowered.get((share, most))
        if lowered is None:
            grads = self.profile._segment_gradients
            doc = json.loads(self.planned.to_json())
            step = doc["step"]
            for segment, at_start in zip(step["segments"], grads):
                made = int(share * min(most, max(0, at_start - grads[0])))
                segment["peak_bytes"] -= made
                segment["start_bytes"] -= made
            step["peak_bytes"] = max([s["peak_bytes"] for s in step["segments"]] + [step["start_bytes"]])
            step["end_bytes"] -= min(int(share * most), max(0, step["end_bytes"] - step["start_bytes"]))
            lowered = _plans.RegionProfile(json.dumps(doc))
            lowered._shape = self.profile._shape
            if len(self._lowered) > 16:  # a sixteenth each, and the profile with the gradients there
                del self._lowered[next(iter(self._lowered))]
            self._lowered[(share, most)] = lowered
        return lowered

    def retimed(self, forward_seconds):
        """This profile re-timed from warm steps (region -> its forward's seconds there:
        RegionProfile._retimed). Its memory figures are as they were."""
        again = _Profiled(self.profile._retimed(forward_seconds), self.signature, self.made, self.gradients,
                          self.optimizer_after)
        again.training, again.model_bytes, again.warm = self.training, self.model_bytes, True
        again.buffer_copies = self.buffer_copies
        return again

    def all_saved_peak(self, base, ratio):
        """peak() of the plan that saves every region, for a step that makes its gradients."""
        return self.peak(self.planned_for(self.gradients, ratio).step_peak_bytes, base, ratio)

    def _backward_left(self):
        """(bytes backward left allocated over the step's start, the gradients among them)."""
        end = self.after_start if self.after_start is not None else self.profile.step_end_bytes
        left = end - self.start
        return left, min(max(0, left), self.gradients)

    def peak(self, planned_peak, base, ratio, absent=None, after=True, extra=0, early=0):
        """The step peak predicted for a step that begins with `base` bytes allocated, its
        inputs `ratio` times the profiled step's, under a plan whose forward and backward peak at
        `planned_peak` in the profiled step (a peak of planned_for(absent)). `absent`: the bytes of
        the gradients the step is to make of those the profiled step made (default: all of them);
        `extra`: those of the gradients it may make beyond them, added whole. `early`: gradients
        the profiled step made too but last, which the step may hold through its backward (the
        part after it holds them either way). `after`: with the part after backward (False: that
        part was an optimizer step this step is not followed by)."""
        absent = self.gradients if absent is None else absent
        peak = base + _scaled(planned_peak - self.origin(ratio), ratio) + extra + early
        if after and self.after_start is not None:
            already = min(self.persisted, max(0, base - self.start))  # made by the profiled step, there before this
            # What backward left allocated: the gradients it made (those this step makes), as they
            # are, and the rest scaled
            left, made = self._backward_left()
            after_peak = (base - already + min(made, absent) + extra + _scaled(left - made, ratio) + self.after_peak
                          - self.after_start)
            peak = max(peak, after_peak)
        return peak

    def origin(self, ratio):
        """What the step's growth is counted from, scaled by `ratio`: the bytes it began with, less,
        where scaled, what it freed of the last step's (`freed`): that part of the start was not the
        step's own, and the growth above the start alone under-counts a longer step."""
        return self.start if ratio == 1.0 else self.start - self.freed

    def backward_end(self, base, ratio, absent, extra=0):
        """The bytes allocated when a step's backward ends (peak()'s arguments)."""
        left, made = self._backward_left()
        return base + min(made, absent) + extra + _scaled(left - made, ratio)

    def after_backward_peak(self, base, ratio):
        """The part of peak() no plan changes (0 where the step was not cut)."""
        return 0 if self.after_start is None else self.peak(self.start, base, ratio)


def _release_failed_backward():
    """After a backward that raised, the engine keeps the nodes it had still to run (and the
    tensors they saved) in this thread's ready queue until the next backward on this thread: a
    backward of nothing frees them, so that the step profiled next does not count them."""
    with torch.inference_mode(False), torch.enable_grad():
        torch.zeros((), requires_grad=True).mul(1).backward()


def _held_weakly(method):
    """A bound method of the fit state, for what the state itself holds (its profile, its watch):
    holding the method weakly leaves no cycle through the state, so that dropping the model frees
    it, its parameters and the state by reference counting, not only when the garbage collector runs."""
    method = weakref.WeakMethod(method)

    def call(*args):
        bound = method()
        return None if bound is None else bound(*args)
    return call


def _close_abandoned(session):
    """Ends a profile its fit state no longer measures, where it is still open (the model was
    dropped during its step): no later profile or forward on this thread meets it."""
    if session._open:
        session.__exit__(RuntimeError, None, None)


def _scaled(count, ratio):
    """`count` bytes scaled by `ratio`, rounded up; bytes the step freed (below 0) stay as measured."""
    return count if count <= 0 else math.ceil(count * ratio)


class FitState:
    """What fit() keeps for one model: the budget, the profiles by input signature, the profile
    being measured (open until the next training forward) and the plan of the step running now."""

    def __init__(self, model, budget, timer="auto", host_budget=0, retime_steps=RETIME_STEPS):
        self._model = weakref.ref(model)  # the model holds this state (model.remat_fit): no cycle back
        self.budget = budget
        self.host_budget = host_budget  # host memory plans may offload to (0: no offload)
        self.timer = timer          # how profiles time regions (profile_regions(timer=))
        self.retime_steps = retime_steps  # planned steps whose regions' times re-time a profile (0: none)
        self.timing = None          # (_Profiled, RegionTimes) where the step running now times its regions
        self.measuring = None       # (profile_regions, signature) open since a training forward
        self.plan = None            # the plan the step running now (or the last planned one) runs under
        self.predicted_peak_bytes = None  # that plan's predicted step peak at that step's inputs
        # (signature, start, predicted peak, ratio, profile's signature, room left for excess, factor the
        # ratio took for it where no plan left that room) of a step planned from a profile scaled
        self.scaled_step = None
        self.planned_step = None    # (signature, predicted peak) of a step planned from its inputs' own profile
        self.backward_peak = None   # the peak when the scaled or diverged step's backward ended
        self.diverged = None        # (what differed, plan's predicted peak, the peak before it) this step
        self.told_differences = set()  # what differed that fit has told the user about
        self.fewer_calls_over = {}  # ("fewer calls", made, profiled) -> such steps over the budget
        self.watch_signature = None  # the inputs of the step the watch follows, where planned unscaled
        self.diverged_peaks = []    # per step that differed: its measured peak
        self.profiled_steps = 0
        self.planned_steps = 0
        self.shape_changes = 0      # steps whose inputs took a shape not seen before (_shape_change)
        self.measuring_had = set()  # the parameters with a gradient when the profiled step began (names)
        self.measuring_graded = set()  # the parameters with a gradient at any point of it (names)
        self.measuring_model_bytes = 0  # the model's parameters' bytes when the profiled step began
        # Gradient accumulation: the optimizer step is seen as the parameters changing (their version
        # counters) after a step's backward; `cycle` steps (micro-batches) from one to the next
        self.position = 0           # the step running now, counted from the last optimizer step (1: the first)
        self.cycle = None           # micro-batches per optimizer step, once one was seen
        self._optimizers = None     # once an optimizer stepped: the optimizers over the model's parameters (weakly)
        self.optimizer_peak_bytes = None  # the predicted peak of an optimizer step after the step running now
        self.expect_optimizer = False  # the step running now is predicted with the optimizer step after it
        self.input_gradient_bytes = 0  # the bytes of the step's inputs that require grad (their gradients')
        # A step's signature is every training forward's inputs (losses summed for one backward: a
        # forward per micro-batch), known in full only as it ends: it is planned for those its first
        # forward's inputs began with in the last such step (followers), or those of the last step
        self.forwards = []          # each training forward's signature in the step running now
        # Per forward of the step running now: whether its backward began (None: not watched, as in
        # a profiled step); a forward with none, followed by another, held its graph through it
        self.backward_began = []
        self.skipped_forwards = 0   # training forwards of this cycle whose backward never ran (skipped batches)
        self.followers = {}         # first forward's signature -> the later forwards' of the last step begun so
        self.last_followers = ()    # the later forwards' signatures of the last step
        self.step_signature = None  # the signature the step running now was planned or profiled for
        self.step_training = True   # whether the step running now began in training mode
        self.closed = False         # close() ran: unfit, or fit again
        self.backward_end = None    # (bytes, gradient bytes) when the planned step's backward ended
        # After a planned step's backward: the peak since then as torch.optim optimizers over the
        # model finished their steps (what runs after them, before the next step, runs outside it)
        self.optimizer_end_peak = None
        self.measured_peak = 0      # the step's peak, as the step ends (_step_peak)
        self._versions = None       # the parameters' version counters when the step began; None: no step open
        self._stepped = False       # an optimizer over the model's parameters stepped since (_optimizer_stepped)
        self._held_by = weakref.WeakKeyDictionary()  # optimizer -> (its parameter count, whether it holds ours)
        self._named = None          # the model's named parameters while a step begins or ends (_parameters_listed)
        # The step's peak, in a window of fit's own (remat_alloc.PeakWindow): the peak statistics
        # (memory_stats(), PyTorch's max_memory_allocated()) stay the user's to read and reset.
        self._window = None
        self._window_peak = 0
        self._awaiting = None       # a planned step's backward hook (weakly: alive with its graph), until it runs
        self.regionless_steps = 0   # profiled training steps in a row whose checkpoints ran no region
        self.others_stepped = False  # another fitted model's step began since this one's began
        self.finished_early = False  # this one's step was ended as another's began (begin_step)
        self.frozen = None          # the names of the parameters that required no gradient in the steps learned from
        self.learned_when_frozen = {}  # frozen -> what was learned while those were, where others are now
        self._learn_afresh()

    # What fit learns from profiles and steps: apart for each set of parameters that require no
    # gradient, which changes what a step keeps for backward and the gradients it makes
    _LEARNED = ("profiles", "latest", "measured_plans", "corrections", "excess", "growth", "warned", "watch",
                "reprofile", "reprofiled", "reserve", "under_predicted", "optimizer_part", "first_optimizer",
                "_new_state", "optimizer_basis")

    def _learn_afresh(self):
        self.profiles = {}          # signature -> _Profiled
        self.latest = None          # the _Profiled made last
        self.measured_plans = {}    # (signature, profiled signature) -> (plan, peak over its start) of a scaled
        #                             step within the budget
        # Steps planned from a profile scaled (key: (signature, profiled signature)): the factor on the
        # token count it scales by (_correction, fixed at the first such step), what such steps took
        # above their prediction (bytes, added to later ones), and how much faster than the token count
        # the first one grew (other inputs' factors are estimated from these)
        self.corrections = {}
        self.excess = {}  # key -> (bytes, the factor on the token count they amount to, where no plan leaves them)
        self.growth = {}
        self.warned = set()         # signatures fit has told the user about
        self.watch = None           # (_Profiled, StepWatch) following planned steps along that profile's step
        self.reprofile = {}         # signature -> (what differed, bytes saving it would add): profile again
        self.reprofiled = set()     # what differed that made fit profile again (once each)
        self.reserve = {}           # signature -> bytes steps took above their plan's prediction (differing, or over)
        self.under_predicted = set()  # signatures whose reserve has a step that ran as profiled and went over
        self.optimizer_part = None  # (its peak over the bytes when backward ended, the state it made) as measured
        # Before one was measured: (rise, state made, None) of the first optimizer step as predicted
        # on stand-ins (remat._optimizer_step), or (None, None, why not); None until asked
        self.first_optimizer = None
        # Where an optimizer is to make state for some parameters (_new_state_rise): (those
        # parameters, the next step's prediction on stand-ins)
        self._new_state = None
        # What the optimizer step's predicted peak came from: "first" (the first, on stand-ins),
        # "measured" (an earlier one), "new state" (on stand-ins: it makes state that was not there)
        self.optimizer_basis = None

    def _follow_frozen(self):
        """Before a step: where the parameters that require no gradient changed (layers frozen or
        unfrozen), what was learned under the others is set aside and what was learned under these
        taken back, if they were so before. Else, where a set seen before froze no more than these
        (layers frozen now that trained then), its steps kept and made at least what these do: these
        plan from a copy of what was learned under the one that froze the most, a bound from above.
        Else (layers unfrozen) nothing bounds them: the step is profiled afresh. Either is said."""
        frozen = tuple(name for name, p in self._named_parameters() if not p.requires_grad)
        if frozen == self.frozen:
            return
        before, self.frozen = self.frozen, frozen
        if before is None:  # the first step
            return
        self.learned_when_frozen[before] = {name: getattr(self, name) for name in self._LEARNED}
        learned = self.learned_when_frozen.pop(frozen, None)
        if learned is not None:
            self.__dict__.update(learned)
            return
        now, then = set(frozen), set(before)
        change = (f"remat.fit: the parameters that require gradients changed ({len(now - then)} frozen since the "
                  f"steps before, {len(then - now)} unfrozen): what a step keeps for backward and the gradients it "
                  "makes change with them")
        # The set that froze the most of these: the tightest bound
        bound = max((key for key in self.learned_when_frozen if set(key) <= now), key=len, default=None)
        if bound is not None:
            copied = {name: copy.copy(value) for name, value in self.learned_when_frozen[bound].items()}
            self.__dict__.update(copied, watch=None)
            _tell(f"{change}, and steps with more of them trained bound these from above: they plan from what was "
                  "learned then")
            return
        self._learn_afresh()
        _tell(f"{change}, and nothing learned bounds them: this step is profiled again (every region saved, which "
              "may peak over the budget), and later steps plan from that profile")

    def _learned_from(self, before):
        """fit() again on a fitted model (another budget): what `before` learned holds whatever the
        budget (profiles, how steps grew, the optimizer step's figures), so the next step plans from
        it rather than profiling again with every region saved, over a budget made smaller."""
        for name in self._LEARNED:
            setattr(self, name, getattr(before, name))
        self.watch = None  # follows the steps of `before`'s plans
        self.frozen = before.frozen
        self.learned_when_frozen = {frozen: dict(learned, watch=None)
                                    for frozen, learned in before.learned_when_frozen.items()}
        self.cycle, self.position, self.shape_changes = before.cycle, before.position, before.shape_changes

    def __deepcopy__(self, memo):
        """The state of a copied model (copy.deepcopy(model): an EMA or teacher copy): fitted with
        the same budget from a profile of its own, at its first training step. The model is copied
        first, so the copy is in memo."""
        model = memo.get(id(self.model))
        if model is None:
            raise TypeError("remat.fit: a fit state is copied with its model (copy.deepcopy(model)), not alone")
        state = FitState(model, self.budget, self.timer, self.host_budget, self.retime_steps)
        _fitted.add(state)
        return state

    def __reduce__(self):
        raise TypeError(f"remat.fit: a fitted model ({type(self.model).__name__}) cannot be pickled "
                        "(torch.save(model), multiprocessing): its fit state follows the running process. Save "
                        "model.state_dict(), or call remat.unfit(model) before saving and remat.fit the loaded model")

    @property
    def model(self):
        return self._model()

    def _read_peak(self):
        """The most requested bytes held since _restart_peak()."""
        device = StepRecorder._counted_device()
        if device is None:
            return 0
        if self._window is None or self._window.device != device:
            self._window = remat_alloc.PeakWindow(device)
            self._window_peak = 0
        self._window_peak = max(self._window_peak, self._window.take())
        return self._window_peak

    def _restart_peak(self):
        self._read_peak()
        self._window_peak = 0

    def close(self):
        """Ends the fit (unfit, or fit again): a planned step's backward still to run (its forward
        ran under this fit) reads no peak here."""
        self.closed = True
        if self._window is not None:
            self._window.close()

    @contextlib.contextmanager
    def _parameters_listed(self):
        """Lists the model's parameters once for what runs inside (a step's start and its end each ask
        several times: versions, gradients, the optimizer's state; each list walks every module), and
        holds them no longer: a parameter the forward makes is seen after it, one replaced after the
        step is freed."""
        self._named = list(self.model.named_parameters())
        try:
            yield
        finally:
            self._named = None

    def _named_parameters(self):
        return self._named if self._named is not None else list(self.model.named_parameters())

    def _parameters(self):
        return [p for _, p in self._named_parameters() if p.requires_grad]

    def _parameter_bytes(self, names=None):
        """The bytes of the parameters named (None: all of them; made bfloat16, they take half)."""
        return sum(p.numel() * p.element_size() for name, p in self._named_parameters()
                   if names is None or name in names)

    def _gradient_bytes(self):
        return sum(p.grad.numel() * p.grad.element_size() for p in self._parameters() if p.grad is not None)

    def _graded(self):
        """The names of the parameters that have a gradient now."""
        return {name for name, p in self._named_parameters() if p.requires_grad and p.grad is not None}

    def _profiled_gradient_bytes(self):
        """_gradient_bytes() for the profile being measured, noting which parameters its backward
        has given a gradient by then (the profile reads it at every segment's start)."""
        self.measuring_graded |= self._graded()
        return self._gradient_bytes()

    def _absent_gradients(self, source):
        """(bytes, bytes, bytes) of the gradients the step's backward is to make, with `source`'s
        profile: those of parameters that have none now whose gradient that profiled step's
        backward made; those of the other parameters that have none now; and those of the step's
        inputs that a part of the model the profiled step did not run may make early.

        The second are counted whole through the step: the profile does not hold them (a layer used
        from a later step on, a parameter first reached then), and where such a parameter stays
        without a gradient the prediction is above the step by its bytes, never below. The third
        (the inputs that require grad, where some parameter's gradient was not made by the profiled
        step): its checkpoints made them last in backward, while a part it did not run that reads
        them, run last in forward, makes them as backward begins, and backward holds them to its
        end."""
        made = other = 0
        unreached = False
        for name, p in self._named_parameters():
            if p.requires_grad:
                unreached = unreached or name not in source.made
                if p.grad is None:
                    if name in source.made:
                        made += p.numel() * p.element_size()
                    else:
                        other += p.numel() * p.element_size()
        return made, other, self.input_gradient_bytes if unreached else 0

    def _optimizer_peak(self, source, base, ratio, absent, extra):
        """The peak of the optimizer step after this step's backward, from the last one measured
        after a planned step: its rise over the bytes when backward ended, less the state it made
        then, which is allocated now. Before any optimizer step was seen (the first cycle of
        gradient accumulation, after the profiled micro-batch), the first one is predicted on
        stand-ins, state and transient whole: none of it is allocated yet. 0 where neither. Where
        the step is to make state for parameters that have none (_new_state_rise), at least its
        prediction on stand-ins."""
        end = source.backward_end(base, ratio, absent, extra)
        self.optimizer_basis = None
        if self.optimizer_part is not None:
            rise, made = self.optimizer_part
            peak = end + max(0, rise - made)
            self.optimizer_basis = "measured"
        elif self.cycle is not None:
            peak = 0  # the profiled step holds it (its part after backward)
        else:
            if self.first_optimizer is None:
                # Every parameter a backward may give a gradient to has one then (as _absent_gradients counts them)
                parameters = self._parameters()
                self.first_optimizer = _optimizer_step.prediction(parameters, {id(p) for p in parameters},
                                                                  self._on_host(parameters))
            rise = self.first_optimizer[0]
            if rise is None:
                return 0
            self.optimizer_basis = "first"
            return end + rise
        rise = self._new_state_rise()
        if rise is not None and end + rise > peak:
            peak = end + rise
            self.optimizer_basis = "new state"
        return peak

    @staticmethod
    def _on_host(parameters):
        """Whether the parameters are on the CPU, whose bytes the budget counts."""
        return bool(parameters) and all(p.device.type == "cpu" for p in parameters)

    def _new_state_rise(self):
        """The rise of the next optimizer step over the bytes when it begins, predicted on stand-ins,
        where an optimizer that holds state is to make state for parameters that have none (a part
        of the model first given a gradient in a later step): what was measured of the optimizer
        step does not hold that state. Counted in every step while they have none, as their
        gradients are (_absent_gradients): a parameter that stays without a gradient puts the
        prediction above the step by its state. None where there are no such parameters, or where
        the step cannot run on stand-ins (its first run is then measured)."""
        parameters = self._parameters()
        optimizers = [o for o in (ref() for ref in self._optimizers or ()) if o is not None]
        if self._optimizers is None or (self._optimizers and not optimizers):
            # Searched once (the collector's objects scanned), again only where those found are gone
            self._optimizers = [weakref.ref(o) for o in _optimizer_step.optimizers_over(parameters)]
            optimizers = [ref() for ref in self._optimizers]
        new = frozenset(id(p) for p in _optimizer_step.without_state(optimizers, parameters))
        if not new:
            return None
        if self._new_state is None or self._new_state[0] != new:
            self._new_state = (new, _optimizer_step.prediction(parameters, {id(p) for p in parameters},
                                                               self._on_host(parameters), optimizers))
        return self._new_state[1][0]

    # --- between steps ---------------------------------------------------------------------------

    def backward_pending(self):
        """Whether the step's backward is still to come: its training forward is done, its backward
        has not begun, and its graph is alive."""
        if self.measuring is not None:
            return bool(self.measuring[0]._step.backward_pending())
        return self._awaiting is not None and self._awaiting() is not None

    def discard_profile(self, step_goes_on=False):
        """Drops the profile of a step whose forward raised (or whose backward did not run in full):
        the next training step is profiled afresh. `step_goes_on`: the step itself runs on, its
        backward and optimizer step to come (a step that ran no region)."""
        if self.measuring is not None:
            session, _ = self.measuring
            self.measuring = None
            self.profiled_steps -= 1
            # Its forward ran: a micro-batch of the cycle all the same, as a planned one that fails is
            # (self.position keeps it: the optimizer steps after the same count of forwards)
            if not step_goes_on:
                self._versions = None
            session.__exit__(RuntimeError, None, None)

    def check_regions_ran(self):
        """After the profiled step's first training forward: where it ran no region of a
        checkpoint, there is nothing to plan: refused now, before its backward (the next step would
        find the profile empty), where no checkpoint ran. Where checkpoints ran, every layer may
        have been skipped (LayerDrop decided in the checkpoints): the step runs unplanned and the
        next is profiled, said once; the third such step in a row is refused."""
        if self.measuring is None or not self.step_training:
            return
        if self.measuring[0]._order:
            self.regionless_steps = 0
            return
        calls = self.measuring[0]._calls
        self.regionless_steps += 1
        self.discard_profile(step_goes_on=bool(calls) and self.regionless_steps < _REGIONLESS_STEPS)
        if calls and self.regionless_steps < _REGIONLESS_STEPS:
            if self.regionless_steps == 1:
                _tell(f"remat.fit: the profiled step ran {calls} checkpoint call(s) and no region in them (every "
                      "layer skipped, as LayerDrop does?): it ran without a plan, and the next training step is "
                      f"profiled instead; {_REGIONLESS_STEPS} such steps in a row are refused")
            return
        ran = (f"{_REGIONLESS_STEPS} training steps in a row ran no region of a checkpoint ({calls} checkpoint "
               "call(s) in the last)" if calls else "the model's training forward ran no region of a checkpoint")
        raise ValueError(f"remat.fit: {ran}, so there is nothing to plan: a plan saves or "
                         "recomputes each region of the model's checkpoints. Mark its layers with remat.checkpoint "
                         "and remat.region (wrap_decoder_layers for a Hugging Face model), or train it without "
                         f"remat.fit. Where the model has them: {_plans.NO_REGION_RAN}")

    def finish_step(self):
        """Ends the training step before this point: closes its profile, or checks the measured
        peak of a step planned from a scaled profile. Once: a step ended early, as another fitted
        model's step began, is not ended again."""
        if self.finished_early:
            self.finished_early = False
            return
        with self._parameters_listed():
            self._finish_step()

    def _finish_step(self):
        forwards, self.forwards = self.forwards, []
        began, self.backward_began = self.backward_began, []
        # A forward whose backward never ran, and another after it: a skipped loss still referenced
        # as the next forward began (`loss` until it is assigned again), not losses summed for one
        # backward. The step is what the forwards whose backward ran are
        held_skipped = any(b is False for b in began[:-1])
        if held_skipped:
            forwards = [f for f, b in zip(forwards, began) if b is not False] or forwards[-1:]
        ran = sum(forwards, ()) if forwards else None  # the step's signature as it ran
        if forwards and self.step_training:  # (an eval forward with grad on, a validation loss, says nothing of them)
            self.followers[forwards[0]] = self.last_followers = tuple(forwards[1:])
        opened = self._versions is not None  # a step began (its forward ran as such)
        updated = opened and (self._stepped or self._versions != [p._version for p in self._parameters()])
        self._versions, self._stepped = None, False
        self.measured_peak = self._step_peak(updated)
        first_optimizer = False
        if updated and self.measuring is None and self.backward_end is not None and \
                StepRecorder._counted_device() is not None:
            # An optimizer step after a planned step's backward: its rise over the bytes then
            # (the window restarted there) and the state it made, kept after it
            end, gradients_then = self.backward_end
            now = remat_alloc.memory_stats(StepRecorder._counted_device())["requested_bytes"]
            made = max(0, now - end + gradients_then - self._gradient_bytes())
            first_optimizer = self.optimizer_part is None and not self.expect_optimizer
            after = self._read_peak() if self.optimizer_end_peak is None else self.optimizer_end_peak
            self.optimizer_part = (max(end, after) - end, made)
        # An eval-mode forward whose backward never began (a validation loss with grad on) is no
        # micro-batch of the cycle; a training one is (a skipped batch: the optimizer steps after as
        # many forwards all the same)
        no_backward = self._awaiting is not None or (self.measuring is not None and
                                                     not self.measuring[0]._step.backward_began)
        if no_backward and not self.step_training:
            self.position = max(0, self.position - 1)
        elif no_backward:
            self.skipped_forwards += 1
        self._awaiting = None
        # Gradients cleared with no optimizer step (a step GradScaler skipped for an inf, zero_grad
        # after it): the cycle ended all the same, or it would be counted as longer than it is
        skipped = opened and not updated and not no_backward and self.position and not self._graded()
        if (updated or skipped) and self.position:
            self._count_cycle()
        missing = None if self.measuring is None else self.measuring[0]._step.backward_missing()
        if missing is not None:
            # Half a step measured: later steps would plan from forward alone, or refuse every budget
            self.discard_profile()
            _release_failed_backward()
            _tell(f"remat.fit: the profiled step was not measured in full: {missing}. Its profile is dropped; the "
                  "next training step is profiled afresh")
        elif self.measuring is not None:
            session, signature = self.measuring
            signature = signature if ran is None else ran
            self.measuring = None
            try:
                session.__exit__(None, None, None)
            except ValueError as error:
                if self.step_training:
                    raise ValueError(f"remat.fit: {error}") from None
                # In eval mode a model may run no checkpoint (transformers checkpoints only in training)
                _tell(f"remat.fit: the profiled step ran in eval mode and is no profile ({error}); the next "
                      "training step is profiled afresh")
                self.profiled_steps -= 1
                self.backward_end = None  # (nothing planned was running: no other step's figures to reset)
                return
            profile = session._result()
            made = (self.measuring_graded | self._graded()) - self.measuring_had
            done = _Profiled(profile, signature, made, self._parameter_bytes(made), optimizer_after=updated)
            done.buffer_copies = {region: sum(b.numel() * b.element_size() for b in buffers)
                                  for region, buffers in session._buffer_writes.items()}
            done.training = self.step_training  # dropout and the like differ by mode: a difference
            done.model_bytes = self.measuring_model_bytes
            self.profiles[signature] = done
            self.latest = done
            if profile.step_peak_bytes > self.budget:
                first = ("Profile with a smaller batch or sequence to keep the first step within it too"
                         if self.profiled_steps == 1 else "")
                _tell(f"remat.fit: the profiled step (every region saved) peaked at "
                      f"{_bytes_text(profile.step_peak_bytes)}, over the budget of {_bytes_text(self.budget)}; "
                      f"later steps run under a plan within the budget. {first}".rstrip())
        elif held_skipped:
            self._held_skipped_graph()
        elif self._fewer_calls():
            pass  # ran outside the plan: said, and nothing learned from it for steps that run as profiled
        elif ran is not None and ran != self.step_signature and self.step_training and \
                StepRecorder._counted_device() is not None:
            self._later_forwards_changed(ran)
        elif self.scaled_step is not None and StepRecorder._counted_device() is not None:
            signature, base, predicted, ratio, source, excess, factor = self.scaled_step
            measured = self.measured_peak
            key = (signature, source)  # against the profile it was scaled from
            grew = (measured - base) / max(1, predicted - excess - base)  # faster than the token count, by
            if key not in self.growth:  # for other inputs' factors
                self.growth[key] = ratio / _ratio(signature, source) * max(1.0, grew)
            # Above its prediction: later steps with these inputs leave room for that much more (whatever
            # their plan: what grew is mostly a part no plan changes; scaled by more, a plan recomputing
            # more regions would count less of it and go over again), or scale by that growth
            if measured > predicted:
                held, scaled = self.excess.get(key, (0, 1.0))
                self.excess[key] = (held + measured - predicted, max(scaled, factor * grew))
            # Within the budget, its plan and what it took above its start are kept: a later step with
            # these inputs whose scaled least plan is refused (a start higher by the last step's tensors
            # it frees) runs under it where that measure says it fits
            if measured <= self.budget:
                self.measured_plans[key] = (self.plan, measured - base)
            else:
                self.measured_plans.pop(key, None)
            if measured > self.budget:
                _tell(f"remat.fit: the last step, planned from a {_scaled_origin(ratio, _ratio(signature, source))}, "
                      f"peaked at {_bytes_text(measured)}, over the budget of {_bytes_text(self.budget)} (predicted "
                      f"{_bytes_text(predicted)}): some region grows faster than the token count. Steps with these "
                      f"inputs now leave {_bytes_text(self.excess.get(key, (0,))[0])} more room, and steps of other "
                      "lengths scaled from that profile scale by more, as estimated from it")
        elif self.diverged is not None and StepRecorder._counted_device() is not None:
            self._check_diverged_step()
        elif self.planned_step is not None and StepRecorder._counted_device() is not None:
            self._check_planned_step(first_optimizer)
            self._take_times()
        self.timing = None
        self.planned_step = None
        self.scaled_step = None
        self.backward_peak = None
        self.backward_end = None
        self.optimizer_end_peak = None
        self.diverged = None

    def _step_peak(self, updated):
        """The step's peak, as it ends: the peak when its backward ended (read then: the loop may
        reset the peak after it) and after it the optimizer step's: up to where torch.optim
        optimizers finished their steps, or up to now where the parameters changed otherwise. What
        runs after the optimizer step, or after a backward no update follows (a micro-batch of
        gradient accumulation), before the next step (a metrics buffer, a checkpoint's staging copy)
        runs outside the step: no plan changes it, and it is said once where it goes over the budget."""
        if self.backward_end is None:  # no backward watched: all since the step was planned
            return max(self.backward_peak or 0, self._read_peak())
        if self.optimizer_end_peak is not None:
            after = self.optimizer_end_peak
        else:
            after = self._read_peak() if updated else 0
        outside = self._read_peak()
        if (self.optimizer_end_peak is not None or not updated) and outside > self.budget and \
                not self.others_stepped and "outside" not in self.told_differences:
            self.told_differences.add("outside")
            _tell(f"remat.fit: memory allocated after the last step's {'optimizer step' if updated else 'backward'} "
                  f"and before the next step peaked at {_bytes_text(outside)}, over the budget of "
                  f"{_bytes_text(self.budget)}: that part runs outside the model's steps, which no plan changes, "
                  "and is not counted against them")
        return max(self.backward_peak or 0, after)

    def _take_times(self):
        """After a step planned from its inputs' own profile that ran as profiled: its regions'
        forward times. Once `retime_steps` such steps were timed, the profile is re-timed: each
        region's seconds times the median of its warm forward times over its profiled one (the
        profiled step is a model's first, which runs cold: its regions took 1.3 to 2.7 times their
        later times on a Llama on the CPU, not alike), and later steps plan from it."""
        if self.timing is None:
            return
        source, times = self.timing
        cold = source.profile._forward_seconds
        # A step that differed (other regions, or more or fewer calls of them) times another step, and
        # one on another clock than the profile's (CUDA initialized since) times another way
        if source.warm or not cold or times.stopped or times.clocks - {source.profile.timer} or \
                times.calls() != {name: calls for name, (calls, _) in cold.items()}:
            return
        source.warm_steps.append(times.seconds())
        if len(source.warm_steps) < self.retime_steps:
            return
        # The regions timed in every step (not one the plan offloads: its copies run inside it)
        timed = set.intersection(*(set(step) for step in source.warm_steps))
        again = source.retimed({name: statistics.median(step[name] for step in source.warm_steps)
                                for name in timed})
        for signature, profile in self.profiles.items():
            if profile is source:
                self.profiles[signature] = again
        if self.latest is source:
            self.latest = again

    def _later_forwards_changed(self, ran):
        """After a planned step whose later forwards took other inputs than those it was planned for
        (followers): what it measured says nothing of steps planned for its inputs, which steps
        beginning as it did are from now on. Said once per signature, with its peak where that went
        over the budget."""
        measured = self.measured_peak
        key = ("later forwards", ran)
        if key in self.told_differences and measured <= self.budget:
            return
        self.told_differences.add(key)
        over = "" if measured <= self.budget else (
            f"; it peaked at {_bytes_text(measured)}, over the budget of {_bytes_text(self.budget)} (predicted "
            f"{_bytes_text(self.predicted_peak_bytes)} for the inputs planned for)")
        _tell(f"remat.fit: the last step's later training forwards took other inputs than the step was planned for "
              f"(inputs {_shapes_text(ran)} where it planned for {_shapes_text(self.step_signature)}: the last step "
              f"that began with the same inputs){over}. Steps whose first forward takes these inputs are planned for "
              "the later ones the last step took")

    def _fewer_calls(self):
        """After a planned step: where it made fewer checkpoint calls than the profiled step (layers
        skipped or run without checkpoint, as in eval mode), it ran outside the plan, which is said
        once per count (with its peak). Its peak says nothing of steps that run as profiled: no room is
        reserved for it and no scale corrected, so those are not refused for it."""
        if self.watch is None or (self.planned_step is None and self.scaled_step is None):
            return False
        ran, profiled = self.watch[1].step_calls, len(self.watch[1].shape.calls)
        if ran >= profiled:
            return False
        measured = None
        if StepRecorder._counted_device() is not None:
            measured = self.measured_peak
        key = ("fewer calls", ran, profiled)
        if key in self.told_differences and measured is not None and measured > self.budget:
            # Never over the budget without a word: each such step again, in a line
            self.fewer_calls_over[key] = self.fewer_calls_over.get(key, 1) + 1
            _tell(f"remat.fit: the last step again made {ran} of the {profiled} checkpoint calls and peaked at "
                  f"{_bytes_text(measured)}, over the budget of {_bytes_text(self.budget)} "
                  f"({self.fewer_calls_over[key]} such steps over it so far)")
        if key not in self.told_differences:
            self.told_differences.add(key)
            peak = "" if measured is None else (
                f"; it peaked at {_bytes_text(measured)}" + (f", over the budget of {_bytes_text(self.budget)}"
                                                             if measured > self.budget else
                                                             f" within the budget of {_bytes_text(self.budget)}"))
            _tell(f"remat.fit: the last step differs from the profiled one: it made {ran} of the {profiled} checkpoint "
                  f"calls the profiled step made (layers skipped, or run without checkpoint as in eval mode), so "
                  f"the plan did not cover what ran without checkpoint{peak}. Steps that run as profiled are planned "
                  "as before; run such steps with checkpoints, or under torch.no_grad() where no backward follows")
        return True

    def _held_skipped_graph(self):
        """After a step whose training forward ran while an earlier forward's graph was alive and its
        backward never ran: the step held both forwards' tensors, which no plan changes. Said once
        (with its peak where over the budget); nothing learned from it."""
        measured = self.measured_peak if StepRecorder._counted_device() is not None else 0
        if "held skipped" in self.told_differences and measured <= self.budget:
            return
        self.told_differences.add("held skipped")
        over = "" if measured <= self.budget else (
            f"; the step peaked at {_bytes_text(measured)}, over the budget of {_bytes_text(self.budget)}")
        _tell("remat.fit: a training forward ran while an earlier forward's graph was still alive and its backward "
              f"never ran (a skipped loss still referenced){over}. That graph's tensors are held until the reference "
              "goes, and no plan changes them: drop a skipped loss (`del loss`) before the next forward. Steps are "
              "planned as the forwards whose backward ran")

    def _count_cycle(self):
        """The optimizer stepped after the step that just ended: it ends a cycle of micro-batches.
        Forwards whose backward never ran (skipped batches) are counted, or not, to match the cycle."""
        skipped, self.skipped_forwards = self.skipped_forwards, 0
        if self.cycle is not None and self.position - skipped == self.cycle:
            self.position = 0
            return
        said = ("cycle", self.position) in self.told_differences
        if self.cycle is not None and self.position != self.cycle and not said:
            self.told_differences.add(("cycle", self.position))
            _tell(f"remat.fit: the optimizer stepped after {self.position} micro-batch(es) where it stepped after "
                  f"{self.cycle} before (the gradient accumulation count changed): later steps are predicted with "
                  f"it after every {self.position} micro-batch(es); every micro-batch is planned so that an optimizer "
                  "step after it would fit too")
        self.cycle = self.position
        self.position = 0

    # --- a step that differs from the profiled one (_step_shape) ------------------------------------

    def _step_diverged(self, what):
        """Called by the StepWatch at the first difference: from there the step recomputes every
        region. The peak from there on is measured (read when backward ends)."""
        device = StepRecorder._counted_device()
        before = 0
        if device is not None:  # the peak so far is kept; the peak from here is the rest's
            before = self._read_peak()
            self._restart_peak()
        self.diverged = (what, self.predicted_peak_bytes, before)
        if what not in self.told_differences:
            self.told_differences.add(what)
            _tell(f"remat.fit: this step differs from the profiled one: {what}. From there every region recomputes "
                  "(the least memory); its peak is measured when its backward ends, later steps with these inputs "
                  "leave room for what it took above its plan's prediction, and one is profiled again where saving "
                  "every region is estimated within the budget")

    @staticmethod
    def _buffer_copies(source):
        """What the runtime's copies of the buffers a checkpoint's forward changes hold above what the
        profiled step measured (docs/python.md, "Buffers a checkpoint changes"): the copies forward
        makes, held to the call's backward, were there in the profiled step too; the ones a recompute
        makes of what it finds were not (the profiled step recomputes no region), and one checkpoint
        recomputes at a time."""
        by_checkpoint = {}
        for region, size in source.buffer_copies.items():
            checkpoint = region.partition(_C.REGION_SEPARATOR)[0]
            by_checkpoint[checkpoint] = by_checkpoint.get(checkpoint, 0) + size
        return max(by_checkpoint.values(), default=0)

    def _check_diverged_step(self):
        """After a step that differed: later steps with its inputs plan for less than the budget,
        by what this one peaked above its plan's prediction (the room such a step takes), and are
        profiled again where saving every region is estimated within the budget."""
        what, predicted, before = self.diverged
        # The step's peak: before the difference, or from there on
        measured = max(before, self.measured_peak)
        self.diverged_peaks.append(measured)
        signature = self.watch_signature
        if signature is None:
            return
        held = self.reserve.get(signature, 0)
        self.reserve[signature] = max(held, measured - predicted, held + measured - self.budget)
        # Said the first time, and again each time such a step goes over despite the room left for
        # it: the room was learned under another plan, and what a differing step takes above its
        # plan's prediction grows as the plan saves less (the differing part recomputes anyway)
        if measured > self.budget and ("over", what, held) not in self.told_differences:
            self.told_differences.add(("over", what, held))
            despite = f", although its plan left {_bytes_text(held)} of room for such steps" if held else ""
            _tell(f"remat.fit: the last step, which differed from the profiled one ({what}), peaked at "
                  f"{_bytes_text(measured)} with every region recomputed from there, over the budget of "
                  f"{_bytes_text(self.budget)} (its plan predicted {_bytes_text(predicted)} for the profiled step"
                  f"{despite}): later steps with these inputs plan for "
                  f"{_bytes_text(self.budget - self.reserve[signature])} to leave room for such steps")
        if what in self.reprofiled:
            return
        profiled = self.watch[0]
        planned = profiled.planned
        all_saved = planned.step_peak_bytes - planned.step_start_bytes
        if measured > predicted:
            # What the step took above its prediction ran at the least memory; saved, it would take
            # about as much more as saving everything takes over the least peak in the profile.
            saving = all_saved / max(1, planned.least_peak_bytes() - planned.step_start_bytes)
            self.reprofile[signature] = (what, math.ceil((measured - predicted) * max(1.0, saving)))
            return
        # The model was made smaller since its profile (bfloat16 after float32): saving every
        # region is estimated at the profile's step scaled as the parameters' bytes were
        smaller = self._parameter_bytes() / max(1, profiled.model_bytes)
        if smaller < 1.0:
            self.reprofile[signature] = (what, math.ceil(all_saved * smaller) - all_saved)

    def _check_planned_step(self, first_optimizer=False):
        """After a step that ran as profiled: over the budget (a prediction that did not hold), it is
        said (each time), and later steps with its inputs plan for less by what it took above its prediction. Where the
        optimizer stepped after it for the first time outside the profiled step (gradient
        accumulation: the profiled micro-batch had none after it), that part was predicted on
        stand-ins, or where it could not be, not known before it ran: over the budget, it is said
        (with why it was not predicted), and later steps predict it as measured."""
        signature, predicted = self.planned_step
        measured = self.measured_peak
        if measured <= self.budget:
            return
        if first_optimizer:
            rise, _, why = self.first_optimizer or (None, None, "no micro-batch before it was planned")
            known = (f"predicted {_bytes_text(self.optimizer_peak_bytes)} with it, on stand-ins" if rise is not None
                     else f"predicted {_bytes_text(predicted)} without it: it was not predicted, as {why}")
            _tell(f"remat.fit: the first optimizer step after accumulated micro-batches ran after a planned step "
                  f"(the profiled micro-batch had none after it) and that step peaked at {_bytes_text(measured)}, "
                  f"over the budget of {_bytes_text(self.budget)} ({known}): its memory is measured now, and later "
                  "micro-batches are planned with it")
            return
        # By what it took above its prediction, not only above the budget: planned for the budget
        # less the overrun alone, the same plan would be chosen again and go over again
        self.reserve[signature] = self.reserve.get(signature, 0) + measured - min(predicted, self.budget)
        self.under_predicted.add(signature)
        # Every time: each such step broke the budget, the room left grows by what it took each time
        _tell(f"remat.fit: the last step peaked at {_bytes_text(measured)}, over the budget of "
              f"{_bytes_text(self.budget)} (predicted {_bytes_text(predicted)}): later steps with these inputs "
              f"plan for {_bytes_text(self.budget - self.reserve[signature])}")

    def watch_backward(self, out):
        """For a planned step: reads the peak when its backward ends (a hook on the forward's
        output queues a callback the autograd engine runs at the end)."""
        if self.scaled_step is None and self.diverged is None and self.planned_step is None:
            return
        tensor = next((t for t in tensors_in(out) if t.requires_grad), None)
        if tensor is None:
            return
        began, forward = self.backward_began, len(self.backward_began) - 1
        began[forward] = False

        def backward_ended():
            if self.closed:  # unfit (or fit again) between this step's forward and its backward
                return
            self.backward_peak = max(self.backward_peak or 0, self._read_peak())
            # From here the window measures what runs after backward (an optimizer step)
            self.backward_end = (remat_alloc.memory_stats(StepRecorder._counted_device())["requested_bytes"],
                                 self._gradient_bytes())
            self._restart_peak()

        def backward_began(grad):
            began[forward] = True
            self._awaiting = None
            torch.autograd.Variable._execution_engine.queue_callback(backward_ended)
            return grad

        tensor.register_hook(backward_began)
        self._awaiting = weakref.ref(backward_began)

    # --- one training forward ----------------------------------------------------------------------

    def continue_step(self, args, kwargs):
        """Before a training forward that begins before the step's backward (gradient accumulation
        by summed losses: forwards, then one backward): part of the step running now, measured in
        its profile, or run under its plan, followed along the profiled step by the same watch (a
        step with more forwards than the profiled one differs from it there)."""
        self.forwards.append(_signature(args, kwargs))
        self.backward_began.append(None)
        if self.measuring is not None:
            return None
        context = _plans.use_plan(self.plan, strict=False)
        context._watch = self.watch[1]
        context._times = None if self.timing is None else self.timing[1]
        return context

    def begin_step(self, args, kwargs):
        """Before a training forward: ends the previous step, then returns the context this
        forward runs in (a use_plan), or None where it runs profiled (the profile is open)."""
        self.finish_step()
        # What another fitted model's steps allocate runs between this model's steps, not in them
        # nor "outside" them (two models trained in turn, a GAN's): a profiled step of another
        # whose backward and optimizer step ran ends now, or its profile would read this step's
        # peak as its own optimizer step's, every plan of it refused as under the peak it reads
        self.others_stepped = False
        for other in list(_fitted):
            if other is self:
                continue
            other.others_stepped = True
            if other.measuring is not None and other._stepped and other.measuring[0]._step.after_backward is not None:
                other.finish_step()
                other.finished_early = True
        with self._parameters_listed():
            return self._begin_step(args, kwargs)

    def _begin_step(self, args, kwargs):
        device = StepRecorder._counted_device()
        if device is None:
            raise ValueError("remat.fit: the step's tensors are not counted, so no step peak can be measured: run the "
                             "training steps inside remat.tag_cpu_tensors() (CPU tensors) or install remat's "
                             "allocator with remat_alloc.install() (CUDA tensors)")
        self._follow_frozen()
        first = _signature(args, kwargs)
        # Planned for the forwards that followed such a first one in training (in eval mode, a
        # validation loss with grad on: itself alone)
        signature = first + sum(self.followers.get(first, self.last_followers) if self.model.training else (), ())
        self.forwards, self.step_signature = [first], signature
        self.backward_began = [None]
        self.step_training = self.model.training
        self.input_gradient_bytes = sum(t.numel() * t.element_size() for t in tensors_in((args, kwargs))
                                        if t.requires_grad)
        start = remat_alloc.memory_stats(device)["requested_bytes"]
        self._versions, self._stepped = [p._version for p in self._parameters()], False
        self.position += 1
        self.expect_optimizer = self.cycle is not None and self.position >= self.cycle
        try:
            return self._step_context(signature, start)
        except ValueError:
            # Refused before its forward: no micro-batch ran (a loop that catches the error and skips
            # the batch keeps its accumulation count; an optimizer step after it is still seen)
            self.position -= 1
            raise

    def _step_context(self, signature, start):
        """begin_step's context for a step with `signature` that begins with `start` bytes."""
        if self.latest is None:
            return self._profile_step(signature)
        known = self.profiles.get(signature)
        if known is not None:
            again = self.reprofile.pop(signature, None)
            if again is not None:
                # A step with these inputs differed from the profile: profiled again where saving
                # every region is estimated within the budget (an estimate: what that step ran
                # instead was measured at the least memory, not saved).
                what, more = again
                estimate = known.all_saved_peak(max(start, known.start), 1.0) + more
                if estimate <= self.budget:
                    self.reprofiled.add(what)
                    return self._profile_step(signature)
            return self._plan_step(known, signature, start, 1.0)
        source, ratio = self._nearest_profile(signature)
        growth = ratio  # of the inputs over the nearest profile's
        key = (signature, source.signature)
        estimated = key not in self.corrections  # (from other inputs' steps, or none)
        ratio *= self._correction(signature, source.signature)
        all_saved = source.all_saved_peak(max(start, source.start), ratio)
        # Profiled again only where every smaller profile, scaled, predicts it within the budget too:
        # a profile whose step began with the last step's tensors still held (freed during it) grows
        # less above its start than the step does, and scaled up it under-counts the longer step
        for other in self.profiles.values():
            scale = _ratio(signature, other.signature)
            if scale > 1.0 and other is not source:
                scale *= self._correction(signature, other.signature)
                all_saved = max(all_saved, other.all_saved_peak(max(start, other.start), scale))
        change = None
        # Not said of an eval forward planned from a larger profile (a validation loss with grad on)
        if signature not in self.warned and (self.model.training or _ratio(signature, source.signature) > 1.0):
            self.warned.add(signature)
            change = self._shape_change(signature, source)
        stretch = _stretch(signature, source.signature)
        if all_saved <= self.budget and stretch >= REPROFILE_GROWTH:
            if change is not None:
                _tell(f"{change}: profiling this step again (every region saved, predicted to peak at "
                      f"{_bytes_text(all_saved)} within the budget of {_bytes_text(self.budget)}); later "
                      "steps with these inputs plan from that profile")
            return self._profile_step(signature)
        self.corrections.setdefault(key, ratio / growth)
        if change is not None:
            change += (": saving every region is predicted over the budget" if all_saved > self.budget else
                       ": a profile of larger inputs bounds it" if stretch == 1.0 else
                       f": within {REPROFILE_GROWTH:g}x the nearest profile's inputs, not profiled again")
        return self._plan_step(source, signature, start, ratio, change=change,
                               tokens=growth if estimated and ratio > growth else None)

    def _shape_change(self, signature, source):
        """What to say of a step whose inputs changed shape (planned from `source`), or None past the
        first SHAPES_SAID such steps (one line then says the rest are not said)."""
        self.shape_changes += 1
        if self.shape_changes > SHAPES_SAID:
            if self.shape_changes == SHAPES_SAID + 1:
                _tell(f"remat.fit: the step's inputs keep changing shape ({self.shape_changes} new shapes so far): "
                      "later ones are planned as these were without a word each (model.remat_fit.profiles holds "
                      "the profiles by inputs); a step over the budget is still said")
            return None
        dtypes = [d for _, d, _ in signature] != [d for _, d, _ in source.signature]
        counted = len(signature) != len(source.signature)
        what = "in number" if counted else "shape or dtype" if dtypes else "shape"
        measured = (_input_bytes(signature) / max(1, _input_bytes(source.signature)) if dtypes else
                    _elements(signature) / max(1, _elements(source.signature)))
        planned_as = "" if measured >= 1.0 else ", planned as the profiled ones"
        return (f"remat.fit: the step's inputs changed {what} ({_shapes_text(source.signature, dtypes)} -> "
                f"{_shapes_text(signature, dtypes)}, {measured:.3g}x the {'bytes' if dtypes else 'elements'}"
                f"{planned_as}{': a tensor given in some steps only, such as a mask' if counted else ''})")

    def _correction(self, signature, profiled):
        """The factor on the token count by which a step with `signature` scales the profile of the
        inputs `profiled`: the one the first such step took, else estimated from the growth measured
        on steps of other inputs scaled from that profile, linearly in the token count between the
        nearest of them (from 1 at the profile's own), and beyond the longest along the steepest such
        line (a sequence x sequence mask grows that way): inputs of many lengths (dynamic padding)
        each went over the budget once before."""
        known = self.corrections.get((signature, profiled))
        if known is not None:
            return known
        ratio = _ratio(signature, profiled)
        measured = sorted((_ratio(s, p), factor) for (s, p), factor in self.growth.items()
                          if p == profiled and _ratio(s, p) > 1.0)
        if ratio <= 1.0 or not measured:
            return 1.0
        below = max((point for point in measured if point[0] <= ratio), default=(1.0, 1.0))
        above = min((point for point in measured if point[0] >= ratio), default=None)
        if above is None:
            return max(1.0, *(1.0 + (factor - 1.0) * (ratio - 1.0) / (r - 1.0) for r, factor in measured))
        if above[0] == below[0]:
            return max(1.0, below[1], above[1])
        return max(1.0, below[1] + (above[1] - below[1]) * (ratio - below[0]) / (above[0] - below[0]))

    def _nearest_profile(self, signature):
        """(the profile a step with `signature` and no profile of its own plans from, the ratio its
        inputs are of that profile's). The one scaled least: of the profiles of smaller inputs the
        largest, scaled up by the token count; where some profile's inputs are as large or larger,
        the smallest of those, as it is (what grows with the inputs is not known to shrink with them).
        Not the latest: after a shorter step was profiled, a longer one plans from the profile
        nearest to it, as it did before."""
        return min(((profile, _ratio(signature, profile.signature)) for profile in self.profiles.values()),
                   key=lambda pair: (pair[1], _elements(pair[0].signature), _input_bytes(pair[0].signature)))

    def _profile_step(self, signature):
        # The copy bandwidth only where plans may offload
        session = _profiling.profile_regions(timer=self.timer, host_copy=self.host_budget > 0)
        # Under fit the plan decides for every region: one the code recomputes that updates a buffer
        # (a BatchNorm's statistics) must stay recomputed, its updates the same whatever the budget
        session._buffers = [b for b in self.model.buffers() if isinstance(b, torch.Tensor)]
        session.__enter__()
        # A model dropped while its step is profiled leaves no profile open on this thread
        weakref.finalize(self, _close_abandoned, session)
        self.measuring_had, self.measuring_graded = self._graded(), set()
        self.measuring_model_bytes = self._parameter_bytes()
        session._step.watch_gradients(_held_weakly(self._profiled_gradient_bytes), self.model.parameters())
        self.measuring = (session, signature)
        self.plan = self.predicted_peak_bytes = self.optimizer_peak_bytes = None
        self.profiled_steps += 1
        return None

    def _plan_step(self, source, signature, start, ratio, *, change=None, tokens=None):
        """The use_plan for a step with `signature`, from `source`'s profile with everything above
        what its step began with scaled by `ratio` (1: the profile of these very inputs, or of larger
        ones, as it is). `tokens`: the token count's ratio, where `ratio` is more by an estimate from
        other inputs' steps, which alone refuses no step."""
        profile = source.profile
        own = signature == source.signature  # the profile of these very inputs
        absent, extra, early = self._absent_gradients(source)
        extra += self._buffer_copies(source)
        base = max(start, source.start)  # more allocated now than then: it stays through the step
        # The profile's part after backward where it is the optimizer step, only before one
        after = self.expect_optimizer or not source.optimizer_after

        def least_at(scale):
            host = int(self.host_budget / scale) if self.host_budget else None
            return source.peak(source.planned_for(absent, scale).least_peak_bytes(host_budget_bytes=host), base,
                               scale, absent, after, extra)

        # Planned from a profile scaled, where steps with these inputs took more than predicted: room is
        # left for that much (most of it a part no plan changes: a mask, the backward's working set),
        # or where no plan then fits, what grew is taken to be held by the regions, scaled by how much
        # faster than the token count it grew (a plan recomputing more of them holds less of it)
        excess, factor = (0, 1.0) if own else self.excess.get((signature, source.signature), (0, 1.0))
        if excess and least_at(ratio) + excess > self.budget:
            excess, ratio = 0, ratio * factor
        # A growth estimated from other inputs' steps, where no plan would fit by it, gives way to the token
        # count: the step is measured, and what it takes above that is learned for its inputs
        if tokens is not None and least_at(ratio) > self.budget >= least_at(tokens):
            ratio = tokens
            self.corrections[(signature, source.signature)] = 1.0
        # Forward and backward, which the plan changes (with the gradients there from the start in
        # micro-batches of gradient accumulation after the first)
        planned = source.planned_for(absent, ratio)
        # What is offloaded scales with the step as the rest does: the profile's regions plan
        # within the host budget shrunk as the step grew
        host = int(self.host_budget / ratio) if self.host_budget else None
        # An optimizer step after this one (expected, or where the accumulation count changes)
        # must fit too: no plan changes it, so the worst micro-batch is checked before every one
        optimizer = self._optimizer_peak(source, base, ratio, absent, extra)
        # Room left for what steps with these inputs took above their prediction
        reserve = (self.reserve.get(signature, 0) if ratio == 1.0 else 0) + excess

        def fastest_within(early):
            """The fastest plan predicted within the budget and its prediction, or (None, None)."""
            try:
                plan = planned.plan(peak_bytes=source.origin(ratio) + int((self.budget - reserve - base - extra - early)
                                                                          / ratio), host_budget_bytes=host)
                return plan, source.peak(plan.peak_bytes, base, ratio, absent, after, extra, early)
            except ValueError:  # no plan's peak is that low: the least plan's is over the budget too
                return None, None

        plan, predicted = fastest_within(early)
        if early and (plan is None or max(predicted, optimizer) + reserve > self.budget):
            # No plan leaves room for the inputs' gradients made early, which happens only where a part of
            # the model the profile did not reach reads the inputs: planned without it rather than refused
            # (a step that then goes over is measured, said, and planned for after)
            plan, predicted = fastest_within(0)
        # The least plan's peak (a search of every plan where the profile is small) only where the
        # fastest plan within the budget is not predicted within it: a measured plan is taken
        # instead, or the step is refused
        if plan is None or max(predicted, optimizer) + reserve > self.budget:
            least_now = least_at(ratio)
            # A plan a step with these inputs ran under, scaled from this profile, within the budget:
            # what it measured above its start beats the scaled prediction where the least plan is refused
            ran = None if own else self.measured_plans.get((signature, source.signature))
            if ran is not None and max(least_now, optimizer) + reserve > self.budget >= \
                    max(base + ran[1] + extra, optimizer):
                plan, predicted = ran[0], base + ran[1] + extra
            elif plan is None or max(least_now, optimizer) + reserve > self.budget:
                self._refuse(source, base, ratio, max(least_now, optimizer), signature, reserve,
                             optimizer=optimizer > least_now, excess=excess)
        predicted += excess
        if self.expect_optimizer:
            predicted = max(predicted, optimizer)
        self.optimizer_peak_bytes = optimizer or None
        if change is not None:
            _tell(f"{change}, so the plan comes from the {_scaled_origin(ratio, _ratio(signature, source.signature))}: "
                  f"predicted peak {_bytes_text(predicted)} within {_bytes_text(self.budget)}, "
                  f"{sum(c == 'recompute' for c in plan.decisions.values())} of {len(plan.decisions)} regions "
                  "recomputed")
        if not own:
            self.scaled_step = (signature, base, predicted, ratio, source.signature, excess,
                                factor if not excess else 1.0)
        else:
            self.planned_step = (signature, predicted)
        self._restart_peak()  # the step's peak, read when backward ends
        self.plan = plan
        self.predicted_peak_bytes = predicted
        self.planned_steps += 1
        # Not strict: a region the profile does not name is a step that differs, which the watch
        # meets by recomputing (a strict plan would refuse it)
        context = _plans.use_plan(plan, strict=False)
        # Sizes compared only against the profile of these very inputs (other inputs make other sizes)
        if self.watch is None or self.watch[0] is not source or self.watch[1].sizes != own:
            self.watch = (source, StepWatch(profile._shape, _held_weakly(self._step_diverged), sizes=own))
        self.watch[1].begin()
        self.watch_signature = signature if own else None
        if source.training != self.model.training:
            # Dropout and the like save other tensors by mode: not the profiled step, from its start
            mode = {True: "training", False: "eval"}
            self.watch[1]._diverge(f"the model is in {mode[self.model.training]} mode, the profiled step ran in "
                                   f"{mode[source.training]} mode")
        context._watch = self.watch[1]
        # Timed until retime_steps steps ran as profiled, in at most RETIME_TRIES times as many
        timed = own and not source.warm and 0 < self.retime_steps and \
            source.timed_steps < RETIME_TRIES * self.retime_steps
        if timed:
            source.timed_steps += 1
        self.timing = (source, RegionTimes(self.timer)) if timed else None
        context._times = None if self.timing is None else self.timing[1]
        return context

    def _refuse(self, source, base, ratio, least_now, signature, reserve=0, optimizer=False, excess=0):
        if source.after_start is not None:
            # Gradients (what backward left allocated) stay through backward; the optimizer step's
            # state and transient, after it, too: no plan changes either
            fixed = max(base + max(0, source.after_start - source.start), source.after_backward_peak(base, ratio))
        else:
            fixed = base + source.persisted  # made in the step, kept after it
        fixed = min(fixed, least_now)
        scaled = ("" if signature == source.signature else
                  f" (the profile at inputs {_shapes_text(source.signature)}, larger, as it is)" if ratio == 1.0 else
                  f" (the profile at inputs {_shapes_text(source.signature)} scaled by {ratio:.3g}, every region "
                  "assumed to scale with the token count)" if ratio <= _ratio(signature, source.signature) else
                  f" (the profile at inputs {_shapes_text(source.signature)} scaled by {ratio:.3g}: "
                  f"{_ratio(signature, source.signature):.3g}x the token count, times more as steps scaled from it "
                  "grew faster)")
        if excess:
            scaled += (f", and steps with these inputs planned so took {_bytes_text(excess)} above their prediction (a "
                       "region growing faster than the token count)")
            least_now += excess
            reserve -= excess
        if reserve:
            scaled += (f", and a step with these inputs that ran the profiled step's checkpoints and regions on the "
                       f"same shapes peaked {_bytes_text(reserve)} above its plan's prediction (what a region keeps "
                       "may depend on the data, a branch inside one)" if signature in self.under_predicted else
                       f", and a step with these inputs that differed from the profiled one took "
                       f"{_bytes_text(reserve)} more")

            least_now += reserve
        if optimizer and self.optimizer_basis == "new state":
            scaled += (" (with the optimizer step after it, which makes the optimizer's state for parameters that "
                       "have none yet, a part of the model given no gradient before, predicted by running its step "
                       "on stand-ins of the parameters: no plan changes that part)")
        elif optimizer and self.optimizer_part is None:
            scaled += (" (with the first optimizer step, which may run after it and makes the optimizer's state, "
                       "predicted by running its step on stand-ins of the parameters: no plan changes that part)")
        elif optimizer:
            scaled += (" (with the optimizer step after it, as measured after an earlier micro-batch of gradient "
                       "accumulation: no plan changes that part)")
        # A validation forward left with gradients on: the plan assumes the checkpoints run, and a model
        # may run none in eval mode (transformers' layers checkpoint only in training)
        evaluating = (f"Give a budget of at least {least_now} bytes, or make the step smaller (a smaller batch or "
                      "sequence)" if self.model.training else
                      "The model is in eval mode with gradients on: a forward with no backward after it (a validation "
                      "loss) holds its graph for nothing, and where the model runs no checkpoint in eval mode no plan "
                      "reduces it; run it under torch.no_grad()")
        raise ValueError(f"remat.fit: no plan keeps this step within the budget of {_bytes_text(self.budget)}: the "
                         f"least step peak any plan reaches at inputs {_shapes_text(signature)} is "
                         f"{_bytes_text(least_now)}{scaled}. What stays allocated through the step (parameters, "
                         f"gradients and optimizer state, the batch: {_bytes_text(fixed)}) is "
                         f"{fixed / least_now:.0%} of it: recompute cannot reduce that part. {evaluating}")


class _FitForward:
    """The instance forward fit() sets: a training forward (grad mode on; in eval mode too where
    no step's backward is pending) begins a step, run profiled or under the plan (in training mode,
    before the last one's backward, part of that step); any other forward runs as it is, part
    of the step before its backward (outside its profile), else ending the step before it. An
    object holding the forward it wraps, so unfit() puts that back."""

    def __init__(self, state, own):
        self.state = state
        self.own = own  # the instance forward replaced, or None where the class's was in use
        self.__doc__ = getattr(self.__wrapped__, "__doc__", None)

    @property
    def __wrapped__(self):
        """The forward this one wraps (inspect.signature follows it). The class's is bound to the
        model on each use, never held: the model holds this object, so holding a bound method of
        the model would be a cycle that keeps the model until the garbage collector runs."""
        if self.own is not None:
            return self.own
        model = self.state.model
        return type(model).forward.__get__(model, type(model))

    def inner(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            # Dynamo traces this forward (the model, or a function calling it, compiled): its step
            # would run no region as such, so neither a profile nor a plan could hold it. Refused
            # when the compiled function runs, every time, before its forward: an exception raised
            # here, at trace time, would make Dynamo run the frame eagerly instead. Dynamo guards on
            # grad mode: a compiled forward under no_grad, no step, is traced apart and runs as it is.
            if torch.is_grad_enabled():
                refuse_planning(UNDER_COMPILE)
            if self.own is not None:
                return self.own(*args, **kwargs)
            model = self.state.model
            return type(model).forward(model, *args, **kwargs)  # (a bound method's __get__ is not traced)
        state = self.state
        # With grad on, a forward in eval mode begins a step too where none is pending (training
        # with dropout off: planned and measured as any step, never run unplanned)
        if not torch.is_grad_enabled() or (not state.model.training and state.backward_pending()):
            if not state.backward_pending():
                state.finish_step()
                return self.inner(*args, **kwargs)
            # Before the step's backward (a metric, a target under no_grad): part of the step, run
            # as it is, outside the step's profile (in force only in its training forwards; its
            # memory counted where it runs)
            return self.inner(*args, **kwargs)
        running = next((other for other in list(_fitted) if other is not state and other.backward_pending()), None)
        if running is not None:
            raise ValueError(
                f"remat.fit: a training forward of this fitted model ({type(state.model).__name__}) runs inside the "
                f"step of another fitted model ({type(running.model).__name__}), whose forward ran and whose backward "
                "is to come: a budget is one step's peak, which two fits would plan for apart. Fit one module that "
                "runs both (remat.unfit each, then remat.fit the outer one)")
        open_profile = _plans.profiling()
        if open_profile is not None and (state.measuring is None or open_profile is not state.measuring[0]):
            return self.inner(*args, **kwargs)  # the caller's own profile_regions measures this step
        # Before the last one's backward (losses summed for one backward): the same step goes on
        context = state.continue_step(args, kwargs) if state.backward_pending() else state.begin_step(args, kwargs)
        if context is None:
            # Profiled: the profile stays open until the next step begins (it measures the step's
            # backward and optimizer step), in force on the thread only while the step's training
            # forwards run, so that checkpoints of other code between them (another model's
            # validation, an EMA or teacher copy) run as they would without it
            session = state.measuring[0]
            _plans._state.session = session
            try:
                out = self.inner(*args, **kwargs)
            except BaseException:
                state.discard_profile()  # a failed step measures nothing: the next one is profiled afresh
                raise
            finally:
                if _plans.profiling() is session:
                    _plans._state.session = None
            state.check_regions_ran()
            return out
        with context:
            out = self.inner(*args, **kwargs)
        state.watch_backward(out)
        return out


_fitted = weakref.WeakSet()  # every FitState fit() made (a model dropped takes its own with it)
_step_hook = None  # the torch.optim step hook, once registered


def _optimizer_stepped(optimizer, args, kwargs):
    """A torch.optim optimizer stepped: an optimizer step for each fitted model with a step open
    whose parameters it holds. A fused or in-place step by other means may leave the parameters'
    version counters as they were (AdamW(fused=True) on the CPU does), which fit reads otherwise."""
    count = sum(len(group["params"]) for group in optimizer.param_groups)
    for state in list(_fitted):
        if state._versions is None or state.model is None:
            continue
        # Asked once per optimizer, again where its parameter groups changed (add_param_group)
        known = state._held_by.get(optimizer)
        if known is None or known[0] != count:
            ids = {id(p) for p in state.model.parameters()}
            known = state._held_by[optimizer] = (
                count, any(id(p) in ids for group in optimizer.param_groups for p in group["params"]))
        if not known[1]:
            continue
        state._stepped = True
        if state.backward_end is not None:
            # A planned step ends with its optimizer steps: what runs after the last, before the next
            # step, runs outside it
            state.optimizer_end_peak = max(state.optimizer_end_peak or 0, state._read_peak())
            state._restart_peak()


def _finish_last_steps():
    """As the process exits, or the last tag_cpu_tensors() guard (which counts the steps of a model
    on the CPU) is exited: a fitted model's last step is checked as the next one would have checked
    it (a step over the budget is said even where it was the job's last)."""
    for state in list(_fitted):
        if not state.closed and state.measuring is None and state.model is not None and not state.backward_pending():
            state.finish_step()


UNDER_COMPILE = "remat.fit: " + _plans.refused_under_compile(
    "the model", "fit can neither profile the step nor carry out a plan in it")


def fit(model, budget, *, host_budget=None, timer="auto", retime_steps=RETIME_STEPS):
    """Keeps every training step of `model` within `budget`, the step's peak allocated bytes
    (an int, or a string with a unit: "70GiB", "512 MiB", "80GB"), and returns the model: the
    first training step runs profiled (remat.profile_regions(), every region saved), later ones
    under the plan of least recompute time predicted within the budget, planned again when the
    inputs change shape (module docstring). The model's checkpoints and regions are its own
    (remat.checkpoint, remat.region, wrap_decoder_layers). model.remat_fit holds the state: its
    .plan is the plan of the last planned step. remat.unfit(model) undoes it. timer: how the profiles time regions,
    "auto" or "wall" (wall-clock, for regions that wait: remat.profile_regions(timer=)).
    retime_steps: the first planned steps at a profile's inputs (3 by default) time their regions'
    forwards as they run (the timer's clock around each region; with timer="wall" on a GPU, a
    synchronization at each region's entry and exit, as in the profile), and the profile's
    seconds are then re-timed from their median: a profiled step is cold (a model's first step ran
    its regions up to 2.7 times slower than its later ones on the CPU, not alike), or may have run
    beside another load. Later steps plan from the re-timed profile, within the same budget. 0:
    plans keep the profiled step's times.
    Calling fit again on a fitted model (another budget) keeps what it learned, its profiles first,
    where timer and whether host_budget is given are unchanged; remat.unfit(model) first forgets it.
    host_budget: host memory the plans may offload regions to (an int or a string with a unit;
    None or 0: no offload): each region is then saved, recomputed or offloaded, the step's peak
    on the device predicted with what the offloader holds there (profile.plan(peak_bytes=,
    host_budget_bytes=)). For a model on a GPU: on the CPU the host is the memory the budget
    counts, and offload frees none of it."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"remat.fit: model must be a torch.nn.Module, got {type(model).__name__}")
    budget = _plans.budget_arg(budget, "remat.fit: budget")
    host_budget = 0 if host_budget is None else host_budget_arg(host_budget, _plans.budget_arg, "remat.fit: host_budget")
    if host_budget and not any(p.is_cuda for p in model.parameters()):
        raise ValueError("remat.fit: host_budget offloads what the checkpoints keep to host memory, which for a model "
                         "on the CPU is the memory the budget counts: offload frees none of it there. Give host_budget "
                         "for a model on a GPU, or leave it out")
    timer = timer_arg("remat.fit", timer)
    retime_steps = retime_steps_arg("remat.fit", retime_steps)
    global _step_hook
    if _step_hook is None:
        _step_hook = register_optimizer_step_post_hook(_optimizer_stepped)
        atexit.register(_finish_last_steps)
        tag_cpu_tensors.before_last_exit.append(_finish_last_steps)
    before = model.__dict__.get("remat_fit")
    keep = isinstance(before, FitState) and before.timer == timer and bool(before.host_budget) == bool(host_budget)
    _take_off(model, keep_profile=keep)
    state = FitState(model, budget, timer, host_budget, retime_steps)
    if keep:
        state._learned_from(before)
    _fitted.add(state)
    model.forward = _FitForward(state, model.__dict__.get("forward"))
    model.remat_fit = state
    return model


def unfit(model):
    """Undoes fit() on `model` (a no-op where it did nothing) and returns the model; a profile
    still being measured is dropped."""
    return _take_off(model)


def _take_off(model, keep_profile=False):
    """unfit(); with keep_profile (fit() again, keeping what was learned) the last step's profile is
    closed and kept where its backward ran (dropped, every step of a loop that fits again before it
    was profiled again, over the budget, without a word)."""
    forward = model.__dict__.get("forward")
    if isinstance(forward, _FitForward):
        if forward.state.measuring is not None and (not keep_profile or forward.state.backward_pending()):
            forward.state.measuring[0].__exit__(RuntimeError, None, None)
            forward.state.measuring = None
        elif not forward.state.backward_pending():
            forward.state.finish_step()  # the last step's peak is checked (said where it broke the budget)
        forward.state.close()
        _fitted.discard(forward.state)
        if forward.own is not None:
            model.forward = forward.own
        else:
            del model.forward
        del model.remat_fit
    return model
