"""Hugging Face transformers models checkpointed by remat, one checkpoint per decoder layer.

transformers checkpoints a model through its decoder layers: every layer that is a
`GradientCheckpointingLayer` runs its forward as `self._gradient_checkpointing_func(
partial(forward, self, **kwargs), *args)` when `self.gradient_checkpointing` is set, the layer
is training and grad mode is on; otherwise it runs as is. `wrap_decoder_layers(model)` uses that
hook and nothing else of the layer: it sets the two instance attributes, with a function that
takes the partial apart and hands the forward to the layer's own `remat.checkpoint(region_name=
<module path>)`, so the hidden states, masks and position embeddings the model passes by keyword
are the checkpoint's inputs. Every layer's checkpoint keeps the CPU and CUDA generators' state for
recompute, as transformers' own checkpointing preserves the RNG state, so dropout draws forward's
masks again. Module hooks (FSDP2's, accelerate's) stay outside the checkpoint,
as with transformers' own checkpointing, and eval mode or no-grad never reaches it. The layer's
children become regions by an instance `forward` wrapper: each name in `save` a save region
(`recompute=False`: autograd keeps what it saves, recompute skips it, and the runtime keeps its
output because the layer's residual add reads it), each name in
`recompute` (by default every other child) a recompute region. A wrapper acts only while its own
layer's checkpoint runs on the thread; anywhere else it calls the forward it wraps. Layers that
are not `GradientCheckpointingLayer`s (older transformers, other models: the modules of an
`nn.ModuleList` named `layers`, or what `layers=` names) get an instance `forward` that
checkpoints under the same conditions. The other modules that carry `gradient_checkpointing` (the
model, its stack) get it set too, as transformers' own switch sets it: they read it to hand their
layers no cache in training (_set_parents_checkpointing).

transformers' own switches act on the same attributes. `model.gradient_checkpointing_disable()`
(`activation_checkpointing_disable()` in transformers 5) turns checkpointing off: the layers run
unchanged and the region wrappers call straight through. `model.gradient_checkpointing_enable()`
(`activation_checkpointing_enable()`, and the Trainer's `gradient_checkpointing=True` /
`activation_checkpointing=True`, which transformers.Trainer applies as training begins, after the
model was wrapped) keeps remat's checkpoints and says so once: its options (the checkpoint's
keyword arguments, every_n_layers, offload) are not applied, and what else it does (PEFT's
enable_input_require_grads) is; after gradient_checkpointing_disable() it turns remat's back on.
That is the instance's `_set_gradient_checkpointing`, through which transformers' switches set the
layers' attributes (_KeepsRemat). To checkpoint with `torch.utils.checkpoint` instead,
`unwrap_decoder_layers(model)` first. `model.is_gradient_checkpointing` reads True while remat
checkpoints the layers. Calling `wrap_decoder_layers` again first undoes the previous call, so the
last call's settings hold and nothing is wrapped twice; `unwrap_decoder_layers(model)` undoes it
and restores what transformers had set.
"""

import copy
import functools
import inspect
import threading
import types
import weakref

import torch

from . import _plans

from ._extension import _C
from ._api import checkpoint
from ._compile import compiled_region
from ._fit import RETIME_STEPS, fit, unfit
from ._offload import CpuOffload
from ._state import checked_state_hooks, cpu_rng_state_hook, cuda_rng_state_hook
from ._step_shape import warn_at_user_line
from ._timing import retime_steps_arg, timer_arg

__all__ = ["wrap_decoder_layers", "unwrap_decoder_layers"]

class _ABSENT:
    """An instance attribute that was not set before wrapping (a class: deepcopy keeps it)."""


