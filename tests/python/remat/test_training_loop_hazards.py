"""What training loops do around checkpoints: forwards that fail and are caught, torch.func
transforms, copied guards. None of them may leak, break backward or mislead."""

import copy
import gc

import pytest
import torch

import remat
import remat_alloc


@pytest.mark.parametrize("raised", [ValueError, KeyboardInterrupt, torch.OutOfMemoryError])
def test_a_forward_that_raises_after_a_save_region_releases_what_the_checkpoint_kept(raised):
    def bad(t):
        remat.region(lambda u: u.sin(), "a", recompute=False)(t)
        raise raised("caught by the job, which skips the batch")

    x = torch.rand(256, 256, requires_grad=True)
    with remat.tag_cpu_tensors():
        for _ in range(20):
            with pytest.raises(raised):
                remat.checkpoint(region_name="failing")(bad)(x)
        gc.collect()
        assert remat.live_bytes("failing") == 0
        good = remat.checkpoint(region_name="failing")(lambda t: remat.region(torch.sin, "a", recompute=False)(t))(x)
        assert remat.live_bytes("failing") > 0
        good.sum().backward()
        del good
        assert remat.live_bytes("failing") == 0
    assert torch.allclose(x.grad, x.detach().cos())


def test_backward_through_a_tensor_of_a_failed_forward_is_still_a_clear_error():
    kept = []

    def bad(t):
        kept.append(remat.region(lambda u: u.exp(), "a")(t))
        raise ValueError("after the region")

    with pytest.raises(ValueError):
        remat.checkpoint(region_name="half-done")(bad)(torch.rand(4, requires_grad=True))
    with pytest.raises(remat.RematError, match="raised an error in forward"):
        kept[0].sum().backward()


def test_vmap_over_a_checkpoint_is_refused_at_forward():
    w = torch.rand(4, 4, requires_grad=True)

    def f(x):
        return remat.checkpoint(region_name="mapped")(lambda t: (t @ w).tanh())(x)

    with pytest.raises(remat.RematError, match="^checkpoint 'mapped' cannot run under torch.func.vmap"):
        torch.func.vmap(f)(torch.rand(3, 4))
    with torch.no_grad():  # nothing to recompute: it just runs
        assert torch.func.vmap(f)(torch.rand(3, 4)).shape == (3, 4)


@pytest.mark.parametrize("guard", [remat.tag_cpu_tensors, remat.track_saved_tensors])
@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_guards_refuse_to_be_copied_and_the_tagging_count_never_goes_below_zero(guard, copier):
    entered = guard()
    with entered:
        with pytest.raises(TypeError, match="cannot be copied"):
            copier(entered)
    with pytest.raises(RuntimeError, match="exited without being entered"):
        entered.__exit__(None, None, None)
    with remat.tag_cpu_tensors():  # a fresh guard still tags
        with remat_alloc.region("after-copies"):
            t = torch.empty(100)
        assert remat.live_bytes("after-copies") == 400
    del t
