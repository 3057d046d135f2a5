"""Misuse a user will really write, and the errors that say what was wrong and how to fix it:
nesting, duplicate names, a body that takes another path in recompute, bad arguments and
results, and torch.utils.checkpoint's options."""

import re

import pytest
import torch

import remat


def exact(message):
    return "^" + re.escape(message) + "$"


def test_duplicate_region_names_are_a_remat_error():
    def body(t):
        a = remat.region(lambda u: u * 2.0, "same")(t)
        return remat.region(lambda u: u * 3.0, "same")(a)

    with pytest.raises(remat.RematError, match=exact(
            "region 'same' appears twice in checkpoint 'dup'; region names must be unique within a checkpoint "
            "(Duplicate torch_remat region name dup::same during forward)")):
        remat.checkpoint(region_name="dup")(body)(torch.rand(2, requires_grad=True))


def test_a_recompute_region_inside_a_save_region_is_a_remat_error():
    def body(t):
        inner = remat.region(lambda v: v * 2.0, "inner", recompute=True)
        return remat.region(lambda u: inner(u).sin(), "outer_region", recompute=False)(t)

    with pytest.raises(remat.RematError, match=exact(
            "region 'inner' (recompute=True) is nested inside a recompute=False (save) region, "
            "'nested.regions::outer_region'; recompute skips the save region's whole body, so the inner region cannot "
            "be recomputed: make the inner region recompute=False, or the enclosing one recompute=True")):
        remat.checkpoint(region_name="nested.regions")(body)(torch.rand(2, requires_grad=True))


def test_a_checkpoint_inside_a_checkpoint_is_a_remat_error():
    def body(t):
        return remat.checkpoint(region_name="inner")(lambda u: u * 2.0)(t)

    with pytest.raises(remat.RematError, match=exact(
            "checkpoint 'inner' is nested inside checkpoint 'outer'; checkpoints do not nest: use regions inside one "
            "checkpoint")):
        remat.checkpoint(region_name="outer")(body)(torch.rand(2, requires_grad=True))


def test_after_a_misuse_error_the_next_checkpoint_runs_normally():
    x = torch.rand(3, requires_grad=True)
    with remat.collect_trace() as trace:
        with pytest.raises(remat.RematError):
            remat.checkpoint(region_name="failed")(lambda t: remat.checkpoint(region_name="inner")(torch.exp)(t))(x)
        assert remat.is_recomputing() is False
        loss = remat.checkpoint(region_name="after-error")(lambda t: remat.region(lambda u: u.exp().sum(), "r")(t))(x)
    loss.backward()
    assert torch.equal(x.grad, x.detach().exp())
    assert [s.name for s in trace.scopes] == ["after-error"]


def test_recompute_reaching_another_region_than_forward_is_a_remat_error_naming_both():
    def body(t):
        name = "in_recompute" if remat.is_recomputing() else "in_forward"
        return remat.region(lambda u: u.exp(), name)(t).sum()

    loss = remat.checkpoint(region_name="diverge.regions")(body)(torch.rand(2, requires_grad=True))
    with pytest.raises(remat.RematError, match=exact(
            "recompute of checkpoint 'diverge.regions' reached region 'in_recompute' where forward ran 'in_forward'; "
            "the body must take the same path in recompute as in forward")):
        loss.backward()


def test_recompute_saving_fewer_tensors_than_forward_names_both_counts():
    def body(t):
        h = t.exp()
        if not remat.is_recomputing():
            h = h.sin()  # a second saved tensor, only in forward
        return h.sum()

    loss = remat.checkpoint(region_name="diverge.saved")(body)(torch.rand(2, requires_grad=True))
    with pytest.raises(RuntimeError, match=exact(
            "recompute of checkpoint 'diverge.saved' recreated 1 saved tensors but forward saved 2; the body must take "
            "the same path in recompute as in forward (branch on remat.is_recomputing() only for work autograd does "
            "not save, and run it under the same autocast and grad modes, with its modules in the same training mode "
            "and the same parameters requiring grad: model.eval() between forward and backward changes what dropout "
            "and batch norm save, and requires_grad_(False) on a layer what its ops save)")):
        loss.backward()


