#!/usr/bin/env python3
"""Step-peak budgets and tracking on a GPU under remat_alloc.install(), the checks CPU CI makes
only with tag_cpu_tensors(): plans chosen by predicted step peak (profile.plan(peak_bytes=)) at
five budgets, each step's measured peak (requested bytes, remat_alloc.memory_stats) within the
budget and at most 3% over the prediction, gradients bitwise those without checkpointing;
remat.fit keeping an AdamW loop whose sequence doubles within its budget; remat.track naming
every byte of a Hugging Face Llama step (when transformers imports). One line a check, a table
of budget / predicted / measured, exit 1 when any check fails.

    PYTHONPATH=build/python:allocator/python REMAT_ALLOC_LIBRARY=build/allocator/libremat_alloc.so \\
        python3 bench/gpu/peak_check.py
"""

import contextlib
import sys
import warnings

import torch

import remat_alloc

# --cpu: the same checks on small tensors on the host, counted inside tag_cpu_tensors(): a dry
# run of this script where there is no GPU.
DEVICE = "cpu" if "--cpu" in sys.argv[1:] else "cuda"
if DEVICE == "cuda":
    remat_alloc.install()
import remat  # noqa: E402

failures = []
SCALE = 1 if DEVICE == "cuda" else 8  # the host run's tensors are this many times narrower


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def check(ok, what):
    print(f"[{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        failures.append(what)


def measured_peak(step):
    synchronize()
    remat_alloc.reset_peak_stats(0)
    step()
    synchronize()
    return remat_alloc.memory_stats(0)["requested_bytes_peak"]


# --- the README's model, 1024 wide, 4 layers of two regions ---------------------------------------

WIDTH, ROWS = 1024 // SCALE, 4096 // SCALE


def layer(x):
    h = remat.region(lambda t: (t * 2).sin(), "attn")(x)
    return remat.region(lambda t: (t.repeat(1, 3) * 3).cos()[:, :WIDTH], "mlp")(h)


def model(x):
    for index in range(4):
        x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x)
    return x.sum()


def plain(x):
    for _ in range(4):
        h = (x * 2).sin()
        x = (h.repeat(1, 3) * 3).cos()[:, :WIDTH]
    return x.sum()


