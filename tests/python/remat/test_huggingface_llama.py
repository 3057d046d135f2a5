"""remat.wrap_decoder_layers on Hugging Face Llama: every decoder layer one checkpoint named after
its module path, attention a save region and the rest recomputed (or everything recomputed),
bitwise the loss and gradients of the uncheckpointed model under sdpa and eager attention and
with attention dropout; torch.distributed's checkpoint_wrapper with remat's checkpoint_fn; the
trace and the saved-tensors report; eval mode, no-grad, transformers' own enable/disable
switches, wrapping twice, and the errors a user meets first. A tiny random LlamaConfig: no
download."""

import warnings

import pytest
import torch

import remat

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (scripts/install-deps.sh installs it from PyPI)")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

LAYER_CHILDREN = ["input_layernorm", "self_attn", "post_attention_layernorm", "mlp"]  # in call order


def llama_config(attn_implementation="sdpa", layers=2, attention_dropout=0.0):
    config = LlamaConfig(hidden_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=128, intermediate_size=128, max_position_embeddings=64, use_cache=False,
                         attention_dropout=attention_dropout)
    config._attn_implementation = attn_implementation
    return config


def twin_models(config):
    """(reference, model): the same weights, both in training mode."""
    torch.manual_seed(0)
    reference = LlamaForCausalLM(config)
    model = LlamaForCausalLM(config)
    model.load_state_dict(reference.state_dict())
    assert model.config._attn_implementation == config._attn_implementation
    return reference.train(), model.train()


def input_ids():
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))


def train_step(model, ids, seed=None):
    """(loss, {parameter name: gradient}) of one forward and backward."""
    if seed is not None:
        torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {name.replace("._checkpoint_wrapped_module", ""): p.grad for name, p in model.named_parameters()}
    return loss.detach(), grads


def assert_bitwise_equal(expected, actual):
    expected_loss, expected_grads = expected
    actual_loss, actual_grads = actual
    assert torch.equal(expected_loss, actual_loss), f"loss {actual_loss.item()!r} != {expected_loss.item()!r}"
    assert actual_grads.keys() == expected_grads.keys()
    missing = [name for name, grad in actual_grads.items() if grad is None]
    assert not missing, f"no gradient for {missing}"
    differ = [name for name in expected_grads if not torch.equal(expected_grads[name], actual_grads[name])]
    assert not differ, f"gradients differ (not bitwise) for {differ}"


def decoder_layers(model):
    return list(model.model.layers)


class BodyCounter:
    """Counts how often each layer child's forward body runs, in forward and in recompute:
    installed as the child's instance forward before wrapping, so the region wraps it."""

    def __init__(self, model, children=("self_attn", "mlp")):
        self.forward = {}
        self.recompute = {}
        for index, layer in enumerate(decoder_layers(model)):
            for child_name in children:
                self._count(f"layers.{index}.{child_name}", getattr(layer, child_name))

    def _count(self, key, child):
        inner = child.forward
        self.forward[key] = self.recompute[key] = 0

        def forward(*args, **kwargs):
            counts = self.recompute if remat.is_recomputing() else self.forward
            counts[key] += 1
            return inner(*args, **kwargs)

        child.forward = forward


def regions_of(trace):
    return {scope.name: [(region.name, region.saved) for region in scope.regions] for scope in trace.scopes}


SAVE_ATTENTION = {"save": ("self_attn",), "saved": {"self_attn"}}
RECOMPUTE_ALL = {"save": (), "saved": set()}


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("plan", [SAVE_ATTENTION, RECOMPUTE_ALL], ids=["attention_saved", "all_recomputed"])
def test_every_decoder_layer_is_one_checkpoint_and_gradients_are_bitwise_exact(attn_implementation, plan):
    reference, model = twin_models(llama_config(attn_implementation))
    ids = input_ids()
    expected = train_step(reference, ids)
    counter = BodyCounter(model)
    assert remat.wrap_decoder_layers(model, save=plan["save"]) is model

    with remat.collect_trace() as trace:
        actual = train_step(model, ids)

    assert_bitwise_equal(expected, actual)
    layer_regions = [(child, child in plan["saved"]) for child in LAYER_CHILDREN]
    assert regions_of(trace) == {"model.layers.0": layer_regions, "model.layers.1": layer_regions}
    # A save region's body runs in forward only; a recompute region's again in backward.
    attention_recomputes = 0 if plan["saved"] else 1
    assert counter.forward == {key: 1 for key in counter.forward}
    assert counter.recompute == {"layers.0.self_attn": attention_recomputes, "layers.0.mlp": 1,
                                 "layers.1.self_attn": attention_recomputes, "layers.1.mlp": 1}


