"""NeMo AutoModel's record/replay API on remat.RecomputeReplay: current(), scope(), take(),
records, and checkpoint_context_fn() with torch.utils.checkpoint and remat.checkpoint, composed
with selective activation checkpointing; bad input is a clear error, never a wrong replay."""

import functools
import threading

import pytest
import torch
import torch.utils.checkpoint as tuc

import remat


def test_current_is_none_outside_a_scope_and_the_binding_inside():
    channel = remat.RecomputeReplay("router")
    recorder = remat.RecomputeReplayRecorder()
    assert channel.current() is None
    with channel.scope(recorder, "record"):
        bound, mode = channel.current()
        assert bound is recorder and mode == "record"
        inner = remat.RecomputeReplayRecorder()
        with channel.scope(inner, "replay"):
            assert channel.current() == (inner, "replay")
        with channel.scope(None, "record"):  # None disables replay inside
            assert channel.current() is None
        assert channel.current() == (recorder, "record")
    assert channel.current() is None


def test_a_mode_other_than_record_or_replay_is_a_value_error():
    channel = remat.RecomputeReplay("router")
    with pytest.raises(ValueError, match="^replay channel 'router': mode 'rewind' is not valid; pass \"record\" or "
                                         "\"replay\" \\(Unsupported router replay mode: 'rewind'\\)$"):
        channel.scope(remat.RecomputeReplayRecorder(), "rewind")
    with pytest.raises(ValueError, match="Unsupported test replay mode: 'rewind'"):  # NeMo's words, as its tests match
        remat.RecomputeReplay("test").scope(remat.RecomputeReplayRecorder(), "rewind")
    assert channel.current() is None


def test_the_binding_is_per_thread():
    channel = remat.RecomputeReplay("router")
    seen = []
    with channel.scope(remat.RecomputeReplayRecorder(), "record"):
        thread = threading.Thread(target=lambda: seen.append(channel.current()))
        thread.start()
        thread.join()
    assert seen == [None]


