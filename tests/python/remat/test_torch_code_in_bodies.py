"""Code written for torch.utils.checkpoint and torch_remat, run under remat: bodies that catch
exceptions (recompute's early stop must pass their handlers), autograd inside a body's forward,
torch_remat's keyword form of region, and torch.utils.checkpoint's options handed to `.call`
by integrations (checkpoint_wrapper, Hugging Face's gradient_checkpointing_kwargs)."""

import functools

import pytest
import torch
import torch.utils.checkpoint

import remat


def grads_of(fn, *params):
    torch.manual_seed(1)
    x = torch.randn(4, 8, requires_grad=True)
    for p in params:
        p.grad = None
    fn(x).sum().backward()
    return [x.grad.clone()] + [p.grad.clone() for p in params]


def assert_bitwise(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


torch.manual_seed(0)
W = torch.randn(8, 8, requires_grad=True)
V = torch.randn(8, 8, requires_grad=True)


def test_the_early_stop_is_a_base_exception_not_a_runtime_error():
    assert issubclass(remat.RecomputeStopped, BaseException)
    assert not issubclass(remat.RecomputeStopped, Exception)


@pytest.mark.parametrize("caught", [RuntimeError, Exception])
def test_a_body_catching_errors_around_regions_lets_the_early_stop_pass(caught):
    fallbacks = []

    def body(x, region):
        h = region(lambda t: (t @ W).tanh(), "a", recompute=True)(x).sin()
        try:  # a kernel fallback: the fast path's errors take the slow one
            out = region(lambda t: (t @ V).cos(), "b", recompute=False)(h)
            out = region(lambda t: t.exp(), "c", recompute=True)(out)
        except caught:
            fallbacks.append(remat.is_recomputing())
            out = (h @ V).cos().exp()
        return out * 2

    expected = grads_of(lambda x: body(x, lambda f, name, recompute=True: f), W, V)
    got = grads_of(remat.checkpoint(region_name="k")(lambda x: body(x, remat.region)), W, V)
    assert fallbacks == []
    assert_bitwise(expected, got)


def test_a_body_that_swallows_the_early_stop_is_told_so():
    def body(x):
        h = (x @ W).tanh()
        try:
            out = h.exp().sin()  # recompute stops here: sin saves the last tensor backward needs
        except BaseException:
            out = h.exp().sin()  # goes on as if nothing happened, saving more
        return out * 2

    y = remat.checkpoint(region_name="k")(body)(torch.randn(4, 8, requires_grad=True))
    with pytest.raises(remat.RematError, match=r"^the body of checkpoint 'k' caught recompute's early stop "
                       r"\(remat\.RecomputeStopped, a BaseException, raised once every tensor backward needs "
                       r"exists\) and went on to save .*; let it propagate: where the body catches every "
                       r"exception, re-raise remat\.RecomputeStopped, a BaseException$"):
        y.sum().backward()


def gradient_penalty(x):
    h = (x @ W).tanh()
    g, = torch.autograd.grad(h.pow(2).sum(), x, create_graph=True)
    return h + g


def auxiliary_loss(x):
    h = (x @ W).tanh()
    (h.pow(2).sum() * 0.1).backward(retain_graph=True)
    return h * 2


@pytest.mark.parametrize("inner", [gradient_penalty, auxiliary_loss])
def test_autograd_inside_forward_through_dropped_tensors_names_the_cause(inner):
    x = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(remat.RematError, match=r"^checkpoint 'c': autograd ran backward through a tensor the "
                       r"checkpoint dropped while its forward was still running \(torch\.autograd\.grad or "
                       r"\.backward\(\) inside the body.*one save region \(remat\.region\(fn, name, "
                       r"recompute=False\)\), or take that gradient outside the checkpoint$"):
        remat.checkpoint(region_name="c")(inner)(x)
    W.grad = None


@pytest.mark.parametrize("inner", [gradient_penalty, auxiliary_loss])
def test_autograd_inside_forward_in_one_save_region_is_bitwise(inner):
    expected = grads_of(lambda x: inner(x).sin(), W)
    got = grads_of(remat.checkpoint(region_name="c")(
        lambda x: remat.region(inner, "inner", recompute=False)(x).sin()), W)
    assert_bitwise(expected, got)


def test_region_takes_torch_remats_keywords():
    def body(x):
        h = remat.region(function=lambda t: (t @ W).tanh(), name="a", recompute=False)(x)
        return remat.region(function=lambda t: t.sin(), name="b", recompute=True)(h)

    expected = grads_of(lambda x: (x @ W).tanh().sin(), W)
    with remat.collect_trace() as trace:
        got = grads_of(remat.checkpoint(region_name="c")(body), W)
    assert_bitwise(expected, got)
    assert "a" in trace.format() and "b" in trace.format()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).tanh()


def test_call_takes_torch_checkpoints_options_as_the_checkpoints():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

    torch.manual_seed(0)
    plain = torch.nn.Sequential(Block(), Block())
    wrapped = torch.nn.Sequential(Block(), Block())
    wrapped.load_state_dict(plain.state_dict())
    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                checkpoint_fn=remat.checkpoint(region_name="block").call, use_reentrant=False,
                                preserve_rng_state=False, determinism_check="default", early_stop=True, debug=False)
    apply_activation_checkpointing(wrapped, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, Block))
    assert_bitwise(grads_of(plain, *plain.parameters()), grads_of(wrapped, *wrapped.parameters()))


class DropoutBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x)).tanh()