@pytest.mark.parametrize("plan", [SAVE_ATTENTION, RECOMPUTE_ALL], ids=["attention_saved", "all_recomputed"])
def test_attention_dropout_is_bitwise_the_uncheckpointed_models_with_the_cpu_rng_hook(plan):
    reference, model = twin_models(llama_config(attention_dropout=0.1))
    ids = input_ids()
    expected = train_step(reference, ids, seed=5)
    remat.wrap_decoder_layers(model, save=plan["save"], recompute_state_hooks=(remat.cpu_rng_state_hook(),))

    assert_bitwise_equal(expected, train_step(model, ids, seed=5))
    assert_bitwise_equal(expected, train_step(model, ids, seed=5))  # a second step draws the same masks again


@pytest.mark.parametrize("plan", [SAVE_ATTENTION, RECOMPUTE_ALL], ids=["attention_saved", "all_recomputed"])
def test_attention_dropout_is_bitwise_the_uncheckpointed_models_without_a_hook_as_with_transformers(plan):
    # transformers' own checkpointing preserves the RNG state; so does wrap_decoder_layers, or
    # recomputed attention would draw new dropout masks and give other gradients.
    reference, model = twin_models(llama_config(attention_dropout=0.3))
    ids = input_ids()
    expected = train_step(reference, ids, seed=5)
    remat.wrap_decoder_layers(model, save=plan["save"])

    assert_bitwise_equal(expected, train_step(model, ids, seed=5))
    after_step = torch.get_rng_state()
    torch.manual_seed(5)
    reference(input_ids=ids, labels=ids).loss.backward()
    assert torch.equal(after_step, torch.get_rng_state())  # recompute left the generator where the reference does


def test_checkpoint_wrapper_with_remat_checkpoint_fn_gives_bitwise_gradients():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper

    reference, model = twin_models(llama_config())
    ids = input_ids()
    expected = train_step(reference, ids)
    layers = model.model.layers
    for index, layer in enumerate(list(layers)):
        layers[index] = checkpoint_wrapper(layer, checkpoint_fn=remat.checkpoint(region_name=f"layers.{index}").call)
    assert all(isinstance(layer, CheckpointWrapper) for layer in layers)

    with remat.collect_trace() as trace:
        actual = train_step(model, ids)

    assert_bitwise_equal(expected, actual)
    assert regions_of(trace) == {"layers.0": [], "layers.1": []}
    with pytest.raises(ValueError, match="inside torch.distributed's checkpoint_wrapper"):
        remat.wrap_decoder_layers(model)


def test_saved_tensors_report_shows_every_layer_and_its_saved_attention():
    _, model = twin_models(llama_config())
    ids = input_ids()
    remat.wrap_decoder_layers(model)
    loss = model(input_ids=ids, labels=ids).loss

    text = remat.saved_tensors_report(loss).format()

    for layer in ("model.layers.0", "model.layers.1"):
        assert f"{layer}::self_attn" in text, text
    loss.backward()


def test_eval_mode_and_no_grad_run_the_layers_without_a_checkpoint():
    reference, model = twin_models(llama_config())
    ids = input_ids()
    remat.wrap_decoder_layers(model)
    with remat.collect_trace() as trace:
        with torch.no_grad():
            trained_no_grad = model(input_ids=ids).logits
        model.eval()
        evaluated = model(input_ids=ids).logits
    assert trace.scopes == []
    with torch.no_grad():
        assert torch.equal(trained_no_grad, reference(input_ids=ids).logits)
        assert torch.equal(evaluated, reference.eval()(input_ids=ids).logits)
    assert evaluated.requires_grad  # eval mode with grad on: autograd as usual, no checkpoint
    evaluated.sum().backward()


