"""A plan never changes gradients through random numbers: dropout in a region the code saves
needs no RNG state hook as written (nothing draws it again), but a budget plan, or remat.fit,
may recompute that region; under a plan a checkpoint therefore keeps the CPU and CUDA RNG
state for recompute too, and the gradients stay bitwise those without checkpointing, with other
random work between forward and backward."""

import warnings

import torch

import remat

WIDTH = 64


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Dropout(0.3))
        self.mlp = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x, checkpointed=True):
        def layer(t):
            h = remat.region(self.attn, "attn", recompute=False)(t)  # dropout, saved as written
            return remat.region(lambda u: self.mlp(u).relu(), "mlp")(h)

        for index in range(4):
            x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x) if checkpointed else layer(x)
        return x.square().mean()


def gradients(model, step=None, checkpointed=True):
    model.zero_grad(set_to_none=True)
    x = torch.ones(16, WIDTH, requires_grad=True)
    torch.manual_seed(7)
    loss = step(x) if step is not None else model(x, checkpointed)
    torch.manual_seed(1234)  # other random work between forward and backward, as a training loop has
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()] + [x.grad.flatten()])


def test_a_plan_that_recomputes_a_saved_region_with_dropout_keeps_its_masks():
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        model = Model()
        reference = gradients(model, checkpointed=False)
        assert torch.equal(gradients(model), reference)  # as written: the dropout region is saved
        with remat.profile_regions() as profile:
            gradients(model)
        plan = profile.plan(peak_bytes=profile.least_peak_bytes())
        recomputed = [path for path, choice in plan.decisions.items() if path.endswith("attn") and choice == "recompute"]
        assert recomputed  # the least peak recomputes some dropout region: what this test is about
        with remat.use_plan(plan):
            assert torch.equal(gradients(model), reference)


def test_fit_keeps_dropout_masks_on_every_step():
    with remat.tag_cpu_tensors():
        torch.manual_seed(0)
        model = Model()
        references = [gradients(model, checkpointed=False) for _ in range(3)]
        with remat.profile_regions() as profile:
            gradients(model)
        fitted = remat.fit(model, budget=profile.least_peak_bytes())
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            bitwise = [torch.equal(gradients(model, step=fitted), want) for want in references]
        # The profiled first step, every region saved, is over this budget and says so; nothing else.
        assert [str(w.message).split(" peaked at")[0] for w in told] == [
            "remat.fit: the profiled step (every region saved)"]
        assert any(choice == "recompute" for path, choice in model.remat_fit.plan.decisions.items()
                   if path.endswith("attn"))
        assert bitwise == [True, True, True]
