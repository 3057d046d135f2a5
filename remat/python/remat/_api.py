"""The checkpoint call and regions.

`remat.checkpoint(**options)` makes a checkpoint and `checkpoint(fn)` the checkpointed function,
so a call reads `remat.checkpoint(region_name="layers.0")(block)(x)`, as torch_remat writes it;
`checkpoint(fn, x)`, torch.utils.checkpoint's form, is refused because it would read as that
function with other semantics. Options are checked once, when the checkpoint is made; each call
then goes straight to the C++ runtime (remat._C), which runs the body under saved-tensor hooks
that keep what save regions save and drop the rest, and recomputes the dropped tensors when
backward first needs them. Every tensor in the call's arguments, positional or keyword and
inside tuples, lists and dicts, is an input of the checkpoint; everything else is passed as it
is. `.call(fn, *args, **kwargs)` is the function-first form that integrations expect
(torch.distributed's checkpoint_wrapper(checkpoint_fn=...), Hugging Face's
_gradient_checkpointing_func).
"""

import functools
import threading
import types


import torch

from ._extension import _C
from . import _plans
from ._arguments import ArgumentTypeError, flag_arg, name_arg
from ._compile import compiled_checkpoint, compiled_region
from ._saved_tensors_hooks import enclosing_hooks, hooks_pair_arg
from ._state import checked_state_hooks, with_rng_state_hooks

RematError = _C.RematError

__all__ = ["checkpoint", "region", "verify_recompute", "recompute_needs_tensor", "is_recomputing", "is_placeholder",
           "name_scope"]


_defaults = threading.local()  # .verify_recompute: [(scope, enabled)] entered on this thread, innermost last
_verify_scopes_entered = 0  # on any thread: while 0, no thread-local lookup per checkpoint call


def _verify_recompute_default():
    if _verify_scopes_entered == 0:
        return False
    entered = getattr(_defaults, "verify_recompute", None)
    return entered[-1][1] if entered else False


class _VerifyRecompute:
    def __init__(self, enabled):
        self._enabled = enabled
        self._entered_into = []  # the thread lists this scope was entered into, latest last

    def __enter__(self):
        global _verify_scopes_entered
        _verify_scopes_entered += 1
        if not hasattr(_defaults, "verify_recompute"):
            _defaults.verify_recompute = []
        _defaults.verify_recompute.append((self, self._enabled))
        self._entered_into.append(_defaults.verify_recompute)
        return self

    def __exit__(self, *exc_info):
        global _verify_scopes_entered
        if not self._entered_into:
            raise RuntimeError("verify_recompute: exited without being entered (or exited once more than entered)")
        _verify_scopes_entered -= 1
        # This thread's list if it was entered here, else where it was entered last (another thread's).
        here = getattr(_defaults, "verify_recompute", None)
        mine = [i for i, entered in enumerate(self._entered_into) if entered is here]
        entered = self._entered_into.pop(mine[-1] if mine else -1)
        # Its own entry, wherever it is: scopes exited out of order leave the others' settings in force.
        index = max(i for i, (scope, _) in enumerate(entered) if scope is self)
        del entered[index]


def verify_recompute(enabled=True):
    """Checkpoints started inside on this thread compare every tensor recompute recreates with
    forward's and raise an error naming the region and the difference on a mismatch (as
    checkpoint(..., verify_recompute=True)). verify_recompute(False) turns it off inside."""
    return _VerifyRecompute(flag_arg("verify_recompute", "enabled", enabled))


_name_scopes = threading.local()  # .prefixes: the name_scope prefixes entered on this thread, outermost first
_name_scopes_entered = 0  # on any thread: while 0, regions skip the thread-local lookup


def _qualified_name(name):
    prefixes = getattr(_name_scopes, "prefixes", None)
    return "/".join((*prefixes, name)) if prefixes else name