def _without_future_warnings(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing_* are deprecated aliases in 5.x
        return call()


def test_gradient_checkpointing_disable_turns_remat_off_and_wrapping_again_on():
    reference, model = twin_models(llama_config())
    ids = input_ids()
    expected = train_step(reference, ids)
    remat.wrap_decoder_layers(model)
    assert _without_future_warnings(lambda: model.is_gradient_checkpointing)

    _without_future_warnings(model.gradient_checkpointing_disable)
    assert not _without_future_warnings(lambda: model.is_gradient_checkpointing)
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert trace.scopes == []

    remat.wrap_decoder_layers(model)
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert list(regions_of(trace)) == ["model.layers.0", "model.layers.1"]


def test_gradient_checkpointing_enable_after_wrapping_keeps_remat_and_says_so_once():
    """transformers.Trainer(gradient_checkpointing=True) turns checkpointing on as training begins,
    after the user wrapped the model: that put torch.utils.checkpoint back, silently (and under
    budget= the first step was refused, naming no region). remat's checkpoints stay; said once."""
    reference, model = twin_models(llama_config())
    ids = input_ids()
    expected = train_step(reference, ids)
    remat.wrap_decoder_layers(model)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.activation_checkpointing_enable()
    said = [str(w.message) for w in told if "remat" in str(w.message)]
    assert len(said) == 1 and "remat's checkpoints stay" in said[0] and "unwrap_decoder_layers" in said[0], said
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert list(regions_of(trace)) == ["model.layers.0", "model.layers.1"]

    # Turned off, then on again: remat's checkpoints again
    model.activation_checkpointing_disable()
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert trace.scopes == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.activation_checkpointing_enable()
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert list(regions_of(trace)) == ["model.layers.0", "model.layers.1"]


def test_gradient_checkpointing_enable_after_unwrapping_puts_torch_checkpoint_back():
    reference, model = twin_models(llama_config())
    ids = input_ids()
    expected = train_step(reference, ids)
    remat.unwrap_decoder_layers(remat.wrap_decoder_layers(model))
    assert all("_set_gradient_checkpointing" not in vars(module) for module in model.modules())
    _without_future_warnings(model.gradient_checkpointing_enable)
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert trace.scopes == []  # torch.utils.checkpoint's; the regions call straight through


def test_wrapping_twice_replaces_the_first_wrapping_and_unwrap_restores_the_layers():
    reference, model = twin_models(llama_config())
    ids = input_ids()
    expected = train_step(reference, ids)
    layer = decoder_layers(model)[0]
    before = {name: dict(module.__dict__) for name, module in layer.named_modules()}

    remat.wrap_decoder_layers(model, save=("self_attn",))
    remat.wrap_decoder_layers(model, save=("mlp",), recompute=("self_attn",))
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    expected_regions = [("self_attn", False), ("mlp", True)]
    assert regions_of(trace) == {"model.layers.0": expected_regions, "model.layers.1": expected_regions}

    assert remat.unwrap_decoder_layers(model) is model
    after = {name: dict(module.__dict__) for name, module in layer.named_modules()}
    assert {name: sorted(d) for name, d in after.items()} == {name: sorted(d) for name, d in before.items()}
    assert layer.gradient_checkpointing is False
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert trace.scopes == []


def test_every_n_layers_checkpoints_every_nth_layer_only():
    reference, model = twin_models(llama_config(layers=4))
    ids = input_ids()
    expected = train_step(reference, ids)
    remat.wrap_decoder_layers(model, every_n_layers=2)
    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(model, ids))
    assert list(regions_of(trace)) == ["model.layers.0", "model.layers.2"]


class Block(torch.nn.Module):
    """A layer that is not a GradientCheckpointingLayer."""

    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Linear(8, 8)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))

    def forward(self, x, scale=None):
        x = x + self.attn(x).tanh()
        return x + self.mlp(x) * scale


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, scale=torch.full((8,), 0.5))
        return x.pow(2).sum()


def test_layers_of_a_module_list_named_layers_are_checkpointed_when_no_layer_is_transformers():
    torch.manual_seed(0)
    reference, model = Stack(), Stack()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(4, 8, requires_grad=True)
    reference(x).backward()
    expected = {name: p.grad for name, p in reference.named_parameters()}

    remat.wrap_decoder_layers(model, save=("attn",))
    with remat.collect_trace() as trace:
        model(x).backward()

    assert all(torch.equal(p.grad, expected[name]) for name, p in model.named_parameters())
    assert regions_of(trace) == {f"layers.{i}": [("attn", True), ("mlp", False)] for i in range(3)}


