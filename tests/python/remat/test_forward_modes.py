"""Recompute runs under the modes forward had: autocast (enabled, dtype, per device type, cache),
the default dtype, and backend flags a context manager sets; gradients equal the same code
without checkpointing."""

import pytest
import torch

import remat

DTYPES = [torch.bfloat16, torch.float16]


def make_inputs():
    torch.manual_seed(0)
    x = torch.rand(8, 16, requires_grad=True)
    w = torch.rand(16, 16, requires_grad=True)
    return x, w


def mixed_block(t, w):
    h = remat.region(lambda u, v: torch.relu(u @ v), "attention", recompute=False)(t, w)
    return remat.region(lambda u, v: (u @ v).tanh(), "mlp")(h, w)


def plain_block(t, w):
    return (torch.relu(t @ w) @ w).tanh()


def gradients(fn, checkpointed, placement, dtype):
    x, w = make_inputs()
    body = (lambda t, v: remat.checkpoint(region_name=f"autocast.{placement}")(fn)(t, v)) if checkpointed else fn
    if placement == "around":
        with torch.autocast("cpu", dtype=dtype):
            out = body(x, w)
    elif placement == "inside":
        inner = fn

        def fn_with_autocast(t, v):
            with torch.autocast("cpu", dtype=dtype):
                return inner(t, v)

        body = (lambda t, v: remat.checkpoint(region_name="autocast.inside")(fn_with_autocast)(t, v)) if checkpointed \
            else fn_with_autocast
        out = body(x, w)
    else:  # around, with a region that turns it off
        def fn_with_fp32_tail(t, v):
            h = fn(t, v)
            with torch.autocast("cpu", enabled=False):
                return remat.region(lambda u: (u.float() * 2.0).sin(), "fp32-tail")(h)

        body = (lambda t, v: remat.checkpoint(region_name="autocast.nested")(fn_with_fp32_tail)(t, v)) if checkpointed \
            else fn_with_fp32_tail
        with torch.autocast("cpu", dtype=dtype):
            out = body(x, w)
    assert out.dtype in (dtype, torch.float32)
    out.float().pow(2).sum().backward()
    return x.grad, w.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("placement", ["around", "inside", "around-with-a-disabled-region"])
@pytest.mark.parametrize("block", [mixed_block, plain_block], ids=["regions", "plain"])
def test_gradients_under_autocast_equal_the_same_code_without_checkpointing(dtype, placement, block):
    expected = gradients(block, False, placement, dtype)
    got = gradients(block, True, placement, dtype)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_recompute_under_autocast_leaves_backwards_autocast_state_as_it_was():
    x, w = make_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = remat.checkpoint(region_name="autocast.state")(plain_block)(x, w)
    assert not torch.is_autocast_enabled("cpu")
    seen = []
    hook = x.register_hook(lambda g: seen.append(torch.is_autocast_enabled("cpu")))
    out.float().sum().backward()
    hook.remove()
    assert seen == [False]
    assert not torch.is_autocast_enabled("cpu")
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # the default, untouched


def test_recompute_uses_the_default_dtype_forward_had():
    x = torch.rand(4, requires_grad=True)

    def body(t):
        return (t * torch.ones(4)).exp()  # torch.ones follows the default dtype

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = remat.checkpoint(region_name="default-dtype")(body)(x.double())
    finally:
        torch.set_default_dtype(previous)
    out.sum().backward()  # recompute under float32 would recreate a float32 tensor: a mismatch
    assert torch.allclose(x.grad, x.detach().double().exp().float())


def test_recompute_runs_under_the_deterministic_algorithms_setting_forward_had():
    x = torch.rand(4, requires_grad=True)
    seen = []

    def body(t):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return t.exp()

    torch.use_deterministic_algorithms(True)
    try:
        out = remat.checkpoint(region_name="deterministic")(body)(x)
    finally:
        torch.use_deterministic_algorithms(False)
    out.sum().backward()
    assert seen == [True, True]
    assert not torch.are_deterministic_algorithms_enabled()