def test_errors_the_runtime_raises_in_backward_are_remat_errors():
    def probe_body(t):
        p = remat.region(lambda u: u * 2.0, "p", recompute=False)(t)
        if remat.is_recomputing():
            (p * 5.0).sum()  # a read forward never made: a placeholder
        return t.exp().sum()

    loss = remat.checkpoint(region_name="backward.error-type")(probe_body)(torch.rand(2, requires_grad=True))
    with pytest.raises(remat.RematError):
        loss.backward()


def test_preserve_rng_state_true_is_refused_with_the_state_hook_alternative():
    # A RematError, and the NotImplementedError torch_remat raises.
    with pytest.raises(NotImplementedError, match=exact(
            "checkpoint 'rng': preserve_rng_state=True is not supported: remat does not preserve torch's RNG state; "
            "pass recompute_state_hooks=[remat.cpu_rng_state_hook(), remat.cuda_rng_state_hook()] (the CUDA one "
            "where random numbers are drawn on CUDA), or your own hook: any object with snapshot() and "
            "restore(state)")) as info:
        remat.checkpoint(region_name="rng", preserve_rng_state=True)(lambda t: t * 2.0)(torch.rand(2, requires_grad=True))
    assert isinstance(info.value, remat.RematError)


def test_preserve_rng_state_false_is_accepted_as_torch_remat_accepts_it():
    x = torch.rand(3, requires_grad=True)
    remat.checkpoint(region_name="rng", preserve_rng_state=False)(lambda t: t * 2.0)(x).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_an_empty_checkpoint_name_is_a_remat_error():
    with pytest.raises(remat.RematError, match="^checkpoint region_name is empty"):
        remat.checkpoint(region_name="")(lambda t: t * 2.0)(torch.rand(2, requires_grad=True))


def test_an_empty_region_name_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match=exact('region: name each region, e.g. region(fn, "attention")')):
        remat.region(lambda t: t, "")


def test_tensor_keyword_arguments_are_inputs_like_positional_ones():
    x = torch.rand(2, requires_grad=True)
    w = torch.rand(2, requires_grad=True)

    def scaled(t, weight=None):
        return (t * weight).exp()

    remat.checkpoint(region_name="kw")(scaled)(x, weight=w).sum().backward()
    assert torch.allclose(x.grad, (x * w).exp().detach() * w.detach())
    assert torch.allclose(w.grad, (x * w).exp().detach() * x.detach())
    x.grad, w.grad = None, None
    remat.checkpoint(region_name="kw.region")(lambda t: remat.region(scaled, "r", recompute=False)(t, weight=w))(
        x).sum().backward()
    assert torch.allclose(w.grad, (x * w).exp().detach() * x.detach())


def returns_a_string(t):
    return "not a tensor"


def returns_a_mixed_tuple(t):
    return t * 2.0, 3


@pytest.mark.parametrize("fn, returned", [
    (returns_a_string, "a str"),
    (lambda t: [], "a list"),
    (lambda t: 3, "an int"),
    (lambda t: (None, 3), "a tuple"),
], ids=["str", "empty-list", "int", "tuple-without-tensors"])
def test_a_return_without_tensors_is_a_type_error_naming_the_function_and_what_it_returned(fn, returned):
    with pytest.raises(TypeError) as raised:
        remat.checkpoint(region_name="bad-return")(fn)(torch.rand(2, requires_grad=True))
    assert str(raised.value) == (f"checkpoint 'bad-return' ({fn.__qualname__}) must return at least one tensor "
                                 f"(alone, or inside tuples, lists, dicts or dataclasses); it returned {returned}")


def test_results_holding_none_numbers_and_dicts_pass_through_unchanged():
    x = torch.rand(2, requires_grad=True)
    out, count = remat.checkpoint(region_name="mixed")(returns_a_mixed_tuple)(x)
    assert count == 3
    attention = lambda t: (t.exp(), None)  # noqa: E731  (Hugging Face attention without weights)
    result = remat.checkpoint(region_name="with-none")(
        lambda t: remat.region(attention, "attention", recompute=False)(t))(x)
    assert isinstance(result, tuple) and result[1] is None
    as_dict = remat.checkpoint(region_name="dict")(lambda t: {"out": t.sin(), "step": 7})(x)
    assert as_dict["step"] == 7
    (as_dict["out"].sum() + result[0].sum() + out.sum()).backward()
    assert torch.allclose(x.grad, x.detach().cos() + x.detach().exp() + 2.0)


