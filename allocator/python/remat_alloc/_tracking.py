"""Categories without annotations: track(model, optimizer) names every byte of a training step.

A category (parameter, gradient, optimizer_state, activation, temporary, input, other) and a
module path are a tag dimension of the allocator. Tracking sets them from PyTorch's own hooks,
never by copying memory. Parameters and buffers exist before the call: their storages are
re-tagged in place, by the address the allocator handed out, under their module path (the
first name of a tied or shared one). A module's forward pre-hook sets this thread's category to
"temporary of that module" and its forward hook (always called, even on an exception) sets back
what was in force, so everything a forward allocates belongs to the innermost module running.
What autograd keeps for backward passes a saved-tensor pack hook (pushed around the model's
forward, unless a remat checkpoint already decides what is kept there): its storage becomes an
activation of the module that produced it. Each module output's autograd node gets a pre-hook
that sets "temporary of that module" when backward reaches it, and backward's end puts back what was
in force before.
A parameter's post-accumulate-grad hook re-tags its .grad as a gradient of that parameter.
An optimizer's state dict is replaced by one that re-tags each tensor as it is stored (so the
state is optimizer_state from the moment the optimizer creates it); the step's own scratch is
a temporary of the optimizer. The state load_state_dict() loads is followed the same way, and
state_dict() hands out plain dicts. The model's tensor arguments are re-tagged as inputs.

Where remat is imported, what runs at every module call, saved tensor and gradient is remat._C's
C++ (registered here through register_native), not Python: the same steps, with what autograd
saves named by the autograd engine remat installs. A module then has no hooks at all: its
`_compiled_call_impl` (which Module.__call__ calls in place of `_call_impl` when set) is a
TrackCall that enters, calls the module's `_call_impl` and leaves, so PyTorch calls the module by
its path for modules without hooks, which costs less than its hook dispatch. A module whose
`_compiled_call_impl` is set already (module.compile()) gets the C++ hooks instead, and a later
module.compile() replaces the TrackCall (that module is then not tracked until track is called
again). Each gradient is tagged by a C++ post-accumulate-grad hook that wraps the parameter's
Python hook dictionary (made first, so hooks registered later still join it). Without remat, the
Python hooks above do it all.

untrack() removes every hook, puts the optimizer's plain state dict back and restores the tag
each re-tagged storage had before, where the tensor is still alive and still owns that storage.
Tracking the same model again is idempotent and picks up modules, parameters and optimizers
added since; modules added after the last track() are not tracked until then (their forward
counts as a temporary of the tracked module that calls them, their parameters stay untagged).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import threading
import weakref
from typing import Any, Iterable

_NONE, _PARAMETER, _GRADIENT, _OPTIMIZER_STATE, _ACTIVATION, _TEMPORARY, _INPUT, _OTHER = range(8)

# Predicates that say a remat checkpoint decides what autograd keeps on this thread now; remat
# registers its own on import. remat_alloc never imports remat (the dependency runs upward).
_checkpoint_probes: list = []

# remat._C where remat is imported: TrackEnter, TrackLeave, GradientTag and RetagLog.
_native = None

_trackers: "weakref.WeakKeyDictionary[Any, Tracker]" = weakref.WeakKeyDictionary()
_trackers_lock = threading.Lock()


def register_checkpoint_probe(probe) -> None:
    """`probe()` is true while a checkpoint on this thread decides what autograd keeps; tracking
    then leaves saved-tensor hooks to it (what the checkpoint keeps reaches track's hook through
    the checkpoint's own inheritance of the pair around it)."""
    if probe not in _checkpoint_probes:
        _checkpoint_probes.append(probe)


def register_native(native) -> None:
    """Trackers made from now on use `native`'s C++ hooks (remat._C; remat registers it on import)."""
    global _native
    _native = native


_loaded = None
_categorize_as_activation = None


def _lib():
    global _loaded, _categorize_as_activation
    if _loaded is None:
        from . import load

        _loaded = load()
        _categorize_as_activation = _loaded.remat_categorize_as_activation
    return _loaded


def _check(status: int) -> None:
    if status != 0:
        from . import RematError

        raise RematError(_lib().remat_last_error().decode(errors="replace"))


def _storage_ptr(tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, ValueError):  # meta, sparse, a lazy module's uninitialized parameter
        return 0


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.saved: list = []  # (category, module bytes) in force before each module entered
        self.hooks: list = []  # saved-tensor hook contexts entered by tracked roots
        self.nodes: set = set()  # ids of autograd nodes given a backward pre-hook in this forward
        # The category and module in force on this thread, as set through _set_category (and
        # remat_alloc.set_category): read without a call into the library.
        self.current: tuple = (0, b"")
        self.restoring: list = []  # backwards (graph task ids) whose end puts back what was in force


_thread = _ThreadState()


def _set_category(category: int, path: bytes) -> None:
    _thread.current = (category, path)
    _lib().remat_set_category(category, path)


class _OptimizerState(collections.defaultdict):
    """An optimizer's `state` that re-tags each tensor as the optimizer stores it."""

    def __init__(self, tracker: "Tracker", optimizer, existing) -> None:
        super().__init__()
        self._tracker = weakref.ref(tracker)
        self._optimizer_name = type(optimizer).__name__
        for param, value in existing.items():
            self[param] = value

    def __missing__(self, param):
        value = _ParamState(self, param)
        dict.__setitem__(self, param, value)
        return value

    def __setitem__(self, param, value) -> None:
        if isinstance(value, dict) and not isinstance(value, _ParamState):
            state = _ParamState(self, param)
            for key, item in value.items():
                state[key] = item
            value = state
        dict.__setitem__(self, param, value)

    def name_of(self, param) -> str:
        tracker = self._tracker()
        name = tracker._param_names.get(id(param)) if tracker is not None else None
        return name if name is not None else f"{self._optimizer_name}.param{id(param):x}"

    def plain(self) -> collections.defaultdict:
        out = collections.defaultdict(dict)
        for param, value in self.items():
            out[param] = dict(value) if isinstance(value, _ParamState) else value
        return out

    def __reduce__(self):  # deepcopy and pickle see PyTorch's own kind of state
        return (collections.defaultdict, (dict,), None, None, iter(self.plain().items()))


class _ParamState(dict):
    """One parameter's optimizer state; tensors stored in it become its optimizer_state."""

    def __init__(self, owner: _OptimizerState, param) -> None:
        super().__init__()
        self._owner = weakref.ref(owner)  # the state holds this dict: no cycle to wait for the collector
        self._param = weakref.ref(param) if _weakrefable(param) else (lambda: param)

    def __setitem__(self, key, value) -> None:
        dict.__setitem__(self, key, value)
        owner = self._owner()
        tracker = owner._tracker() if owner is not None else None
        param = self._param()
        if tracker is not None and param is not None:
            # A tensor, or lists of them (LBFGS's history, stored again at the end of each step)
            for tensor in _tensors_in(value, []):
                tracker._retag_owned(tensor, _OPTIMIZER_STATE, owner.name_of(param))

    def __reduce__(self):
        return (dict, (), None, None, iter(dict(self).items()))


def _plain_state_dict(optimizer, state_dict) -> None:
    """An optimizer's state_dict post-hook: each parameter's state as a plain dict."""
    state = state_dict.get("state")
    if isinstance(state, dict):
        for key, value in state.items():
            if isinstance(value, _ParamState):
                state[key] = dict(value)


def _weakrefable(obj) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


def _is_tensor(value) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _tensors_in(value, out: list, depth: int = 0) -> list:
    """The tensors in a module's arguments or outputs: a tensor, or tuples, lists and dicts of
    them (Hugging Face's ModelOutput is a dict), a few levels deep."""
    if _is_tensor(value):
        out.append(value)
    elif depth < 3 and isinstance(value, (tuple, list)):
        for item in value:
            _tensors_in(item, out, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            _tensors_in(item, out, depth + 1)
    return out


class _CallHandle:
    """Takes a TrackCall off its module again (where it is still the module's)."""

    def __init__(self, module, call) -> None:
        self._module = weakref.ref(module)
        self._call = call

    def remove(self) -> None:
        module = self._module()
        if module is not None and module.__dict__.get("_compiled_call_impl") is self._call:
            del module.__dict__["_compiled_call_impl"]
        self._call = None


class Tracker:
    """The tracking of one model: its hooks, the optimizers it follows and the tags it replaced.
    Made by track(); untrack() (or leaving it as a context manager) ends it."""

    def __init__(self, model) -> None:
        self._model = weakref.ref(model)
        self._root_name = type(model).__name__
        self._handles: list = []
        self._modules: set[int] = set()  # ids of modules tracked (by hooks or a TrackCall)
        self._calls: dict[int, Any] = {}  # module id -> the TrackCall set as its _compiled_call_impl
        self._params_hooked: set[int] = set()
        self._param_names: dict[int, str] = {}
        self._optimizers: list = []  # (weakref to optimizer, its original state object)
        # storage address -> (weakref to the tensor that owns it, tag before tracking,
        # (category, module) tracking gave it)
        self._restore: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._active = True
        self._native = _native
        self._log = _native.RetagLog() if _native is not None else None  # what the C++ hooks re-tag
        # What autograd saves outside the model's forward is named too while it is held (remat._C)
        self._active_tracking = _native.ActiveTracking() if _native is not None else None

    # -- re-tagging ------------------------------------------------------------------------
    def _retag_owned(self, tensor, category: int, name: str) -> bool:
        """Re-tags `tensor`'s storage, remembering the tag it had so untrack() can restore it.
        False when no remat allocator owns the storage. A sparse tensor's values (its indices may be
        another tensor's storage: an embedding's input ids)."""
        if tensor.is_sparse:
            tensor = tensor._values()
        ptr = _storage_ptr(tensor)
        if ptr == 0:
            return True  # nothing allocated (an empty or meta tensor)
        known = self._restore.get(ptr)
        if known is not None and known[0]() is tensor and known[2] == (category, name):
            return True  # re-tagged for this tensor already (a gradient accumulated into again)
        previous = ctypes.c_uint32()
        if _lib().remat_retag_block(ptr, category, name.encode(), ctypes.byref(previous)) != 0:
            return False
        with self._lock:
            known = self._restore.get(ptr)
            first = previous.value
            if known is not None and known[0]() is not None:
                first = known[1]  # keep the tag from before tracking
            try:
                ref = weakref.ref(tensor, lambda r, ptr=ptr: self._forget(ptr, r))
            except TypeError:
                ref = lambda: None  # noqa: E731  (cannot be followed: never restored)
            self._restore[ptr] = (ref, first, (category, name))
        return True

    def _forget(self, ptr: int, ref) -> None:
        with self._lock:
            entry = self._restore.get(ptr)
            if entry is not None and entry[0] is ref:
                del self._restore[ptr]

    # -- parameters, buffers, gradients ------------------------------------------------------
    def _tag_parameters(self, model, *, refuse_foreign=True) -> None:
        foreign: list[tuple[str, int]] = []
        seen: set[int] = set()
        named = [(name, p, _PARAMETER) for name, p in model.named_parameters()]
        named += [(name, b, _PARAMETER) for name, b in model.named_buffers()]
        for name, tensor, category in named:
            self._param_names.setdefault(id(tensor), name)
            ptr = _storage_ptr(tensor)
            if ptr == 0 or ptr in seen:
                continue  # a storage shared with an earlier name keeps that name
            seen.add(ptr)
            if not self._retag_owned(tensor, category, name):
                foreign.append((name, tensor.untyped_storage().nbytes()))
                continue
            if tensor.grad is not None:
                self._retag_owned(tensor.grad, _GRADIENT, name)
        if foreign and refuse_foreign:
            from . import RematError

            total = sum(size for _, size in foreign)
            shown = ", ".join(name for name, _ in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise RematError(
                f"track: {len(foreign)} parameters and buffers ({total} bytes: {shown}) were not allocated by remat's "
                "allocator, so they cannot be tagged. On the CPU, create the model inside remat.tag_cpu_tensors() "
                "(enter it before building the model, then call track); on CUDA, call remat_alloc.install() before "
                "the first CUDA tensor")

    def _hook_gradients(self, model) -> None:
        for name, param in model.named_parameters():
            self._hook_gradient(name, param)

    def _hook_gradient(self, name: str, param) -> None:
        """Makes `param`'s .grad a gradient of `name` as backward accumulates it."""
        import torch

        # A lazy module's parameter takes no hook until its first forward made it (track again then).
        # The C++ hook goes on a frozen parameter too, for when it is unfrozen; Python's cannot.
        frozen = not param.requires_grad and self._native is None
        if id(param) in self._params_hooked or frozen or torch.nn.parameter.is_lazy(param):
            return
        self._params_hooked.add(id(param))
        if self._native is not None:
            # In C++: backward calls no Python for it. Python's hooks dictionary is made first,
            # so that hooks registered later join it (and run before the tagging) instead of
            # replacing the C++ hook.
            if param._post_accumulate_grad_hooks is None:
                param._post_accumulate_grad_hooks = collections.OrderedDict()
            self._handles.append(self._native.hook_gradient(param, self._log, name))
        else:
            self._handles.append(param.register_post_accumulate_grad_hook(self._grad_hook(name)))

    def _grad_hook(self, name: str):
        if self._native is not None:
            return self._native.GradientTag(self._log, name)

        def tag_gradient(param) -> None:
            if param.grad is not None:
                self._retag_owned(param.grad, _GRADIENT, name)

        return tag_gradient

    # -- modules ---------------------------------------------------------------------------
    def _hook_modules(self, model) -> None:
        for name, module in model.named_modules():
            if id(module) in self._modules:
                call = self._calls.get(id(module))
                if call is None or module.__dict__.get("_compiled_call_impl") is call:
                    continue
                del self._calls[id(module)]  # replaced since (module.compile()): hooks from now on
            self._modules.add(id(module))
            path = (name or self._root_name).encode()
            root = module is model
            if self._native is not None and module.__dict__.get("_compiled_call_impl") is None:
                # No hooks: Module.__call__ calls the C++ TrackCall (which calls the module's
                # _call_impl between enter and leave) where it would call _call_impl, so PyTorch
                # takes its path for modules without hooks; module.compile() later replaces it.
                call = self._native.TrackCall(module, path, root)
                _follow_replicas()
                module._compiled_call_impl = call
                self._calls[id(module)] = call
                self._handles.append(_CallHandle(module, call))
                continue
            if self._native is not None:  # a root's also names the model's tensor arguments inputs
                pre, post = self._native.TrackEnter(path, root), self._native.TrackLeave(path, root)
            else:
                pre, post = self._pre_hook(path, root), self._post_hook(path, root)
            self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=root))
            self._handles.append(module.register_forward_hook(post, always_call=True))

    def _pre_hook(self, path: bytes, root: bool):
        lib = _lib()

        def enter(module, args, kwargs=None):
            if root:
                self._enter_root(args, kwargs)
            _thread.saved.append(_thread.current)
            _thread.current = (_TEMPORARY, path)
            lib.remat_set_category(_TEMPORARY, path)

        return enter

    def _post_hook(self, path: bytes, root: bool):
        lib = _lib()

        def leave(module, args, output):
            if _thread.saved:
                _thread.current = _thread.saved.pop()
                lib.remat_set_category(*_thread.current)
            if output is not None and self._active:
                import torch

                if torch.is_grad_enabled():
                    self._hook_backward(path, output)
            if root:
                self._leave_root()

        return leave

    def _enter_root(self, args, kwargs) -> None:
        import torch

        self._tag_inputs(args, kwargs)
        if torch.is_grad_enabled() and not any(probe() for probe in _checkpoint_probes):
            hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            hooks.__enter__()
            _thread.hooks.append(hooks)
        else:
            _thread.hooks.append(None)

    def _tag_inputs(self, args, kwargs) -> None:
        lib = _lib()
        for tensor in _tensors_in((args, kwargs or {}), []):
            ptr = _storage_ptr(tensor)
            index = ctypes.c_int()
            if ptr and lib.remat_block_category(ptr, ctypes.byref(index), None, 0, None) == 0:
                if index.value in (_NONE, _TEMPORARY, _OTHER):
                    lib.remat_retag_block(ptr, _INPUT, b"input", None)

    def _leave_root(self) -> None:
        _thread.nodes.clear()
        if _thread.hooks:
            hooks = _thread.hooks.pop()
            if hooks is not None:
                hooks.__exit__(None, None, None)

    def _pack(self, tensor):
        # Kept for backward: an activation of the module that produced it (its module stays),
        # unless it is something else already (a parameter, an input) or a parameter tracking does
        # not know (a leaf that requires grad, or a view of one: it keeps its tag). One call into
        # the library: the storage's address is the tensor's less its offset.
        try:
            ptr = tensor.data_ptr()
        except RuntimeError:  # sparse and other tensors without one storage
            return tensor, None
        base = tensor._base if tensor._base is not None else tensor
        if ptr and not (base.is_leaf and base.requires_grad):
            _categorize_as_activation(ptr - tensor.storage_offset() * tensor.element_size(), None)
        # Held without its graph: a tensor autograd saves as its own node's output would otherwise
        # hold that node, and the node the tensor, a cycle Python's collector cannot see. Its
        # version too: autograd checks none through hooks, and unpack does as autograd would.
        return tensor.detach(), tensor._version

    def _hook_backward(self, path: bytes, output) -> None:
        """Backward reaches a module's output nodes before the module's own nodes: each sets
        "temporary of that module". Inner modules finish first, so a node an inner module already
        hooked keeps the inner one. The backward's end puts back what was in force before it."""
        import torch

        lib = _lib()

        def entering(grad_outputs):
            _restore_when_backward_ends()
            _thread.current = (_TEMPORARY, path)
            lib.remat_set_category(_TEMPORARY, path)

        hooked = _thread.nodes
        outputs = [output] if isinstance(output, torch.Tensor) else _tensors_in(output, [])
        for tensor in outputs:
            node = tensor.grad_fn
            if node is None:
                continue
            if id(node) not in hooked:
                hooked.add(id(node))
                node.register_prehook(entering)

    # -- optimizers ------------------------------------------------------------------------
    def _follow_optimizer(self, optimizer) -> None:
        if any(ref() is optimizer for ref, _ in self._optimizers):
            self._follow_state(optimizer)  # its state replaced since (by an assignment): followed again
            return
        import torch

        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"track: optimizer must be a torch.optim.Optimizer (or a list of them), got "
                            f"{type(optimizer).__name__} {optimizer!r:.80}")
        original = optimizer.state
        if isinstance(original, _OptimizerState):
            from . import RematError

            raise RematError(f"track: the optimizer {type(optimizer).__name__} is already followed by the tracking of "
                             "another model; untrack that model first")
        # Parameters it trains that are not the model's (a separate head, a learnable temperature) are
        # named as its state_dict numbers them, across its groups: parameters, gradients and state.
        params = [param for group in optimizer.param_groups for param in group["params"]]
        for number, param in enumerate(params):
            if id(param) not in self._param_names:
                name = f"{type(optimizer).__name__}.param{number}"
                self._param_names[id(param)] = name
                self._retag_owned(param, _PARAMETER, name)
                self._hook_gradient(name, param)
        self._follow_state(optimizer)
        name = type(optimizer).__name__.encode()
        if self._native is not None:
            before_step = self._native.TrackEnter(name)
            after_step = self._native.TrackLeave(name, with_outputs=False)
        else:
            def before_step(opt, args, kwargs):
                _thread.saved.append(_thread.current)
                _set_category(_TEMPORARY, name)

            def after_step(opt, args, kwargs):
                if _thread.saved:
                    _set_category(*_thread.saved.pop())

        self._handles.append(optimizer.register_step_pre_hook(before_step))
        self._handles.append(optimizer.register_step_post_hook(after_step))
        # state_dict() hands out plain dicts, as untracked (torch.load's weights_only takes them);
        # load_state_dict() replaces the state with the loaded one, which is followed in turn.
        self._handles.append(optimizer.register_state_dict_post_hook(_plain_state_dict, prepend=True))
        self._handles.append(optimizer.register_load_state_dict_post_hook(self._follow_state, prepend=True))
        self._optimizers.append((weakref.ref(optimizer), original))

    def _follow_state(self, optimizer) -> None:
        """Makes optimizer.state one that re-tags each tensor stored in it, those in it now too."""
        if not isinstance(optimizer.state, _OptimizerState):
            optimizer.state = _OptimizerState(self, optimizer, optimizer.state)

    # -- ending ----------------------------------------------------------------------------
    def untrack(self) -> None:
        """Removes every hook, gives the optimizers their plain state back and restores the tag
        each re-tagged storage had before tracking (where its tensor still owns it)."""
        if not self._active:
            return
        self._active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for ref, _ in self._optimizers:
            optimizer = ref()
            if optimizer is not None and isinstance(optimizer.state, _OptimizerState):
                tracked_state = optimizer.state
                optimizer.state = tracked_state.plain()
                tracked_state.clear()
        self._optimizers.clear()
        if self._active_tracking is not None:
            self._active_tracking.end()
        if self._log is not None:
            self._log.restore()
        lib = _lib()
        with self._lock:
            entries, self._restore = self._restore, {}
        for ptr, (ref, previous, (category, name)) in entries.items():
            tensor = ref()
            if tensor is None or _storage_ptr(tensor) != ptr:
                continue  # freed or moved since: nothing of ours to undo
            index, needed = ctypes.c_int(), ctypes.c_size_t()
            if lib.remat_block_category(ptr, ctypes.byref(index), None, 0, ctypes.byref(needed)) != 0:
                continue
            module = ctypes.create_string_buffer(needed.value)
            lib.remat_block_category(ptr, ctypes.byref(index), module, needed.value, None)
            if index.value == category and module.value.decode(errors="replace") == name:
                lib.remat_set_block_tag(ptr, previous)  # still what tracking made it
        model = self._model()
        with _trackers_lock:
            if model is not None and _trackers.get(model) is self:
                del _trackers[model]
        # A backward that raised never ran the callback that ends its module's category on this
        # thread: what is allocated after untracking has none.
        from . import category, set_category

        if category()[1]:
            set_category("none")

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.untrack()

    @property
    def tracked_storages(self) -> int:
        """Storages re-tagged and still alive (parameters, buffers, gradients, optimizer state)."""
        with self._lock:
            alive = sum(1 for ref, _, _ in self._restore.values() if ref() is not None)
        return alive + (self._log.alive() if self._log is not None else 0)


