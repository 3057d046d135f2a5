"""What plain autograd refuses, remat refuses too, with the reason: an in-place change to a
checkpoint input that recompute would read, backward through a checkpoint whose forward
failed, sparse inputs; and an exception from a context's exit reaches the caller."""

import pytest
import torch

import remat


def test_backward_through_a_tensor_from_a_failed_checkpoint_is_an_error_not_a_crash():
    kept = {}

    def body(u):
        kept["h"] = u.exp().sin()  # exp's output is dropped, to be recomputed
        raise ValueError("bad batch")

    a = torch.randn(5, requires_grad=True)
    with pytest.raises(ValueError, match="bad batch"):
        remat.checkpoint(region_name="failing")(body)(a)
    with pytest.raises(RuntimeError, match="checkpoint 'failing' raised an error in forward, so the tensors it "
                                           "dropped cannot be recomputed"):
        kept["h"].sum().backward()


def test_an_input_changed_in_place_after_forward_is_refused_like_autograd_does():
    def block(t):
        return t.sin() * 2

    a = torch.randn(4, requires_grad=True)
    h = a * 1.0
    h += remat.checkpoint(region_name="residual")(block)(h)  # h was the checkpoint's input
    with pytest.raises(RuntimeError, match=r"input 0 of checkpoint 'residual' was changed by an in-place operation "
                                           r"after forward \(version 0, now 1\)"):
        h.sum().backward()

    # The same written out of place trains, with autograd's gradient.
    a.grad = None
    h = a * 1.0
    h = h + remat.checkpoint(region_name="residual")(block)(h)
    h.sum().backward()
    torch.testing.assert_close(a.grad, 1 + 2 * a.detach().cos())


def test_a_body_that_changes_its_input_in_place_is_refused_in_forward():
    def body(t):
        t.mul_(2)
        return t.sin()

    a = torch.randn(5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"checkpoint 'scales' changed its input 0 in place"):
        remat.checkpoint(region_name="scales")(body)(a * 1.0)


def test_a_sparse_input_is_refused_with_the_fix():
    s = torch.randn(4, 4).to_sparse().requires_grad_()
    with pytest.raises(RuntimeError, match=r"input 0 of checkpoint 'sparse' has layout Sparse; checkpoints take "
                                           r"strided tensors: pass input.to_dense\(\)"):
        remat.checkpoint(region_name="sparse")(lambda t: torch.sparse.mm(t, torch.randn(4, 4)).exp())(s)


class InterruptOnExit:
    def exit_forward(self):
        raise KeyboardInterrupt("pressed Ctrl-C")


def test_an_exception_from_a_context_exit_reaches_the_caller():
    x = torch.randn(4, requires_grad=True)
    with pytest.raises(KeyboardInterrupt, match="pressed Ctrl-C"):
        remat.checkpoint(contexts=[InterruptOnExit])(lambda t: t.sin())(x)


def test_a_save_region_that_changes_its_input_in_place_is_refused():
    lin = torch.nn.Linear(8, 8)
    act = torch.nn.LeakyReLU(0.1, inplace=True)

    def block(x):
        h = lin(x)
        a = remat.region(act, "act", recompute=False)(h)  # leaky_relu_ on h
        return a * h

    with pytest.raises(RuntimeError, match=r"save region 'block::act' changed its input 0 in place \(an op such as "
                                           r"LeakyReLU\(inplace=True\)"):
        remat.checkpoint(region_name="block")(block)(torch.randn(4, 8, requires_grad=True))


def ids_changed_in_place(ids):
    ids += 2  # local to global ids, in place: the recorded tensor changes too
    return ids


def first_of_a_tuple_changed_in_place(decision):
    ids, _ = decision  # a routing decision of (indices, counts)
    return ids.add_(1).remainder_(8)


def first_of_a_list_replaced(decision):
    decision[0] = decision[0] + 1  # the list recorded is the one replayed
    return decision[0]


