"""A region the code recomputes that changes its input in place, or whose output is changed in
place after it returns, runs as written under remat.checkpoint (gradients bitwise those without
checkpointing); profile_regions, which saves every region to measure it, cannot run it saved and
refuses it naming the region, that the code recomputes it, and the fix (not "make the region a
recompute region", which it is)."""

import pytest
import torch

import remat


def make_layer(in_place_input):
    torch.manual_seed(0)
    lin, out = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def layer(x):
        h = remat.region(lin, "lin")(x)
        if in_place_input:
            h = remat.region(torch.nn.ReLU(inplace=True), "act")(h)  # changes its input in place
        else:
            h += x  # changes the output of region 'lin' in place
        return remat.region(out, "out", recompute=False)(h)

    return layer, list(lin.parameters()) + list(out.parameters())


def step(layer, x, checkpointed):
    y = x
    for index in range(2):
        y = remat.checkpoint(region_name=f"layers.{index}")(layer)(y) if checkpointed else layer(y)
    return y.square().mean()


@pytest.mark.parametrize("in_place_input, what", [(True, r"save region 'layers.0::act' changed its input 0 in place"),
                                                  (False, r"output 0 of save region 'layers.0::lin' was changed in "
                                                          r"place after the region returned")])
def test_a_recompute_region_changing_values_in_place_runs_checkpointed_and_a_profile_refuses_it(in_place_input, what):
    layer, parameters = make_layer(in_place_input)
    x = torch.randn(4, 16, requires_grad=True)
    grads = []
    for checkpointed in (False, True):
        step(layer, x, checkpointed).backward()
        grads.append([t.grad.clone() for t in parameters + [x]])
        for t in parameters + [x]:
            t.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    region = "layers.0::act" if in_place_input else "layers.0::lin"
    with pytest.raises(remat.RematError, match=rf"profile_regions: region '{region}' is a recompute region in your "
                                               rf"code.*{what}.*No profile \(nor remat.fit, whose first step is one\) "
                                               r"can measure this model until that op is made out-of-place"):
        with remat.profile_regions():
            step(layer, x, True).backward()
    with remat.profile_regions() as profile:  # the refused profile left nothing behind: another one runs
        step(lambda t: remat.region(lambda u: u.sin(), "sin")(t), x, True).backward()
    assert [r.name for r in profile.regions] == ["layers.0::sin", "layers.1::sin"]
