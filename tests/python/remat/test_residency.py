"""What a checkpoint keeps resident after forward, in exact bytes counted by the tagging
allocator (shared/DESIGN.md's residency table), and that it all goes after backward.

CPU tensors carry region tags only while remat.tag_cpu_tensors() is in force, so each test
allocates inside it. Regions A and B multiply by 0-dim float32 tensors made at import
(untagged) rather than by Python floats: PyTorch turns a Python float into an 8-byte double
tensor that autograd saves without calling any saved-tensor hook, so it would stay with the
graph, tagged with its region, whatever the region's policy (8 bytes more per region)."""

import pytest
import torch

import remat
import remat_alloc
from remat._plans import live_checkpoint_bytes

N = 1000  # elements per tensor
FLOAT = 4  # bytes per float32 element
TWO = torch.tensor(2.0)
THREE = torch.tensor(3.0)


class Chain:
    """A: p = exp(x) (autograd saves p), y = 3p.  B: q = exp(y), z = 3q.  C: sum(3z)."""

    def __init__(self, name, a_saves, b_saves):
        self.name = name
        self.a_saves = a_saves
        self.b_saves = b_saves
        self.runs = {"A": 0, "B": 0, "C": 0}

    def _a(self, t):
        self.runs["A"] += 1
        return t.exp() * THREE

    def _b(self, t):
        self.runs["B"] += 1
        return t.exp() * THREE

    def _c(self, t):
        self.runs["C"] += 1
        return (t * 3.0).sum()  # a Python float: mul saves no tensor through hooks, so recompute never reaches C

    def body(self, x):
        y = remat.region(self._a, "A", recompute=not self.a_saves)(x)
        z = remat.region(self._b, "B", recompute=not self.b_saves)(y)
        return remat.region(self._c, "C")(z)

    def forward(self, x):
        return remat.checkpoint(region_name=self.name)(self.body)(x)

    def resident_bytes(self):
        return remat.live_bytes("input") + remat.live_bytes(self.name + "::A") + remat.live_bytes(self.name + "::B")


def run_with_fresh_input(chain, w):
    """Runs the chain on x = 2w, tagged "input", that only the checkpoint can keep alive."""
    with remat_alloc.region("input"):
        x = w * TWO
    return chain.forward(x)


def reference_grad(w):
    w_ref = w.detach().clone().requires_grad_(True)
    (((w_ref * TWO).exp() * THREE).exp() * THREE * 3.0).sum().backward()
    return w_ref.grad


@pytest.fixture
def tagged():
    with remat.tag_cpu_tensors():
        yield


# shared/DESIGN.md: save/save keeps y, z, p, q; save/recompute keeps y, p and recreates z, q;
# recompute/save keeps x, z, q and recreates y, p; recompute/recompute keeps x only.
TABLE = [
    pytest.param(True, True, 4, 1, 1, id="save-save"),
    pytest.param(True, False, 2, 1, 2, id="save-recompute"),
    pytest.param(False, True, 3, 2, 1, id="recompute-save"),
    pytest.param(False, False, 1, 2, 2, id="recompute-recompute"),
]


@pytest.mark.parametrize("a_saves, b_saves, resident_tensors, a_runs, b_runs", TABLE)
def test_resident_bytes_and_recomputed_regions_match_the_table(tagged, a_saves, b_saves, resident_tensors, a_runs,
                                                               b_runs):
    w = (torch.rand(N) * 0.1).requires_grad_(True)
    chain = Chain(f"residency.{int(a_saves)}{int(b_saves)}", a_saves, b_saves)
    loss = run_with_fresh_input(chain, w)
    assert chain.resident_bytes() == resident_tensors * N * FLOAT
    loss.backward()
    assert chain.runs == {"A": a_runs, "B": b_runs, "C": 1}  # recompute stops before C: nothing after B is needed
    assert torch.equal(w.grad, reference_grad(w))
    del loss
    assert remat.live_bytes(chain.name) == 0
    assert remat.live_bytes("input") == 0