def _unpack(packed):
    tensor, version = packed
    if version is not None and tensor._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace operation: a "
            f"tensor saved for backward in a tracked forward (remat_alloc.track) is at version {tensor._version}; "
            f"expected version {version} instead. Clone it before changing it in place, or change a copy.")
    return tensor


def _follow_replicas() -> None:
    """nn.DataParallel makes each replica with Module._replicate_for_data_parallel(), which hands the
    replica the module's __dict__ as it is: a TrackCall there would call the original module (its
    weights, on its device), not the replica. Wrapped once, so that a replica takes a TrackCall of
    its own (the same module path)."""
    import torch

    replicate = torch.nn.Module._replicate_for_data_parallel
    if getattr(replicate, "_remat_follows_replicas", False):
        return

    @functools.wraps(replicate)
    def replicate_for_data_parallel(module):
        replica = replicate(module)
        call = replica.__dict__.get("_compiled_call_impl")
        if _native is not None and isinstance(call, _native.TrackCall):
            replica._compiled_call_impl = call.for_module(replica)
        return replica

    replicate_for_data_parallel._remat_follows_replicas = True
    torch.nn.Module._replicate_for_data_parallel = replicate_for_data_parallel


_converting = threading.local()  # how deep this thread is in Module._apply calls


def _follow_conversions() -> None:
    """model.to(dtype), .half() and the like give each parameter and buffer a new storage
    (Module._apply sets param.data): wrapped once, so that where the outermost conversion returns,
    a tracked model it reached names its parameters, buffers and gradients again (those a
    conversion moved where no remat allocator tags them, to another device, keep none)."""
    import torch

    apply = torch.nn.Module._apply
    if getattr(apply, "_remat_follows_conversions", False):
        return

    @functools.wraps(apply)
    def apply_and_name(module, *args, **kwargs):
        _converting.depth = getattr(_converting, "depth", 0) + 1
        try:
            return apply(module, *args, **kwargs)
        finally:
            _converting.depth -= 1
            if _converting.depth == 0:
                with _trackers_lock:
                    trackers = [(model, tracker) for model, tracker in _trackers.items()
                                if tracker._active and id(module) in tracker._modules]
                for model, tracker in trackers:
                    tracker._tag_parameters(model, refuse_foreign=False)

    apply_and_name._remat_follows_conversions = True
    torch.nn.Module._apply = apply_and_name