class name_scope:
    """Regions called inside are named prefix/name (scopes nest: outer/inner/name), so one
    sub-block called several times in a checkpoint gets a distinct name each time:

        for index, block in enumerate(blocks):
            with remat.name_scope(f"block.{index}"):
                x = block(x)

    Around a checkpoint call it names the checkpoint's regions too (recompute enters the same
    prefixes). Under torch.compile it changes nothing (compiled regions carry no names)."""

    def __init__(self, prefix):
        if torch.compiler.is_compiling():
            self._prefix = None
            return
        name_arg("name_scope", "prefix", prefix)
        if not prefix:
            raise ValueError("name_scope: the prefix is empty; give it text, e.g. name_scope(\"block.0\")")
        self._prefix = prefix

    def __enter__(self):
        global _name_scopes_entered
        if self._prefix is None:
            return self
        if not hasattr(_name_scopes, "prefixes"):
            _name_scopes.prefixes = []
        _name_scopes.prefixes.append(self._prefix)
        _name_scopes_entered += 1
        return self

    def __exit__(self, *exc_info):
        global _name_scopes_entered
        if self._prefix is not None:
            _name_scopes_entered -= 1
            _name_scopes.prefixes.pop()
        return False


class _NameScopesOfTheCall:
    """The name_scope prefixes in force where a checkpoint was called, in force again around its
    recompute, which backward runs outside them: regions are named there as forward named them."""

    __slots__ = ("_prefixes", "_outer")

    def __init__(self, prefixes):
        self._prefixes = prefixes
        self._outer = None

    def enter_recompute(self):
        global _name_scopes_entered
        self._outer = getattr(_name_scopes, "prefixes", None)
        _name_scopes.prefixes = list(self._prefixes)
        _name_scopes_entered += 1

    def exit_recompute(self):
        global _name_scopes_entered
        _name_scopes_entered -= 1
        _name_scopes.prefixes = self._outer if self._outer is not None else []


class _TorchCheckpointContexts:
    """torch.utils.checkpoint's context_fn contract, (forward context, recompute context) per
    call, as the runtime's per-call context: the first around forward, the second around every
    recompute."""

    __slots__ = ("_forward", "_recompute")

    def __init__(self, context_fn):
        contexts = context_fn()
        if not (isinstance(contexts, tuple) and len(contexts) == 2):
            raise TypeError(f"checkpoint: context_fn must return a (forward context, recompute context) pair, as for "
                            f"torch.utils.checkpoint; it returned {type(contexts).__name__}")
        self._forward, self._recompute = contexts

    def enter_forward(self):
        self._forward.__enter__()

    def exit_forward(self):
        self._forward.__exit__(None, None, None)

    def enter_recompute(self):
        self._recompute.__enter__()

    def exit_recompute(self):
        self._recompute.__exit__(None, None, None)


class _UnsupportedOption(RematError, NotImplementedError):
    """An option remat refuses: a RematError, and the NotImplementedError torch_remat raises."""


_REFUSED_OPTIONS = {
    "debug": "debug is torch.utils.checkpoint's recompute log; remat reports mismatches itself, naming the region "
             "(and compares values with verify_recompute=True)",
}


