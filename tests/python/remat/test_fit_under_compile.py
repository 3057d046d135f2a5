"""remat.fit on a model run through torch.compile: a compiled step runs no region as such, so fit
can neither profile it nor carry out a plan in it. The compiled function is refused at its first
step, before its forward runs, and at every step after (never a loop that runs every other step),
with a ValueError naming torch.compile and the fix; under no_grad a compiled forward runs as it is.
The fix it names works: the eager model fitted, with compiled code inside its regions, runs every
planned step within the budget, gradients bitwise those of the same model without checkpointing."""

import pytest
import torch

import remat

import fit_loop

HIDDEN, BATCH, SEQUENCE = 32, 16, 32

REFUSED = (r"remat.fit: the model runs under torch.compile .* no region runs as such .* so fit can neither profile "
           r"the step nor carry out a plan in it; nothing of the step ran\. Profile and plan the eager model .* with "
           r"compiled code inside its regions if wanted \(remat.region\(torch.compile\(fn\), name\).* "
           r"torch._functorch.config.activation_memory_budget")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def batch(step):
    return torch.randn(BATCH, SEQUENCE, HIDDEN, generator=torch.Generator().manual_seed(step), requires_grad=True)


def model_of_two_layers():
    return fit_loop.CheckpointedLayers([fit_loop.Layer(HIDDEN) for _ in range(2)])


COMPILES = {
    "torch.compile(model) after fit": lambda model: torch.compile(model, backend="aot_eager"),
    "fullgraph": lambda model: torch.compile(model, backend="aot_eager", fullgraph=True),
    "a compiled step calling the model": lambda model: torch.compile(lambda x: model(x), backend="aot_eager"),
}


@pytest.mark.parametrize("compiled_by", COMPILES.values(), ids=COMPILES.keys())
def test_a_compiled_model_under_fit_is_refused_before_its_first_step_and_at_every_step(compiled_by):
    with fit_loop.fitted(model_of_two_layers, "64 MiB") as (model, _):
        compiled = compiled_by(model)
        for step in range(1, 5):
            with pytest.raises(ValueError, match=REFUSED):
                compiled(batch(step))
            # Refused before the forward: no step was profiled or planned, no profile is left open,
            # no gradient was made
            assert (model.remat_fit.profiled_steps, model.remat_fit.planned_steps) == (0, 0)
            assert remat._plans.profiling() is None
            assert all(p.grad is None for p in model.parameters())
        with torch.no_grad():  # a compiled forward outside training runs as it is
            assert compiled(batch(5)).item() == pytest.approx(remat.unfit(model)(batch(5)).item(), rel=1e-6)


def test_a_model_compiled_before_fit_is_refused_at_its_first_step():
    with fit_loop.fitted(model_of_two_layers, None) as (model, _):
        model.compile(backend="aot_eager")
        remat.fit(model, "64 MiB")
        for step in (1, 2, 3):
            with pytest.raises(ValueError, match=REFUSED):
                model(batch(step)).backward()
        assert model.remat_fit.profiled_steps == 0
        # The fix it names for a compiled model without a plan: unfit, and the compiled step runs
        remat.unfit(model)
        model(batch(4)).backward()
        assert all(p.grad is not None for p in model.parameters())


def test_inductor_refuses_a_compiled_model_under_fit_or_inside_a_profile_before_its_forward():
    with fit_loop.fitted(model_of_two_layers, "64 MiB") as (model, _):
        compiled = torch.compile(model)
        for step in (1, 2):
            with pytest.raises(ValueError, match=REFUSED):
                compiled(batch(step))
        assert model.remat_fit.profiled_steps == 0 and all(p.grad is None for p in model.parameters())
        remat.unfit(model)
        with pytest.raises(ValueError, match=r"profile_regions: checkpoint 'layers.0' runs under torch.compile .* "
                                             r"so no profile can measure it and no plan can apply to it"):
            with remat.profile_regions():
                compiled(batch(3)).backward()
        assert all(p.grad is None for p in model.parameters())
        compiled(batch(4)).backward()  # outside the block the compiled step runs
        assert all(p.grad is not None for p in model.parameters())


class CompiledRegions(torch.nn.Module):
    """Two layers under remat.checkpoint whose regions run compiled modules: the eager model
    fit profiles and plans, compiled code inside each region."""

    def __init__(self, checkpointed=True):
        super().__init__()
        self.layers = torch.nn.ModuleList(fit_loop.Layer(HIDDEN) for _ in range(2))
        for layer in self.layers:
            for child in (layer.attn, layer.up, layer.down):
                child.compile(backend="aot_eager")
        self.checkpointed = checkpointed

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x) if self.checkpointed else layer(x)
        return x.square().mean()


def run(budget, checkpointed=True, steps=5):
    """Per step of an SGD loop (peak, gradients as bytes, plan decisions, predicted peak), and
    the fit state."""
    rows = []
    with fit_loop.fitted(lambda: CompiledRegions(checkpointed), budget) as (model, _):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(1, steps + 1):
            peak, grads = fit_loop.sgd_step(model, optimizer, batch(step))
            state = getattr(model, "remat_fit", None)
            rows.append((peak, grads, None if state is None or state.plan is None else dict(state.plan.decisions),
                         None if state is None else state.predicted_peak_bytes))
        return rows, fit_loop.unfit(model, batch(steps))


def test_the_fix_it_names_fits_the_eager_model_with_compiled_regions_within_the_budget_and_bitwise():
    plain, _ = run(None, checkpointed=False)
    _, state = run("1 GiB")
    profile = state.latest.planned
    least, everything = profile.least_peak_bytes(), profile.step_peak_bytes
    assert least < everything
    budget = (least + everything) // 2
    rows, _ = run(budget)
    assert rows[0][2] is None and all(row[2] is not None for row in rows[1:])  # profiled, then planned
    assert any(choice == "recompute" for choice in rows[1][2].values())
    for (peak, grads, plan, predicted), (_, plain_grads, _, _) in zip(rows, plain):
        assert grads == plain_grads  # bitwise those of the same compiled layers without checkpointing
        if plan is not None:
            assert peak <= budget and peak <= predicted, (peak, predicted, budget)
