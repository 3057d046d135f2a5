"""remat.fit holds the model it fits without a reference cycle: once the user drops the model and
the optimizer over its parameters, the model and its parameters are freed by reference counting
alone, with the cyclic garbage collector off (a cycle kept them, and the device memory they hold,
until the collector ran). Checked after a profiled step, after a planned step, and while the
profile of the first step is still open."""

import gc
import weakref

import pytest
import torch

import remat
import remat_alloc

import fit_loop

HIDDEN, BATCH, SEQUENCE = 32, 4, 8


class Model(fit_loop.CheckpointedLayers):
    def __init__(self):
        super().__init__([fit_loop.Layer(HIDDEN) for _ in range(2)])


def batch(step):
    return torch.randn(BATCH, SEQUENCE, HIDDEN, generator=torch.Generator().manual_seed(step))


@pytest.fixture
def collector_off():
    # torch keeps the first optimizer a process makes in a cycle (once): made here, so that only
    # fit's references are in question
    torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.01)
    gc.collect()  # and earlier tests' garbage
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("steps, end_step", [(1, False), (1, True), (3, True), (3, False)])
def test_the_model_and_its_parameters_are_freed_without_the_garbage_collector(collector_off, steps, end_step):
    """`steps` training steps (the first profiled, later ones planned), the last one ended by a
    forward under no_grad or left open (its profile or its plan still in force), then the user's
    references dropped."""
    with remat.tag_cpu_tensors():
        start = remat_alloc.memory_stats()["requested_bytes"]
        model = Model()
        model = remat.fit(model, budget="1GiB")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for step in range(steps):
            optimizer.zero_grad(set_to_none=True)
            model(batch(step)).backward()
            optimizer.step()
        if end_step:
            with torch.no_grad():
                model(batch(steps))
        assert model.remat_fit.profiled_steps == 1 and model.remat_fit.planned_steps == steps - 1
        held = remat_alloc.memory_stats()["requested_bytes"]
        alive = [weakref.ref(model), weakref.ref(model.remat_fit)] + [weakref.ref(p) for p in model.parameters()]
        del model, optimizer
        assert [ref() is None for ref in alive] == [True] * len(alive)
        assert remat._plans.profiling() is None  # a profile still open is closed with its fit state
        # What they held on the device (CPU tensors counted) is given back: parameters, gradients,
        # the optimizer's momentum
        assert remat_alloc.memory_stats()["requested_bytes"] <= start < held


def test_a_fit_state_kept_after_unfit_holds_none_of_the_models_parameters(collector_off):
    """A loop that keeps model.remat_fit (to read its plan, say) after remat.unfit(model), then drops
    the model: the parameters, their gradients and the optimizer's momentum are freed all the same
    (the state lists the parameters while a step runs, and lets go of them when it ends)."""
    with remat.tag_cpu_tensors():
        start = remat_alloc.memory_stats()["requested_bytes"]
        model = remat.fit(Model(), budget="1GiB")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for step in range(3):
            optimizer.zero_grad(set_to_none=True)
            model(batch(step)).backward()
            optimizer.step()
        state = model.remat_fit
        remat.unfit(model)
        alive = [weakref.ref(p) for p in model.parameters()]
        del model, optimizer
        assert [ref() is None for ref in alive] == [True] * len(alive)
        assert remat_alloc.memory_stats()["requested_bytes"] <= start
        assert state.profiled_steps == 1 and state.planned_steps == 2
