"""Budget plans: which regions to save, chosen from what one training step measured.

    with remat.profile_regions() as profile:          # one ordinary step, forward and backward
        model(**batch).loss.backward()
    plan = profile.plan(budget_bytes=12 << 30)        # the least recompute time within 12 GiB
    with remat.use_plan(plan):                        # every region takes its choice from the plan
        model(**batch).loss.backward()

profile_regions() runs the step with every region saved (a plan of one pattern, "*": save), so it
measures both choices at once: each region's saved bytes from what its checkpoint keeps (the
saved-tensors report, each storage once) and its forward time (CUDA events on a GPU, the thread's
CPU time otherwise), and the bytes the checkpoints keep with every region recomputed (their tensor
inputs, each storage once: `base_bytes`). That step keeps what saving everything keeps: profile
with a batch that fits so. Regions nested in another region are planned as part of the outermost.

The solver (exact 0/1 knapsack) and the region_profile and remat_plan dumps are C++
(remat/budget, also behind `remat-report advise`), reached through remat._budget.
"""

from __future__ import annotations

import json
import threading
import time
from collections import namedtuple

import torch
from remat_alloc.arguments import path_arg

from . import _budget
from ._extension import _C
from ._trace import collect_trace

__all__ = ["RegionCost", "RegionProfile", "Plan", "profile_regions", "use_plan", "load_plan"]

RegionCost = namedtuple("RegionCost", ["name", "saved_bytes", "seconds"])
RegionCost.__doc__ = "What one region costs: bytes its checkpoint keeps while it is saved, and its forward seconds."

# .session: the profile_regions being measured; .plans: use_plan blocks, innermost last;
# .checkpoints: (name, choices) of the checkpoints running under a plan or a profile, innermost last
_state = threading.local()
_SAVE_ALL = None  # _C.RegionChoices([("*", False)]), made on first use


def _save_all():
    global _SAVE_ALL
    if _SAVE_ALL is None:
        _SAVE_ALL = _C.RegionChoices([("*", False)])
    return _SAVE_ALL


def region_choices(own=None):
    """The choices a checkpoint called now applies: every region saved while a profile is being
    measured, else its own plan's, else the innermost use_plan's; None: every region its own."""
    if getattr(_state, "session", None) is not None:
        return _save_all()
    if own is not None:
        return own
    plans = getattr(_state, "plans", None)
    return plans[-1]._choices() if plans else None


def profiling():
    """The profile_regions block being measured on this thread, or None."""
    return getattr(_state, "session", None)


def run_checkpoint(name, choices, args, kwargs, call):
    """Runs a checkpoint's call() under `choices` (None: no plan), measured when profiling."""
    if choices is None:
        return call()
    if not hasattr(_state, "checkpoints"):
        _state.checkpoints = []
    _state.checkpoints.append((name, choices))
    try:
        profile = profiling()
        return call() if profile is None else profile.run_checkpoint(name, args, kwargs, call)
    finally:
        _state.checkpoints.pop()


def run_region(name, own_recompute, call):
    """Runs a region's call() (the runtime's region) in the innermost checkpoint. Under a plan
    (or a profile, which saves every region) a region may be saved that its code recomputes: its
    outputs are kept for recompute, since code between regions may read them again there. None
    of this outside a plan: call() as it is."""
    running = getattr(_state, "checkpoints", None)
    if not running:
        return call()
    checkpoint, choices = running[-1]
    recompute = choices.recompute_of(f"{checkpoint}::{name}")
    saved = not own_recompute if recompute is None else not recompute

    def run():
        out = call()
        if saved and not _C.is_recomputing():
            _C.recompute_needs_tensor(*tensors_in(out))
        return out

    profile = profiling()
    return run() if profile is None else profile.time_region(f"{checkpoint}::{name}", run)