class Checkpoint:
    """A checkpoint made by remat.checkpoint(**options): call it on a function."""

    __slots__ = ("region_name", "_hooks", "_hooks_under_plan", "_hooks_keeping_rng", "_channels", "_context_fn", "_contexts", "_verify",
                 "_saved_tensors_hooks", "_plan")

    def __init__(self, region_name, hooks, channels, context_fn, verify, saved_tensors_hooks=None, plan=None):
        self.region_name = region_name
        self._plan = plan  # the budget plan in force for this checkpoint (_plans.plan_arg), or None
        self._hooks = hooks
        self._hooks_under_plan = None  # made at the first call under a plan (_state_hooks)
        self._hooks_keeping_rng = None  # made at the first .call() that preserves the RNG state
        self._saved_tensors_hooks = saved_tensors_hooks  # the runtime's pair, or None
        self._channels = channels  # the `contexts` option
        self._context_fn = context_fn
        # What the runtime enters around forward and recompute.
        self._contexts = channels + ([functools.partial(_TorchCheckpointContexts, context_fn)] if context_fn else [])
        self._verify = verify

    def __repr__(self):
        return f"remat.checkpoint(region_name={self.region_name!r})"

    def __call__(self, fn):
        """`fn` checkpointed: calling the result runs fn(*args, **kwargs) keeping only what
        backward needs."""
        if not callable(fn):
            raise TypeError(f"{self!r}: fn must be callable, got {type(fn).__name__}")
        return _Checkpointed(self, fn)

    def call(self, fn, *args, **kwargs):
        """Runs fn(*args, **kwargs) checkpointed: the function-first form integrations call in
        place of torch.utils.checkpoint.checkpoint(fn, *args, **kwargs). As there, its options
        among the keywords (use_reentrant, preserve_rng_state, determinism_check, debug,
        early_stop, context_fn) are the checkpoint's, checked as remat.checkpoint() checks them,
        not fn's. preserve_rng_state is True unless given, as there: recompute draws forward's
        random numbers (the CPU generator's and the CUDA generators', as cpu_rng_state_hook() and
        cuda_rng_state_hook() keep them), so dropout in fn gives the gradients it gives without
        checkpointing; preserve_rng_state=False leaves the state to the checkpoint's own hooks."""
        options = {option: kwargs.pop(option) for option in _TORCH_CALL_OPTIONS if option in kwargs}
        context_fn = options.pop("context_fn", None)
        if context_fn is torch.utils.checkpoint.noop_context_fn:
            context_fn = None
        if options.pop("debug", False) is not False:
            raise RematError(f"checkpoint '{self.region_name}': {_REFUSED_OPTIONS['debug']}")
        keep_rng = options.pop("preserve_rng_state", True)
        if not isinstance(keep_rng, bool):  # the name formatted only then: under torch.compile Dynamo
            #                                 guards a string it formats, another graph for every layer
            keep_rng = flag_arg(f"checkpoint '{self.region_name}'", "preserve_rng_state", keep_rng)
        if options:
            _check_torch_options(self.region_name, **options)
        if context_fn is None:
            return self._run(fn, args, kwargs, keep_rng=keep_rng)
        _check_context_fn(self.region_name, context_fn)
        if self._context_fn is not None:
            raise RematError(f"checkpoint '{self.region_name}': context_fn given to both remat.checkpoint() and .call(); "
                             "pass it once")
        if torch.compiler.is_compiling():  # torch.utils.checkpoint's own, as remat.checkpoint(context_fn=) passes it
            return compiled_checkpoint(self, fn, args, kwargs, _verify_recompute_default(), context_fn)
        return self._run(fn, args, kwargs, [functools.partial(_TorchCheckpointContexts, context_fn)], keep_rng)

    def _run(self, fn, args, kwargs, call_contexts=(), keep_rng=False):
        if torch.compiler.is_compiling():
            return compiled_checkpoint(self, fn, args, kwargs, _verify_recompute_default())
        verify = _verify_recompute_default() if self._verify is None else self._verify
        saved_tensors_hooks = self._saved_tensors_hooks or enclosing_hooks()
        contexts = [*self._contexts, *call_contexts] if call_contexts else self._contexts
        prefixes = getattr(_name_scopes, "prefixes", None) if _name_scopes_entered else None
        if prefixes:  # called inside name_scope: recompute names regions as forward did
            contexts = [*contexts, functools.partial(_NameScopesOfTheCall, tuple(prefixes))]
        return _plans.run_checkpoint(
            self.region_name, self._plan, fn, args, kwargs,
            lambda body, choices, caller=None: _C.checkpoint(body, args, kwargs, self.region_name,
                                                             self._state_hooks(choices, keep_rng), contexts,
                                                             verify, saved_tensors_hooks, choices, caller))

    def _state_hooks(self, choices, keep_rng=False):
        """The state hooks of a call: its own, or under a plan (`choices`) with the RNG state
        hooks too, since a plan may recompute a region the code saves, random draws and all (the
        runtime adds the CPU generator's there), or with both RNG state hooks where the call keeps
        the RNG state (keep_rng: .call()'s preserve_rng_state). (The CPU state is kept as plain
        values, no tensor: what the step counts is the same.)"""
        if choices is not None:
            if self._hooks_under_plan is None:
                self._hooks_under_plan = with_rng_state_hooks(self._hooks)
            return self._hooks_under_plan
        if keep_rng:
            if self._hooks_keeping_rng is None:
                self._hooks_keeping_rng = with_rng_state_hooks(self._hooks, cpu=True)
            return self._hooks_keeping_rng
        return self._hooks


