"""Budget plans: which regions to save, chosen from what one training step measured.

    with remat.profile_regions() as profile:          # one ordinary step, forward and backward
        model(**batch).loss.backward()
    plan = profile.plan(budget_bytes=12 << 30)        # the least recompute time within 12 GiB
    with remat.use_plan(plan):                        # every region takes its choice from the plan
        model(**batch).loss.backward()

profile_regions() (_profiling) runs the step with every region saved, so it measures both choices
at once: each region's saved bytes from what its checkpoint keeps (the saved-tensors report, each
storage once) and its forward time (CUDA events on a GPU, the thread's CPU time otherwise), and
the bytes the checkpoints keep with every region recomputed (their tensor inputs, each storage
once: `base_bytes`). That step keeps what saving everything keeps: profile with a batch that fits so.
Regions nested in another region are planned as part of the outermost: under a plan they recompute
with it (inside a saved region the runtime runs them inert), unless the plan names them.

A plan names regions exactly or by a grouped plan's patterns, where each '*' stands for a number
("layers.*::attn"). The regions a plan meets are checked against those it was made for (strict
use_plan, wrap_decoder_layers(plan=)), as soon as a checkpoint's forward shows a difference.

The solver (exact 0/1 knapsack) and the region-profile and remat-plan dumps are C++
(remat/budget, also behind `remat-report advise`), reached through remat._budget.
"""

from __future__ import annotations

import contextlib
import json
import numbers
import operator
import threading
from collections import namedtuple

import torch
from remat_alloc.arguments import path_arg

from . import _budget
from ._arguments import flag_arg
from ._extension import _C
from ._kept_ops import RegionKeep, held_storages
from ._offload_plans import PlanOffload, host_budget_arg
from ._saved_tensors_hooks import torch_checkpoint_around
from ._step_profile import tensors_in
from ._step_shape import StepWatch, warn_at_user_line

__all__ = ["RegionCost", "RegionProfile", "Plan", "use_plan", "load_plan"]

RegionCost = namedtuple("RegionCost", ["name", "saved_bytes", "seconds"])
RegionCost.__doc__ = "What one region costs: bytes its checkpoint keeps while it is saved, and its forward seconds."

# .session: the profile_regions being measured; .plans: use_plan blocks, innermost last. The
# checkpoint whose body runs (in forward or recompute) is the runtime's to know: its
# _CheckpointRun, under a plan or a profile, is the call's caller (_C.checkpoint_caller()).
_state = threading.local()

# Why no region of a checkpoint ran in a step that ran checkpoints: said where a plan or a profile
# saw none
NO_REGION_RAN = ("a step run through torch.compile (torch.compile(model), model.compile(), a compiled block around "
                 "the regions) runs no region as such (compiled regions carry no names, and the compiled step follows "
                 "AOTAutograd's partitioner, not a plan or a profile): profile and plan the eager model (remat.fit on "
                 "a model that is not compiled), with compiled code inside its regions if wanted "
                 "(remat.region(torch.compile(fn), name); docs/python.md, \"Under torch.compile\"); else the "
                 "model's checkpoints have no regions (remat.region, wrap_decoder_layers)")


# Whether a profile_regions or use_plan block is open on any thread (_open_blocks of them).
# Dynamo reads it where it traces a checkpoint, and guards on it (remat._compile.compiled_checkpoint):
# a bool, so that nested blocks or blocks on several threads compile nothing more.
block_open = False
_open_blocks = 0
_blocks_lock = threading.Lock()


def block_opened(opened=True):
    global block_open, _open_blocks
    with _blocks_lock:
        _open_blocks += 1 if opened else -1
        block_open = _open_blocks > 0


def refused_under_compile(subject, consequence):
    """Why `subject`, run through torch.compile, is refused where a profile or a plan was to
    hold it (`consequence`), and the fix: raised before it runs (remat._compile)."""
    return (f"{subject} runs under torch.compile (torch.compile(model), model.compile(), or a compiled function "
            "calling it), where no region runs as such (AOTAutograd's partitioner decides what the compiled graph "
            f"saves and recomputes), so {consequence}; nothing of the step ran. Profile and plan the eager model "
            "(remat.fit on the model not compiled), with compiled code inside its regions if wanted "
            "(remat.region(torch.compile(fn), name), or .compile() on the modules a region runs), or leave the "
            "profile and the plan out (remat.unfit(model)) and bound the compiled step with "
            "torch._functorch.config.activation_memory_budget (docs/python.md, \"Under torch.compile\")")


def profiling():
    """The profile_regions block being measured on this thread, or None."""
    return getattr(_state, "session", None)


def run_checkpoint(name, own_plan, fn, args, kwargs, call):
    """Runs one checkpoint call: call(body, choices, caller) runs `body` with `choices`, the plan
    the runtime applies (None: none), and `caller`, this call's _CheckpointRun, which the runtime
    hands back to the call's regions in forward and in recompute (run_region). The plan in force
    is the checkpoint's own (a _PlanInForce), else the innermost use_plan's; while a profile is
    measured there is none, and every region is saved here. A strict plan checks the regions
    this call ran as soon as its forward is done."""
    profile = profiling()
    plans = getattr(_state, "plans", None)
    in_force = None if profile is not None else own_plan if own_plan is not None else plans[-1] if plans else None
    if torch_checkpoint_around():
        return _inside_torch_checkpoint(name, profile is not None or in_force is not None, fn, args, kwargs)
    if profile is None and in_force is None:
        return call(fn, None)
    run = _CheckpointRun(name, None if in_force is None else in_force.plan._choices(), profile,
                         None if in_force is None else in_force.plan._kept_ops,
                         None if in_force is None else in_force.plan._must_save)
    if in_force is not None and in_force.plan._offload is not None:
        run.offload, run.plan = in_force.plan._offload, in_force.plan
    if in_force is not None:
        run.times = in_force.times
    # Profiled or watched, the settings are chosen here, region by region; the runtime is given a
    # plan naming no region, so that it takes them as they come and runs as it does under a plan.
    if profile is not None:
        return profile.run_checkpoint(name, args, kwargs, lambda: call(run.body(fn), _no_choices(), run))
    if in_force.watch is not None and torch.is_grad_enabled():
        # Watched: a step which differs from the profiled one recomputes every region from there
        # on (_step_shape).
        run.watch = in_force.watch.call(name, args, kwargs)
        out = call(run.body(fn), _no_choices(), run)
        run.watch.forward_done(out)
    else:
        out = call(run.body(fn), run.choices, run)
    in_force.checkpoint_ran(run)
    for outer in plans or ():  # use_plan blocks the checkpoint's own plan, or an inner block, won over
        if outer is not in_force:
            outer.ran_under_another_plan(run)
    return out