def test_a_model_without_decoder_layers_is_a_clear_error():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"found no decoder layers in Sequential: looked for modules that are "
                                         r"transformers\.modeling_layers\.GradientCheckpointingLayer .* and for an "
                                         r"nn\.ModuleList named 'layers'; pass layers="):
        remat.wrap_decoder_layers(model)


def test_a_save_name_no_layer_has_is_a_clear_error_and_changes_nothing():
    _, model = twin_models(llama_config())
    layer = decoder_layers(model)[0]
    before = dict(layer.__dict__)
    with pytest.raises(ValueError, match=r"save='attention' names no submodule of any decoder layer "
                                         r"\(LlamaDecoderLayer; LlamaDecoderLayer has self_attn, mlp, "):
        remat.wrap_decoder_layers(model, save=("attention",))
    assert layer.__dict__.keys() == before.keys()
    assert "forward" not in layer.self_attn.__dict__


@pytest.mark.parametrize("kwargs, message", [
    ({"save": ("mlp",), "recompute": ("mlp",)}, "'mlp' is in both save and recompute"),
    ({"save": ("self_attn", "self_attn.o_proj")}, "'self_attn.o_proj' is inside 'self_attn', and regions do not nest"),
    ({"save": (3,)}, "save must hold non-empty child names"),
    ({"every_n_layers": 0}, "every_n_layers must be a positive int, got 0"),
    ({"recompute_state_hooks": (object(),)}, "object has no snapshot"),
])
def test_bad_options_are_clear_errors(kwargs, message):
    _, model = twin_models(llama_config())
    with pytest.raises((ValueError, TypeError), match=message):
        remat.wrap_decoder_layers(model, **kwargs)
    assert "_gradient_checkpointing_func" not in decoder_layers(model)[0].__dict__


def test_a_deep_copy_of_a_wrapped_model_checkpoints_its_own_layers():
    import copy

    reference, model = twin_models(llama_config())
    ids = input_ids()
    expected = train_step(reference, ids)
    remat.wrap_decoder_layers(model)
    copied = copy.deepcopy(model)

    with remat.collect_trace() as trace:
        assert_bitwise_equal(expected, train_step(copied, ids))
    assert regions_of(trace) == {layer: [(child, child == "self_attn") for child in LAYER_CHILDREN]
                                 for layer in ("model.layers.0", "model.layers.1")}
    assert all(p.grad is None for p in model.parameters())  # the copy ran its own modules only
    remat.unwrap_decoder_layers(copied)
    assert "forward" not in decoder_layers(copied)[0].self_attn.__dict__
    assert "forward" in decoder_layers(model)[0].self_attn.__dict__
    # what wrapping set on the copy's layers is taken off them too (a bound method deepcopy copied twice)
    assert all("_gradient_checkpointing_func" not in layer.__dict__ for layer in decoder_layers(copied))
    assert "_gradient_checkpointing_func" in decoder_layers(model)[0].__dict__