def check_plans_by_peak():
    torch.manual_seed(0)
    x = torch.randn(ROWS, WIDTH, device=DEVICE, requires_grad=True)
    plain(x).backward()
    reference = x.grad.clone()
    x.grad = None
    with remat.profile_regions() as profile:
        model(x).backward()
    timer = profile.timer
    check(profile.step_peak_bytes is not None and timer == ("cuda_events" if DEVICE == "cuda" else "thread_time"),
          f"the profile measured the step on {DEVICE} ({profile.step_peak_bytes} B peak, timer {timer})")

    def run(plan):
        x.grad = None
        with remat.use_plan(plan):
            model(x).backward()

    least, most = profile.least_peak_bytes(), profile.step_peak_bytes
    saved_all = profile.plan(peak_bytes=most)
    print(f"{'budget':>12} {'predicted':>12} {'measured':>12}  decisions")
    for budget in [least + (most - least) * i // 4 for i in range(5)]:
        plan = profile.plan(peak_bytes=budget)
        measured_peak(lambda: run(saved_all))
        measured = max(measured_peak(lambda: run(plan)), measured_peak(lambda: run(plan)))
        decisions = "".join(choice[0] for choice in plan.decisions.values())
        print(f"{budget:>12} {plan.peak_bytes:>12} {measured:>12}  {decisions}")
        check(measured <= budget and measured <= plan.peak_bytes * 1.03 and torch.equal(x.grad, reference),
              f"budget {budget}: measured {measured} within the budget and 3% of the prediction "
              f"{plan.peak_bytes}, gradients bitwise")


# --- remat.fit: an AdamW loop whose sequence doubles at step 5 ------------------------------------

HIDDEN = 256 // SCALE


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Linear(HIDDEN, HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        h = remat.region(lambda t: self.attn(t).sin() + t, "attn")(x)
        return remat.region(lambda t: self.down(self.up(t).cos()) + t, "mlp")(h)


class Model(torch.nn.Module):
    def __init__(self, checkpoints=True):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(4))
        self.checkpoints = checkpoints  # False: no checkpointing, every activation kept

    def forward(self, x):
        for index, each in enumerate(self.layers):
            x = remat.checkpoint(region_name=f"layers.{index}")(each)(x) if self.checkpoints else each(x)
        return x.square().mean()


def check_fit():
    def batch(step):
        sequence = 512 // SCALE * (2 if step >= 5 else 1)
        generator = torch.Generator(device=DEVICE).manual_seed(step)
        return torch.randn(16, sequence, HIDDEN, device=DEVICE, generator=generator)

    def loop(budget, reference=None):
        """Step peaks, each step's gradients (numpy copies, which no count sees; or, given
        `reference`, the copies of a run without checkpointing, whether each step's are bitwise
        those) and what fit said."""
        torch.manual_seed(0)
        net = Model(checkpoints=budget is not None).to(DEVICE)
        if budget is not None:
            net = remat.fit(net, budget=budget)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        peaks, grads = [], []
        with warnings.catch_warnings(record=True) as told:
            warnings.simplefilter("always")
            for step in range(8):
                x = batch(step)

                def train():
                    optimizer.zero_grad(set_to_none=True)
                    net(x).backward()
                    optimizer.step()

                peaks.append(measured_peak(train))
                # Outside the measured step, as numpy arrays: the --cpu run counts host tensors, and
                # copies kept over the steps would raise every later step's peak
                if reference is None:
                    grads.append([p.grad.cpu().numpy().copy() for p in net.parameters()])
                else:
                    grads.append(all((p.grad.cpu().numpy() == want).all() for p, want in zip(net.parameters(),
                                                                                             reference[step])))
        return peaks, grads, [str(w.message) for w in told]

    free_peaks, free_grads, _ = loop(None)
    print(f"without checkpointing: step peaks {free_peaks}")
    budget = free_peaks[-1] * 9 // 10  # the short steps fit whole, the long ones must recompute
    check(max(free_peaks[:5]) <= budget < free_peaks[-1],
          f"fit: the budget {budget} B is above the short steps' peaks without checkpointing and below the long ones'")
    try:
        peaks, bitwise, told = loop(budget, free_grads)
    except ValueError as error:
        check(False, f"fit: refused a budget of {budget} B that saving everything stays under at the short "
                     f"sequence: {error}")
        return
    print(f"fit budget {budget}: step peaks {peaks}")
    check(max(peaks[1:]) <= budget, f"fit: every step after the profiled one within {budget} B "
                                    f"(highest {max(peaks[1:])})")
    check(all(bitwise), f"fit: gradients bitwise those of the loop without checkpointing, every step ({bitwise})")
    check(len(told) == 1, f"fit: told once about the longer sequence ({len(told)} warnings: {told[:2]})")


# --- remat.track on a Hugging Face Llama ----------------------------------------------------------

def check_track():
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:
        print(f"[skipped] track: transformers does not import ({error})")
        return
    config = LlamaConfig(hidden_size=512 // SCALE, num_hidden_layers=4, num_attention_heads=8 if SCALE == 1 else 4,
                         num_key_value_heads=4 if SCALE == 1 else 2, vocab_size=4096 // SCALE,
                         intermediate_size=1376 // SCALE, max_position_embeddings=1024, use_cache=False)
    torch.manual_seed(0)
    net = LlamaForCausalLM(config).to(DEVICE).train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    ids = torch.randint(0, 4096 // SCALE, (4, 512 // SCALE), device=DEVICE)

    def train():
        optimizer.zero_grad(set_to_none=True)
        net(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    with remat.track(net, optimizer):
        train()
        synchronize()
        remat_alloc.reset_peak_stats(0)
        train()
        synchronize()
        at_peak = remat_alloc.category_bytes(0, at_peak=True)
    total = sum(at_peak.values())
    print("track: bytes per category at the step's peak:", at_peak)
    check(at_peak["none"] <= 0.01 * total, f"track: {at_peak['none']} of {total} B at the peak without a category")
    parameters = sum(p.untyped_storage().nbytes() for p in net.parameters())
    check(abs(at_peak["parameter"] - parameters) <= 0.01 * parameters,
          f"track: parameters {at_peak['parameter']} B against {parameters} B of storage")
    check(at_peak["optimizer_state"] >= 2 * parameters * 0.99,
          f"track: optimizer state {at_peak['optimizer_state']} B, AdamW's two moments at least")


with contextlib.nullcontext() if DEVICE == "cuda" else remat.tag_cpu_tensors():
    check_plans_by_peak()
    check_fit()
    check_track()
print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
sys.exit(1 if failures else 0)