_TORCH_CHECKPOINT_AROUND = ("runs inside torch.utils.checkpoint (timm's set_grad_checkpointing(True), a model's own "
                            "gradient checkpointing), which keeps nothing of what runs inside it and runs it all "
                            "again in backward")
_told_inside_torch_checkpoint = set()


def _inside_torch_checkpoint(name, planned, fn, args, kwargs):
    """A checkpoint called inside torch.utils.checkpoint: the outer checkpoint already keeps
    nothing of it and recomputes it whole, and a checkpoint of remat's inside would keep its own
    tensors through the outer one's hooks (its backward then failed: torch's count of saved tensors
    differed, or remat's checkpoint nested in itself). It runs `fn` as it is, said once per name;
    under a plan or a profile, whose regions it cannot save or recompute there, it is refused."""
    if planned:
        raise _C.RematError(f"checkpoint '{name}' {_TORCH_CHECKPOINT_AROUND}: a plan (remat.fit, use_plan, a "
                            "profile) cannot save or recompute its regions there. Turn the outer checkpointing off "
                            "(timm: model.set_grad_checkpointing(False); transformers: "
                            "model.gradient_checkpointing_disable()) and let remat's checkpoints decide")
    if name not in _told_inside_torch_checkpoint:
        _told_inside_torch_checkpoint.add(name)
        warn_at_user_line(f"remat: checkpoint '{name}' {_TORCH_CHECKPOINT_AROUND}: it runs its function as it is "
                          "there, its regions neither saved nor recomputed of their own. Turn the outer checkpointing "
                          "off to have remat's checkpoint decide")
    return fn(*args, **kwargs)


def _no_choices():
    if not hasattr(_no_choices, "choices"):
        _no_choices.choices = _C.RegionChoices([])
    return _no_choices.choices


def run_region(name, own_recompute, call, args=()):
    """Runs a region: call(recompute, wrap) is the runtime's region with that setting, its body
    wrapped by wrap(body) where wrap is not None (ops measured or kept). Outside a
    checkpoint under a plan or a profile, with the region's own setting. `args`: its arguments,
    which a profile records (what a saved region keeps of its inputs)."""
    running = _C.checkpoint_caller()
    if running is None:
        return call(own_recompute)
    return running.run_region(name, own_recompute, call, args)


class _CheckpointRun:
    """One call of a checkpoint under a plan or a profile. A region takes the plan's choice where
    the plan names it; a region nested in one that took the plan's choice is part of it (the
    profile measured the outermost) and recomputes with it: inside a saved region the runtime
    runs it inert. While a profile is measured every region is saved. Under a plan a region may
    be saved that its code recomputes: its outputs are kept for recompute, since code between
    regions may read them again there."""

    def __init__(self, name, choices, profile, kept_ops=None, must_save=()):
        self.name = name
        self.choices = choices  # None while profiling
        self.profile = profile
        self.watch = None  # the _CallWatch of a watched plan, which then applies the choices here
        self.kept_ops = kept_ops or {}  # region -> {op index: op name} a per-op plan keeps
        self.must_save = must_save or ()  # the plan's entries whose regions no step may recompute
        self.offload, self.plan = None, None  # the plan's PlanOffload where it offloads regions
        self.times = None  # a _timing.RegionTimes timing the top-level regions' forwards (watched, remat.fit)
        self._keeps = {}  # region (watched: (region, occurrence)) -> its RegionKeep, from forward to recompute
        self.ran = []  # (path, planned) of the regions forward ran that are not part of a planned region
        self._open = []  # for each region open now: whether it, or one around it, took the plan's choice
        self._settings = {}  # watched: (path, occurrence) -> (recompute setting, keeps ops) forward ran it with
        self._seen = {}  # watched: path -> regions of that path run in this pass (forward, or a recompute)

    def body(self, fn):
        def body(*args, **kwargs):
            self._seen = {}  # each pass (forward, recompute) counts its regions from the first
            return fn(*args, **kwargs)

        # Errors name the body by its __qualname__ ("checkpoint 'layers.0' (Block.forward)"): that
        # alone is copied, not all update_wrapper copies, at every call.
        body.__qualname__ = getattr(fn, "__qualname__", type(fn).__name__)
        return body

    def run_region(self, name, own_recompute, call, args=()):
        path = _C.region_path(self.name, name)
        if self.watch is not None:
            return self._run_watched_region(path, own_recompute, call, args)
        inside_planned = any(self._open)
        if self.profile is not None:
            recompute, planned = False, True
        else:
            choice = self.choices.recompute_of(path)
            planned = choice is not None
            recompute = choice if planned else True if inside_planned else own_recompute
        recomputing = _C.is_recomputing()
        if not recomputing and (planned or not inside_planned):
            self.ran.append((path, planned))

        wrap = None
        if self.profile is not None:
            wrap = self.profile.op_meter(path, own_recompute)
        elif recompute and path in self.kept_ops:
            keep = self._keeps.get(path)
            if keep is None:
                keep = self._keeps[path] = RegionKeep(path, self.kept_ops[path])
            wrap = lambda body: keep.wrap(body, recomputing)  # noqa: E731

        def run():
            out = call(recompute, wrap)
            if not recompute and not recomputing:
                _C.recompute_needs_tensor(*tensors_in(out))
            return out

        self._open.append(planned or inside_planned)
        try:
            if self.profile is not None:
                return self.profile.time_region(path, run, args)
            with self._offloading(path, planned, recompute, recomputing):
                return run()
        finally:
            self._open.pop()

    def _may_recompute(self, path):
        return not any(entry == path or ("*" in entry and _budget.matches(entry, path)) for entry in self.must_save)

    def _offloading(self, path, planned, recompute, recomputing):
        """The offloader's block for a region the plan offloads (saved, in forward), else none."""
        if self.offload is None or not planned:
            return contextlib.nullcontext()
        return self.offload.around(self.plan._entry_for(path), recompute, recomputing)

    def _run_watched_region(self, path, own_recompute, call, args):
        """A region under a watched plan, which the runtime runs with no plan of its own: the
        setting passed is the one the runtime would take from the plan (run_region), and inside a
        saved region it runs inert (False). A top-level region recomputes once the step has
        diverged, but for one the plan must save; until then a region the plan recomputes keeps
        the ops the plan keeps. Recompute runs each region as forward ran it."""
        recomputing = _C.is_recomputing()
        occurrence = self._seen.get(path, 0)
        self._seen[path] = occurrence + 1
        top_level = not self._open
        keeps_ops = False  # recomputed keeping the plan's ops: the plan's choice, the step not diverged
        if recomputing:
            recompute, keeps_ops = self._settings.get((path, occurrence), (own_recompute, False))
            planned = False
        elif not top_level and not all(setting for setting, _ in self._open):
            recompute, planned = False, False
        else:
            choice = self.choices.recompute_of(path)
            planned = choice is not None
            inside_planned = any(taken for _, taken in self._open)
            if planned or not inside_planned:
                self.ran.append((path, planned))
            diverged = top_level and self.watch.region(path, args) and self._may_recompute(path)
            if diverged:
                choice, planned = True, True  # the least memory
            recompute = choice if planned else True if inside_planned else own_recompute
            keeps_ops = recompute and not diverged and path in self.kept_ops
            self._settings[(path, occurrence)] = (recompute, keeps_ops)
        wrap = None
        if keeps_ops:
            keep = self._keeps.get((path, occurrence))
            if keep is None:
                keep = self._keeps[(path, occurrence)] = RegionKeep(path, self.kept_ops[path])
            wrap = lambda body: keep.wrap(body, recomputing)  # noqa: E731
        def body():
            return call(recompute, wrap)

        self._open.append((recompute, planned or any(taken for _, taken in self._open)))
        try:
            with self._offloading(path, planned, recompute, recomputing):
                if self.times is not None and top_level and not recomputing:
                    if self.watch.watch.diverged is not None:
                        self.times.stop()  # the step differs from the profiled one: its times are of no use
                    offloaded = self.offload is not None and planned and \
                        self.plan._entry_for(path) in self.offload.offloaded and not recompute
                    out = self.times.run(path, body, timing=not offloaded)
                else:
                    out = body()
        finally:
            self._open.pop()
        if not recomputing:
            if not recompute:
                _C.recompute_needs_tensor(*tensors_in(out))
            if top_level:
                self.watch.region_done(path, out)
        return out


