"""Training loops under remat.fit as the fit tests run them: a model made fresh once earlier
runs' models are freed (budgets are absolute bytes), every CPU tensor counted
(remat.tag_cpu_tensors(), so remat_alloc's peak is the step's), every warning recorded."""

import contextlib
import gc
import warnings

import torch

import remat
import remat_alloc


@contextlib.contextmanager
def fitted(make_model, budget):
    """Yields (model, warnings): make_model() (torch's seed 0) under remat.fit(budget), or as it
    is where budget is None, inside tag_cpu_tensors() with every warning recorded."""
    gc.collect()  # models of earlier runs (reference cycles) freed
    torch.manual_seed(0)
    with remat.tag_cpu_tensors(), warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        model = make_model()
        yield (model if budget is None else remat.fit(model, budget=budget)), told


def peak_of(step):
    """The allocated peak while step() runs (requested bytes, as remat.fit budgets them)."""
    remat_alloc.reset_peak_stats()
    step()
    return remat_alloc.memory_stats()["requested_bytes_peak"]


def sgd_step(model, optimizer, x):
    """One training step on x (zero_grad, forward, backward, optimizer step): its measured peak,
    and the gradients as bytes (not tensors, which would be counted in the steps after)."""
    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x).backward()
        optimizer.step()

    return peak_of(step), [p.grad.numpy().tobytes() for p in model.parameters()]


def train_rows(make_model, budget, make_optimizer, batch, steps=4):
    """Trains make_model() under remat.fit(budget) (as it is where budget is None) with sgd_step on
    batch(step), made inside the count, for `steps` steps: per step (its peak, fit's prediction for
    it or None, the gradients and the buffers as bytes), and the fit state (None where unfitted)."""
    with fitted(make_model, budget) as (model, _):
        optimizer = make_optimizer(model.parameters())
        rows = []
        for step in range(steps):
            x = batch(step)
            peak, grads = sgd_step(model, optimizer, x)
            state = getattr(model, "remat_fit", None)
            rows.append((peak, None if state is None else state.predicted_peak_bytes, grads,
                         [b.numpy().tobytes() for b in model.buffers()]))
        return rows, unfit(model, x)


def unfit(model, inputs):
    """Ends the last step with a forward on `inputs` outside training, and takes remat.fit off
    the model; returns its fit state (None: the model was not fitted)."""
    state = getattr(model, "remat_fit", None)
    if state is not None:
        with torch.no_grad():
            model(inputs)
        remat.unfit(model)
    return state


def messages(told, about):
    """The recorded warnings' messages that mention `about`."""
    return [str(w.message) for w in told if about in str(w.message)]


class Layer(torch.nn.Module):
    """A decoder-like layer of two regions, "attn" and "mlp", each with a residual; plain=True
    runs it without regions."""

    def __init__(self, width):
        super().__init__()
        self.attn = torch.nn.Linear(width, width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x, plain=False):
        attn = lambda t: self.attn(t).sin() + t
        mlp = lambda t: self.down(self.up(t).cos()) + t
        if plain:
            return mlp(attn(x))
        return remat.region(mlp, "mlp")(remat.region(attn, "attn")(x))


class CheckpointedLayers(torch.nn.Module):
    """Layers each run under remat.checkpoint (named "layers.<index>"), or plain (their
    forward(x, plain=True)) where checkpointed is False; the loss is the output's mean square."""

    def __init__(self, layers, checkpointed=True):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.checkpointed = checkpointed

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            if self.checkpointed:
                x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
            else:
                x = layer(x, plain=True)
        return x.square().mean()