def _byte_count(value, what):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int number of bytes, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must be 0 or more bytes, got {value}")
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
        self._text = _budget.check_profile(text, "profile")
        doc = json.loads(self._text)
        self.base_bytes = doc["base_bytes"]
        self.all_saved_bytes = doc["all_saved_bytes"]
        self.device = doc.get("device_name", "")
        self.timer = doc.get("timer", "")
        self.regions = [RegionCost(r["name"], r["saved_bytes"], r["seconds"]) for r in doc["regions"]]

    @classmethod
    def from_json(cls, source):
        """A profile from a region_profile dump: its text, or the path of a file holding it."""
        text, name = _text_of(source, "RegionProfile.from_json")
        return cls(_budget.check_profile(text, name))

    def to_json(self, path=None):
        """The region_profile dump (schemas/region_profile.schema.json); written atomically to
        `path` when given."""
        if path is not None:
            _C.write_dump(path_arg("RegionProfile.to_json", "path", path), self._text)
        return self._text

    def plan(self, budget_bytes, *, group=False):
        """The plan that recomputes the least time with base_bytes plus the saved regions' bytes
        at most budget_bytes. group=True plans regions whose names differ only in numbers as one
        ("layers.*::attn"): one choice for every layer. A budget below base_bytes is a ValueError
        naming the smallest one."""
        budget_bytes = _byte_count(budget_bytes, "plan: budget_bytes")
        return Plan(_budget.plan(self._text, budget_bytes, bool(group)), profile=self, group=bool(group))

    def frontier(self, steps=8, *, group=False):
        """The fastest plan at `steps` budgets spread from base_bytes to everything saved."""
        if isinstance(steps, bool) or not isinstance(steps, int) or not 2 <= steps <= 1000:
            raise ValueError(f"frontier: steps must be an int from 2 to 1000, got {steps!r}")
        return [Plan(text, profile=self, group=bool(group)) for text in _budget.frontier(self._text, steps, bool(group))]

    def __repr__(self):
        return (f"RegionProfile({len(self.regions)} regions, base_bytes={self.base_bytes}, "
                f"all_saved_bytes={self.all_saved_bytes})")


class Plan:
    """Save or recompute for each region (RegionProfile.plan(), load_plan()): apply it with
    remat.use_plan(plan), checkpoint(..., plan=plan) or wrap_decoder_layers(model, plan=plan)."""

    def __init__(self, text, *, profile=None, group=False):
        self._text = _budget.check_plan(text, "plan")
        doc = json.loads(self._text)
        self.budget_bytes = doc["budget_bytes"]
        self.base_bytes = doc["base_bytes"]
        self.kept_bytes = doc["kept_bytes"]
        self.recompute_seconds = doc["recompute_seconds"]
        self.exact = doc["exact"]
        self.least_recompute_seconds = doc["least_recompute_seconds"]
        self.decisions = dict(doc["decisions"])  # region (or pattern) -> "save" or "recompute"
        self._costs = {r["name"]: RegionCost(r["name"], r["saved_bytes"], r["seconds"]) for r in doc["regions"]}
        self._profile = profile
        self._group = group
        self._region_choices = None

    def _choices(self):
        if self._region_choices is None:
            self._region_choices = _C.RegionChoices(
                [(name, choice == "recompute") for name, choice in self.decisions.items()])
        return self._region_choices

    def recompute_of(self, region):
        """True or False where the plan decides `region` ("checkpoint::region"), else None."""
        return self._choices().recompute_of(region)

    def to_json(self, path=None):
        """The remat_plan dump (schemas/remat_plan.schema.json); written atomically to `path`
        when given."""
        if path is not None:
            _C.write_dump(path_arg("Plan.to_json", "path", path), self._text)
        return self._text

    def format(self):
        """The plan as a table, then (for a plan made from a profile) the budget/time frontier."""
        width = max([len(name) for name in self.decisions] + [6])
        lines = [f"plan: {self.kept_bytes} of {self.budget_bytes} bytes kept (base {self.base_bytes}), "
                 f"{self.recompute_seconds:.6g} s recomputed{'' if self.exact else ' (not proved optimal)'}",
                 f"{'region':<{width}}  {'saved bytes':>14}  {'seconds':>10}  decision"]
        for name, choice in self.decisions.items():
            cost = self._costs.get(name)
            saved = f"{cost.saved_bytes:>14}" if cost else f"{'':>14}"
            seconds = f"{cost.seconds:>10.6g}" if cost else f"{'':>10}"
            lines.append(f"{name:<{width}}  {saved}  {seconds}  {choice}")
        if self._profile is not None:
            lines += ["", "frontier (the fastest plan at each budget):",
                      f"{'budget bytes':>16}  {'kept bytes':>16}  {'recompute s':>12}"]
            for point in self._profile.frontier(group=self._group):
                lines.append(f"{point.budget_bytes:>16}  {point.kept_bytes:>16}  {point.recompute_seconds:>12.6g}")
        return "\n".join(lines)

    def __repr__(self):
        saved = sum(1 for choice in self.decisions.values() if choice == "save")
        return (f"Plan({saved} of {len(self.decisions)} saved, kept_bytes={self.kept_bytes}, "
                f"budget_bytes={self.budget_bytes}, recompute_seconds={self.recompute_seconds:.6g})")