def test_a_regions_bad_return_names_the_region_and_its_function():
    x = torch.rand(2, requires_grad=True)
    with pytest.raises(TypeError, match=exact(
            "region 'head' (returns_a_string) must return at least one tensor (alone, or inside tuples, lists, dicts or dataclasses); "
            "it returned a str")):
        remat.checkpoint(region_name="bad-region-return")(lambda t: remat.region(returns_a_string, "head")(t))(x)


def test_fn_that_is_not_callable_is_a_type_error():
    with pytest.raises(TypeError, match=exact("remat.checkpoint(region_name='checkpoint'): fn must be callable, got "
                                              "Tensor")):
        remat.checkpoint()(torch.rand(2))(torch.rand(2))
    for error in (TypeError, RuntimeError):  # RuntimeError: what torch_remat raises, and its users catch
        with pytest.raises(error, match=exact("region 'r': fn must be callable, got int (region expects a function "
                                              "as its first argument)")):
            remat.region(3, "r")
        with pytest.raises(error, match="region expects a function as its first argument"):
            remat.region("name-as-fn", "attn")


def test_a_state_hook_without_snapshot_and_restore_is_a_type_error():
    with pytest.raises(TypeError, match=exact(
            "checkpoint: recompute_state_hooks: object has no snapshot() method; a state hook is any object with "
            "snapshot() and restore(state)")):
        remat.checkpoint(region_name="bad-hook", recompute_state_hooks=[object()])(lambda t: t * 2.0)(torch.rand(2, requires_grad=True))


def test_a_context_that_is_not_a_factory_is_a_type_error():
    with pytest.raises(TypeError, match=exact(
            "contexts: an int is not a context factory; pass a remat.RecomputeReplay or a callable returning an object "
            "with enter_forward/exit_forward/enter_recompute/exit_recompute")):
        remat.checkpoint(region_name="bad-context", contexts=[3])(lambda t: t * 2.0)(torch.rand(2, requires_grad=True))


def test_a_python_exception_in_forward_reaches_the_caller_as_itself():
    def body(t):
        raise KeyError("raised in forward")

    with pytest.raises(KeyError, match="raised in forward"):
        remat.checkpoint(region_name="forward-raises")(body)(torch.rand(2, requires_grad=True))
    assert remat.is_recomputing() is False


# Names and flags are checked when the region or checkpoint is made, before anything runs: the
# runtime takes names as C++ strings, and a NUL would cut a dump path and print raw in a trace.

def never_called(t):
    raise AssertionError("the body must not run")


def test_a_region_name_that_is_not_a_str_is_refused_at_decoration():
    with pytest.raises(TypeError, match=exact("region: name must be a str, got int 5")):
        remat.region(never_called, 5)
    with pytest.raises(TypeError, match=exact("region: name must be a str (decode bytes first), got bytes b'mlp'")):
        remat.region(name=b"mlp")


def test_recompute_accepts_only_a_real_bool():
    with pytest.raises(TypeError, match=exact("region 'mlp': recompute must be True or False, got str 'False'")):
        remat.region(never_called, "mlp", recompute="False")
    with pytest.raises(TypeError, match=exact("region 'attention': recompute must be True or False, got int 0")):
        remat.region(name="attention", recompute=0)
    with pytest.raises(TypeError, match=exact("checkpoint 'layers.0': verify_recompute must be True or False, "
                                              "got str 'no'")):
        remat.checkpoint(region_name="layers.0", verify_recompute="no")(never_called)(torch.rand(2))
    with pytest.raises(TypeError, match=exact("verify_recompute: enabled must be True or False, got int 1")):
        remat.verify_recompute(1)


