"""torch_remat's saved-tensor hook contract on remat: which pair takes which kept tensor, with which
kind and captured context, when unpacks run, and that gradients stay those of plain autograd."""

import pytest
import torch

import remat


class Recording:
    """A hook pair holding a copy of each packed tensor (an offloader's shape) and logging what it saw."""

    def __init__(self, name="pair"):
        self.name = name
        self.packs = []  # (kind, context)
        self.unpacks = []  # kinds, in unpack order

    def pack(self, tensor):
        info = remat.current_saved_tensor_info()
        self.packs.append((info.kind, info.context))
        return (info.kind, tensor.detach().clone())

    def unpack(self, payload):
        kind, tensor = payload
        self.unpacks.append(kind)
        return tensor


def attention(x):
    return (x * 2.0).sin()


def mlp(h):
    return (h * 3.0).cos()


def block(x):
    h = remat.region(attention, "attention", recompute=False)(x)
    return remat.region(mlp, "mlp")(h)


def reference_grad(x, body=block):
    leaf = x.detach().clone().requires_grad_(True)
    body(leaf * 1.0).sum().backward()
    return leaf.grad


K = remat.SavedTensorKind


def test_a_pair_around_the_call_takes_what_save_regions_keep_and_gives_exact_gradients():
    pair = Recording()
    x = torch.rand(4, 3, requires_grad=True)
    with remat.saved_tensors_hooks(pair.pack, pair.unpack):
        y = remat.checkpoint(region_name="layers.0")(block)(x * 1.0)
    assert sorted(kind.name for kind, _ in pair.packs) == ["BACKWARD", "SAVE_OUTPUT"]
    y.sum().backward()  # the unpack hook runs after the block has exited
    # The save region's output comes back in recompute, before backward reaches sin's saved input.
    assert pair.unpacks == [K.SAVE_OUTPUT, K.BACKWARD]
    assert torch.equal(x.grad, reference_grad(x))


def test_the_checkpoint_pair_takes_the_inputs_recompute_reads_and_shadows_an_enclosing_pair():
    outer, own = Recording("outer"), Recording("own")

    def body(t):
        return (t.sin() * t).sum()

    x = torch.rand(5, requires_grad=True)
    with remat.saved_tensors_hooks(outer.pack, outer.unpack):
        loss = remat.checkpoint(region_name="plain", saved_tensors_hooks=(own.pack, own.unpack))(body)(x * 1.0)
    loss.backward()
    assert [kind for kind, _ in own.packs] == [K.CHECKPOINT_INPUT]
    assert own.unpacks == [K.CHECKPOINT_INPUT]
    assert outer.packs == []  # the explicit pair comes first
    assert torch.allclose(x.grad, x.detach().sin() + x.detach() * x.detach().cos())


def test_a_deferred_save_output_pack_sees_the_context_captured_where_the_region_ran():
    current = {"bucket": "forward-0"}
    pair = Recording()

    def body(t):
        with remat.saved_tensors_hooks(pair.pack, pair.unpack, capture_context=lambda: current["bucket"]):
            h = remat.region(attention, "attention", recompute=False)(t)
        current["bucket"] = "changed after the region"
        return remat.region(mlp, "mlp")(h)

    x = torch.rand(3, requires_grad=True)
    remat.checkpoint(region_name="ctx")(body)(x * 1.0).sum().backward()
    # The output is packed when forward ends, after the block exited and the state changed.
    assert sorted((kind.name, context) for kind, context in pair.packs) == [
        ("BACKWARD", "forward-0"), ("SAVE_OUTPUT", "forward-0")]
    assert torch.equal(x.grad, reference_grad(x))