def test_a_scope_exited_on_another_thread_is_refused_and_stays_bound_where_it_was_entered():
    channel = remat.RecomputeReplay("router")
    scope = channel.scope(remat.RecomputeReplayRecorder(), "record")
    scope.__enter__()
    errors = []

    def exit_elsewhere():
        try:
            scope.__exit__(None, None, None)
        except remat.RematError as error:
            errors.append(str(error))

    thread = threading.Thread(target=exit_elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "was exited on thread" in errors[0] and "exit it where it was entered" in errors[0]
    assert channel.current() is not None  # still bound here
    scope.__exit__(None, None, None)
    assert channel.current() is None


def test_recorder_records_in_order_takes_back_and_counts_misses():
    channel = remat.RecomputeReplay("layout")
    recorder = remat.RecomputeReplayRecorder()
    ids = torch.tensor([3, 1, 2])
    with channel.scope(recorder, "record"):
        recorder.record(ids)
        recorder.record((ids, ids + 1))
        recorder.record(7)
    assert len(recorder) == 3
    assert recorder.records[0] is ids and recorder.records[2] == 7 and isinstance(recorder.records, tuple)
    with channel.scope(recorder, "replay"):
        assert recorder.take() is ids
        pair = recorder.take()
        assert torch.equal(pair[1], ids + 1)
        assert recorder.take() == 7
        assert recorder.take() is None
        assert recorder.replay_misses == 1
        recorder.rewind()
        assert recorder.take() is ids


def test_a_recorder_driven_directly_takes_records_then_none_as_nemos_does():
    recorder = remat.RecomputeReplayRecorder()
    recorder.record(1)
    recorder.record("two")
    assert recorder.take() == 1
    assert recorder.take() == "two"
    assert recorder.take() is None
    assert recorder.take() is None
    assert recorder.replay_misses == 2
    recorder.rewind()
    assert recorder.take() == 1
    assert len(recorder) == 2 and recorder.records == (1, "two")


def test_one_recorder_shared_by_two_checkpoint_calls_is_refused_instead_of_replaying_the_other_call():
    channel = remat.RecomputeReplay("router")
    shared = remat.RecomputeReplayRecorder()
    sharing_context_fn = lambda: (channel.scope(shared, "record"), channel.scope(shared, "replay"))  # noqa: E731
    x = torch.rand(4, requires_grad=True)

    def body(t):
        return t.exp().sum()

    tuc.checkpoint(body, x, use_reentrant=False, context_fn=sharing_context_fn)
    with pytest.raises(remat.RematError, match="already holds the forward decisions of another checkpoint call"):
        tuc.checkpoint(body, x, use_reentrant=False, context_fn=sharing_context_fn)


def routed_block(channel, computed):
    """A block whose 'router' decision (top-2 of a projection) is recorded and replayed."""
    weight = torch.nn.Parameter(torch.rand(8, 8))

    def block(t):
        recording = channel.current()
        if recording is not None and recording[1] == "replay":
            indices = recording[0].take()
        else:
            computed.append(1)
            with torch.no_grad():
                indices = (t @ weight).topk(2, dim=-1).indices
            if recording is not None:
                recording[0].record(indices)
        return torch.gather(t @ weight, -1, indices).exp().sum()

    return block, weight


def assert_gradients_of_the_plain_block(x, weight):
    reference_x = x.detach().clone().requires_grad_()
    reference_weight = weight.detach().clone().requires_grad_()
    indices = (reference_x @ reference_weight).topk(2, dim=-1).indices
    torch.gather(reference_x @ reference_weight, -1, indices).exp().sum().backward()
    assert torch.equal(x.grad, reference_x.grad)
    assert torch.equal(weight.grad, reference_weight.grad)


@pytest.mark.parametrize("through", ["torch.utils.checkpoint", "remat.checkpoint"])
def test_checkpoint_context_fn_records_in_forward_and_replays_in_recompute(through):
    channel = remat.RecomputeReplay("router")
    computed = []
    block, weight = routed_block(channel, computed)
    x = torch.rand(4, 8, requires_grad=True)
    exits = []
    context_fn = channel.checkpoint_context_fn(on_record_exit=lambda recorder: exits.append(len(recorder)))
    if through == "torch.utils.checkpoint":
        loss = tuc.checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    else:
        loss = remat.checkpoint(region_name="routed", context_fn=context_fn)(block)(x)
    assert computed == [1] and exits == [1]
    loss.backward()
    assert computed == [1]  # recompute took the recorded decision
    assert_gradients_of_the_plain_block(x, weight)


def test_each_checkpoint_call_gets_a_fresh_recorder():
    channel = remat.RecomputeReplay("router")
    recorders = []
    context_fn = channel.checkpoint_context_fn(on_record_exit=recorders.append)
    block = lambda t: t.exp().sum() * float(channel.record_or_replay(lambda: 2.0))  # noqa: E731
    x = torch.rand(3, requires_grad=True)
    losses = [tuc.checkpoint(block, x, use_reentrant=False, context_fn=context_fn) for _ in range(2)]
    assert len(recorders) == 2 and recorders[0] is not recorders[1]
    assert [len(r) for r in recorders] == [1, 1]
    sum(losses).backward()
    assert all(r.replay_misses == 0 for r in recorders)


@pytest.mark.parametrize("through", ["torch.utils.checkpoint", "remat.checkpoint"])
def test_checkpoint_context_fn_composes_with_selective_activation_checkpointing(through):
    def policy(ctx, op, *args, **kwargs):
        return tuc.CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else tuc.CheckpointPolicy.PREFER_RECOMPUTE

    channel = remat.RecomputeReplay("router")
    computed = []
    block, weight = routed_block(channel, computed)
    context_fn = channel.checkpoint_context_fn(functools.partial(tuc.create_selective_checkpoint_contexts, policy))
    x = torch.rand(4, 8, requires_grad=True)
    if through == "torch.utils.checkpoint":
        loss = tuc.checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    else:
        loss = remat.checkpoint(region_name="sac", context_fn=context_fn)(block)(x)
    loss.backward()
    assert computed == [1]
    assert_gradients_of_the_plain_block(x, weight)


def test_checkpoint_context_fn_arguments_are_checked():
    channel = remat.RecomputeReplay("router")
    with pytest.raises(TypeError, match="^checkpoint_context_fn: context_fn must be callable or None, got int$"):
        channel.checkpoint_context_fn(3)
    with pytest.raises(TypeError, match="^checkpoint_context_fn: on_record_exit must be callable or None, got str$"):
        channel.checkpoint_context_fn(on_record_exit="log")


def test_the_channel_and_recorder_are_generic_as_nemos_are():
    # NeMo's modules annotate at import time: `x: RecomputeReplay[torch.Tensor] = ...`.
    channel_type = remat.RecomputeReplay[torch.Tensor]
    recorder_type = remat.RecomputeReplayRecorder[int]
    assert channel_type.__origin__ is remat.RecomputeReplay and channel_type.__args__ == (torch.Tensor,)
    assert recorder_type.__origin__ is remat.RecomputeReplayRecorder and recorder_type.__args__ == (int,)
    assert isinstance(remat.RecomputeReplay("generic"), remat.RecomputeReplay)
