"""remat.CpuOffload on CPU, where the same path runs with synchronous copies into the host pool:
bitwise gradients (the checkpoint tests' block, prefetch 0-2, autocast, the pair and `with`
forms, PyTorch's own saves, a Hugging Face Llama in one line); what stays resident and why; the
bytes on the host tagged by region and phase `offloaded`; prefetch hits and misses by
checkpoint; nothing left on the host after backward over many steps or after forwards that
raised; bad arguments."""

import json

import pytest
import torch

import remat
import remat_alloc
from transformer_block import Block, D

LAYERS = 4


def layer(block, i):
    def body(x):
        y = remat.region(block.attention, "attention", recompute=False)(x)
        return block.mlp(y)

    return remat.checkpoint(region_name=f"layers.{i}")(body)


def run(block, x, hooks=None, autocast=False):
    """(output, {parameter index: gradient}, input gradient) of LAYERS checkpoints."""
    for p in block.parameters():
        p.grad = None
    x = x.detach().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        h = x
        for i in range(LAYERS):
            body = layer(block, i)
            if hooks is not None:
                body = remat.checkpoint(region_name=f"layers.{i}", saved_tensors_hooks=hooks)(
                    lambda t, b=block: b.mlp(remat.region(b.attention, "attention", recompute=False)(t)))
            h = body(h)
        loss = h.float().square().sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in block.parameters()], x.grad.clone()


def assert_same(expected, actual):
    assert torch.equal(expected[0], actual[0])
    for e, a in zip(expected[1], actual[1]):
        assert torch.equal(e, a)
    assert torch.equal(expected[2], actual[2])