def _restore_when_backward_ends() -> None:
    """Once per backward (graph task): its end puts back what is in force now (nothing, or the
    user's own category: a backward inside a category scope, in LBFGS's closure, in a loop running
    the model's parts). A few are followed per thread, each forgotten at its end."""
    import torch

    task = torch._C._current_graph_task_id()
    restoring = _thread.restoring
    if task < 0 or task in restoring:
        return
    if len(restoring) >= 16:
        restoring.pop(0)
    restoring.append(task)
    before = _thread.current

    def restore():
        _set_category(*before)
        if task in _thread.restoring:
            _thread.restoring.remove(task)

    torch.autograd.Variable._execution_engine.queue_callback(restore)


def _optimizers(optimizer) -> Iterable:
    if optimizer is None:
        return []
    if isinstance(optimizer, (list, tuple)):
        return list(optimizer)
    return [optimizer]


def _check_allocator_owns(model) -> None:
    import torch

    from . import RematError, is_installed

    devices = {t.device.type for t in list(model.parameters()) + list(model.buffers())}
    if "cpu" in devices:
        probe = torch.empty(1)
        index = ctypes.c_int()
        if _lib().remat_block_category(probe.untyped_storage().data_ptr(), ctypes.byref(index), None, 0, None) != 0:
            raise RematError(
                "track: CPU tensors do not come from remat's allocator now, so their memory cannot be tagged; enter "
                "remat.tag_cpu_tensors() first, create the model inside it, then call track(model, optimizer)")
    if "cuda" in devices and not is_installed():
        raise RematError("track: the model is on CUDA but remat's allocator is not PyTorch's CUDA allocator; call "
                         "remat_alloc.install() right after importing torch, before the first CUDA tensor")


