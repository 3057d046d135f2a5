"""The runtime's autograd engine chains to PyTorch's: Python's saved-tensor hooks, anomaly
mode and torch.utils.checkpoint keep working around and inside checkpoints, and a Python
exception raised in recompute reaches the caller of backward() as itself."""

import pytest
import torch
import torch.utils.checkpoint

import remat


def block(w1, w2):
    def body(x):
        h = remat.region(lambda t: torch.tanh(t @ w1), "attention", recompute=False)(x)
        return remat.region(lambda t: torch.tanh(t @ w2), "mlp")(h)

    return body


def weights(n=16):
    return torch.randn(n, n, requires_grad=True), torch.randn(n, n, requires_grad=True)


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, tensors)


def test_gradients_are_bitwise_those_without_checkpointing():
    w1, w2 = weights()
    x = torch.randn(4, 16, requires_grad=True)
    with_checkpoint = grads_of(remat.checkpoint(region_name="layers.0")(block(w1, w2))(x).sum(), (w1, w2, x))
    without = grads_of(block(w1, w2)(x).sum(), (w1, w2, x))
    for a, b in zip(with_checkpoint, without):
        assert torch.equal(a, b)


def test_python_exception_in_recompute_reaches_backward_with_its_traceback():
    w1, _ = weights()
    calls = []

    def body(x):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("raised in recompute")
        return torch.tanh(x @ w1)

    y = remat.checkpoint(region_name="failing")(body)(torch.randn(4, 16, requires_grad=True))
    with pytest.raises(ValueError, match="raised in recompute") as raised:
        y.sum().backward()
    assert any(entry.name == "body" for entry in raised.traceback)


def test_detect_anomaly_metadata_inside_and_outside_checkpoints():
    w1, w2 = weights()
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autograd.detect_anomaly():
        inside = remat.checkpoint(region_name="anomaly")(lambda t: torch.tanh(t @ w1) * 2)(x)
        outside = torch.tanh(inside @ w2)
        assert isinstance(inside.grad_fn.metadata, dict)
        assert isinstance(outside.grad_fn.metadata, dict)
        outside.sum().backward()
    assert w1.grad is not None and w2.grad is not None


def test_saved_tensors_hooks_pushed_inside_a_checkpoint_take_the_tensors_saved_under_them():
    w1, _ = weights()
    packed = []

    def body(x):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
            return torch.tanh(x @ w1)

    x = torch.randn(4, 16, requires_grad=True)
    y = remat.checkpoint(region_name="user-hooks")(body)(x)
    assert packed, "the user's pack hook saw the tensors saved under it"
    y.sum().backward()
    assert torch.equal(w1.grad, grads_of(torch.tanh(x @ w1).sum(), (w1,))[0])


def test_save_on_cpu_around_checkpoints_still_packs_what_is_saved_outside_them():
    w1, w2 = weights()
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autograd.graph.save_on_cpu():
        h = remat.checkpoint(region_name="under-save-on-cpu")(lambda t: torch.tanh(t @ w1))(x)
        y = torch.tanh(h @ w2)
    y.sum().backward()
    expected = grads_of(torch.tanh(torch.tanh(x @ w1) @ w2).sum(), (w1, w2))
    assert torch.equal(w1.grad, expected[0]) and torch.equal(w2.grad, expected[1])


def test_beside_torch_utils_checkpoint_in_one_model():
    w1, w2 = weights()
    x = torch.randn(4, 16, requires_grad=True)
    h = remat.checkpoint(region_name="ours")(lambda t: torch.tanh(t @ w1))(x)
    y = torch.utils.checkpoint.checkpoint(lambda t: torch.tanh(t @ w2), h, use_reentrant=False)
    got = grads_of(y.sum(), (w1, w2, x))
    expected = grads_of(torch.tanh(torch.tanh(x @ w1) @ w2).sum(), (w1, w2, x))
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_torch_func_refuses_checkpoints_with_its_own_message():
    w1, _ = weights()

    def f(x):
        return remat.checkpoint(region_name="under-func")(lambda t: torch.tanh(t @ w1.detach()))(x).sum()

    with pytest.raises(RuntimeError, match="checkpoint 'under-func' cannot run here"):
        torch.func.grad(f)(torch.randn(4, 16))


def test_save_on_cpu_inside_a_checkpoint_gives_the_same_gradients():
    w1, w2 = weights()
    x = torch.randn(4, 16, requires_grad=True)

    def body(t):
        h = torch.tanh(t @ w1)
        with torch.autograd.graph.save_on_cpu():
            return torch.tanh(h @ w2)

    got = grads_of(remat.checkpoint(region_name="save-on-cpu-inside")(body)(x).sum(), (w1, w2, x))
    expected = grads_of(torch.tanh(torch.tanh(x @ w1) @ w2).sum(), (w1, w2, x))
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_saved_tensors_hooks_around_a_checkpoint_see_what_it_keeps_and_what_is_saved_outside_it():
    w1, w2 = weights()
    x = torch.randn(4, 16, requires_grad=True)
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(tuple(t.shape)) or t, lambda t: t):
        h = remat.checkpoint(region_name="hooks-around")(lambda t: torch.tanh(t @ w1 * 3.0))(x)
        inside = list(packed)
        y = torch.tanh(h @ w2)
    # Inherited as torch_remat inherits it: the pair holds the input recompute starts from, and
    # never sees what the body saved (dropped, recomputed in backward).
    assert inside == [(4, 16)]
    assert len(packed) > 1, "the user's hooks take what is saved outside the checkpoint"
    got = grads_of(y.sum(), (w1, w2, x))
    expected = grads_of(torch.tanh(torch.tanh(x @ w1 * 3.0) @ w2).sum(), (w1, w2, x))
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


def test_under_torch_compile_the_body_runs_eagerly_in_forward_and_recompute_and_gradients_match_eager():
    """Dynamo cannot trace the runtime, so it runs a checkpoint eagerly; the body must then run
    eagerly in forward too, as recompute (from backward, outside the compiled frame) runs it."""
    x = torch.rand(32, 64, requires_grad=True)

    def body(t):
        h = remat.region(lambda u: torch.sigmoid(u) * u, "swish", recompute=False)(t)
        return remat.region(lambda u: (u @ u.t()).tanh(), "mlp")(h)

    def step(t):
        return remat.checkpoint(region_name="compiled.l0")(body)(t)

    torch.compile(step, backend="aot_eager")(x).sum().backward()
    compiled = x.grad.clone()
    x.grad = None
    swish = torch.sigmoid(x) * x
    (swish @ swish.t()).tanh().sum().backward()
    assert torch.allclose(compiled, x.grad, atol=1e-6)
    torch._dynamo.reset()