def dropout_grads(checkpoint_fn=None, **options):
    """The gradients of two dropout blocks (seed 0 for the weights, 1 for the masks), each run
    through checkpoint_fn(block, x, **options) where given."""
    torch.manual_seed(0)
    blocks = [DropoutBlock(), DropoutBlock()]
    x = torch.rand(8, 16, requires_grad=True)
    torch.manual_seed(1)
    for block in blocks:
        x = block(x) if checkpoint_fn is None else checkpoint_fn(block, x, **options)
    x.sum().backward()
    return [p.grad for block in blocks for p in block.parameters()]


@pytest.mark.parametrize("options", [{}, {"preserve_rng_state": True}, {"use_reentrant": False}])
def test_call_preserves_the_rng_state_as_torch_checkpoint_does_unless_told_not_to(options):
    # torch.utils.checkpoint.checkpoint(fn, x) draws forward's dropout masks again in recompute,
    # and so does .call() in its place: the gradients are those without checkpointing
    plain = dropout_grads()
    assert_bitwise(plain, dropout_grads(torch.utils.checkpoint.checkpoint, use_reentrant=False))
    assert_bitwise(plain, dropout_grads(remat.checkpoint(region_name="block").call, **options))
    # preserve_rng_state=False, as torch's: recompute draws new masks
    unkept = dropout_grads(remat.checkpoint(region_name="block").call, preserve_rng_state=False)
    assert not all(torch.equal(a, b) for a, b in zip(plain, unkept))


def test_huggingface_gradient_checkpointing_through_call_keeps_dropouts_masks():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64, n_positions=16,
                                     resid_pdrop=0.2, attn_pdrop=0.2, embd_pdrop=0.0)

    def grads(checkpointed):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config).train()
        if checkpointed:
            model._set_gradient_checkpointing(True, gradient_checkpointing_func=remat.checkpoint(
                region_name="layer").call)
        ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
        torch.manual_seed(1)
        model(input_ids=ids, labels=ids).loss.backward()
        return [p.grad for p in model.parameters()]

    assert_bitwise(grads(False), grads(True))


def test_call_leaves_the_functions_own_keywords_to_it():
    seen = {}

    def fn(x, scale=1.0, **kwargs):
        seen.update(kwargs)
        return x * scale

    x = torch.rand(3, requires_grad=True)
    y = remat.checkpoint(region_name="c").call(fn, x, scale=2.0, use_reentrant=False, mask=None)
    assert seen == {"mask": None}
    assert torch.equal(y, x * 2.0)


@pytest.mark.parametrize("options, error, message", [
    ({"use_reentrant": True}, remat.RematError, "use_reentrant=True is not supported"),
    ({"preserve_rng_state": 1}, TypeError, "preserve_rng_state must be True or False"),
    ({"determinism_check": "strict"}, remat.RematError, "determinism_check='strict' is not supported"),
    ({"early_stop": False}, remat.RematError, "early_stop=False is not supported"),
    ({"debug": True}, remat.RematError, "debug is torch.utils.checkpoint's recompute log"),
    ({"context_fn": 3}, TypeError, "context_fn must be callable"),
])
def test_call_refuses_torch_checkpoints_options_as_checkpoint_does(options, error, message):
    called = []
    with pytest.raises(error, match="^checkpoint 'c': " + message):
        remat.checkpoint(region_name="c").call(lambda t: called.append(t) or t * 2, torch.rand(3), **options)
    assert called == []


def test_call_applies_a_context_fn():
    entered = []

    def context_fn():
        def scope(kind):
            class Scope:
                def __enter__(self):
                    entered.append(kind)

                def __exit__(self, *exc):
                    return False
            return Scope()
        return scope("forward"), scope("recompute")

    x = torch.rand(3, requires_grad=True)
    remat.checkpoint(region_name="c").call(lambda t: t.sin().sin(), x, context_fn=context_fn).sum().backward()
    assert entered == ["forward", "recompute"]
    with pytest.raises(remat.RematError, match="^checkpoint 'c': context_fn given to both"):
        remat.checkpoint(region_name="c", context_fn=context_fn).call(lambda t: t * 2, x, context_fn=context_fn)


def _layer_with_a_save_region(x):
    h = remat.region(lambda t: (t @ W).tanh(), "attn", recompute=False)(x)
    return remat.region(lambda t: (t @ V).sin() + t, "mlp")(h)


def test_a_checkpoint_inside_torch_checkpoint_runs_its_function_as_it_is_and_says_so():
    # timm's set_grad_checkpointing(True) around blocks a user checkpointed with remat: remat's
    # checkpoint kept its tensors through torch's checkpoint's hooks, and backward failed ("is nested
    # inside checkpoint" with a save region; under a plan, torch's count of saved tensors differed)
    plain = grads_of(_layer_with_a_save_region, W, V)
    inner = remat.checkpoint(region_name="inner_layer")(_layer_with_a_save_region)
    outer = functools.partial(torch.utils.checkpoint.checkpoint, inner, use_reentrant=False)
    with pytest.warns(UserWarning, match=r"checkpoint 'inner_layer' runs inside torch.utils.checkpoint .*: it runs "
                                         r"its function as it is there"):
        got = grads_of(outer, W, V)
    assert_bitwise(plain, got)
    # Under a plan it cannot carry out there: refused, naming what to turn off
    with remat.profile_regions() as profile:
        inner(torch.randn(4, 8)).sum().backward()
    with remat.use_plan(profile.plan(budget_bytes=profile.base_bytes), strict=False):
        with pytest.raises(remat.RematError, match=r"checkpoint 'inner_layer' runs inside torch.utils.checkpoint .*: "
                                                   r"a plan .* cannot save or recompute its regions there. Turn the "
                                                   r"outer checkpointing off \(timm: model.set_grad_checkpointing"):
            grads_of(outer, W, V)