def load_plan(source):
    """A plan from a remat_plan dump (plan.to_json(), remat-report advise --json): its text, or
    the path of a file holding it. Every field is checked; an edited dump that is wrong is a
    ValueError naming the field."""
    text, name = _text_of(source, "load_plan")
    return Plan(_budget.check_plan(text, name))


def plan_arg(where, plan):
    """The choices of a plan given as an option (checkpoint(plan=), wrap_decoder_layers(plan=))."""
    if plan is None:
        return None
    if not isinstance(plan, Plan):
        raise TypeError(f"{where}: plan must be a remat.Plan (profile.plan(...) or remat.load_plan(path)), "
                        f"got {type(plan).__name__}")
    return plan._choices()


class use_plan:
    """`with remat.use_plan(plan):` every checkpoint called inside on this thread takes each
    region's choice from the plan (by name; a checkpoint's own plan= wins). strict=True (the
    default): at the end of the block, a plan entry that no region ran under, or a region that
    ran and the plan does not name, is a ValueError naming them (a plan from another model
    layout); strict=False lets the regions the plan does not name keep their own setting."""

    def __init__(self, plan, *, strict=True):
        if not isinstance(plan, Plan):
            raise TypeError(f"use_plan: expected a remat.Plan (profile.plan(...) or remat.load_plan(path)), "
                            f"got {type(plan).__name__}")
        self._plan = plan
        self._strict = bool(strict)
        self._trace = None

    def __enter__(self):
        if not hasattr(_state, "plans"):
            _state.plans = []
        self._trace = collect_trace()
        self._trace.__enter__()
        _state.plans.append(self._plan)
        return self._plan

    def __exit__(self, exc_type, *rest):
        _state.plans.pop()
        self._trace.__exit__(exc_type, *rest)
        if self._strict and exc_type is None:
            ran = [f"{scope.name}::{region.name}" for scope in self._trace.scopes for region in scope.regions]
            self._check(ran)
        return False

    def _check(self, ran):
        unnamed = sorted({name for name in ran if self._plan.recompute_of(name) is None})
        ran_names = set(ran)
        unused = [entry for entry in self._plan.decisions
                  if entry not in ran_names
                  and not ("*" in entry and any(_budget.matches(entry, name) for name in ran_names))]
        problems = []
        if unused:
            problems.append(f"the plan names {len(unused)} region(s) that did not run: {', '.join(unused[:8])}"
                            f"{' ...' if len(unused) > 8 else ''}")
        if unnamed:
            problems.append(f"{len(unnamed)} region(s) ran that the plan does not name: {', '.join(unnamed[:8])}"
                            f"{' ...' if len(unnamed) > 8 else ''}")
        if problems:
            raise ValueError("use_plan: " + "; ".join(problems) + ". The plan was made for another model layout: "
                             "profile this model again (remat.profile_regions()), or pass strict=False to let "
                             "unnamed regions keep their own setting")