@pytest.fixture
def x():
    return torch.randn(4, 8, D, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_gradients_are_bitwise_those_without_offload_and_each_checkpoint_misses_once_at_most(x, prefetch):
    block = Block()
    expected = run(block, x)
    off = remat.CpuOffload(prefetch=prefetch, min_bytes=0)
    assert_same(expected, run(block, x, hooks=(off.pack, off.unpack)))
    stats = off.stats()
    assert stats["offloaded_tensors"] > 0 and stats["resident_host_bytes"] == 0
    # The attention's normalized input is saved by the q, k and v projections: one copy holds it.
    assert stats["shared_tensors"] >= 2 * LAYERS
    unpacks = stats["prefetch_hits"] + stats["prefetch_misses"]
    assert unpacks == stats["offloaded_tensors"] + stats["shared_tensors"]
    # Backward reaches the last checkpoint first: its first tensor is copied back on the spot;
    # without prefetch every checkpoint's first tensor is, with it only the last checkpoint's.
    assert stats["prefetch_misses"] == (LAYERS if prefetch == 0 else 1)
    assert stats["wait_bytes"] > 0


def test_what_is_offloaded_is_what_the_saved_tensors_report_bills_the_regions_without_offload(x):
    block = Block()

    def forward(hooks):
        h = x.detach().requires_grad_(True) * 1.0
        for i in range(LAYERS):
            h = remat.checkpoint(region_name=f"layers.{i}", saved_tensors_hooks=hooks)(
                lambda t: block.mlp(remat.region(block.attention, "attention", recompute=False)(t)))(h)
        return h.square().sum()

    kept = remat.saved_tensors_report(forward(None))
    off = remat.CpuOffload(min_bytes=0)
    loss = forward((off.pack, off.unpack))
    # Each storage once, parameters left out, as the report bills them.
    assert off.stats()["offloaded_bytes"] == kept.region_bytes > 0
    assert off.stats()["resident_host_bytes"] == kept.region_bytes
    loss.backward()


def test_the_with_form_is_the_pair_form_and_keeps_parameters_where_they_are(x):
    block = Block()
    expected = run(block, x)
    pair, scoped = remat.CpuOffload(min_bytes=0), remat.CpuOffload(min_bytes=0)
    assert_same(expected, run(block, x, hooks=(pair.pack, pair.unpack)))
    with scoped:
        assert_same(expected, run(block, x))
    a, b = pair.stats(), scoped.stats()
    block_form = remat.CpuOffload(min_bytes=0)
    with remat.saved_tensors_hooks(block_form.pack, block_form.unpack):
        assert_same(expected, run(block, x))
    assert block_form.stats()["offloaded_bytes"] == b["offloaded_bytes"]
    # The with block also holds what PyTorch saves outside the checkpoints: square()'s input.
    assert (b["offloaded_tensors"], b["offloaded_bytes"]) == (a["offloaded_tensors"] + 1,
                                                              a["offloaded_bytes"] + x.numel() * 4)
    # The attention weights its save region saves stay with the model; so does the leaf input.
    assert b["kept_resident_reasons"] == {"a parameter or a view of one": b["kept_resident_tensors"]}
    assert b["kept_resident_tensors"] >= 4 * LAYERS


def test_under_bf16_autocast_gradients_are_bitwise_those_without_offload(x):
    block = Block()
    expected = run(block, x, autocast=True)
    off = remat.CpuOffload(min_bytes=0)
    assert_same(expected, run(block, x, hooks=(off.pack, off.unpack), autocast=True))
    assert off.stats()["offloaded_tensors"] > 0


def test_outside_checkpoints_it_holds_pytorchs_own_saves(x):
    block = Block()

    def plain():
        for p in block.parameters():
            p.grad = None
        loss = block.mlp(block.attention(x)).square().sum()
        loss.backward()
        return [p.grad.clone() for p in block.parameters()]

    expected = plain()
    off = remat.CpuOffload(min_bytes=0)
    with off:
        actual = plain()
    for e, a in zip(expected, actual):
        assert torch.equal(e, a)
    stats = off.stats()
    assert stats["offloaded_tensors"] > 0 and stats["resident_host_bytes"] == 0
    assert stats["kept_resident_reasons"].get("a parameter or a view of one", 0) > 0


def offloaded_regions(tmp_path):
    """{region: requested bytes} live in phase `offloaded`, from a snapshot."""
    remat_alloc.dump_snapshot(str(tmp_path / "snapshot.json"))
    snapshot = json.loads((tmp_path / "snapshot.json").read_text())
    regions = {}
    for stat in snapshot["tag_stats"]:
        tag = snapshot["tags"][stat["tag"]]
        if tag["phase"] == "offloaded" and stat["requested_bytes"]["current"]:
            name = snapshot["names"][tag["region"]]
            regions[name] = regions.get(name, 0) + stat["requested_bytes"]["current"]
    return regions


def test_host_bytes_are_tagged_by_region_and_phase_offloaded_until_backward(x, tmp_path):
    block = Block()
    off = remat.CpuOffload(min_bytes=0)
    h = x.detach().requires_grad_(True)
    with off:
        for i in range(LAYERS):
            h = layer(block, i)(h)
    resident = off.stats()["resident_host_bytes"]
    assert resident == off.stats()["offloaded_bytes"] > 0
    assert remat.live_bytes("layers") == resident
    offloaded = offloaded_regions(tmp_path)
    assert sum(offloaded.values()) == resident
    # Recompute starts from the saved attention output, so what is kept is the save region's.
    assert set(offloaded) == {f"layers.{i}::attention" for i in range(LAYERS)}
    h.square().sum().backward()
    assert off.stats()["resident_host_bytes"] == 0 and remat.live_bytes("layers") == 0


def test_nothing_stays_on_the_host_over_a_thousand_steps(x):
    block = Block()
    off = remat.CpuOffload(min_bytes=0)
    for step in range(1000):
        run(block, x, hooks=(off.pack, off.unpack))
        assert off.stats()["resident_host_bytes"] == 0, f"step {step}"
    stats = off.stats()
    assert stats["peak_host_bytes"] == stats["offloaded_bytes"]  # one step's worth, never more
    assert remat.live_bytes("layers") == 0


def test_a_forward_that_raises_gives_its_host_buffers_back(x):
    block = Block()
    off = remat.CpuOffload(min_bytes=0)

    def failing(t):
        remat.region(block.attention, "attention", recompute=False)(t)
        raise RuntimeError("boom")

    for _ in range(200):
        h = x.detach().requires_grad_(True)
        with pytest.raises(RuntimeError, match="boom"):
            with off:
                h = layer(block, 0)(h)
                remat.checkpoint(region_name="layers.1")(failing)(h)
        del h
    assert off.stats()["resident_host_bytes"] == 0
    assert remat.live_bytes("layers") == 0


def test_tensors_that_gain_nothing_stay_resident_and_are_counted():
    off = remat.CpuOffload(min_bytes=1024)
    small = torch.randn(4)
    sparse = torch.randn(8, 8).to_sparse()
    overlapping = torch.randn(8).expand(8, 8)
    with off:
        for t in (small, sparse, overlapping):
            payload = off.pack(t)
            assert off.unpack(payload) is t
    reasons = off.stats()["kept_resident_reasons"]
    assert reasons == {"under min_bytes": 1, "sparse or another layout": 1, "overlapping or not dense": 1}
    assert off.stats()["offloaded_tensors"] == 0


def test_a_payload_of_another_pair_is_refused():
    off = remat.CpuOffload()
    with pytest.raises(TypeError):
        off.unpack(torch.zeros(2))


def test_a_payload_of_another_offloader_is_refused_and_stays_counted_where_it_was_made():
    first, second = remat.CpuOffload(min_bytes=0), remat.CpuOffload(min_bytes=0)
    t = torch.randn(1024)
    payload = first.pack(t)
    with pytest.raises(RuntimeError, match="made by another CpuOffload's pack; unpack each payload with the "
                                           "offloader that packed it"):
        second.unpack(payload)
    assert second.stats()["prefetch_misses"] == 0 and first.stats()["resident_host_bytes"] == 4096
    assert torch.equal(first.unpack(payload), t)
    del payload
    assert first.stats()["resident_host_bytes"] == 0


@pytest.mark.parametrize("kwargs", [{"prefetch": -1}, {"prefetch": 1.5}, {"min_bytes": -1},
                                    {"max_inflight_bytes": 0}, {"prefetch": True}, {"prefetch": 2**64},
                                    {"min_bytes": 2**64}, {"max_inflight_bytes": 2**64}])
def test_bad_arguments_name_the_argument(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        remat.CpuOffload(**kwargs)


def test_under_torch_compile_the_pair_is_refused_with_a_clear_error(x):
    block = Block()
    off = remat.CpuOffload()

    @torch.compile(backend="aot_eager", fullgraph=True)
    def compiled(t):
        return remat.checkpoint(region_name="layers.0", saved_tensors_hooks=(off.pack, off.unpack))(block.mlp)(t)

    with pytest.raises(Exception, match="saved_tensors_hooks are not supported under"):
        compiled(x)


transformers = pytest.importorskip("transformers")


def test_hugging_face_llama_in_one_line_gives_the_same_gradients():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=128, intermediate_size=128, max_position_embeddings=64, use_cache=False)
    torch.manual_seed(0)
    reference, model = LlamaForCausalLM(config).train(), LlamaForCausalLM(config).train()
    model.load_state_dict(reference.state_dict())
    off = remat.CpuOffload(min_bytes=0)
    remat.wrap_decoder_layers(model, offload=off)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    for m in (reference, model):
        m.zero_grad(set_to_none=True)
        m(input_ids=ids, labels=ids).loss.backward()
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        assert torch.equal(p.grad, q.grad), name
    stats = off.stats()
    assert stats["offloaded_tensors"] > 0 and stats["resident_host_bytes"] == 0
    assert stats["prefetch_misses"] == 1
    with pytest.raises(TypeError, match="offload must be"):
        remat.wrap_decoder_layers(model, offload="yes")


def test_checkpoint_inputs_are_tagged_with_the_checkpoint_under_an_enclosing_region(x, tmp_path):
    block = Block()
    off = remat.CpuOffload(min_bytes=0)
    h = x.detach().requires_grad_(True)
    with remat_alloc.region("outer"), off:
        for i in range(3):
            h = remat.checkpoint(region_name=f"layers.{i}")(block.mlp)(h)  # no save region: the input is kept
    regions = offloaded_regions(tmp_path)
    assert regions == {f"outer::layers.{i}": x.numel() * 4 for i in (1, 2)}  # layer 0's input is a leaf
    h.sum().backward()
    assert offloaded_regions(tmp_path) == {}


@pytest.mark.parametrize("view", ["conj", "neg"])
def test_a_tensor_and_its_conjugate_or_negative_view_saved_together_keep_their_own_values(view):
    x = torch.randn(64, 64, dtype=torch.complex64, generator=torch.Generator().manual_seed(5), requires_grad=True)

    def loss_of(h):
        other = h.conj() if view == "conj" else torch._neg_view(h)
        return (h * other).real.sum()

    h = x * 1
    loss_of(h).backward()
    expected = x.grad.clone()
    x.grad = None
    off = remat.CpuOffload(min_bytes=0)
    with off:
        h = x * 1
        loss = loss_of(h)
    loss.backward()
    assert torch.equal(x.grad, expected)
    assert off.stats()["offloaded_tensors"] == 2 and off.stats()["shared_tensors"] == 0

    c = torch.randn(256, dtype=torch.complex64)
    other = c.conj() if view == "conj" else torch._neg_view(c)
    with off:
        first, second = off.pack(c), off.pack(other)
        assert torch.equal(off.unpack(second), other.resolve_conj().resolve_neg())
        assert torch.equal(off.unpack(first), c)


def test_a_conjugate_view_saved_inside_a_save_region_gives_autograds_gradient():
    x = torch.randn(64, 64, dtype=torch.complex64, generator=torch.Generator().manual_seed(6), requires_grad=True)

    def body(t):
        h = t * 1
        return remat.region(lambda u: (u * u.conj()).real, "product", recompute=False)(h).sum()

    (x * 1 * (x * 1).conj()).real.sum().backward()
    expected = x.grad.clone()
    for hooks in (None, "offload"):
        x.grad = None
        off = remat.CpuOffload(min_bytes=0)
        pair = (off.pack, off.unpack) if hooks else None
        remat.checkpoint(region_name="ckpt", saved_tensors_hooks=pair)(body)(x).backward()
        assert torch.equal(x.grad, expected), hooks


def test_a_tensor_changed_in_place_after_it_was_saved_is_refused_as_autograd_refuses():
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(8, 64, requires_grad=True)
    h = x * 1
    y = (h @ w).sum()
    h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()

    off = remat.CpuOffload(min_bytes=0)
    with off:
        h = x * 1
        y = (h @ w).sum()
    h.add_(1)
    with pytest.raises(RuntimeError, match=r"CpuOffload.unpack: a tensor saved for backward \(Float \[8, 64\]\) was "
                                           r"modified by an inplace operation after it was saved \(version 0, now 1\)"):
        y.backward()

    with off:  # a parameter stays resident, and is checked the same way
        y = (x @ w).sum()
    with torch.no_grad():
        w.add_(1)
    with pytest.raises(RuntimeError, match=r"\(Float \[64, 64\]\) was modified by an inplace operation"):
        y.backward()