def _gradient_checkpointing_layer_class():
    """transformers.modeling_layers.GradientCheckpointingLayer, or None (transformers missing
    or older than 4.52)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return None
    return GradientCheckpointingLayer


def _transformers_version():
    try:
        import transformers
    except ImportError:
        return "not installed"
    return transformers.__version__


# --- which child regions run inside which layer call -------------------------------------------

_calls = threading.local()  # .stack: the _LayerCall of every wrapped layer forward running here
# The plan of the layer Dynamo traces now: set outside the checkpoint (its higher-order op
# allows no side effects inside) and only read inside, where region wrappers look it up.
_traced_plan = None


class _LayerCall:
    """One run of a layer's body (forward or recompute): its plan and the region names used so
    far, so a child called twice gets "mlp" and then "mlp#2" in forward and recompute alike."""

    __slots__ = ("plan", "_uses")

    def __init__(self, plan):
        self.plan = plan
        self._uses = {}

    def region_name(self, name):
        uses = self._uses.get(name, 0) + 1
        self._uses[name] = uses
        return name if uses == 1 else f"{name}#{uses}"


def _call_stack():
    if not hasattr(_calls, "stack"):
        _calls.stack = []
    return _calls.stack


def _current_call():
    stack = _call_stack()
    return stack[-1] if stack else None


def _region_forward(child, *args, **kwargs):
    """The instance forward of a child named in a plan, bound to the child: a region while a plan
    naming it runs on the thread, the forward it wraps (the child's `_remat_inner_forward`)
    otherwise. A child's forward calls it through a function bound to the child, one per class
    forward it wraps (_region_forward_for), not an object per child: torch.compile guards a bound
    method by its function, the same for every layer (an object of each layer's own made every
    layer another graph, 8 for 10 layers, and the 9th on ran eagerly past the recompile limit);
    copy.deepcopy(model) binds the copy's to the copy's child."""
    inner = child.__dict__["_remat_inner_forward"]
    if torch.compiler.is_compiling():
        # Read off the child, not looked up in the plan's regions: a dict keyed by modules makes
        # Dynamo guard each key's parameters by identity, another graph for every layer
        if _traced_plan is None:
            return inner(*args, **kwargs)
        return compiled_region(inner, not child.__dict__["_remat_region_saved"], args, kwargs)
    call = _current_call()
    entry = call.plan.regions.get(child) if call is not None else None
    if entry is None:
        return inner(*args, **kwargs)
    name, save = entry
    region = call.region_name(name)
    # Names were checked when the layer was wrapped; the region goes straight to the runtime.
    return _plans.run_region(
        region, not save,
        lambda setting, wrap=None: _C.region(inner if wrap is None else wrap(inner), args, kwargs, region, setting),
        (args, kwargs))


_REGION_FORWARD_STATE = ("_remat_inner_forward", "_remat_region_saved")  # on a child, read by _region_forward

# The forward a child is given, per function it wraps (its class's forward): one function for every
# child of a class, with that forward's name, docstring and signature (inspect.signature follows
# __wrapped__), bound to each child
_region_forwards = weakref.WeakKeyDictionary()


def _region_forward_for(child, inner):
    """`child`'s region forward around `inner` (what child.forward was)."""
    wrapped = inner.__func__ if inspect.ismethod(inner) and inner.__self__ is child else None
    function = _region_forwards.get(wrapped) if wrapped is not None else None
    if function is None:
        def function(child, *args, **kwargs):
            return _region_forward(child, *args, **kwargs)

        functools.update_wrapper(function, wrapped if wrapped is not None else inner)
        function._remat_region_forward = True
        if wrapped is not None:  # kept for the class's other children; an instance's own forward
            _region_forwards[wrapped] = function  # (a hook's) gets a function of its own
    return types.MethodType(function, child)


def _is_region_forward(forward, child):
    return inspect.ismethod(forward) and getattr(forward.__func__, "_remat_region_forward", False) and \
        forward.__self__ is child


# --- one layer ---------------------------------------------------------------------------------


def _same(current, value):
    """Whether an attribute still holds the value set: the same object, or a bound method of the
    same function on the same object (copy.deepcopy makes a new one for each reference to it)."""
    if current is value:
        return True
    return (inspect.ismethod(current) and inspect.ismethod(value) and current.__func__ is value.__func__
            and current.__self__ is value.__self__)


class _LayerPlan:
    """What wrap_decoder_layers did to one layer: its checkpoint, its child regions
    ({child module: (region name, saved)}), and what to put back."""

    def __init__(self, layer, path, ckpt, regions):
        self.layer = layer
        self.path = path
        self.checkpoint = ckpt
        self.regions = regions
        self.restore = []  # (module, attribute, previous value or _ABSENT, value set)
        self.body = self._make_body()

    def __deepcopy__(self, memo):
        """The plan of a copied model: its modules copied with the model, the checkpoint (its
        options, immutable) shared."""
        copied = _LayerPlan.__new__(_LayerPlan)
        memo[id(self)] = copied
        copied.layer = copy.deepcopy(self.layer, memo)
        copied.path = self.path
        copied.checkpoint = self.checkpoint
        copied.regions = copy.deepcopy(self.regions, memo)
        copied.restore = copy.deepcopy(self.restore, memo)
        copied.body = copied._make_body()
        return copied

    def __reduce__(self):
        layer = self.path or f"a {type(self.layer).__name__}"
        raise TypeError(f"remat.wrap_decoder_layers: a model whose layers it wrapped ({layer}) cannot be pickled "
                        "(torch.save(model), multiprocessing): its checkpoints hold the running process's state hooks. "
                        "Save model.state_dict(), or call remat.unwrap_decoder_layers(model) (which undoes the fit of "
                        "wrap_decoder_layers(budget=) too) before saving and wrap the loaded model")

    def _make_body(self):
        def body(function, *args, **kwargs):
            """The checkpoint's body: the layer's forward with its child regions in force."""
            stack = _call_stack()
            stack.append(_LayerCall(self))
            try:
                return function(*args, **kwargs)
            finally:
                stack.pop()

        body.__qualname__ = f"{type(self.layer).__qualname__}.forward"  # errors: "checkpoint '...' (<Layer>.forward)"
        return body

    def checkpoint_function(self, function, *args, **kwargs):
        """The layer's _gradient_checkpointing_func: transformers passes partial(forward, self,
        **kwargs) and the positional arguments; the keyword tensors become checkpoint inputs."""
        if isinstance(function, functools.partial):
            args = function.args + args
            kwargs = {**function.keywords, **kwargs}
            function = function.func
        if torch.compiler.is_compiling():
            global _traced_plan
            outer, _traced_plan = _traced_plan, self
            try:
                return self.checkpoint.call(function, *args, **kwargs)
            finally:
                _traced_plan = outer
        return self.checkpoint.call(self.body, function, *args, **kwargs)

    def set_attribute(self, module, attribute, value):
        self.restore.append((module, attribute, module.__dict__.get(attribute, _ABSENT), value))
        setattr(module, attribute, value)

    def reapply(self):
        """Sets again what wrapping set (turned off since by gradient_checkpointing_disable, say)."""
        for module, attribute, _, value in self.restore:
            if not _same(module.__dict__.get(attribute, _ABSENT), value):
                setattr(module, attribute, value)

    def undo(self):
        hooked = set()  # children whose region forward something else holds now (a hook set after wrapping)
        for module, attribute, previous, value in reversed(self.restore):
            if not _same(module.__dict__.get(attribute, _ABSENT), value):
                if attribute == "forward":
                    hooked.add(id(module))
                continue  # replaced since (gradient_checkpointing_enable, another wrapper): leave it
            if id(module) in hooked and attribute in _REGION_FORWARD_STATE:
                continue  # what the region forward the hook calls reads: it runs the wrapped forward now
            if previous is _ABSENT:
                delattr(module, attribute)
            else:
                setattr(module, attribute, previous)
        self.restore.clear()


class _PlainLayerForward:
    """The instance forward of a layer that is not a GradientCheckpointingLayer: checkpointed
    under the conditions transformers uses (training, grad mode on)."""

    def __init__(self, plan, inner):
        functools.update_wrapper(self, inner)
        self.plan = plan
        self.inner = inner

    def __call__(self, *args, **kwargs):
        if self.plan.layer.training and torch.is_grad_enabled() and _current_call() is None:
            return self.plan.checkpoint.call(self.plan.body, self.inner, *args, **kwargs)
        return self.inner(*args, **kwargs)


# --- finding layers and children ---------------------------------------------------------------


def _names_arg(parameter, names):
    if names is None:
        return None
    if isinstance(names, str):
        return (names,)
    if not hasattr(names, "__iter__"):
        raise TypeError(f"wrap_decoder_layers: {parameter} must be child names (a str or a sequence of str, such as "
                        f"(\"self_attn\",)), got {type(names).__name__}")
    names = tuple(names)
    for name in names:
        if not isinstance(name, str) or not name or "\0" in name:
            raise TypeError(f"wrap_decoder_layers: {parameter} must hold non-empty child names such as \"self_attn\", "
                            f"got {name!r:.80}")
    return names


def _module_paths(model):
    """{module: its first path in model}."""
    paths = {}
    for path, module in model.named_modules():
        paths.setdefault(module, path)
    return paths


def _submodule(model, path, what):
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ValueError(f"wrap_decoder_layers: {what} no submodule of {type(model).__name__}") from None


def _find_layers(model, layers, paths):
    """[(path, layer)] in model order."""
    if layers is not None:
        if isinstance(layers, str):
            layers = _submodule(model, layers, f"layers={layers!r} names")
        modules = list(layers.children()) if isinstance(layers, torch.nn.ModuleList) else list(layers)
        found = []
        for item in modules:
            if isinstance(item, str):
                item = _submodule(model, item, f"layers holds {item!r}, which names")
            if not isinstance(item, torch.nn.Module):
                raise TypeError(f"wrap_decoder_layers: layers must hold modules or their paths, got "
                                f"{type(item).__name__}")
            if item not in paths:
                raise ValueError(f"wrap_decoder_layers: layers holds a {type(item).__name__} that is not a submodule "
                                 f"of {type(model).__name__}")
            found.append((paths[item], item))
        if not found:
            raise ValueError("wrap_decoder_layers: layers= holds no modules")
        return found

    layer_class = _gradient_checkpointing_layer_class()
    if layer_class is not None:
        found = []
        for path, module in model.named_modules():
            if isinstance(module, layer_class) and not any(
                    path.startswith(outer + ".") or outer == "" for outer, _ in found):
                found.append((path, module))  # outermost only: a layer inside a layer is part of it
        if found:
            return found
    found = []
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and path.rsplit(".", 1)[-1] == "layers":
            found.extend((paths[layer], layer) for layer in module.children())
    if found:
        return found
    raise ValueError(
        f"wrap_decoder_layers: found no decoder layers in {type(model).__name__}: looked for modules that are "
        f"transformers.modeling_layers.GradientCheckpointingLayer (transformers {_transformers_version()}) and for "
        "an nn.ModuleList named 'layers'; pass layers= (a ModuleList, its path such as \"model.layers\", or the "
        "layer modules)")


def _refuse_checkpoint_wrapped(model, found):
    wrapped = [path for path, module in model.named_modules() if type(module).__name__ == "CheckpointWrapper"]
    for path, _ in found:
        for outer in wrapped:
            if outer == "" or path.startswith(outer + "."):
                raise ValueError(f"wrap_decoder_layers: layer '{path}' is inside torch.distributed's "
                                 f"checkpoint_wrapper ('{outer or type(model).__name__}'), which checkpoints it "
                                 "already; checkpoints do not nest: drop the wrapper, or pass its checkpoint_fn="
                                 "remat.checkpoint(region_name=...).call instead of calling wrap_decoder_layers")


def _children_of(layer, names):
    """{name: module} for the names a layer has (dotted paths allowed)."""
    found = {}
    for name in names:
        try:
            found[name] = layer.get_submodule(name)
        except AttributeError:
            continue
    return found


def _check_region_names(save, recompute):
    both = set(save) & set(recompute or ())
    if both:
        raise ValueError(f"wrap_decoder_layers: {sorted(both)[0]!r} is in both save and recompute; a child is one "
                         "region or the other")
    names = list(save) + list(recompute or ())
    for outer in names:
        for inner in names:
            if inner.startswith(outer + "."):
                raise ValueError(f"wrap_decoder_layers: {inner!r} is inside {outer!r}, and regions do not nest: name "
                                 "one of them")


def _layer_regions(layer, save, recompute):
    """{child module: (region name, saved)} for one layer."""
    regions = {}
    for name, child in _children_of(layer, save).items():
        regions[child] = (name, True)
    if recompute is None:  # every other direct child, except those that hold a save region
        recompute = [name for name, _ in _called_children(layer)
                     if name not in save and not any(path.startswith(name + ".") for path in save)]
    for name, child in _children_of(layer, recompute).items():
        if child not in regions:
            regions[child] = (name, False)
    return regions


_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


def _called_children(module, prefix=""):
    """(path, child) of the module's children its forward can call: a ModuleList or ModuleDict
    (T5's block keeps its sublayers in one, named "layer") is never called itself, its entries are."""
    for name, child in module.named_children():
        if isinstance(child, _CONTAINERS):
            yield from _called_children(child, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", child


def _require_present(parameter, names, found_layers):
    for name in names:
        containers = [layer.get_submodule(name) for _, layer in found_layers if _has_submodule(layer, name)]
        if containers and all(isinstance(child, _CONTAINERS) for child in containers):
            entries = ", ".join(repr(f"{name}.{entry}") for entry, _ in containers[0].named_children())
            raise ValueError(f"wrap_decoder_layers: {parameter}={name!r} names a {type(containers[0]).__name__}, "
                             "which a layer never calls itself (it calls its entries), so no region would run: name "
                             f"its entries instead ({entries or 'it has none'})")
        if containers:
            continue
        kinds = sorted({type(layer).__name__ for _, layer in found_layers})
        _, first = found_layers[0]
        children = ", ".join(name for name, _ in first.named_children()) or "no children"
        raise ValueError(f"wrap_decoder_layers: {parameter}={name!r} names no submodule of any decoder layer "
                         f"({', '.join(kinds)}; {type(first).__name__} has {children})")


def _has_submodule(layer, name):
    try:
        layer.get_submodule(name)
    except AttributeError:
        return False
    return True


# --- the entry points --------------------------------------------------------------------------


def wrap_decoder_layers(model, save=("self_attn",), recompute_state_hooks=(), *, recompute=None, layers=None,
                        every_n_layers=1, context_fn=None, contexts=(), verify_recompute=None, plan=None,
                        offload=None, budget=None, host_budget=None, timer=None, retime_steps=None):
    """Runs every decoder layer of a Hugging Face model as one remat checkpoint named after its
    module path ("model.layers.0"), and returns the model:

        model = remat.wrap_decoder_layers(model)                        # attention saved, the rest recomputed
        model = remat.wrap_decoder_layers(model, save=())               # everything recomputed

    save: the layer's children (names such as "self_attn", or dotted paths such as
        "self_attn.o_proj") that are save regions: what autograd saves in them is kept and
        recompute skips them. Each must be a submodule of at least one layer (hybrid models
        have attention in some layers only).
    recompute_state_hooks: further state hooks, as for remat.checkpoint; the CPU and CUDA RNG
        states are kept already (dropout draws forward's masks again in recompute).
    recompute: the children that are recompute regions (named in traces and memory reports);
        by default every direct child not in `save`; () for none. Recomputed they are either way.
    layers: which modules are the decoder layers: a ModuleList, its path ("model.layers") or the
        modules (or paths) themselves. By default the outermost
        transformers.modeling_layers.GradientCheckpointingLayer modules, else the modules of
        every nn.ModuleList named "layers".
    every_n_layers: checkpoint only every n-th layer (0, n, 2n, ...); the others keep their
        activations (transformers' activation_checkpointing_enable(every_n_layers=) does the same).
    context_fn, contexts, verify_recompute: as for remat.checkpoint, for every layer's checkpoint.
    plan: a remat.Plan from a profile of this model (remat.profile_regions()): each region it
        names ("model.layers.0::self_attn") is saved or recomputed as it says, over `save`.
    offload: True, or a remat.CpuOffload: what the layers' checkpoints keep (the save regions'
        tensors and each layer's input) is held in host memory and brought back ahead of
        backward. Pass your own CpuOffload to read its stats().
    budget: the training step's peak allocated bytes (an int, or a string such as "70GiB"): the
        model is then remat.fit(model, budget): its first training step runs profiled, later ones
        under the plan of least recompute predicted within the budget, planned again when the
        inputs change shape. Not with plan=.
    host_budget: with budget=, host memory the plans may offload regions to
        (remat.fit(host_budget=)); for a model on a GPU.
    timer: with budget=, how the profiles time regions (remat.fit(timer=)): "auto" (CUDA events
        on a GPU, the thread's CPU time on the CPU) or "wall" (wall-clock, for regions that wait).
    retime_steps: with budget=, the planned steps timed to re-time each profile (remat.fit(retime_steps=):
        3 by default; 0: none).

    Checkpoints run only in training mode with grad mode on; in eval mode or under no_grad the
    layers run unchanged. Calling it again replaces the previous call's wrapping; see the module
    docstring for how gradient_checkpointing_enable/disable relate.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"wrap_decoder_layers: model must be a torch.nn.Module, got {type(model).__name__}")
    save = _names_arg("save", save) or ()
    recompute = _names_arg("recompute", recompute)
    if isinstance(every_n_layers, bool) or not isinstance(every_n_layers, int) or every_n_layers < 1:
        raise ValueError(f"wrap_decoder_layers: every_n_layers must be a positive int, got {every_n_layers!r}")
    _check_region_names(save, recompute)
    if budget is not None:
        if plan is not None:
            raise TypeError("wrap_decoder_layers: give plan= (a plan made already) or budget= (a plan made from the "
                            "first step's profile), not both")
        budget = _plans.budget_arg(budget, "wrap_decoder_layers: budget")
        timer = timer_arg("wrap_decoder_layers", "auto" if timer is None else timer)
        retime_steps = retime_steps_arg("wrap_decoder_layers", RETIME_STEPS if retime_steps is None else retime_steps)
    elif timer is not None:
        raise TypeError("wrap_decoder_layers: timer= is how the profiles of budget= time regions; give it with "
                        "budget= (or time a profile of your own: remat.profile_regions(timer=))")
    elif retime_steps is not None:
        raise TypeError("wrap_decoder_layers: retime_steps= is how many planned steps re-time the profiles of "
                        "budget=; give it with budget=")
    if host_budget is not None and budget is None:
        raise TypeError("wrap_decoder_layers: host_budget= is the host memory budget='s plans may offload to; give "
                        "it with budget= (or plan with a host budget yourself: profile.plan(peak_bytes=, "
                        "host_budget_bytes=), then plan=)")
    if offload is True:
        offload = CpuOffload()
    if not (offload is None or offload is False or isinstance(offload, CpuOffload)):
        raise TypeError(f"wrap_decoder_layers: offload must be True, False, None or a remat.CpuOffload, got "
                        f"{type(offload).__name__}")
    hooks = (offload.pack, offload.unpack) if offload else None
    # transformers' checkpointing preserves the RNG state; users switching to remat expect the same.
    state_hooks = [cpu_rng_state_hook(), cuda_rng_state_hook(), *checked_state_hooks(recompute_state_hooks)]

    paths = _module_paths(model)
    found = _find_layers(model, layers, paths)
    _refuse_checkpoint_wrapped(model, found)
    _require_present("save", save, found)
    if recompute is not None:
        _require_present("recompute", recompute, found)

    layer_class = _gradient_checkpointing_layer_class()
    # A plan for another layout is refused now, before any layer changes, where the checkpoints it
    # names differ from the layers', and at the first layer whose regions differ, as use_plan does.
    plan = _plans.layout_checked_plan("wrap_decoder_layers", plan, [
        path or type(layer).__name__ for index, (path, layer) in enumerate(found) if index % every_n_layers == 0])
    # Make every checkpoint first, so bad options fail before any layer changes.
    plans = []
    for index, (path, layer) in enumerate(found):
        if index % every_n_layers != 0:
            plans.append((path, layer, None))
            continue
        ckpt = checkpoint(region_name=path or type(layer).__name__, recompute_state_hooks=state_hooks,
                          context_fn=context_fn, contexts=contexts, verify_recompute=verify_recompute, plan=plan,
                          saved_tensors_hooks=hooks)
        plans.append((path, layer, _LayerPlan(layer, path, ckpt, _layer_regions(layer, save, recompute))))

    # Only now: a call with bad arguments leaves the previous wrapping in force. Its fit goes too: a
    # profile of the previous wrapping's regions is of no use to this one
    unwrap_decoder_layers(model)
    for path, layer, plan in plans:
        if plan is None:
            if layer_class is not None and isinstance(layer, layer_class):
                restore = _LayerPlan(layer, path, None, {})
                restore.set_attribute(layer, "gradient_checkpointing", False)
                layer._remat_layer_plan = restore
            continue
        for child in plan.regions:
            if _is_region_forward(child.__dict__.get("forward"), child):
                continue  # shared with a layer wrapped before: its wrapper serves every plan
            plan.set_attribute(child, "_remat_inner_forward", child.forward)
            plan.set_attribute(child, "_remat_region_saved", plan.regions[child][1])
            plan.set_attribute(child, "forward", _region_forward_for(child, child.__dict__["_remat_inner_forward"]))
        if layer_class is not None and isinstance(layer, layer_class):
            plan.set_attribute(layer, "_gradient_checkpointing_func", plan.checkpoint_function)
            plan.set_attribute(layer, "gradient_checkpointing", True)
        else:
            plan.set_attribute(layer, "forward", _PlainLayerForward(plan, layer.forward))
        layer._remat_layer_plan = plan
    _set_parents_checkpointing(model, found, layer_class)
    _keep_remat_when_enabled(model)
    return model if budget is None else fit(model, budget, host_budget=host_budget, timer=timer,
                                            retime_steps=retime_steps)


def _run_as_is(function, *args, **kwargs):
    """A module's _gradient_checkpointing_func that runs `function` as it is: the layers checkpoint."""
    return function(*args, **kwargs)


def _set_parents_checkpointing(model, found, layer_class):
    """Sets `gradient_checkpointing` on the modules that carry it and are neither a decoder layer
    nor inside one (the model, its stack), as transformers' gradient_checkpointing_enable does:
    such a module reads it to hand its layers no cache in training (GPT-2 passes the cache
    positionally, so the layers' own clearing of keyword caches misses it, and recompute updated
    the cache a second time). Their _gradient_checkpointing_func runs what it is given as it is
    (the layers checkpoint). Inside a layer it is left alone: T5's attention then makes its zero
    position bias a leaf that requires grad (for reentrant checkpoints), which a region may not
    return."""
    inside = {id(module) for _, layer in found for module in layer.modules()}
    for module in model.modules():
        if id(module) in inside or not hasattr(module, "gradient_checkpointing") or \
                (layer_class is not None and isinstance(module, layer_class)):
            continue
        restore = _LayerPlan(module, None, None, {})
        restore.set_attribute(module, "gradient_checkpointing", True)
        restore.set_attribute(module, "_gradient_checkpointing_func", _run_as_is)
        module._remat_layer_plan = restore


class _KeepsRemat:
    """The `_set_gradient_checkpointing` of a transformers model whose layers remat checkpoints:
    turning checkpointing on (gradient_checkpointing_enable, activation_checkpointing_enable,
    Trainer's gradient_checkpointing=True) keeps remat's checkpoints in place (turned on again
    where they were turned off), said once; turning it off runs as transformers' own does."""

    def __init__(self, model, method):
        self.model = weakref.ref(model)  # the model holds this as an attribute: no cycle back
        self.method = method
        self.said = False

    def __deepcopy__(self, memo):
        """A copied model's (copy.deepcopy: its module is copied first, so it is in memo)."""
        return _KeepsRemat(memo.get(id(self.model()), self.model()), self.method)

    def __call__(self, *args, **kwargs):
        enable = kwargs.get("enable", args[0] if args else True)
        if not enable:
            return self.method(self.model(), *args, **kwargs)
        for module in self.model().modules():
            plan = module.__dict__.get("_remat_layer_plan")
            if plan is not None:
                plan.reapply()
        if not self.said:
            self.said = True
            warn_at_user_line(
                f"remat.wrap_decoder_layers: checkpointing was turned on for {type(self.model()).__name__} "
                "(gradient_checkpointing_enable, activation_checkpointing_enable, or Trainer's "
                "gradient_checkpointing=True) while remat checkpoints its layers: remat's checkpoints stay, and "
                "the options given there (the checkpoint's keyword arguments, every_n_layers, offload) are not "
                "applied. To checkpoint with torch.utils.checkpoint instead, call "
                "remat.unwrap_decoder_layers(model) first; to stop this warning, leave gradient_checkpointing off "
                "(remat checkpoints the layers already)")
        return None


def _keep_remat_when_enabled(model):
    """Sets _KeepsRemat as the `_set_gradient_checkpointing` of every module of `model` whose class
    has one (the transformers models in it: a PEFT model's base model, its stack)."""
    for module in model.modules():
        method = getattr(type(module), "_set_gradient_checkpointing", None)
        if not callable(method):
            continue
        plan = module.__dict__.get("_remat_layer_plan")
        if plan is None:
            plan = module._remat_layer_plan = _LayerPlan(module, None, None, {})
        plan.set_attribute(module, "_set_gradient_checkpointing", _KeepsRemat(module, method))


def unwrap_decoder_layers(model):
    """Undoes wrap_decoder_layers on `model` (a no-op where it did nothing) and returns the
    model: the layers' checkpoint settings and the children's forwards are what they were,
    except where something set them again since (gradient_checkpointing_enable, say). A
    remat.fit of the model (budget=, or fit after wrapping) is undone too: its plans were of the
    layers' regions, and without them every later step ran unplanned over its budget."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"unwrap_decoder_layers: model must be a torch.nn.Module, got {type(model).__name__}")
    unfit(model)
    for module in list(model.modules()):
        plan = module.__dict__.get("_remat_layer_plan")
        if plan is None:
            continue
        plan.undo()
        del module._remat_layer_plan
    return model