def budget_arg(value, what):
    """A budget in bytes from an int ("any integer": numpy.int64, a 0-d integer tensor, what a
    computed budget often is), a float that is a whole number of bytes, or a string with a unit
    ("70GiB", "512 MiB", "80GB": remat._budget.parse_budget, the reader remat-report uses too).
    Refused: bools, 0 or less, NaN and infinities, fractions of a byte, a string without a unit."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number of bytes or a string with a unit, got a bool ({value}); write "
                        f"{_budget.BUDGET_FORMS}, or pass an int number of bytes")
    if isinstance(value, str):
        return _budget.parse_budget(value, what)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item") and not isinstance(value, numbers.Number):
        value = value.item()  # a 0-d tensor or array: its number (torch.tensor(1e9) as numpy.float32(1e9) is)
    if not isinstance(value, float) and isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        value = float(value)  # numpy.float32 and the like: as a float
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")) or not value.is_integer():
            raise ValueError(f"{what} must be a whole number of bytes, got the float {value!r}; pass an int, or a "
                             f"string such as '70GiB'")
        value = int(value)
    elif not hasattr(type(value), "__index__"):
        raise TypeError(f"{what} must be an int number of bytes or a string with a unit ('70GiB', '512 MiB', "
                        f"'80GB'), got {type(value).__name__}")
    else:
        try:
            value = operator.index(value)
        except TypeError:  # a tensor of floats, or of more than one element
            raise TypeError(f"{what} must be an int number of bytes, got {type(value).__name__} "
                            f"{value!r:.80}") from None
    if value <= 0:
        raise ValueError(f"{what} must be more than 0 bytes, got {value}; pass the bytes the step may use, such as "
                         f"70 * 2**30 or '70GiB'")
    if value >= 1 << 64:
        raise ValueError(f"{what} is {value}, more than 2**64 - 1 bytes")
    return value


def _text_of(source, what):
    """A dump's text: the text itself (it starts with '{'), or the path of a file holding it."""
    import os

    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if text.lstrip().startswith("{"):
            return text, "<text>"
        try:
            with open(text, encoding="utf-8") as file:
                return file.read(), text
        except OSError as error:
            raise ValueError(f"{what}: cannot read {text!r}: {error.strerror}") from None
    raise TypeError(f"{what}: expected a path or the dump's JSON text, got {type(source).__name__}")


class RegionProfile:
    """What each region of each checkpoint cost on one step (remat.profile_regions())."""

    def __init__(self, text):
        self._read_checked(_budget.Profile(text, "profile"))

    def _read_checked(self, read):
        """Reads the dump as remat._budget read and checked it, keeping that reading for plans."""
        self._read(read.to_json(), read)

    @classmethod
    def _checked(cls, text):
        """The profile of a dump remat._budget has checked and written already: read, not checked again."""
        profile = cls.__new__(cls)
        profile._read(text)
        return profile

    def _read(self, text, solver_profile=None):
        self._text = text
        self._solver_profile = solver_profile  # the dump as remat._budget read it, once (_solver)
        self._least_peaks = {}  # least_peak_bytes() by (group, host budget)
        self._peak_plans = {}   # plans by step peak made: (group, host budget) -> [(asked, peak, proved, dump)]
        doc = json.loads(text)
        self.base_bytes = doc["base_bytes"]
        self.all_saved_bytes = doc["all_saved_bytes"]
        step = doc.get("step")
        # The measured step peak with every region saved, and what was allocated before the step
        # (parameters, optimizer state, the batch); None without step memory.
        self.step_peak_bytes = step["peak_bytes"] if step else None
        self.step_start_bytes = step["start_bytes"] if step else None
        self.step_end_bytes = step["end_bytes"] if step else None  # when it ended: gradients made, say
        self.device = doc.get("device_name", "")
        self.timer = doc.get("timer", "")
        self.regions = [RegionCost(r["name"], r["saved_bytes"], r["seconds"]) for r in doc["regions"]]
        self._shape = None  # the StepShape profile_regions recorded; a dump does not hold it
        # region -> (its calls, their forward seconds as timed, before per-op figures priced it:
        # remat.fit re-times the profile against those); nor this
        self._forward_seconds = None
        self._after_backward = None  # the first step segment after backward ended (profile_regions); nor this
        self._segment_gradients = None  # per step segment, the model's gradient bytes when it began (remat.fit)
        # region -> the ops a per-op plan may keep: [{"index", "op", "bytes", "seconds"}] (ops=True)
        self.ops = {r["name"]: r["ops"] for r in doc["regions"] if r.get("ops")}
        self.has_ops = bool(self.ops)
        # The copy bandwidth each way (bytes a second) and, per region, the bytes an offload would
        # move: what plans with a host budget are priced by (None / {} in profiles without them).
        self.host_copy = doc.get("host_copy")
        self.offload_bytes = {r["name"]: r["offload_bytes"] for r in doc["regions"] if r.get("offload_bytes")}

    @classmethod
    def from_json(cls, source):
        """A profile from a region-profile dump: its text, or the path of a file holding it."""
        text, name = _text_of(source, "RegionProfile.from_json")
        profile = cls.__new__(cls)
        profile._read_checked(_budget.Profile(text, name))
        return profile

    def __getstate__(self):
        # What copy.deepcopy and pickle take: the profile without remat._budget's reading of it,
        # read again when a plan is made.
        state = self.__dict__.copy()
        state["_solver_profile"] = None
        return state

    def _solver(self):
        """The dump as remat._budget reads it, read once for every plan made from this profile (a
        10,000-region profile with per-op figures takes most of a second to read)."""
        if self._solver_profile is None:
            self._solver_profile = _budget.Profile(self._text)
        return self._solver_profile

    def _retimed(self, forward_seconds):
        """This profile re-timed: each region in `forward_seconds` (region -> its forward's seconds,
        as _forward_seconds times them) priced at those over its own, its ops too (a region whose
        own were 0 at those), and what the dump does not hold as here."""
        doc = json.loads(self._text)
        for region in doc["regions"]:
            name = region["name"]
            if name not in forward_seconds:
                continue
            own = self._forward_seconds[name][1]
            if own > 0:
                factor = forward_seconds[name] / own
                region["seconds"] *= factor
                for op in region.get("ops", ()):
                    op["seconds"] *= factor
            else:
                region["seconds"] = forward_seconds[name]
        profile = RegionProfile._checked(json.dumps(doc))
        profile._shape, profile._after_backward = self._shape, self._after_backward
        profile._segment_gradients = self._segment_gradients
        profile._forward_seconds = {name: (calls, forward_seconds.get(name, seconds))
                                    for name, (calls, seconds) in self._forward_seconds.items()}
        return profile

    def to_json(self, path=None):
        """The region-profile dump (schemas/region-profile.schema.json); written atomically to
        `path` when given."""
        if path is not None:
            _C.write_dump(path_arg("RegionProfile.to_json", "path", path), self._text)
        return self._text

    def plan(self, budget_bytes=None, *, peak_bytes=None, group=False, ops=False, host_budget_bytes=None):
        """The plan that recomputes the least time within a budget, given as an int number of bytes
        or a string with a unit ("70GiB", "512 MiB", "80GB"):

        peak_bytes: the training step's peak allocated bytes (remat_alloc.memory_stats()), as
            predicted from the profiled step (plan.peak_bytes). A budget below every plan's peak
            is a ValueError naming the least peak and what it is made of.
        budget_bytes: what the checkpoints keep from forward to backward, base_bytes plus the
            saved regions' bytes. A budget below base_bytes is a ValueError naming the smallest.

        group=True plans regions whose names differ only in numbers as one ("layers.*::attn"): one
        choice for every layer (with host_budget_bytes, by budget_bytes only; offloading a pattern
        offloads every region it stands for, each region's copies priced on their own).

        ops=True (from a profile_regions(ops=True) profile; not with group=True) also lets a
        recomputed region keep the outputs of chosen ops, which recompute then does not run again
        (plan.kept_ops; remat/budget/op_plan.hpp). With peak_bytes, the predicted peak counts what
        the kept ops made, held from forward to backward (the profile's step lists each op's
        storages: profile with ops=True and the step's tensors counted). With host_budget_bytes
        too, offload is a fourth choice of each region beside save, recompute and recompute keeping
        ops (solve_ops_offload, solve_peak_ops_offload).

        host_budget_bytes (with budget_bytes or peak_bytes): host memory offloaded regions may hold
        (0: none). Each region is then saved, recomputed or offloaded (plan.offloaded,
        plan.host_bytes): an offloaded region keeps nothing on the device between forward and
        backward and costs its copies' time as the profile measured the bandwidth
        (remat/budget/offload_plan.hpp). With peak_bytes the predicted peak counts what stays on
        the device: an offloaded region's bytes are back from the backward of the next checkpoint
        call that offloads (the offloader prefetches one call ahead) to the end of its own."""
        group = flag_arg("plan", "group", group)
        if host_budget_bytes is not None:
            return self._plan_offload(budget_bytes, peak_bytes, group, ops, host_budget_bytes)
        if (budget_bytes is None) == (peak_bytes is None):
            raise TypeError("plan: give one budget: peak_bytes= (the step's peak, such as '70GiB') or budget_bytes= "
                            "(what the checkpoints keep)")
        if self._ops_planned(ops, group):
            if peak_bytes is not None:
                peak_bytes = budget_arg(peak_bytes, "plan: peak_bytes")
                return Plan._checked(_budget.plan_by_peak_ops(self._solver(), peak_bytes), profile=self)
            budget_bytes = budget_arg(budget_bytes, "plan: budget_bytes")
            return Plan._checked(_budget.plan_ops(self._solver(), budget_bytes), profile=self)
        if peak_bytes is not None:
            peak_bytes = budget_arg(peak_bytes, "plan: peak_bytes")
            text = self._plan_by_peak(peak_bytes, (group, None),
                                      lambda: _budget.plan_by_peak(self._solver(), peak_bytes, group))
            return Plan._checked(text, profile=self, group=group)
        budget_bytes = budget_arg(budget_bytes, "plan: budget_bytes")
        return Plan._checked(_budget.plan(self._solver(), budget_bytes, group), profile=self, group=group)

    def _ops_planned(self, ops, group):
        """Whether plan(ops=) plans per op, refusing a grouped plan or a profile without per-op figures."""
        if not flag_arg("plan", "ops", ops):
            return False
        if group:
            raise ValueError("plan: ops=True keeps ops of regions as measured: drop group=True, or plan without ops")
        if not self.has_ops:
            raise ValueError("plan: ops=True needs per-op figures, and this profile lists no op a plan could keep: "
                             "profiled without them (profile with remat.profile_regions(ops=True)), or no region has "
                             "one (a region that must be recomputed runs again whole; in-place ops, views, random ops "
                             "and ops whose output the region writes into later are never listed): plan without ops")
        return True

    def _plan_offload(self, budget_bytes, peak_bytes, group, ops, host_budget_bytes):
        ops = self._ops_planned(ops, group)
        if group and peak_bytes is not None:
            raise ValueError("plan: host_budget_bytes= with peak_bytes= plans regions as measured: drop group=True, "
                             "or plan by budget_bytes= (what the checkpoints keep), which groups with a host budget")
        if (budget_bytes is None) == (peak_bytes is None):
            given = "both were given" if budget_bytes is not None else "neither was given"
            raise TypeError("plan: host_budget_bytes= needs one device budget: budget_bytes= (what the checkpoints "
                            f"may keep on the device) or peak_bytes= (the step's peak on the device); {given}")
        host_budget_bytes = host_budget_arg(host_budget_bytes, budget_arg)
        self._check_host_copy(host_budget_bytes, "plan")
        if ops:
            if peak_bytes is not None:
                peak_bytes = budget_arg(peak_bytes, "plan: peak_bytes")
                text = _budget.plan_by_peak_ops_offload(self._solver(), peak_bytes, host_budget_bytes)
            else:
                budget_bytes = budget_arg(budget_bytes, "plan: budget_bytes")
                text = _budget.plan_ops_offload(self._solver(), budget_bytes, host_budget_bytes)
            return Plan._checked(text, profile=self)
        if peak_bytes is not None:
            peak_bytes = budget_arg(peak_bytes, "plan: peak_bytes")
            text = self._plan_by_peak(peak_bytes, (False, host_budget_bytes), lambda: _budget.plan_by_peak_offload(
                self._solver(), peak_bytes, host_budget_bytes))
            return Plan._checked(text, profile=self)
        budget_bytes = budget_arg(budget_bytes, "plan: budget_bytes")
        return Plan._checked(_budget.plan_offload(self._solver(), budget_bytes, host_budget_bytes, group), profile=self,
                    group=group)

    def _plan_by_peak(self, peak_bytes, key, search):
        """The dump of the plan by step peak `search()` makes, from the plans made before where one
        answers. A plan proved the fastest within a larger peak is the fastest within every peak
        from its own up to that one (the plans within the smaller are among those within the larger,
        it among them), so a loop planning every step (remat.fit, whose peak moves with what each
        step begins with) searches once a shape, not once a step. A plan not proved answers only the
        peak it was made for."""
        made = self._peak_plans.setdefault(key, [])
        for asked, peak, proved, text in made:
            if asked == peak_bytes:
                return text
            if proved and peak <= peak_bytes <= asked:
                field = f'"peak_budget_bytes":{asked},'
                if field in text:
                    return text.replace(field, f'"peak_budget_bytes":{peak_bytes},', 1)
        text = search()
        doc = Plan._checked(text)
        if len(made) >= 64:  # a loop of many shapes and starts keeps the latest
            del made[0]
        made.append((peak_bytes, doc.peak_bytes, doc.exact, text))
        return text

    def _check_host_copy(self, host_budget_bytes, where):
        if host_budget_bytes > 0 and self.host_copy is None:
            raise ValueError(f"{where}: host_budget_bytes needs the copy bandwidth, which this profile does not have "
                             "(profile_regions(host_copy=False), or a dump written before it was measured): profile "
                             "again with remat.profile_regions()")

    def least_peak_bytes(self, *, group=False, host_budget_bytes=None):
        """The least step peak any plan reaches, predicted (what plan(peak_bytes=) can meet at
        best); with host_budget_bytes, among plans that may offload that much."""
        group = flag_arg("least_peak_bytes", "group", group)
        if host_budget_bytes is not None:
            if group:
                raise ValueError("least_peak_bytes: host_budget_bytes= plans by step peak regions as measured: drop "
                                 "group=True")
            host_budget_bytes = host_budget_arg(host_budget_bytes, budget_arg)
            self._check_host_copy(host_budget_bytes, "least_peak_bytes")
        # Searched once (as many plans as plan(peak_bytes=) weighs): a loop asks before every step
        least = self._least_peaks.get((group, host_budget_bytes))
        if least is None:
            least = (_budget.least_peak(self._solver(), group) if host_budget_bytes is None else
                     _budget.least_peak_offload(self._solver(), host_budget_bytes))
            self._least_peaks[(group, host_budget_bytes)] = least
        return least

    def predict_peak(self, plan):
        """The step peak (allocated bytes) predicted for `plan` (made from this profile)."""
        recompute_by_region = {name: choice == "recompute" for name, choice in plan.decisions.items()}
        grouped = any("*" in name for name in plan.decisions)
        if not plan.kept_ops and not plan.offloaded:
            return _budget.predict_peak(self._solver(), recompute_by_region, grouped)
        if plan.offloaded and grouped:
            raise ValueError("predict_peak: a plan that offloads names each region of the profile, not patterns")
        offloaded_by_region = {name: choice == "offload" for name, choice in plan.decisions.items()} \
            if plan.offloaded else {}
        kept_by_region = {name: [index for index, _ in ops] for name, ops in plan.kept_ops.items()}
        return _budget.predict_peak(self._solver(), recompute_by_region, False, offloaded_by_region, kept_by_region)

    def frontier(self, steps=8, *, group=False, by="kept"):
        """The fastest plan at `steps` budgets spread from the least to everything saved: by="kept"
        budgets of what the checkpoints keep (base_bytes to all_saved_bytes), by="peak" budgets of
        the step's peak (least_peak_bytes() to step_peak_bytes; each plan's peak_bytes is its
        prediction), to draw recompute time against the step peak."""
        if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= 1000:
            raise ValueError(f"frontier: steps must be an int from 2 to 1000, got {steps!r}")
        group = flag_arg("frontier", "group", group)
        if by == "kept":
            return [Plan._checked(text, profile=self, group=group) for text in _budget.frontier(self._solver(), steps, group)]
        if by != "peak":
            raise ValueError(f"frontier: by must be 'kept' (what the checkpoints keep) or 'peak' (the step's peak), "
                             f"got {by!r}")
        if self.step_peak_bytes is None:
            raise ValueError("frontier: by='peak' needs the step's memory, which this profile does not have: profile "
                             "with the step's tensors counted (remat.tag_cpu_tensors() for CPU tensors, "
                             "remat_alloc.install() for CUDA)")
        least = self.least_peak_bytes(group=group)
        most = max(least, self.step_peak_bytes)
        budgets = sorted({least + (most - least) * i // (steps - 1) for i in range(steps)})
        return [Plan._checked(_budget.plan_by_peak(self._solver(), budget, group), profile=self, group=group) for budget in budgets]

    def __repr__(self):
        return (f"RegionProfile({len(self.regions)} regions, base_bytes={self.base_bytes}, "
                f"all_saved_bytes={self.all_saved_bytes})")


class Plan:
    """Save or recompute for each region (RegionProfile.plan(), load_plan()): apply it with
    remat.use_plan(plan), checkpoint(..., plan=plan) or wrap_decoder_layers(model, plan=plan)."""

    def __init__(self, text, *, profile=None, group=False):
        self._read(_budget.check_plan(text, "plan"), profile, group)

    @classmethod
    def _checked(cls, text, *, profile=None, group=False):
        """The plan of a dump remat._budget has written or checked already (the solvers' plans,
        load_plan's): read, not checked again, which for 10,000 regions would cost as much as
        making the plan."""
        plan = cls.__new__(cls)
        plan._read(text, profile, group)
        return plan

    def _read(self, text, profile, group):
        self._text = text
        doc = json.loads(text)
        self.budget_bytes = doc["budget_bytes"]
        self.base_bytes = doc["base_bytes"]
        self.kept_bytes = doc["kept_bytes"]
        self.recompute_seconds = doc["recompute_seconds"]
        self.exact = doc["exact"]
        self.least_recompute_seconds = doc["least_recompute_seconds"]
        self.peak_bytes = doc.get("peak_bytes")  # the predicted step peak of a plan by peak_bytes, else None
        self.peak_budget_bytes = doc.get("peak_budget_bytes")
        self.decisions = dict(doc["decisions"])  # region (or pattern) -> "save" or "recompute"
        listed = doc.get("regions", [])  # absent from a plan given as decisions alone
        self._costs = {r["name"]: RegionCost(r["name"], r["saved_bytes"], r["seconds"]) for r in listed}
        # region -> {op index: op name}: the ops a per-op plan keeps while the region recomputes
        self._kept_ops = {r["name"]: {op["index"]: op["op"] for op in r["kept_ops"]} for r in listed
                          if r.get("kept_ops")}
        self.kept_ops = {name: sorted(ops.items()) for name, ops in self._kept_ops.items()}
        # region (or pattern) -> why it must be saved: no step recomputes it, diverged or not
        self._must_save = {r["name"]: r["must_save"] for r in listed if r.get("must_save")}
        # region (or pattern) -> why it must be recomputed: saved, its checkpoint would run it again
        self._must_recompute = {r["name"]: r["must_recompute"] for r in listed if r.get("must_recompute")}
        # A plan with a host budget: the regions it offloads, what they hold on the host and what
        # their copies cost (part of recompute_seconds); None / [] / 0 otherwise.
        self.host_budget_bytes = doc.get("host_budget_bytes")
        self.host_bytes = doc.get("host_bytes", 0)
        self.offload_seconds = doc.get("offload_seconds", 0.0)
        self.offloaded = [name for name, choice in self.decisions.items() if choice == "offload"]
        self._offload = PlanOffload(self.offloaded) if self.offloaded else None
        self._patterns = [entry for entry in self.decisions if "*" in entry]
        # pattern -> the regions of the profile it stands for (a grouped plan's)
        self._pattern_counts = {r["name"]: r["count"] for r in listed if "*" in r["name"]}
        self._profile = profile
        self._group = group
        self._region_choices = None
        self._shared_watch = None  # the StepWatch of checkpoints given this plan as an option (offloading)
        self._told = set()  # differences from the profiled step a watched use_plan warned about

    @property
    def offloader(self):
        """The remat.CpuOffload that carries out the plan's offload decisions (its stats(): what
        the last step offloaded); None for a plan that offloads nothing."""
        return None if self._offload is None else self._offload.offloader

    def _option_watch(self):
        """The StepWatch every checkpoint given this plan as an option shares (None for a plan
        read from a dump)."""
        if self._shared_watch is None:
            self._shared_watch = self._step_watch()
        return self._shared_watch

    def __getstate__(self):
        # What copy.deepcopy, pickle and torch.save take: the plan without what it made for use
        # (the runtime's region choices, the offloader and its host memory), made again when used.
        state = self.__dict__.copy()
        state["_region_choices"] = None
        state["_shared_watch"] = None
        if state.get("_offload") is not None:
            state["_offload"] = PlanOffload(self.offloaded)
        return state

    def _step_watch(self):
        """A StepWatch along the step this plan's profile measured (None for a plan read from a
        dump, whose profile's step is not known), warning once per plan for each difference."""
        shape = getattr(self._profile, "_shape", None)
        if shape is None:
            return None

        def diverged(what):
            if what in self._told:
                return
            self._told.add(what)
            prediction = "" if self.peak_bytes is None else f" ({self.peak_bytes} bytes at the step's peak)"
            warn_at_user_line(f"use_plan: this step differs from the profiled one: {what}. From there every region "
                              f"recomputes (the least memory), and the plan's prediction{prediction} does not hold "
                              "for it; profile a step like this one (remat.profile_regions()) to plan for it")

        return StepWatch(shape, diverged)

    def _choices(self):
        if self._region_choices is None:
            self._region_choices = _C.RegionChoices(
                [(name, choice == "recompute") for name, choice in self.decisions.items()])
        return self._region_choices

    def recompute_of(self, region):
        """True or False where the plan decides `region` ("checkpoint::region"), else None."""
        return self._choices().recompute_of(region)

    def _entry_for(self, region):
        """The decision `region` takes its choice from, as the runtime looks it up: the exact name,
        else the first pattern that matches; None where the plan does not name it."""
        if region in self.decisions:
            return region
        return next((pattern for pattern in self._patterns if _budget.matches(pattern, region)), None)

    def _layout_problems(self, under, unnamed, *, complete=True):
        """What shows the plan was made for another model layout, given the regions that took a
        choice from each entry ({entry: regions}) and those that ran unnamed; `complete`: every
        region has run, so an entry no region ran under, or a pattern under fewer regions than it
        stands for, is one too."""
        problems = []
        if unnamed:
            problems.append(f"{len(unnamed)} region(s) ran that the plan does not name: {_listed(unnamed)}")
        counted = [(pattern, count, len(under.get(pattern, ()))) for pattern, count in self._pattern_counts.items()]
        more = [f"{pattern} ({ran} ran, {count} in the profile)" for pattern, count, ran in counted if ran > count]
        fewer = [f"{pattern} ({ran} ran, {count} in the profile)" for pattern, count, ran in counted
                 if complete and 0 < ran < count]
        if more:
            problems.append(f"more regions ran under {len(more)} pattern(s) than each stands for in the profile the "
                            f"plan was made from: {_listed(more)}")
        if fewer:
            problems.append(f"fewer regions ran under {len(fewer)} pattern(s) than each stands for in the profile "
                            f"the plan was made from: {_listed(fewer)}")
        if complete:
            unused = [entry for entry in self.decisions if entry not in under]
            if unused and not under and not unnamed:
                problems.append(f"none of the {len(unused)} region(s) the plan names ran ({_listed(unused)}): "
                                f"{NO_REGION_RAN}")
            elif unused:
                problems.append(f"the plan names {len(unused)} region(s) that did not run: {_listed(unused)}")
        return problems

    def to_json(self, path=None):
        """The remat-plan dump (schemas/remat-plan.schema.json); written atomically to `path`
        when given."""
        if path is not None:
            _C.write_dump(path_arg("Plan.to_json", "path", path), self._text)
        return self._text

    def format(self):
        """The plan as a table, then (for a plan made from a profile) the budget/time frontier."""
        width = max([len(name) for name in self.decisions] + [6])
        lines = []
        if self.peak_bytes is not None:
            lines.append(f"step peak: {self.peak_bytes} bytes predicted, within {self.peak_budget_bytes}")
        if self.host_budget_bytes is not None:
            lines.append(f"host: {self.host_bytes} of {self.host_budget_bytes} bytes offloaded "
                         f"({len(self.offloaded)} region(s)), copies {self.offload_seconds:.6g} s of the time below")
        lines += [f"plan: {self.kept_bytes} of {self.budget_bytes} bytes kept (base {self.base_bytes}), "
                  f"{self.recompute_seconds:.6g} s recomputed{'' if self.exact else ' (not proved optimal)'}",
                 f"{'region':<{width}}  {'saved bytes':>14}  {'seconds':>10}  decision"]
        for name, choice in self.decisions.items():
            cost = self._costs.get(name)
            saved = f"{cost.saved_bytes:>14}" if cost else f"{'':>14}"
            seconds = f"{cost.seconds:>10.6g}" if cost else f"{'':>10}"
            if name in self._must_save:
                choice += f" (must be saved: {self._must_save[name]})"
            if name in self._must_recompute:
                choice += f" (must be recomputed: {self._must_recompute[name]})"
            kept = self.kept_ops.get(name)
            if kept:
                choice += f", keeping {len(kept)} op(s): " + ", ".join(f"{index} {op}" for index, op in kept)
            lines.append(f"{name:<{width}}  {saved}  {seconds}  {choice}")
        # The frontier drawn is of plans without offload: not beside a plan that may offload
        if self._profile is not None and self.peak_bytes is not None and self.host_budget_bytes is None:
            lines += ["", "frontier by step peak (the fastest plan at each peak budget):",
                      f"{'peak budget':>16}  {'peak predicted':>16}  {'recompute s':>12}"]
            for point in self._profile.frontier(group=self._group, by="peak"):
                lines.append(f"{point.peak_budget_bytes:>16}  {point.peak_bytes:>16}  {point.recompute_seconds:>12.6g}")
        elif self._profile is not None and not self.kept_ops and self.host_budget_bytes is None:
            lines += ["", "frontier (the fastest plan at each budget):",
                      f"{'budget bytes':>16}  {'kept bytes':>16}  {'recompute s':>12}"]
            for point in self._profile.frontier(group=self._group):
                lines.append(f"{point.budget_bytes:>16}  {point.kept_bytes:>16}  {point.recompute_seconds:>12.6g}")
        return "\n".join(lines)

    def __repr__(self):
        saved = sum(1 for choice in self.decisions.values() if choice == "save")
        offloaded = f", {len(self.offloaded)} offloaded (host_bytes={self.host_bytes})" if self.offloaded else ""
        return (f"Plan({saved} of {len(self.decisions)} saved{offloaded}, kept_bytes={self.kept_bytes}, "
                f"budget_bytes={self.budget_bytes}, recompute_seconds={self.recompute_seconds:.6g})")


def load_plan(source):
    """A plan from a remat-plan dump (plan.to_json(), remat-report advise --json): its text, or
    the path of a file holding it. Every field is checked; an edited dump that is wrong is a
    ValueError naming the field."""
    text, name = _text_of(source, "load_plan")
    return Plan._checked(_budget.check_plan(text, name))


def _plan_option(where, plan):
    if not isinstance(plan, Plan):
        raise TypeError(f"{where}: plan must be a remat.Plan (profile.plan(...) or remat.load_plan(path)), "
                        f"got {type(plan).__name__}")
    return plan


def plan_arg(where, plan):
    """The plan given as an option (checkpoint(plan=)): regions it does not name keep their own
    setting. wrap_decoder_layers' strict _PlanInForce passes through."""
    if plan is None or isinstance(plan, _PlanInForce):
        return plan
    return _watched_if_offloading(_PlanInForce(_plan_option(where, plan), strict=False, where=where))


def layout_checked_plan(where, plan, checkpoint_names):
    """The plan given to wrap_decoder_layers, strict as use_plan is, and checked now against the
    checkpoints the model will run (`checkpoint_names`)."""
    if plan is None:
        return None
    in_force = _PlanInForce(_plan_option(where, plan), strict=True, where=where)
    in_force.check_checkpoint_names(checkpoint_names)
    return _watched_if_offloading(in_force)


def _watched_if_offloading(in_force):
    """A plan that offloads, given as an option, follows each step as use_plan does: a step that
    differs from the profiled one (a longer sequence) would move more to the host than the plan's
    host budget, and recomputes instead. One watch for the plan, whatever checkpoint it is given to."""
    if in_force.plan._offload is not None:
        in_force.watch = in_force.plan._option_watch()
    return in_force


def _listed(names):
    return ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")


class _PlanInForce:
    """A plan as checkpoints apply it. Strict, it refuses a plan made for another model layout
    with a ValueError naming the regions: a region that ran and the plan does not name, or more
    regions under a grouped plan's pattern than it stands for, as soon as the checkpoint that ran
    them has done its forward; at finished(), a plan entry that no region ran under, or a pattern
    under fewer regions than it stands for."""

    def __init__(self, plan, *, strict, where):
        self.plan = plan
        self.strict = strict
        self.where = where
        self.watch = None  # a _step_shape.StepWatch where the plan's profile recorded its step
        self.times = None  # a _timing.RegionTimes where the watched step's regions are timed (remat.fit)
        self._under = {}  # plan entry -> the regions that took their choice from it
        self._seen = set()

    def checkpoint_ran(self, run):
        if not self.strict:
            return
        for path, planned in run.ran:
            if planned and path not in self._seen:
                self._seen.add(path)
                self._under.setdefault(self.plan._entry_for(path), set()).add(path)
        unnamed = [path for path, planned in run.ran if not planned]
        self._refuse(self.plan._layout_problems(self._under, unnamed, complete=False),
                     f"{self.where}: checkpoint '{run.name}'")

    def ran_under_another_plan(self, run):
        """The regions of a checkpoint whose own plan= won over this one ran all the same: the
        entries here that name them are not ones "that did not run" (nor are they checked against
        this plan's layout, which did not choose for them)."""
        if not self.strict:
            return
        for path, _ in run.ran:
            entry = self.plan._entry_for(path)
            if entry is not None and path not in self._seen:
                self._seen.add(path)
                self._under.setdefault(entry, set()).add(path)

    def finished(self):
        if self.strict:
            self._refuse(self.plan._layout_problems(self._under, []), self.where)

    def check_checkpoint_names(self, names):
        """Refuses, before any step, a plan with regions of checkpoints other than `names` (every
        checkpoint the model will run) or none for some of them: those would keep their own
        settings, which the plan's kept_bytes does not count."""
        def checkpoint_part(entry):
            return entry.partition(_C.REGION_SEPARATOR)[0]

        def names_checkpoint(entry, name):
            return checkpoint_part(entry) == name or ("*" in entry and _budget.matches(checkpoint_part(entry), name))

        foreign = [entry for entry in self.plan.decisions if not any(names_checkpoint(entry, name) for name in names)]
        unplanned = [name for name in names if not any(names_checkpoint(entry, name) for entry in self.plan.decisions)]
        problems = []
        if foreign:
            problems.append(f"the plan names {len(foreign)} region(s) of checkpoints the model does not have: "
                            f"{_listed(foreign)}")
        if unplanned:
            problems.append(f"the plan names no region of {len(unplanned)} checkpoint(s): {_listed(unplanned)}")
        self._refuse(problems, self.where)

    @staticmethod
    def _refuse(problems, where):
        if problems and NO_REGION_RAN in problems[-1]:
            raise ValueError(f"{where}: " + "; ".join(problems))
        if problems:
            raise ValueError(f"{where}: " + "; ".join(problems) + ". The plan was made for another model layout: "
                             "profile this model again (remat.profile_regions()), or apply the plan with "
                             "remat.use_plan(plan, strict=False) to let the regions it does not name keep their own "
                             "setting")


class use_plan:
    """`with remat.use_plan(plan):` every checkpoint called inside on this thread takes each
    region's choice from the plan (by name; a checkpoint's own plan= wins, and so does a use_plan
    block inside this one; inside profile_regions it is refused). strict=True (the
    default) refuses a plan from another model layout with a ValueError naming the regions: a
    region that ran and the plan does not name, or more regions under a grouped plan's pattern
    than it stands for, as soon as the checkpoint that ran them has done its forward; a plan
    entry that no region ran under (or a pattern under fewer regions than it stands for) at the
    end of the block. strict=False lets the regions the plan does not name keep their own
    setting."""

    def __init__(self, plan, *, strict=True):
        if not isinstance(plan, Plan):
            raise TypeError(f"use_plan: expected a remat.Plan (profile.plan(...) or remat.load_plan(path)), "
                            f"got {type(plan).__name__}")
        self._plan = plan
        self._strict = bool(strict)
        self._in_force = None
        self._watch = None  # remat.fit's own StepWatch, else one made at __enter__
        self._times = None  # remat.fit's RegionTimes where it times this step's regions

    def __enter__(self):
        if profiling() is not None:
            raise RuntimeError("use_plan: a profile is being measured on this thread (profile_regions), which saves "
                               "every region, so no plan can apply inside it: run the planned step after the "
                               "profile_regions block")
        if not hasattr(_state, "plans"):
            _state.plans = []
        self._in_force = _PlanInForce(self._plan, strict=self._strict, where="use_plan")
        self._in_force.watch = self._watch if self._watch is not None else self._plan._step_watch()
        self._in_force.times = self._times
        _state.plans.append(self._in_force)
        block_opened()
        return self._plan

    def __exit__(self, exc_type, *rest):
        _state.plans.pop()
        block_opened(False)
        if exc_type is None:
            self._in_force.finished()
        return False


def live_checkpoint_bytes():
    """Bytes the live checkpoints (forward done, backward to come) keep, each storage once: what a
    plan's kept_bytes predicts."""
    storages = {}
    for report in _C.live_checkpoint_reports():
        for region in report.regions:
            for tensor in region.tensors:
                storages[(tensor.device, tensor.address)] = tensor.bytes
    storages.update(held_storages())  # outputs of ops kept inside recomputed regions
    return sum(storages.values())
