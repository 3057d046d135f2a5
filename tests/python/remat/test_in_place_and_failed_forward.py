"""What plain autograd refuses, remat refuses too, with the reason: an in-place change to a
checkpoint input that recompute would read, backward through a checkpoint whose forward
failed, sparse inputs; and an exception from a context's exit reaches the caller."""

import pytest
import torch

import remat


def test_backward_through_a_tensor_from_a_failed_checkpoint_is_an_error_not_a_crash():
    kept = {}

    def body(u):
        kept["h"] = u.exp().sin()  # exp's output is dropped, to be recomputed
        raise ValueError("bad batch")

    a = torch.randn(5, requires_grad=True)
    with pytest.raises(ValueError, match="bad batch"):
        remat.checkpoint(body, a, region_name="failing")
    with pytest.raises(RuntimeError, match="checkpoint 'failing' raised an error in forward, so the tensors it "
                                           "dropped cannot be recomputed"):
        kept["h"].sum().backward()


def test_an_input_changed_in_place_after_forward_is_refused_like_autograd_does():
    def block(t):
        return t.sin() * 2

    a = torch.randn(4, requires_grad=True)
    h = a * 1.0
    h += remat.checkpoint(block, h, region_name="residual")  # h was the checkpoint's input
    with pytest.raises(RuntimeError, match=r"input 0 of checkpoint 'residual' was changed by an in-place operation "
                                           r"after forward \(version 0, now 1\)"):
        h.sum().backward()

    # The same written out of place trains, with autograd's gradient.
    a.grad = None
    h = a * 1.0
    h = h + remat.checkpoint(block, h, region_name="residual")
    h.sum().backward()
    torch.testing.assert_close(a.grad, 1 + 2 * a.detach().cos())


def test_a_body_that_changes_its_input_in_place_is_refused_in_forward():
    def body(t):
        t.mul_(2)
        return t.sin()

    a = torch.randn(5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"checkpoint 'scales' changed its input 0 in place"):
        remat.checkpoint(body, a * 1.0, region_name="scales")


def test_a_sparse_input_is_refused_with_the_fix():
    s = torch.randn(4, 4).to_sparse().requires_grad_()
    with pytest.raises(RuntimeError, match=r"input 0 of checkpoint 'sparse' has layout Sparse; checkpoints take "
                                           r"strided tensors: pass input.to_dense\(\)"):
        remat.checkpoint(lambda t: torch.sparse.mm(t, torch.randn(4, 4)).exp(), s, region_name="sparse")


class InterruptOnExit:
    def exit_forward(self):
        raise KeyboardInterrupt("pressed Ctrl-C")


def test_an_exception_from_a_context_exit_reaches_the_caller():
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(KeyboardInterrupt, match="pressed Ctrl-C"):
        remat.checkpoint(lambda t: t.sin(), x, contexts=[InterruptOnExit])
