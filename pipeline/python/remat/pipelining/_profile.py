"""What one pipeline stage costs in memory, measured once in one process (no ranks launched).

profile_stage runs a copy of the stage's module on one microbatch the way PyTorch's pipeline
stage runs it (its forward, then PyTorch's own stage_backward, or stage_backward_input and
stage_backward_weight for the zero-bubble split), with every tensor allocated through remat's
tagging allocator (CPU tensors under remat.tag_cpu_tensors(), CUDA tensors once
remat_alloc.install() made it PyTorch's), and reads the allocator's figures around each piece:
bytes allocated before, after, and at the peak in between. Sizes are what the allocator hands
out, rounded as it rounds them, so they add up to what a rank's snapshot will show.

    profile = remat.pipelining.profile_stage(stage_module, x_microbatch, stage_index=1, num_stages=4,
                                             model="llama-8l", optimizer=lambda p: torch.optim.Adam(p))

The checkpointing or plan the module runs under is measured as it is: run the module inside
remat.checkpoint or remat.use_plan as the job will. remat.pipelining.predict(...) and
`remat-report predict` turn one profile per stage into each rank's predicted peak.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Optional

import remat_alloc
import torch

from .. import _pipeline_plan
from .._memory import tag_cpu_tensors
from ._torch_internals import stage_backward_functions

__all__ = ["profile_stage"]


def _tensors(value: Any) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


class _Meter:
    """Bytes allocated through the tagging allocator, now and at the peak since mark()."""

    def __init__(self, device: int):
        self.device = device

    def now(self) -> int:
        return int(remat_alloc.memory_stats(self.device)["allocated_bytes"])

    def mark(self) -> int:
        remat_alloc.reset_peak_stats(self.device)
        return self.now()

    def peak_above(self, start: int) -> int:
        return max(0, int(remat_alloc.memory_stats(self.device)["allocated_bytes_peak"]) - start)

    def allocated_for(self, make: Callable[[], Any]) -> int:
        """What the allocator hands out for the tensors make() creates (kept until measured)."""
        start = self.now()
        made = make()
        size = self.now() - start
        del made
        return size


def _device_index(device: torch.device) -> int:
    return device.index or 0 if device.type == "cuda" else 0


def profile_stage(module: torch.nn.Module, example_inputs: Any, *, stage_index: int, num_stages: int, model: str,
                  loss_fn: Optional[Callable] = None, target: Optional[torch.Tensor] = None,
                  optimizer: Optional[Callable] = None, split_backward: bool = True,
                  path: Optional[str] = None) -> dict:
    """Measures stage `stage_index` of `num_stages` on one microbatch; returns the stage_profile dump.

    module: the stage's module (a copy runs; the module itself is not changed).
    example_inputs: one microbatch's input to the stage (a tensor or a tuple of tensors), the
      same size the job's microbatches have.
    model: names the whole model, the same for each of its stages; predict refuses profiles of
      different models.
    loss_fn, target: the last stage's loss and one microbatch's target (required there).
    optimizer: builds the job's optimizer from parameters (lambda p: torch.optim.AdamW(p)); its
      state and its step's transient are measured. None: no optimizer state.
    split_backward: also measure the zero-bubble split (I then W) as PyTorch's stage runs it.
    path: also write the dump there (atomically).
    Returns the `stage-profile` dump (schemas/stage-profile.schema.json) as a dict.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"profile_stage: module must be a torch.nn.Module, got {type(module).__name__}")
    for name, value in (("stage_index", stage_index), ("num_stages", num_stages)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"profile_stage: {name} must be an int, got {type(value).__name__}")
    if not 0 <= stage_index < num_stages:
        raise ValueError(f"profile_stage: stage_index {stage_index} is not a stage of {num_stages}; give 0 to "
                         f"num_stages - 1")
    if not isinstance(model, str) or not model:
        raise ValueError("profile_stage: model must name the whole model (the same string for each of its stages)")
    is_last = stage_index == num_stages - 1
    if is_last and (loss_fn is None or target is None):
        raise ValueError("profile_stage: the last stage computes the loss; give loss_fn and one microbatch's target")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError("profile_stage: example_inputs must be a tensor or a tuple of tensors (one microbatch)")
    device = inputs[0].device
    with tag_cpu_tensors():
        figures = _measure(module, inputs, stage_index, is_last, loss_fn, target, optimizer, split_backward,
                           _Meter(_device_index(device)))
    text = _pipeline_plan.stage_profile_json(model, stage_index, num_stages, str(device), figures)
    if path is not None:
        from .._memory import write_dump
        write_dump(path, text)
    return json.loads(text)