def test_names_with_a_nul_are_refused_naming_the_argument():
    nul = "contains a NUL character; C strings end there, so pass it without one"
    with pytest.raises(ValueError, match=exact(f"region: name 'layers.0\\x00.attention' {nul}")):
        remat.region(never_called, "layers.0\0.attention")
    with pytest.raises(ValueError, match=exact(f"checkpoint: region_name 'layers\\x000' {nul}")):
        remat.checkpoint(region_name="layers\x000")(never_called)(torch.rand(2))
    with pytest.raises(ValueError, match=exact(f"RecomputeReplay: name 'router\\x00' {nul}")):
        remat.RecomputeReplay("router\0")
    with pytest.raises(ValueError, match=exact(f"live_bytes: region_prefix 'layers\\x00' {nul}")):
        remat.live_bytes("layers\0")
    with pytest.raises(ValueError, match=exact("region: name 'mlp\\udc80' is not valid Unicode (surrogates not "
                                               "allowed); pass text that encodes as UTF-8")):
        remat.region(never_called, "mlp\udc80")
    assert remat._C.collect_trace().scopes == []  # nothing ran


def test_a_checkpoint_name_that_is_not_a_str_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=exact("checkpoint: region_name must be a str, got int 5")):
        remat.checkpoint(region_name=5)(never_called)(torch.rand(2))
    with pytest.raises(TypeError, match=exact("RecomputeReplay: name must be a str, got NoneType None")):
        remat.RecomputeReplay(None)
    with pytest.raises(TypeError, match=exact("live_bytes: region_prefix must be a str, got NoneType None")):
        remat.live_bytes(None)


def test_a_recompute_replay_subclassed_for_checks_still_replays():
    channel = remat.RecomputeReplay("checked")
    assert channel.name == "checked"
    computed = []
    loss = remat.checkpoint(region_name="replay.checked", contexts=[channel])(lambda t: t * float(channel.record_or_replay(lambda: computed.append(1) or 2.0)))(torch.rand(2, requires_grad=True))
    loss.sum().backward()
    assert computed == [1]


def test_write_dump_refuses_a_path_with_a_nul_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match=exact(f"write_dump: path '{tmp_path}/report\\x00.json' contains a NUL "
                                               "character; a path cannot hold one")):
        remat.write_dump(str(tmp_path / "report") + "\0.json", "{}")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match=exact("write_dump: path must be a str, bytes or os.PathLike path, got int 3")):
        remat.write_dump(3, "{}")
    with pytest.raises(TypeError, match=exact("write_dump: the dump must be a str (a report's to_json()), got bytes")):
        remat.write_dump(str(tmp_path / "bytes.json"), b"{}")
    with pytest.raises(ValueError, match=r"^write_dump: the dump is not one JSON document \(.*\); pass a report's "):
        remat.write_dump(str(tmp_path / "broken.json"), "{not json")
    assert list(tmp_path.iterdir()) == []


def test_write_dump_takes_path_objects_and_bytes_paths(tmp_path):
    remat.write_dump(tmp_path / "path.json", '{"a": 1}')
    remat.write_dump(bytes(tmp_path / "bytes.json"), '{"b": 2}')
    assert (tmp_path / "path.json").read_text() == '{"a": 1}'
    assert (tmp_path / "bytes.json").read_text() == '{"b": 2}'


def test_torch_remats_defaults_spelled_out_are_accepted():
    # torch_remat's checkpoint() defaults: region_name=None, determinism_check="none".
    x = torch.rand(3, requires_grad=True)
    remat.checkpoint(region_name=None, determinism_check="none")(lambda t: t * 2.0)(x).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0))
    with remat.collect_trace() as trace:
        remat.checkpoint(region_name=None)(lambda t: remat.region(torch.sin, "r")(t))(x).sum().backward()
    assert [scope.name for scope in trace.scopes] == ["checkpoint"]
    with pytest.raises(remat.RematError, match=r"determinism_check='all' is not supported"):
        remat.checkpoint(region_name="c", determinism_check="all")(never_called)(x)


def test_argument_type_errors_are_also_the_runtime_error_torch_remat_raises():
    for make in (lambda: remat.region(never_called, "mlp", recompute=1), lambda: remat.name_scope(5),
                 lambda: remat.region(never_called, 5)):
        with pytest.raises(TypeError) as info:
            make()
        assert isinstance(info.value, RuntimeError), info.value