class profile_regions:
    """`with remat.profile_regions() as profile:` around one ordinary training step (forward and
    backward) measures every region of every checkpoint called inside on this thread; after the
    block, `profile` is a RegionProfile (profile.regions, profile.base_bytes, profile.plan())."""

    def __init__(self):
        self._profile = None
        self._depth = 0         # regions being timed, to leave nested ones to the outermost
        self._order = []        # region names in the order they first ran
        self._bytes = {}        # region -> saved bytes, added up over the calls of its checkpoint
        self._timings = {}      # region -> [seconds or (start event, end event)]
        self._inputs = {}       # storage key -> bytes of checkpoint inputs
        self._device = "cpu"

    def __enter__(self):
        if getattr(_state, "session", None) is not None:
            raise RuntimeError("profile_regions: a profile is being measured on this thread already; profile one "
                               "step at a time")
        _state.session = self
        return self

    def __exit__(self, exc_type, *rest):
        _state.session = None
        if exc_type is not None:
            return False
        if not self._order:
            raise ValueError("profile_regions: no region of a checkpoint ran inside the block; run one training step "
                             "of a model whose checkpoints have regions (remat.region, wrap_decoder_layers)")
        if any(isinstance(t, tuple) for times in self._timings.values() for t in times):
            torch.cuda.synchronize()
        regions = []
        for name in self._order:
            seconds = sum(t[0].elapsed_time(t[1]) / 1000.0 if isinstance(t, tuple) else t for t in self._timings[name])
            regions.append({"name": name, "saved_bytes": self._bytes.get(name, 0), "seconds": max(seconds, 0.0)})
        doc = {"kind": "region_profile", "schema_version": 1, "device_name": self._device,
               "timer": "cuda_events" if self._device.startswith("cuda") else "thread_time",
               "base_bytes": sum(self._inputs.values()), "regions": regions}
        self._profile = RegionProfile(json.dumps(doc))
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
        out = call()
        for tensor in tensors_in((args, kwargs)):
            storage = tensor.untyped_storage()
            self._inputs[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
        reports = [report for report in _C.live_checkpoint_reports() if report.checkpoint == name]
        if reports:
            for region in reports[-1].regions:
                if region.region not in self._timings:
                    continue
                # Each storage once, and not the checkpoints' inputs (position embeddings every
                # layer takes, say): base_bytes has those whatever the plan.
                kept = sum(t.bytes for t in region.tensors
                           if not t.shares_storage and (t.device, t.address) not in self._inputs)
                self._bytes[region.region] = self._bytes.get(region.region, 0) + kept
        return out

    def time_region(self, name, call):
        if self._depth > 0 or _C.is_recomputing():
            return call()
        if name not in self._timings:
            self._timings[name] = []
            self._order.append(name)
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._depth += 1
        try:
            if cuda:
                self._device = f"cuda:{torch.cuda.current_device()}"
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = call()
                end.record()
                self._timings[name].append((start, end))
            else:
                start = time.thread_time()
                out = call()
                self._timings[name].append(time.thread_time() - start)
        finally:
            self._depth -= 1
        return out


def live_checkpoint_bytes():
    """Bytes the live checkpoints (forward done, backward to come) keep, each storage once: what a
    plan's kept_bytes predicts."""
    storages = {}
    for report in _C.live_checkpoint_reports():
        for region in report.regions:
            for tensor in region.tensors:
                storages[(tensor.device, tensor.address)] = tensor.bytes
    return sum(storages.values())


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
