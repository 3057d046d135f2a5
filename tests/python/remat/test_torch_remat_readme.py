"""torch_remat's README examples as its README writes them, with only the import line changed
(`import remat` for `import torch_remat as remat`): the quick start, state hooks, is_recomputing,
and the three diagnostics."""

from contextvars import ContextVar

import pytest
import torch

import remat  # torch_remat's README: import torch_remat as remat


class Block(torch.nn.Module):
    """The README's block: attention and a mixture of experts saved, norms recomputed."""

    def __init__(self, width=16):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(width)
        self.attention = torch.nn.Linear(width, width)
        self.ffn_norm = torch.nn.LayerNorm(width)
        self.moe = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, width))

    def forward(self, hidden_states):
        x = self.attention_norm(hidden_states)
        attn = remat.region(
            self.attention,
            "attention",
            recompute=False,
        )(x)
        remat.recompute_needs_tensor(attn)
        hidden_states = hidden_states + attn

        x = self.ffn_norm(hidden_states)
        moe = remat.region(
            self.moe,
            "moe",
            recompute=False,
        )(x)
        remat.recompute_needs_tensor(moe)
        return hidden_states + moe


def gradients(module, x):
    return [p.grad.clone() for p in module.parameters()] + [x.grad.clone()]


def test_quick_start_gives_the_gradients_of_the_plain_block():
    torch.manual_seed(0)
    block = Block()
    hidden_states = torch.rand(4, 16, requires_grad=True)

    output = remat.checkpoint(region_name="layers.0")(block)(hidden_states)

    output.pow(2).sum().backward()
    checkpointed = gradients(block, hidden_states)
    block.zero_grad()
    hidden_states.grad = None
    block(hidden_states).pow(2).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(checkpointed, gradients(block, hidden_states)))


def test_the_ambiguous_form_is_refused_as_the_readme_says():
    block = Block()
    with pytest.raises(TypeError, match=r"^remat.checkpoint\(fn\) is not supported: it reads as "
                                        r"torch.utils.checkpoint.checkpoint"):
        remat.checkpoint(block)(torch.rand(4, 16))
    with pytest.raises(TypeError, match=r"^remat.checkpoint\(fn, \*args\) is not supported"):
        remat.checkpoint(block, torch.rand(4, 16))


rng_counter = ContextVar("rng_counter", default=0)


class CpuRNGStateHook:
    """The README's CudaRNGStateHook, for the CPU generator: a plain class, not a subclass."""

    def snapshot(self):
        return torch.get_rng_state(), rng_counter.get()

    def restore(self, state):
        cpu_rng_state, counter = state
        torch.set_rng_state(cpu_rng_state)
        rng_counter.set(counter)


class CudaRNGStateHook:
    def __init__(self, device):
        self.device = device

    def snapshot(self):
        return torch.cuda.get_rng_state(self.device), rng_counter.get()

    def restore(self, state):
        cuda_rng_state, counter = state
        torch.cuda.set_rng_state(cuda_rng_state, self.device)
        rng_counter.set(counter)


def dropout_block(t):
    rng_counter.set(rng_counter.get() + 1)
    kept = remat.region(lambda u: torch.nn.functional.dropout(u.exp(), 0.5), "attention", recompute=False)(t)
    return remat.region(lambda u: torch.nn.functional.dropout(u.sin(), 0.5), "mlp")(kept)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the README's CudaRNGStateHook needs a CUDA device"))])
def test_state_hook_from_the_readme_gives_forwards_dropout_masks_in_recompute(device):
    hidden_states = torch.rand(256, device=device, requires_grad=True)
    rng_hook = CudaRNGStateHook(hidden_states.device) if device == "cuda" else CpuRNGStateHook()
    torch.manual_seed(3)
    output = remat.checkpoint(
        region_name="layers.0",
        recompute_state_hooks=(rng_hook,),
    )(dropout_block)(hidden_states)
    output.sum().backward()
    checkpointed = hidden_states.grad.clone()
    hidden_states.grad = None
    torch.manual_seed(3)
    dropout_block(hidden_states).sum().backward()
    assert torch.equal(checkpointed, hidden_states.grad)


def test_an_object_missing_restore_is_refused_when_the_checkpoint_is_made():
    class SnapshotOnly:
        def snapshot(self):
            return 0

    with pytest.raises(TypeError, match=r"^checkpoint: recompute_state_hooks: SnapshotOnly has no restore\(\) method"):
        remat.checkpoint(region_name="layers.0", recompute_state_hooks=(SnapshotOnly(),))