def test_inputs_of_a_checkpoint_that_starts_saving_are_dropped_from_its_next_call(tagged):
    # A checkpoint whose last call ran no save region keeps every input without watching which
    # are read. When it runs a save region again (A saved, B recomputed), that call still keeps
    # them; the next one drops an input that only save regions read, as the table says.
    w = (torch.rand(N) * 0.1).requires_grad_(True)
    chain = Chain("residency.starts-saving", False, False)
    x_bytes = N * FLOAT
    calls = [
        (False, x_bytes),  # recompute/recompute: x
        (True, 2 * N * FLOAT + x_bytes),  # save/recompute: y, p, and x kept as before
        (True, 2 * N * FLOAT),  # save/recompute: y, p
    ]
    for saves, expected in calls:
        chain.a_saves = saves
        loss = run_with_fresh_input(chain, w)
        assert chain.resident_bytes() == expected, "save/recompute" if saves else "recompute/recompute"
        w.grad = None
        loss.backward()
        assert torch.equal(w.grad, reference_grad(w))
        del loss
        assert remat.live_bytes("input") == 0


def test_save_region_keeps_exactly_what_autograd_saves_in_it(tagged):
    # sin saves its input (the region's input is not tagged with the region) and cos saves sin's
    # result: 1 tensor of N floats in the region; the output is persisted only when asked.
    x = torch.rand(N, requires_grad=True)

    def body(t):
        h = remat.region(lambda u: u.sin().cos(), "kept", recompute=False)(t)
        return h.sum()

    loss = remat.checkpoint(region_name="residency.kept")(body)(x)
    assert remat.live_bytes("residency.kept::kept") == N * FLOAT
    loss.backward()
    assert torch.allclose(x.grad, -x.detach().sin().sin() * x.detach().cos())
    del loss
    assert remat.live_bytes("residency.kept") == 0


def test_recompute_needs_tensor_persists_a_save_regions_output(tagged):
    x = torch.rand(N, requires_grad=True)

    def body(t, mark):
        h = remat.region(lambda u: u * THREE, "scaled", recompute=False)(t)  # saves nothing tagged
        if mark:
            remat.recompute_needs_tensor(h)
        return h.sum()

    unmarked = remat.checkpoint(region_name="residency.unmarked")(body)(x, False)
    assert remat.live_bytes("residency.unmarked::scaled") == 0
    marked = remat.checkpoint(region_name="residency.marked")(body)(x, True)
    assert remat.live_bytes("residency.marked::scaled") == N * FLOAT
    (unmarked + marked).backward()
    assert torch.equal(x.grad, torch.full((N,), 6.0))


def test_live_bytes_return_to_zero_after_backward_every_iteration(tagged):
    w1 = torch.randn(16, 16, requires_grad=True)
    w2 = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(4, 16, requires_grad=True)

    def body(t):
        y = remat.region(lambda u: torch.tanh(u @ w1), "attention", recompute=False)(t)
        return remat.region(lambda u: torch.tanh(u @ w2), "mlp")(y)

    for i in range(3):
        out = remat.checkpoint(region_name="residency.leak")(body)(x)
        assert remat.live_bytes("residency.leak::attention") == 4 * 16 * FLOAT, f"iteration {i}"  # tanh's result
        out.sum().backward()
        del out
        assert remat.live_bytes("residency.leak") == 0, f"iteration {i}"


def test_live_bytes_prefix_covers_nested_regions_by_whole_components(tagged):
    with remat_alloc.region("lb.0"):
        a = torch.empty(10)
        with remat_alloc.region("attention"):
            b = torch.empty(20)
            assert remat.live_bytes("lb.0") == 30 * FLOAT
            assert remat.live_bytes("lb.0::attention") == 20 * FLOAT
            assert remat.live_bytes("lb") == 30 * FLOAT  # "." separates components, as in module paths
            assert remat.live_bytes("l") == 0
    with remat_alloc.region("lb.1"):
        c = torch.empty(5)
    with remat_alloc.region("lb.10"):
        d = torch.empty(7)
    assert remat.live_bytes("lb.1") == 5 * FLOAT  # not lb.10
    assert remat.live_bytes("lb") == 42 * FLOAT
    del a, b, c, d
    assert remat.live_bytes("lb") == 0