def _measure(module, inputs, stage_index, is_last, loss_fn, target, optimizer, split_backward, meter) -> dict:
    stage_backward, stage_backward_input, stage_backward_weight = stage_backward_functions()
    first = stage_index == 0
    figures = {"optimizer_state": 0, "optimizer_transient": 0, "target_bytes": 0, "loss_bytes": 0,
               "input_grad_bytes": 0}
    start = meter.now()
    stage = copy.deepcopy(module)
    stage.train()
    figures["params"] = meter.now() - start
    params = [p for p in stage.parameters() if p.requires_grad]
    figures["grads"] = meter.allocated_for(lambda: [torch.empty_like(p) for p in params])
    figures["input_bytes"] = meter.allocated_for(lambda: [torch.empty_like(t) for t in inputs])
    if is_last:
        figures["target_bytes"] = meter.allocated_for(lambda: torch.empty_like(target))
        mb_target = target.detach().clone()

    def fresh_inputs():
        # What the stage reads: a received buffer (a leaf that requires grad) past stage 0.
        return tuple(t.detach().clone().requires_grad_(not first and t.is_floating_point()) for t in inputs)

    def forward(xs):
        output = stage(*xs)
        outputs = tuple(_tensors(output))
        loss = loss_fn(output, mb_target) if is_last else None
        return outputs, loss

    def received_grads(outputs):
        # The gradients the next stage sends: receive buffers, held apart from the stage's own memory.
        return None if is_last else [torch.ones_like(o) for o in outputs]

    def full_backward(outputs, loss, xs, grads):
        if is_last:
            return stage_backward(loss, None, list(xs))
        return stage_backward(outputs, grads, list(xs))

    # A first pass creates the parameter gradients, as a step's first backward does (its peak,
    # those gradients included, is first_backward_transient); the second runs as every later
    # microbatch does.
    for measured in (False, True):
        xs = fresh_inputs()
        base = meter.mark()
        outputs, loss = forward(xs)
        if measured:
            figures["forward_transient"] = meter.peak_above(base)
            figures["forward_kept"] = meter.now() - base
            figures["output_bytes"] = meter.allocated_for(lambda: [torch.empty_like(o) for o in outputs])
            if is_last:
                figures["loss_bytes"] = meter.allocated_for(lambda: torch.empty_like(loss))
        grads = received_grads(outputs)
        before = meter.mark()
        grads_input = full_backward(outputs, loss, xs, grads)
        if not measured:
            figures["first_backward_transient"] = meter.peak_above(before)  # it creates the gradients
        else:
            figures["backward_transient"] = meter.peak_above(before)
            if not first:
                figures["input_grad_bytes"] = meter.allocated_for(
                    lambda: [torch.empty_like(g) for g in grads_input if g is not None])
        del outputs, loss, grads_input, xs, grads

    figures["input_backward_kept"] = figures["forward_kept"]
    figures["input_backward_transient"] = figures["backward_transient"]
    figures["weight_backward_transient"] = 0
    if split_backward and not first:
        _measure_split(stage, forward, fresh_inputs, is_last, figures, meter, stage_backward_input,
                       stage_backward_weight)

    if optimizer is not None:
        built = optimizer(params)
        before = meter.now()
        built.step()  # the first step creates the state
        figures["optimizer_state"] = meter.now() - before
        before = meter.mark()
        built.step()
        figures["optimizer_transient"] = meter.peak_above(before)
        del built
    return figures


def _measure_split(stage, forward, fresh_inputs, is_last, figures, meter, backward_input, backward_weight) -> None:
    """I (input gradients, the graph kept for W) then W (weight gradients), as PyTorch's stage runs them."""
    xs = fresh_inputs()
    base = meter.now()
    outputs, loss = forward(xs)
    roots = [loss] if is_last else list(outputs)
    grads = None if is_last else [torch.ones_like(o) for o in outputs]
    received = meter.now() - base - figures["forward_kept"]  # the stand-in received gradients
    start = meter.mark()
    grads_input, param_groups = backward_input(
        roots, grads, list(xs), stage.parameters())
    figures["input_backward_transient"] = meter.peak_above(start)
    kept = meter.now() - base - received - figures["input_grad_bytes"]
    figures["input_backward_kept"] = max(0, kept)
    del grads_input
    start = meter.mark()
    backward_weight(stage.parameters(), param_groups)
    figures["weight_backward_transient"] = meter.peak_above(start)