@pytest.mark.parametrize("decide, change, refusal", [
    (lambda x: x.abs().argmax(dim=1), ids_changed_in_place,
     r"the tensor recorded in forward was changed in place afterwards \(version 0, now 1\)"),
    (lambda x: (x.abs().argmax(dim=1), torch.ones(3)), first_of_a_tuple_changed_in_place,
     r"tensor 0 of the value recorded in forward was changed in place afterwards \(version 0, now 2\)"),
    (lambda x: [x.abs().argmax(dim=1)], first_of_a_list_replaced,
     r"the list or dict recorded in forward was changed afterwards"),
], ids=["tensor", "tensor in a tuple", "list"])
def test_a_replayed_decision_changed_after_forward_is_refused(decide, change, refusal):
    table = torch.randn(8, 4, requires_grad=True)
    router = remat.RecomputeReplay("router")

    def body(x):
        ids = change(router.record_or_replay(lambda: decide(x)))
        return (table[ids] * x).exp()

    y = remat.checkpoint(contexts=[router], region_name="moe")(body)(torch.randn(3, 4))
    with pytest.raises(RuntimeError, match=r"replay channel 'router': " + refusal):
        y.sum().backward()


def test_a_recorder_taken_directly_names_its_channel_in_the_refusal():
    """NeMo's style: the recorder from channel.current(), recorded into and taken from by hand."""
    weight = torch.randn(8, 8, requires_grad=True)
    channel = remat.RecomputeReplay("router.topk")

    def body(x):
        bound = channel.current()
        if bound is not None and bound[1] == "replay":
            ids = bound[0].take()
        else:
            ids = (x @ weight).detach().topk(2, dim=-1).indices
            if bound is not None:
                bound[0].record(ids)
        y = (x @ weight) * torch.nn.functional.one_hot(ids, 8).sum(-2)
        ids.add_(1)
        return y

    y = remat.checkpoint(region_name="moe", context_fn=channel.checkpoint_context_fn())(body)(torch.randn(4, 8))
    with pytest.raises(RuntimeError, match=r"replay channel 'router.topk': the tensor recorded"):
        y.sum().backward()


def test_backward_on_two_threads_through_one_checkpoint_matches_autograd():
    import threading

    a = torch.randn(256, requires_grad=True)

    def body(u):
        h = remat.region(lambda v: v.exp().sin(), "s", recompute=False)(u)
        g = remat.region(lambda v: v.cos().exp().tanh(), "r")(h)
        return remat.region(lambda v: (v * 1.5).sigmoid().exp(), "r2")(g), (g * h).exp()

    b = a.detach().clone().requires_grad_()
    k, m = body(b)
    expected = [torch.autograd.grad(k.sum(), b, retain_graph=True)[0], torch.autograd.grad(m.sum(), b)[0]]
    failures = []
    for _ in range(40):
        outputs = remat.checkpoint(region_name="shared")(body)(a)

        def run(i):
            try:
                for _ in range(3):
                    got = torch.autograd.grad(outputs[i].sum(), a, retain_graph=True)[0]
                    if not torch.allclose(got, expected[i]):
                        failures.append(f"output {i}: wrong gradient")
            except RuntimeError as error:
                failures.append(f"output {i}: {error}")

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert failures == []


def test_a_save_region_output_changed_in_place_afterwards_is_refused():
    def body(a, b):
        h = remat.region(lambda u: u * 3, "scale", recompute=False)(a)
        h.mul_(2)
        return (h * b).sin()

    a = torch.randn(5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"output 0 of save region 'twice::scale' was changed in place after the "
                                           r"region returned"):
        remat.checkpoint(region_name="twice")(body)(a, b)


def test_control_characters_in_names_are_refused_by_the_runtime_itself():
    # The Python layer refuses NUL first; the runtime refuses what reaches it from C++ or _C.
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"checkpoint name 'blk...' holds the control character \\x1B at byte 3"):
        remat._C.checkpoint(lambda t: t.sin(), (x,), {}, "blk\x1b[31m", [], [], False)