def test_live_bytes_of_checkpoints_named_as_module_paths_sum_under_their_parent():
    x = torch.rand(64, requires_grad=True)
    with remat.tag_cpu_tensors():
        h = x
        for i in range(4):
            h = remat.checkpoint(region_name=f"layers.{i}")(
                lambda t: remat.region(lambda u: u.exp(), "attention", recompute=False)(t))(h)
        per_layer = remat.live_bytes("layers.0")
        assert per_layer > 0
        assert remat.live_bytes("layers") == sum(remat.live_bytes(f"layers.{i}") for i in range(4))
        assert remat.live_bytes("layers") >= 4 * 64 * FLOAT
        h.sum().backward()


def test_tag_cpu_tensors_tags_only_while_in_force_and_frees_through_it_afterwards():
    with remat.tag_cpu_tensors():
        with remat_alloc.region("guarded"):
            tagged = torch.empty(100)
        assert remat.live_bytes("guarded") == 100 * FLOAT
    with remat_alloc.region("guarded"):
        untagged = torch.empty(100)  # PyTorch's own allocator: not counted
    assert remat.live_bytes("guarded") == 100 * FLOAT
    del tagged  # freed through the tagging allocator even after the guard
    assert remat.live_bytes("guarded") == 0
    assert untagged.numel() == 100


def residual_step(weights, recomputes, checkpointed):
    """(x, the output) of two layers of a decoder layer's shape, each a checkpoint where
    `checkpointed`: a norm, attention (a matmul and dropout), the residual sum made by code between
    regions, a second norm that saves that sum, the MLP, the second residual. Every region saved."""
    def rms(t):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    def layer(h):
        if remat.is_recomputing():
            recomputes.append(h.shape)
        n = remat.region(rms, "input_layernorm", recompute=False)(h)
        a = remat.region(lambda t: torch.nn.functional.dropout(t @ weights[0], 0.25), "self_attn", recompute=False)(n)
        r = h + a
        m = remat.region(rms, "post_attention_layernorm", recompute=False)(r)
        return r + remat.region(lambda t: (t @ weights[1]).sin(), "mlp", recompute=False)(m)

    torch.manual_seed(0)
    x = torch.randn(4, 64, requires_grad=True)
    torch.manual_seed(1)  # the dropout masks
    h = x * 1.0
    for index in range(2):
        h = remat.checkpoint(region_name=f"residual.{index}")(layer)(h) if checkpointed else layer(h)
    return x, h


def test_an_all_saved_residual_layer_keeps_what_autograd_keeps_and_recomputes_nothing():
    # Each layer's second norm saves the residual sum, made between regions. With every region
    # saved the checkpoint keeps that sum (not attention's output, to make it again), and no input
    # or output nothing reads again: it keeps what autograd keeps without it, and backward runs no
    # recompute; the gradients, dropout's included, are bitwise those without checkpointing.
    torch.manual_seed(2)
    weights = [torch.randn(64, 64, requires_grad=True) for _ in range(2)]
    recomputes = []
    saved = {}  # what autograd saves without checkpoints, parameters left out, each storage once

    def pack(t):
        if not (t.is_leaf and t.requires_grad):
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x_plain, out_plain = residual_step(weights, recomputes, checkpointed=False)
    expected = torch.autograd.grad(out_plain.sum(), [x_plain, *weights])
    autograd_bytes = sum(saved.values())
    del out_plain

    before = live_checkpoint_bytes()  # what checkpoints of earlier tests in this process still keep
    x, out = residual_step(weights, recomputes, checkpointed=True)
    kept = live_checkpoint_bytes() - before
    got = torch.autograd.grad(out.sum(), [x, *weights])
    assert recomputes == []
    assert kept == autograd_bytes, (kept, autograd_bytes)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
