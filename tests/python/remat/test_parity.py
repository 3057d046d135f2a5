"""Gradients through remat.checkpoint are bitwise those without checkpointing and those of
torch.utils.checkpoint (non-reentrant) on a small transformer block, for every save/recompute
policy; and the same on CUDA tensors when the tagging allocator is PyTorch's CUDA allocator."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.utils.checkpoint

import remat
from transformer_block import Block, assert_bitwise_equal, gradients

POLICIES = [
    pytest.param(True, True, id="save-attention-save-mlp"),
    pytest.param(True, False, id="save-attention-recompute-mlp"),
    pytest.param(False, True, id="recompute-attention-save-mlp"),
    pytest.param(False, False, id="recompute-attention-recompute-mlp"),
]


def checkpointed(block, name, attention_saves, mlp_saves):
    def body(x):
        y = remat.region(block.attention, "attention", recompute=not attention_saves)(x)
        return remat.region(block.mlp, "mlp", recompute=not mlp_saves)(y)

    return lambda x: remat.checkpoint(region_name=name)(body)(x)


@pytest.mark.parametrize("attention_saves, mlp_saves", POLICIES)
def test_gradients_are_bitwise_equal_to_no_checkpointing_and_to_torch_utils_checkpoint(attention_saves, mlp_saves):
    block = Block()
    x = torch.randn(2, 6, 16, requires_grad=True)

    block.forward(x).pow(2).sum().backward()
    expected = gradients(block, x)

    torch.utils.checkpoint.checkpoint(block.forward, x, use_reentrant=False).pow(2).sum().backward()
    torch_checkpoint = gradients(block, x)

    name = f"parity.{int(attention_saves)}{int(mlp_saves)}"
    out = checkpointed(block, name, attention_saves, mlp_saves)(x)
    assert torch.equal(out, block.forward(x))  # forward values too
    out.pow(2).sum().backward()
    actual = gradients(block, x)

    assert_bitwise_equal(torch_checkpoint, expected)
    assert_bitwise_equal(actual, expected)


def test_two_layers_with_a_torch_utils_checkpoint_between_them_match_bitwise():
    blocks = [Block(), Block(), Block()]
    x = torch.randn(2, 6, 16, requires_grad=True)

    def model(t, use_remat):
        h = checkpointed(blocks[0], "parity.stack.0", True, False)(t) if use_remat else blocks[0].forward(t)
        h = torch.utils.checkpoint.checkpoint(blocks[1].forward, h, use_reentrant=False)
        return checkpointed(blocks[2], "parity.stack.2", False, True)(h) if use_remat else blocks[2].forward(h)

    model(x, use_remat=False).sum().backward()
    expected = [g for b in blocks for g in (p.grad.clone() for p in b.parameters())] + [x.grad.clone()]
    for t in [p for b in blocks for p in b.parameters()] + [x]:
        t.grad = None
    model(x, use_remat=True).sum().backward()
    actual = [p.grad for b in blocks for p in b.parameters()] + [x.grad]
    assert_bitwise_equal(actual, expected)


CUDA_CHECKS = """
    import os
    import torch
    import remat_alloc

    remat_alloc.install()  # before the first CUDA tensor
    import remat
    from transformer_block import Block, assert_bitwise_equal, gradients

    assert torch.cuda.get_allocator_backend() == "pluggable"
    torch.use_deterministic_algorithms(True)

    # Residency on the device, in exact bytes through the allocator's tags.
    N = 1000
    TWO, THREE = torch.tensor(2.0, device="cuda"), torch.tensor(3.0, device="cuda")
    for a_saves, b_saves, resident in [(True, True, 4), (False, False, 1)]:
        name = f"cuda.residency.{int(a_saves)}{int(b_saves)}"
        w = (torch.rand(N, device="cuda") * 0.1).requires_grad_(True)
        with remat_alloc.region("cuda.input"):
            x = w * TWO

        def body(t):
            y = remat.region(lambda u: u.exp() * THREE, "A", recompute=not a_saves)(t)
            z = remat.region(lambda u: u.exp() * THREE, "B", recompute=not b_saves)(y)
            return remat.region(lambda u: (u * 3.0).sum(), "C")(z)

        loss = remat.checkpoint(region_name=name)(body)(x)
        del x
        kept = sum(remat_alloc.live_bytes(r, device=0) for r in ("cuda.input", name + "::A", name + "::B"))
        assert kept == resident * N * 4, (name, kept)
        assert remat.live_bytes(name + "::A") == remat_alloc.live_bytes(name + "::A", device=0)
        loss.backward()
        w_ref = w.detach().clone().requires_grad_(True)
        (((w_ref * TWO).exp() * THREE).exp() * THREE * 3.0).sum().backward()
        assert torch.equal(w.grad, w_ref.grad), name
        del loss
        assert remat_alloc.live_bytes(name, device=0) == 0, name
        assert remat_alloc.live_bytes("cuda.input", device=0) == 0, name

    # The transformer block: bitwise parity with no checkpointing.
    block = Block("cuda")
    x = torch.randn(2, 6, 16, device="cuda", requires_grad=True)
    block.forward(x).pow(2).sum().backward()
    expected = gradients(block, x)

    def body(t):
        y = remat.region(block.attention, "attention", recompute=False)(t)
        return remat.region(block.mlp, "mlp")(y)

    out = remat.checkpoint(region_name="cuda.layers.0")(body)(x)
    assert remat_alloc.live_bytes("cuda.layers.0::attention", device=0) > 0
    out.pow(2).sum().backward()
    assert_bitwise_equal(gradients(block, x), expected)
    del out
    assert remat_alloc.live_bytes("cuda.layers.0", device=0) == 0

    # Dropout on the device with a Python state hook for the CUDA generator.
    class CudaRng(remat.RecomputeStateHook):
        def snapshot(self):
            return torch.cuda.get_rng_state()

        def restore(self, state):
            torch.cuda.set_rng_state(state)

    torch.cuda.manual_seed(7)
    block.forward(x, dropout=0.3).pow(2).sum().backward()
    expected = gradients(block, x)
    torch.cuda.manual_seed(7)
    out = remat.checkpoint(region_name="cuda.dropout", recompute_state_hooks=[CudaRng()])(
        lambda t: remat.region(lambda u: block.forward(u, 0.3), "all")(t))(x)
    torch.rand(3, device="cuda")  # the caller moves the generator on before backward
    out.pow(2).sum().backward()
    assert_bitwise_equal(gradients(block, x), expected)
    print("cuda checks passed")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and a CUDA build of torch")
def test_works_with_cuda_tensors_when_the_tagging_allocator_is_the_current_cuda_allocator():
    # A fresh process: PyTorch cannot swap an allocator it has used, and this one may have.
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
           "PYTHONPATH": os.pathsep.join([here] + os.environ.get("PYTHONPATH", "").split(os.pathsep))}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CUDA_CHECKS)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cuda checks passed" in done.stdout