def test_is_recomputing_suppresses_forward_only_metrics():
    metrics = []

    def record_metric(value):
        metrics.append(value)

    def block(t):
        value = t.exp()
        if not remat.is_recomputing():
            record_metric(value)
        return value.sin().sum()

    remat.checkpoint(region_name="layers.0")(block)(torch.rand(3, requires_grad=True)).backward()
    assert len(metrics) == 1


def test_collect_trace_prints_the_configured_regions():
    def model(inputs):
        return remat.checkpoint(region_name="test_flag")(
            lambda t: remat.region(torch.cos, "cos")(remat.region(torch.sin, "sin", recompute=False)(t)))(inputs)

    inputs = torch.rand(3, requires_grad=True)
    with remat.collect_trace() as trace:
        output = model(inputs)
    print(trace.format())
    assert trace.format() == ("remat trace: 1 checkpoint(s), 2 region(s)\n"
                              "scope [test_flag]\n"
                              "  sin: save\n"
                              "  cos: recompute\n")
    output.sum().backward()


def test_print_current_memory_report_inside_a_checkpoint_forward(capsys):
    def block(t):
        h = remat.region(lambda u: u.exp() * 2.0, "attn", recompute=False)(t)  # exp saves its result
        out = remat.region(lambda u: u.sin(), "mlp")(h)  # reads attn's output again in recompute
        if not remat.is_recomputing():
            remat.print_current_memory_report()
        return out.sum()

    remat.checkpoint(region_name="layers.report")(block)(torch.rand(3, requires_grad=True)).backward()
    assert capsys.readouterr().out == ("layers.report: 24 B resident in 2 storage(s)\n"
                                       "layers.report::attn: 24 B\n"
                                       "  12 B  saved.0   (3,)  float32\n"
                                       "  12 B  output.0  (3,)  float32\n")


def test_print_saved_tensors_report_after_the_full_forward(capsys):
    x = torch.rand(3, 4, requires_grad=True)
    h = x.clone()  # x itself, a leaf that requires grad, is the caller's and not billed
    for i in range(2):
        h = remat.checkpoint(region_name=f"layer.{i}")(
            lambda t: remat.region(lambda u: u.sin().cos(), "sq", recompute=False)(t))(h)
    loss = h.tanh().sum()
    remat.print_saved_tensors_report(loss)
    printed = capsys.readouterr().out
    assert printed.startswith("saved for backward: 240 B resident -- 2 region(s) 192 B, outside regions 48 B\n")
    assert "  96 B  x2  layer.0-1  (2 storages each)\n" in printed
    assert "outside regions: 48 B in 1 storage\n       48 B  TanhBackward0 (x1)\n" in printed
    assert "[x2: layer.0-1]\nlayer.0: 96 B resident in 2 storage(s)\nlayer.0::sq: 96 B\n" in printed
    loss.backward()


def test_the_format_functions_end_without_a_newline_and_take_torch_remats_annotate(capsys):
    # As torch_remat's: format_* return the text, print_* add the one newline.
    x = torch.rand(3, 4, requires_grad=True)
    formatted = {}

    def body(t):
        if not remat.is_recomputing():
            formatted["current"] = remat.format_current_memory_report(annotate=None)
            remat.print_current_memory_report(annotate=None)
        return remat.region(lambda u: u.sin().cos(), "sq", recompute=False)(t)

    loss = remat.checkpoint(region_name="layer.0")(body)(x * 1).tanh().sum()
    printed_current = capsys.readouterr().out
    texts = [formatted["current"], remat.format_saved_tensors_report(loss),
             remat.format_saved_tensors_report(loss, annotate=None)]
    remat.print_saved_tensors_report(loss, annotate=None)
    printed_saved = capsys.readouterr().out
    assert all(text and not text.endswith("\n") for text in texts), texts
    assert printed_current == texts[0] + "\n" and printed_saved == texts[1] + "\n"
    for report in (remat.format_current_memory_report, remat.print_current_memory_report,
                   remat.format_saved_tensors_report, remat.print_saved_tensors_report,
                   remat.format_oom_saved_tensors_report):
        with pytest.raises(TypeError, match=f"{report.__name__}: annotate is not supported"):
            report(annotate=lambda t: "site")
    loss.backward()