def test_a_parameter_changed_in_place_between_forward_and_backward_is_refused():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)

    def body(t):  # reads w from its closure: recompute reads it again
        return (t @ w).tanh()

    y = remat.checkpoint(region_name="captured")(body)(x * 1).sum()
    with torch.no_grad():
        w.add_(1)
    with pytest.raises(RuntimeError, match=r"a tensor that the body of checkpoint 'captured' read \(saved tensor #\d, "
                                           r"float32 \[8, 8\] on cpu\) was changed by an in-place operation after "
                                           r"forward \(version 0, now 1\)"):
        y.backward()

    # Inside a region the message names the region.
    def with_region(t):
        return remat.region(lambda u: (u @ w).tanh(), "mlp")(t)

    y = remat.checkpoint(region_name="layers.0")(with_region)(x * 1).sum()
    with torch.no_grad():
        w.mul_(2)
    with pytest.raises(RuntimeError, match=r"a tensor that region 'layers.0::mlp' read"):
        y.backward()

    # A change after backward, as an optimizer step makes, is the next step's value.
    x.grad = None
    y = remat.checkpoint(region_name="layers.0")(with_region)(x * 1).sum()
    y.backward()
    torch.testing.assert_close(x.grad, (1 - (x @ w).tanh() ** 2).detach() @ w.detach().T)
    with torch.no_grad():
        w.add_(1)


def test_a_parameter_that_no_op_saves_changed_between_forward_and_backward_is_refused():
    layer = torch.nn.Linear(8, 8)  # addmm saves the input and the weight, not the bias
    x = torch.randn(4, 8, requires_grad=True)

    def body(t):
        return layer(t).tanh()

    y = remat.checkpoint(region_name="linear")(body)(x * 1).sum()
    with torch.no_grad():
        layer.bias.add_(1)
    with pytest.raises(RuntimeError, match=r"a parameter \(a leaf that requires grad, float32 \[8\] on cpu\) that "
                                           r"checkpoint 'linear' read was changed by an in-place operation after "
                                           r"forward \(version 1, now 2\)"):  # nn.Linear's init changed it once
        y.backward()

    # Read only inside a save region, which recompute skips, or after the last tensor recompute
    # recreates, it may change: backward needs no value of it.
    bias = torch.zeros(8, requires_grad=True)

    def saved_then_shifted(t):
        h = remat.region(lambda u: (u + bias).tanh(), "saved", recompute=False)(t)
        return h.exp() + bias

    y = remat.checkpoint(region_name="shifted")(saved_then_shifted)(x * 1).sum()
    with torch.no_grad():
        bias.add_(1)
    y.backward()
    assert bias.grad is not None and x.grad is not None


def test_a_closure_tensor_without_grad_that_forward_saved_changed_before_backward_is_refused():
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    mask = torch.rand(4, 8)  # no grad; mul saves it for backward

    y = remat.checkpoint(region_name="masked")(lambda t: layer(t) * mask)(x * 1).sum()
    mask.mul_(2)  # plain autograd refuses this on backward; recompute would read the doubled mask
    with pytest.raises(RuntimeError, match=r"a tensor that the body of checkpoint 'masked' read \(saved tensor #\d, "
                                           r"float32 \[4, 8\] on cpu\) was changed by an in-place operation after "
                                           r"forward \(version 0, now 1\)"):
        y.backward()

    # Unchanged, the gradient is autograd's.
    x.grad = None
    expected = torch.autograd.grad((layer(x) * mask).sum(), x)[0]
    remat.checkpoint(region_name="masked")(lambda t: layer(t) * mask)(x * 1).sum().backward()
    assert torch.equal(x.grad, expected)


def test_a_tensor_the_body_changes_in_place_after_an_op_saved_it_is_refused_as_changed_in_forward():
    """b = lin(x).sigmoid(); b.mul_(2): autograd refuses it without checkpointing; the refusal said the
    tensor was changed after forward and advised stepping the optimizer after backward."""
    lin = torch.nn.Linear(6, 6)

    def body(t):
        b = lin(t).sigmoid()  # sigmoid saves its output
        b.mul_(2)
        return b

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        body(torch.randn(4, 6, requires_grad=True)).sum().backward()
    y = remat.checkpoint(region_name="layer")(body)(torch.randn(4, 6, requires_grad=True)).sum()
    with pytest.raises(RuntimeError, match=r"a tensor that the body of checkpoint 'layer' saved for backward \(saved "
                                           r"tensor #\d, float32 \[4, 6\] on cpu\) was changed by an in-place "
                                           r"operation later in the same forward \(version 0 when saved, 1 as forward "
                                           r"ended\).*b = b \* 2 rather than b.mul_\(2\)"):
        y.backward()