class _DocOfWrapped:
    """A wrapper's __doc__: its function's on an instance, the class's own on the class."""

    def __init__(self, class_doc):
        self._class_doc = class_doc

    def __get__(self, instance, owner=None):
        return self._class_doc if instance is None else getattr(instance.__wrapped__, "__doc__", None)


class _FunctionWrapper:
    """What functools.update_wrapper gives a wrapper, read from the function (__wrapped__) when
    asked instead of copied when the wrapper is made: torch_remat's call style makes wrappers
    per call (remat.region(fn, "attn")(x)), where copying cost more than the runtime's work."""

    __doc__ = _DocOfWrapped(__doc__)

    def __init__(self, fn):
        self.__wrapped__ = fn
        self.__module__ = getattr(fn, "__module__", None)  # found on the class otherwise

    def __getattr__(self, name):  # called only for what the wrapper does not have itself
        fn = self.__dict__.get("__wrapped__")
        if fn is not None and (name in ("__name__", "__qualname__", "__annotations__", "__type_params__")
                               or not name.startswith("__")):
            return getattr(fn, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class _Checkpointed(_FunctionWrapper):
    """fn under a checkpoint (what checkpoint(**options)(fn) returns), with fn's name and
    docstring; __wrapped__ is fn. On a class, it binds as a method does."""

    __doc__ = _DocOfWrapped(__doc__)

    def __init__(self, ckpt, fn):
        super().__init__(fn)
        self._checkpoint = ckpt

    def __get__(self, instance, owner=None):
        return self if instance is None else types.MethodType(self, instance)

    def __repr__(self):
        return f"{self._checkpoint!r}({getattr(self.__wrapped__, '__qualname__', type(self.__wrapped__).__name__)})"

    def __call__(self, *args, **kwargs):
        return self._checkpoint._run(self.__wrapped__, args, kwargs)


def checkpoint(*positional, region_name="checkpoint", recompute_state_hooks=(), context_fn=None, contexts=(),
               verify_recompute=None, saved_tensors_hooks=None, plan=None, preserve_rng_state=False, use_reentrant=None,
               determinism_check="default", early_stop=True, **unknown):
    """A checkpoint: remat.checkpoint(**options)(fn)(*args, **kwargs) runs fn keeping only what
    backward needs from save regions and recomputing the rest in backward.

    region_name: the checkpoint's name in traces, reports and tags ("layers.0"); None, as
        torch_remat's default, is "checkpoint".
    recompute_state_hooks: objects with snapshot() and restore(state) (for dropout:
        cpu_rng_state_hook(), and cuda_rng_state_hook() where it runs on CUDA), restored for
        recompute.
    context_fn: as torch.utils.checkpoint's, a callable returning a (forward context, recompute
        context) pair per call (RecomputeReplay.checkpoint_context_fn(), or
        torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)).
    contexts: RecomputeReplay channels, or callables returning an object with any of
        enter_forward/exit_forward/enter_recompute/exit_recompute.
    verify_recompute: compare the values recompute recreates with forward's (shapes, dtypes and
        devices are always compared).
    saved_tensors_hooks: a (pack_hook, unpack_hook) pair holding what the checkpoint keeps: the
        inputs recompute needs and what save regions keep (see remat.saved_tensors_hooks).
    plan: a remat.Plan (profile.plan(...), remat.load_plan(path)): each region it names takes its
        save or recompute choice from it; the others keep their own (see remat.use_plan).
    preserve_rng_state: False, or left out; True is refused (RNG state belongs in a state hook:
        remat.cpu_rng_state_hook(), remat.cuda_rng_state_hook()).
    use_reentrant=False, determinism_check="default" and early_stop=True are torch.utils.checkpoint's
    keywords with the meaning they have here (remat is non-reentrant, checks what recompute
    recreates, and stops recompute early); their other values are refused, but for
    determinism_check="none", torch_remat's default, which checks the same.
    """
    if region_name is None:  # torch_remat's default
        region_name = "checkpoint"
    if torch.compiler.is_compiling() and not positional and not unknown:
        # Traced by Dynamo: the options were checked where this code ran eagerly, or are checked
        # by compiled_checkpoint; the checks themselves use what Dynamo cannot trace.
        if saved_tensors_hooks is not None:
            raise _UnsupportedOption(f"checkpoint '{region_name}': saved_tensors_hooks are not supported under "
                                     "torch.compile (the compiled graph saves what the partitioner chooses); make "
                                     "the checkpoint outside the compiled function, or drop the pair")
        return Checkpoint(region_name, list(recompute_state_hooks), list(contexts), context_fn, verify_recompute)
    if positional:
        what = "remat.checkpoint(fn)" if len(positional) == 1 else "remat.checkpoint(fn, *args)"
        raise TypeError(f"{what} is not supported: it reads as torch.utils.checkpoint.checkpoint(fn, *args), whose "
                        "semantics differ. Make the checkpoint with its options, then call it on the function: "
                        "remat.checkpoint(region_name=\"layers.0\")(fn)(*args, **kwargs)")
    for option in unknown:
        if option in _REFUSED_OPTIONS:
            raise RematError(f"checkpoint '{region_name}': {_REFUSED_OPTIONS[option]}")
        raise TypeError(f"checkpoint() got an unexpected keyword argument {option!r}; its options are region_name, "
                        "recompute_state_hooks, context_fn, contexts, verify_recompute, saved_tensors_hooks, plan (and "
                        "torch.utils.checkpoint's "
                        "use_reentrant=False, determinism_check, early_stop); arguments for the function go to the "
                        "call: remat.checkpoint(region_name=...)(fn)(*args, **kwargs)")
    name_arg("checkpoint", "region_name", region_name)
    _check_torch_options(region_name, preserve_rng_state, use_reentrant, determinism_check, early_stop)
    if verify_recompute is not None:
        flag_arg(f"checkpoint '{region_name}'", "verify_recompute", verify_recompute)
    if isinstance(contexts, (str, bytes)) or not hasattr(contexts, "__iter__"):
        raise TypeError(f"checkpoint '{region_name}': contexts must be a sequence, got {type(contexts).__name__}")
    if context_fn is not None:
        _check_context_fn(region_name, context_fn)
    return Checkpoint(region_name, checked_state_hooks(recompute_state_hooks), list(contexts), context_fn,
                      verify_recompute, hooks_pair_arg(f"checkpoint '{region_name}'", saved_tensors_hooks),
                      _plans.plan_arg(f"checkpoint '{region_name}'", plan))


# torch.utils.checkpoint.checkpoint's own keywords: Checkpoint.call takes them as it does.
_TORCH_CALL_OPTIONS = ("use_reentrant", "preserve_rng_state", "determinism_check", "debug", "early_stop", "context_fn")


def _check_context_fn(region_name, context_fn):
    if not callable(context_fn):
        raise TypeError(f"checkpoint '{region_name}': context_fn must be callable (returning a (forward context, "
                        f"recompute context) pair), got {type(context_fn).__name__}")


def _check_torch_options(region_name, preserve_rng_state=False, use_reentrant=None, determinism_check="default",
                         early_stop=True):
    """Refuses torch.utils.checkpoint's options where they ask for what remat does not do."""
    if preserve_rng_state is not False:
        raise _UnsupportedOption(f"checkpoint '{region_name}': preserve_rng_state={preserve_rng_state!r} is not "
                                 "supported: remat does not preserve torch's RNG state; pass recompute_state_hooks="
                                 "[remat.cpu_rng_state_hook(), remat.cuda_rng_state_hook()] (the CUDA one where "
                                 "random numbers are drawn on CUDA), or your own hook: any object with snapshot() and "
                                 "restore(state)")
    if use_reentrant is not None and use_reentrant is not False:
        raise RematError(f"checkpoint '{region_name}': use_reentrant={use_reentrant!r} is not supported; remat's "
                         "checkpoint is non-reentrant (it recomputes through saved-tensor hooks, which is what lets "
                         "save regions keep their tensors): pass use_reentrant=False or leave it out")
    if determinism_check not in ("default", "none"):
        raise RematError(f"checkpoint '{region_name}': determinism_check={determinism_check!r} is not supported; remat "
                         "always checks the shape, dtype and device of what recompute recreates (determinism_check="
                         "\"default\"; \"none\", torch_remat's default, is accepted and checks the same), and compares "
                         "values too with verify_recompute=True")
    if early_stop is not True:
        raise RematError(f"checkpoint '{region_name}': early_stop={early_stop!r} is not supported; recompute always "
                         "stops once every tensor backward needs exists")


def region(function=None, name=None, recompute=True):
    """A region inside a checkpoint: region(fn, "mlp")(x) (or torch_remat's keyword form,
    region(function=fn, name="mlp", recompute=True)), or as a decorator,
    @region(name="attention", recompute=False). recompute=False makes a save region: what
    autograd saves in it is kept, and recompute skips its body. Outside a checkpoint the body
    simply runs. Tensors in its arguments (positional or keyword) are its inputs; its result may
    hold None and other values beside tensors."""
    if torch.compiler.is_compiling() and name is not None:
        # Made inside a compiled function: Dynamo cannot trace the checks below on every callable
        # (isinstance on an autograd Function's apply); names are not used under compile.
        def compiled(body):
            return lambda *args, **kwargs: compiled_region(body, recompute, args, kwargs)

        return compiled if function is None else compiled(function)
    if isinstance(function, str) and name is None:  # @region("attention")
        function, name = None, function
    if name is None or name == "":
        raise ValueError("region: name each region, e.g. region(fn, \"attention\")")
    name_arg("region", "name", name)
    flag_arg(f"region '{name}'", "recompute", recompute)

    def wrap(body):
        if not callable(body):
            raise ArgumentTypeError(f"region '{name}': fn must be callable, got {type(body).__name__} (region expects a "
                                "function as its first argument)")
        return _Region(body, name, recompute)

    return wrap if function is None else wrap(function)


class _Region(_FunctionWrapper):
    """fn as a region (what region(fn, name) returns), with fn's name and docstring."""

    __doc__ = _DocOfWrapped(__doc__)

    def __init__(self, fn, name, recompute):
        super().__init__(fn)
        self._name = name
        self._recompute = recompute

    def __call__(self, *args, **kwargs):
        body, name, recompute = self.__wrapped__, self._name, self._recompute
        if torch.compiler.is_compiling():
            return compiled_region(body, recompute, args, kwargs)
        qualified = name if _name_scopes_entered == 0 else _qualified_name(name)
        return _plans.run_region(qualified, recompute,
                                 lambda setting, wrap=None: _C.region(body if wrap is None else wrap(body), args, kwargs,
                                                                      qualified, setting), (args, kwargs))


def recompute_needs_tensor(*tensors):
    """Keeps the save-region outputs behind these tensors (the outputs, or views of them) for
    recompute, which then reads their values instead of placeholders. A no-op outside a
    checkpoint's forward, for tensors no save region returned, and under torch.compile (the
    compiled graph keeps what it needs)."""
    if torch.compiler.is_compiling():
        return
    _C.recompute_needs_tensor(*tensors)


def is_recomputing():
    """Whether a checkpoint's recompute runs on this thread. False under torch.compile, where the
    compiled graph never runs the body's Python again (Dynamo cannot trace the runtime's call: a
    body asking broke the graph, and fullgraph=True raised)."""
    if torch.compiler.is_compiling():
        return False
    return _C.is_recomputing()


def is_placeholder(tensor):
    """Whether `tensor` is (a view of) a placeholder: what recompute hands back for a skipped save
    region's output that forward did not keep (real shape and dtype, no data)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"is_placeholder: expected a Tensor, got {type(tensor).__name__}")
    return _C.is_placeholder(tensor)