def test_pickling_a_wrapped_model_is_refused_naming_state_dict_and_unwrap():
    import io
    import pickle

    _, model = twin_models(llama_config())
    remat.wrap_decoder_layers(model)
    for save in (pickle.dumps, lambda m: torch.save(m, io.BytesIO())):
        with pytest.raises(TypeError, match=r"remat.wrap_decoder_layers: a model whose layers it wrapped "
                                            r"\(model.layers.0\) cannot be pickled .*state_dict\(\), or call "
                                            r"remat.unwrap_decoder_layers\(model\)"):
            save(model)
    remat.unwrap_decoder_layers(model)
    restored = pickle.loads(pickle.dumps(model))
    ids = input_ids()
    with torch.no_grad():
        assert torch.equal(restored(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("compiled", ["decoder-layers", "whole-model"])
def test_compiled_llama_with_remat_layers_matches_the_uncompiled_uncheckpointed_model(compiled):
    """Each decoder layer compiled: one graph for all of them (each layer's own wrapper objects and
    its checkpoint's name, read while tracing, were guards that compiled a graph per layer, and
    past Dynamo's recompile limit of 8 the later layers ran eagerly)."""
    from torch._dynamo.utils import counters

    reference, model = twin_models(llama_config(layers=4))
    ids = input_ids()
    expected = train_step(reference, ids)
    remat.wrap_decoder_layers(model, save=("self_attn",))
    torch._dynamo.reset()
    counters.clear()
    try:
        if compiled == "decoder-layers":
            for layer in decoder_layers(model):
                layer.compile(backend="aot_eager")
            actual = train_step(model, ids)
            assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
        else:
            compiled_model = torch.compile(model, backend="aot_eager", fullgraph=True)  # no graph break
            model.zero_grad(set_to_none=True)
            loss = compiled_model(input_ids=ids, labels=ids).loss
            loss.backward()
            actual = loss.detach(), {name: p.grad for name, p in model.named_parameters()}
    finally:
        torch._dynamo.reset()
    expected_loss, expected_grads = expected
    actual_loss, actual_grads = actual
    assert torch.allclose(actual_loss, expected_loss, rtol=1e-6, atol=1e-6)
    assert all(torch.allclose(actual_grads[name], grad, rtol=1e-5, atol=1e-6) for name, grad in expected_grads.items())


def test_layers_named_by_a_path_that_is_not_there_are_a_clear_error():
    _, model = twin_models(llama_config())
    with pytest.raises(ValueError, match=r"^wrap_decoder_layers: layers='model\.nope' names no submodule of "
                                         r"LlamaForCausalLM$"):
        remat.wrap_decoder_layers(model, layers="model.nope")
    with pytest.raises(ValueError, match=r"^wrap_decoder_layers: layers holds 'model\.layers\.9', which names no "
                                         r"submodule of LlamaForCausalLM$"):
        remat.wrap_decoder_layers(model, layers=["model.layers.0", "model.layers.9"])


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_a_model_handing_its_layers_the_cache_positionally_hands_none_in_training_as_with_transformers(
        attn_implementation):
    """GPT-2 passes its cache to each block positionally and drops it only where the model's own
    gradient_checkpointing is set, as transformers' gradient_checkpointing_enable sets it on every
    module that has it. wrap_decoder_layers set it on the layers alone: the cache became a
    checkpoint input, recompute updated it a second time, and backward failed ("recreated saved
    tensor #7 as float32 [8, 8, 24] ... forward saved float32 [8, 8, 12]") or attended over twice
    the keys. Now the model hands no cache in training, as under transformers' own checkpointing,
    with gradients bitwise the plain model's; unwrapping restores the flag."""
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64)
    config._attn_implementation = attn_implementation
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(config).train()
    model = transformers.GPT2LMHeadModel(config).train()
    model.load_state_dict(reference.state_dict())
    remat.wrap_decoder_layers(model, save=())
    assert model.transformer.gradient_checkpointing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(1)  # the same dropout masks
        expected = reference(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
        torch.manual_seed(1)
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
    assert out.past_key_values is None
    expected.loss.backward()
    out.loss.backward()
    assert torch.equal(out.loss, expected.loss)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    remat.unwrap_decoder_layers(model)
    assert not model.transformer.gradient_checkpointing and "_gradient_checkpointing_func" not in vars(
        model.transformer)


def test_a_childs_forward_keeps_its_signature_and_a_hook_set_after_wrapping_outlives_unwrapping():
    """A region's forward was a function of remat's own: inspect.signature gave (*args, **kwargs).
    An accelerate-style hook set on a child after wrapping (its forward replaced by one calling the
    wrapped forward) failed once the model was unwrapped (KeyError: '_remat_inner_forward')."""
    import functools
    import inspect

    reference, model = twin_models(llama_config())
    remat.wrap_decoder_layers(model)
    attention = decoder_layers(model)[0].self_attn
    assert inspect.signature(attention.forward) == inspect.signature(decoder_layers(reference)[0].self_attn.forward)
    wrapped = attention.forward
    attention.forward = functools.partial(lambda *args, **kwargs: wrapped(*args, **kwargs))
    ids = input_ids()
    expected_loss, expected_grads = train_step(reference, ids)
    for unwrap in (False, True):
        if unwrap:
            remat.unwrap_decoder_layers(model)
            assert isinstance(attention.forward, functools.partial)  # the hook stays, calling what it wrapped
        loss, grads = train_step(model, ids)
        assert torch.equal(loss, expected_loss)
        assert all(torch.equal(grads[name], grad) for name, grad in expected_grads.items())
