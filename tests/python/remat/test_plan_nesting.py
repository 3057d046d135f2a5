"""use_plan and profile_regions nested: a use_plan block inside another wins for the checkpoints
called in it, and the outer one counts their regions as run (it named them "regions that did not
run" at its end), gradients bitwise those without checkpointing; use_plan inside profile_regions
and profile_regions inside use_plan are refused up front, naming the other block, as a profile
inside a profile is."""

import contextlib

import pytest
import torch

import remat
from remat._plans import live_checkpoint_bytes


def layer(x):
    h = remat.region(lambda t: (t * 2).sin(), "attn")(x)
    return remat.region(lambda t: (t.repeat(1, 3) * 3).cos()[:, :64], "mlp")(h)


def model(x, plain=False):
    for index in range(3):
        x = layer(x) if plain else remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
    return x.sum()


@pytest.fixture(scope="module")
def plans():
    x = torch.randn(16, 64, requires_grad=True)
    with remat.profile_regions() as profile:
        model(x).backward()
    return profile.plan(budget_bytes=profile.base_bytes), profile.plan(budget_bytes=10**9)


def test_an_inner_use_plan_wins_and_the_outer_counts_its_regions_as_run(plans):
    recompute_all, save_all = plans
    x = torch.randn(16, 64, requires_grad=True)
    model(x, plain=True).backward()
    reference = x.grad.clone()

    def kept_under(*plans_entered):
        """What the checkpoints keep after forward with the plans entered, outermost first."""
        x.grad = None
        with contextlib.ExitStack() as stack:
            for plan in plans_entered:
                stack.enter_context(remat.use_plan(plan))
            loss = model(x)
            kept = live_checkpoint_bytes()
            loss.backward()
        assert torch.equal(x.grad, reference)
        return kept

    nested = kept_under(recompute_all, save_all)
    assert nested == kept_under(save_all) > kept_under(recompute_all), (nested, kept_under(recompute_all))


def test_use_plan_inside_profile_regions_is_refused_up_front(plans):
    x = torch.randn(16, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"use_plan: a profile is being measured on this thread \(profile_regions\)"
                                           r".*run the planned step after the profile_regions block"):
        with remat.profile_regions():
            with remat.use_plan(plans[0]):
                model(x).backward()


def test_profile_regions_inside_use_plan_is_refused_up_front(plans):
    x = torch.randn(16, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"profile_regions: a plan is in force on this thread \(use_plan\).*profile "
                                           r"outside the use_plan block"):
        with remat.use_plan(plans[0]):
            with remat.profile_regions():
                model(x).backward()
    with remat.profile_regions() as profile:  # the refused blocks left nothing behind
        model(x).backward()
    assert len(profile.regions) == 6