def test_an_enclosing_pytorch_pair_is_inherited_by_the_checkpoint():
    seen = []

    def pack(tensor):
        seen.append(remat.current_saved_tensor_info().kind)
        return tensor

    x = torch.rand(3, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = remat.checkpoint(region_name="inherit")(block)(x * 1.0)
    assert sorted(kind.name for kind in seen) == ["BACKWARD", "SAVE_OUTPUT"]
    y.sum().backward()
    assert torch.equal(x.grad, reference_grad(x))


def test_outside_checkpoints_the_pair_is_pytorchs_with_kind_backward():
    pair = Recording()
    x = torch.rand(3, requires_grad=True)
    with remat.saved_tensors_hooks(pair.pack, pair.unpack, capture_context=lambda: "unused"):
        loss = x.exp().sum()
    loss.backward()
    assert pair.packs == [(K.BACKWARD, None)]
    assert pair.unpacks == [K.BACKWARD]
    assert torch.equal(x.grad, x.detach().exp())


def test_the_info_is_refused_outside_a_pack_hook():
    with pytest.raises(RuntimeError, match="may only be called from a remat saved-tensor pack hook"):
        remat.current_saved_tensor_info()
    info = remat.SavedTensorInfo(K.BACKWARD)
    assert info.context is None
    with pytest.raises(AttributeError):
        info.kind = K.SAVE_OUTPUT  # frozen


def test_bad_pairs_are_refused_with_what_is_wrong():
    with pytest.raises(TypeError, match="saved_tensors_hooks must be a \\(pack_hook, unpack_hook\\) pair"):
        remat.checkpoint(saved_tensors_hooks=lambda t: t)
    with pytest.raises(TypeError, match="unpack_hook must be callable, got int"):
        remat.saved_tensors_hooks(lambda t: t, 3)

    def bad_unpack(payload):
        return "not a tensor"

    x = torch.rand(3, requires_grad=True)
    with remat.saved_tensors_hooks(lambda t: t, bad_unpack):
        y = remat.checkpoint(region_name="bad")(block)(x * 1.0)
    with pytest.raises(TypeError, match="the unpack hook returned str; it must return the Tensor"):
        y.sum().backward()


def test_a_saved_tensor_changed_in_place_after_the_save_is_an_error_not_a_wrong_gradient():
    kept = {}

    def body(t):
        def save(u):
            kept["t"] = u * 2.0
            return kept["t"].sin()  # sin saves kept["t"]

        return remat.region(save, "attention", recompute=False)(t)

    y = remat.checkpoint(region_name="mutated")(body)(torch.rand(4, requires_grad=True) * 1.0)
    kept["t"].mul_(3.0)
    with pytest.raises(RuntimeError, match="of region 'mutated::attention' was modified in-place after it was saved"):
        y.sum().backward()


def test_a_save_output_is_packed_where_a_region_claims_it_and_recompute_runs_before_any_unpack():
    # torch_remat's contract for group offloaders: the output is packed when the consuming region
    # claims it (inside forward, so a flush at the end of the block sees it), and in backward the
    # body starts again (is_recomputing) before any unpack of the pair, so it can onload first.
    log = []

    def pack(tensor):
        log.append(f"pack {remat.current_saved_tensor_info().kind.name}")
        return tensor.detach().clone()

    def unpack(payload):
        log.append("unpack")
        return payload

    def body(t):
        log.append("recompute starts" if remat.is_recomputing() else "forward starts")
        with remat.saved_tensors_hooks(pack, unpack):
            h = remat.region(lambda u: u.exp(), "producer", recompute=False)(t)
        log.append("consumer claims")
        m = remat.region(lambda u: u.sin(), "consumer")(h)
        if not remat.is_recomputing():
            log.append("block flushed")
        with remat.saved_tensors_hooks(pack, unpack):
            return remat.region(lambda u: (u * 2.0).cos(), "tail", recompute=False)(m)  # cos saves u * 2.0

    x = torch.rand(3, requires_grad=True)
    y = remat.checkpoint(region_name="order")(body)(x * 1.0)
    assert log == ["forward starts", "pack BACKWARD", "consumer claims", "pack SAVE_OUTPUT", "block flushed",
                   "pack BACKWARD"]
    del log[:]
    y.sum().backward()
    # The first node backward runs is the tail's, whose saved tensor the pair holds: the body
    # starts again before that unpack; then the producer's output comes back as recompute
    # reaches it, and the producer's own saved tensor last.
    assert log == ["recompute starts", "unpack", "consumer claims", "unpack", "unpack"]
    e = x.detach().exp()
    assert torch.allclose(x.grad, -(2.0 * e.sin()).sin() * 2.0 * e.cos() * e)


def test_changes_in_place_to_what_recompute_would_read_are_errors_not_wrong_gradients():
    # A view a save region saved of an input recompute recreates (not kept: taken from that
    # input again), changed in place after the region.
    def body(x):
        u = x.sin()
        h = remat.region(lambda t: t * t, "square", recompute=False)(u)
        u.mul_(3.0)
        return (h * remat.region(lambda t: t.cos(), "after")(u)).sum()

    loss = remat.checkpoint(region_name="ferried")(body)(torch.rand(4, requires_grad=True) * 1.0)
    with pytest.raises(remat.RematError, match="of region 'ferried::square' was modified in-place after it was saved"):
        loss.backward()

    # A save region's output recompute reads, changed in place between forward and backward.
    outputs = {}

    def producer_then_consumer(x):
        outputs["h"] = remat.region(lambda t: t * 2.0, "producer", recompute=False)(x)
        return remat.region(lambda t: t.sin(), "consumer")(outputs["h"])

    y = remat.checkpoint(region_name="mutated.output")(producer_then_consumer)(torch.rand(3, requires_grad=True) * 1.0)
    outputs["h"].mul_(10.0)
    with pytest.raises(remat.RematError, match="output 0 of save region 'mutated.output::producer' was changed in place "
                                               "after forward"):
        y.sum().backward()


def test_a_copying_pair_that_changes_the_layout_gives_the_gradient_of_plain_autograd():
    # save_on_cpu(pin_memory=True) hands back contiguous copies: recompute starts from tensors
    # laid out as forward's were, so a view taken from a recreated input still fits.
    def body(x):
        u = x * 2.0  # keeps the transposed input's strides
        h = remat.region(lambda t: t[:, 1:] * t[:, 1:], "square", recompute=False)(u)
        return remat.region(lambda t: t.cos(), "after")(h) * u[:, 1:].cos()

    def contiguous_copy(tensor):
        return torch.empty(tensor.size()).copy_(tensor)

    x = torch.rand(6, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(contiguous_copy, lambda payload: payload):
        remat.checkpoint(region_name="layout")(body)(x.t() * 1.0).sum().backward()
    leaf = x.detach().clone().requires_grad_(True)
    body(leaf.t() * 1.0).sum().backward()
    assert torch.equal(x.grad, leaf.grad)


def test_an_unpack_returning_another_shape_names_the_unpack_hook():
    def body(t):
        return (t.sin() * t).sum()  # the input is kept for recompute

    checkpointed = remat.checkpoint(region_name="shape", saved_tensors_hooks=(lambda t: t, lambda t: t[:2]))(body)
    loss = checkpointed(torch.rand(4, requires_grad=True) * 1.0)
    with pytest.raises(remat.RematError, match="the saved-tensor unpack hook returned float32 \\[2\\] on cpu for input 0 "
                                               "of checkpoint 'shape', which was packed as float32 \\[4\\] on cpu"):
        loss.backward()


def test_blocks_exited_out_of_order_or_shared_by_threads_leave_no_pair_behind():
    import threading

    a = remat.saved_tensors_hooks(lambda t: t, lambda t: t)
    b = remat.saved_tensors_hooks(lambda t: t, lambda t: t)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert not remat._C.saved_tensor_hooks_active()

    shared = remat.saved_tensors_hooks(lambda t: t, lambda t: t)
    entered, release = threading.Event(), threading.Event()
    seen = []

    def other_thread():
        with shared:
            entered.set()
            release.wait(10)
            seen.append(remat._C.saved_tensor_hooks_active())
        seen.append(remat._C.saved_tensor_hooks_active())

    thread = threading.Thread(target=other_thread)
    thread.start()
    entered.wait(10)
    with shared:  # entered and exited here while the other thread holds its own entry
        pass
    release.set()
    thread.join(10)
    assert seen == [True, False] and not remat._C.saved_tensor_hooks_active()
    with pytest.raises(RuntimeError, match="exited on a thread that did not enter it"):
        shared.__exit__(None, None, None)


def test_ops_a_pair_runs_on_tensors_that_require_grad_are_not_recorded_into_the_checkpoint():
    scale = torch.tensor(2.0, requires_grad=True)

    def pack(tensor):
        return tensor * scale  # would save `tensor` and `scale` if autograd recorded it

    def unpack(payload):
        return payload / scale

    def body(x):
        u = x.cos()
        h = remat.region(lambda t: (t * 2.0).sin(), "attention", recompute=False)(u)
        return remat.region(lambda t: t.tanh(), "mlp")(h) * u

    x = torch.rand(4, 3, requires_grad=True)
    remat.checkpoint(region_name="ops", saved_tensors_hooks=(pack, unpack))(body)(x * 1.0).sum().backward()
    leaf = x.detach().clone().requires_grad_(True)
    body(leaf * 1.0).sum().backward()
    assert torch.allclose(x.grad, leaf.grad) and scale.grad is None