def track(model, optimizer=None) -> Tracker:
    """Tags the memory of `model`'s training step by category and module without annotations
    (see this module's docstring): parameters and buffers now, then activations, temporaries,
    gradients and inputs as they are made, and the state of `optimizer` (one, or a list) as it
    is created. Tracking a model again returns its Tracker, adding new modules, parameters and
    optimizers. Returns the Tracker; its untrack() restores the previous tags."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"track: model must be a torch.nn.Module, got {type(model).__name__} {model!r:.80}")
    optimizers = _optimizers(optimizer)
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"track: optimizer must be a torch.optim.Optimizer (or a list of them), got "
                            f"{type(opt).__name__} {opt!r:.80}")
    _check_allocator_owns(model)
    with _trackers_lock:
        tracker = _trackers.get(model)
        fresh = tracker is None
        if fresh:
            tracker = Tracker(model)
            _trackers[model] = tracker
    try:
        tracker._tag_parameters(model)
    except Exception:
        if fresh:
            tracker.untrack()
        raise
    tracker._hook_gradients(model)
    tracker._hook_modules(model)
    _follow_conversions()
    for opt in optimizers:
        tracker._follow_optimizer(opt)
    return tracker


def untrack(model) -> None:
    """Ends the tracking of `model` (nothing when it is not tracked)."""
    with _trackers_lock:
        tracker = _trackers.get(model)
    if tracker is not None:
        tracker.untrack()
