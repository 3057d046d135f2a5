"""wrap_decoder_layers on a Hugging Face model whose layers keep their sublayers in a ModuleList
(T5's block: its only child, "layer", is never called itself). save=("layer",) ran no region
(accepted, silently a no-op) and save=() with a budget was refused as a model without regions;
unwrap_decoder_layers left wrap_decoder_layers(budget=)'s fit in force, every later step running
unplanned over its budget."""

import warnings

import pytest
import torch

import remat

transformers = pytest.importorskip("transformers")


def t5():
    config = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                                   vocab_size=64, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).train()


def step(model, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (2, 12), generator=generator)
    labels = torch.randint(1, 64, (2, 8), generator=generator)
    return model(input_ids=ids, labels=labels).loss


def test_a_container_named_as_a_region_is_refused_naming_its_entries():
    with pytest.raises(ValueError, match=r"save='layer' names a ModuleList, which a layer never calls itself .* "
                                         r"name its entries instead \('layer.0', 'layer.1'"):
        remat.wrap_decoder_layers(t5(), save=("layer",))


def test_by_default_a_containers_entries_are_the_regions_and_gradients_are_bitwise():
    reference, model = t5(), t5()
    remat.wrap_decoder_layers(model, save=("layer.0",))
    with remat.collect_trace() as trace:
        loss = step(model)
        loss.backward()
    expected = step(reference)
    expected.backward()
    assert torch.equal(loss, expected)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    regions = {region.name for scope in trace.scopes for region in scope.regions}
    # Encoder blocks: self-attention (saved) and feed-forward; decoder blocks: cross-attention too
    assert {"layer.0", "layer.1", "layer.2"} <= regions, regions


def test_a_budget_plans_a_containers_entries_and_unwrapping_undoes_the_fit():
    with remat.tag_cpu_tensors(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiled step over the budget, said
        model = remat.wrap_decoder_layers(t5(), save=(), budget="1GiB")
        for seed in range(2):
            step(model, seed).backward()
        assert model.remat_fit.plan is not None and len(model.remat_fit.plan.decisions) >= 10
        remat.unwrap_decoder_layers(model)
        assert not hasattr(model, "remat_fit") and "forward" not in vars(model)
        step(model, 2).backward()  # runs plain: nothing of the fit left to say a step is over its budget
