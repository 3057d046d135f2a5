"""remat under torch.compile: checkpoints and regions traced by Dynamo (0 graph breaks,
fullgraph=True), save regions saved and recompute regions recomputed by AOTAutograd's
partitioner, gradients equal to eager; eager-only options refused with a clear error."""


import functools
import threading

import pytest
import torch
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

import remat

TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # float32; Inductor reorders reductions


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def parameters(*shapes):
    torch.manual_seed(0)
    return [torch.rand(*shape, requires_grad=True) for shape in shapes]


def grads_of(step, tensors, *inputs):
    for t in tensors:
        t.grad = None
    out = step(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.pow(2).sum() for o in outs).backward()
    return [t.grad.clone() for t in tensors]


def save_and_recompute(x, w1, w2):
    def body(t):
        h = remat.region(lambda u: torch.relu(u @ w1), "attention", recompute=False)(t)
        return remat.region(lambda u: (u @ w2).tanh(), "mlp")(h)
    return remat.checkpoint(region_name="l0")(body)(x)


def residual(x, w1, w2):
    def body(t):
        h = remat.region(lambda u: torch.relu(u @ w1), "attention", recompute=False)(t) + t
        return remat.region(lambda u: (u @ w2).tanh(), "mlp")(h) + h
    return remat.checkpoint(region_name="residual")(body)(x)


def multiple_outputs(x, w1, w2):
    def body(t):
        h = remat.region(lambda u: torch.relu(u @ w1), "attention", recompute=False)(t)
        return h.sin(), remat.region(lambda u: (u @ w2).tanh(), "mlp")(h)
    return remat.checkpoint(region_name="outputs")(body)(x)


def tuple_inputs(x, w1, w2):
    def body(pair, scale=1.0):
        a, b = pair
        h = remat.region(lambda u, v: torch.relu(u @ v), "attention", recompute=False)(a, b)
        return remat.region(lambda u: (u @ w2).tanh() * scale, "mlp")(h)
    return remat.checkpoint(region_name="tuple")(body)((x, w1), scale=0.5)


CASES = [save_and_recompute, residual, multiple_outputs, tuple_inputs]


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph", "fullgraph"])
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_compiled_checkpoints_have_no_graph_breaks_and_eager_gradients(case, fullgraph):
    x, w1, w2 = parameters((16, 32), (32, 32), (32, 32))
    expected = grads_of(case, (x, w1, w2), x, w1, w2)
    explanation = torch._dynamo.explain(case)(x, w1, w2)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    compiled = torch.compile(case, backend="aot_eager", fullgraph=fullgraph)
    got = grads_of(compiled, (x, w1, w2), x, w1, w2)
    assert all(torch.allclose(g, e, **TOLERANCE) for g, e in zip(got, expected))


@pytest.mark.parametrize("case", [save_and_recompute, residual], ids=["save-and-recompute", "residual"])
def test_inductor_compiled_checkpoints_give_eager_gradients(case):
    x, w1, w2 = parameters((16, 32), (32, 32), (32, 32))
    expected = grads_of(case, (x, w1, w2), x, w1, w2)
    got = grads_of(torch.compile(case, fullgraph=True), (x, w1, w2), x, w1, w2)
    assert all(torch.allclose(g, e, **TOLERANCE) for g, e in zip(got, expected))


def test_a_swish_checkpoint_compiled_gives_the_eager_gradient():
    # Once off by 1.91: the body compiled in forward and run eagerly in recompute.
    x = torch.rand(64, requires_grad=True)
    step = lambda t: remat.checkpoint(region_name="swish")(lambda u: torch.sigmoid(u) * u)(t)  # noqa: E731
    (expected,) = grads_of(step, (x,), x)
    (got,) = grads_of(torch.compile(step, backend="aot_eager"), (x,), x)
    assert torch.allclose(got, expected, **TOLERANCE)


def test_dropout_in_a_compiled_checkpoint_gives_gradients_consistent_with_its_forward():
    x, w1, w2 = parameters((16, 32), (32, 32), (32, 32))

    def case(t):
        def body(u):
            h = remat.region(lambda v: torch.nn.functional.dropout(v @ w1, 0.5), "attention", recompute=False)(u)
            return remat.region(lambda v: torch.nn.functional.dropout((v @ w2).tanh(), 0.3), "mlp")(h)
        return remat.checkpoint(region_name="dropout", recompute_state_hooks=[remat.cpu_rng_state_hook()])(body)(t)

    torch.manual_seed(7)
    out = torch.compile(case, backend="aot_eager", fullgraph=True)(x)
    out.sum().backward()
    # The same masks, read back from the output: dropout keeps or zeroes each element.
    torch.manual_seed(7)
    reference = x.detach().clone().requires_grad_()
    case_eager_out = case(reference)
    assert torch.equal((out == 0), (case_eager_out == 0))
    case_eager_out.sum().backward()
    assert torch.allclose(x.grad, reference.grad, **TOLERANCE)


@pytest.mark.parametrize("breaks", ["graph_break", "item"])
def test_dropout_in_a_checkpoint_whose_body_breaks_the_graph_is_recomputed_with_forward_masks(breaks):
    """Dynamo breaks the graph inside the body and runs the checkpoint eagerly: recompute must draw
    forward's dropout masks (it drew new ones, gradients wrong without a word)."""
    x, w1, w2 = parameters((8, 16), (16, 16), (16, 16))

    def body(u):
        h = (u @ w1).relu()
        if breaks == "graph_break":
            torch._dynamo.graph_break()
        else:
            h = h * (1.0 + 0.0 * h.sum().item())
        return (torch.nn.functional.dropout(h @ w2, 0.5) * h).sum()

    def gradients(fn):
        for t in (x, w1, w2):
            t.grad = None
        torch.manual_seed(2)
        fn(x).backward()
        return [t.grad.clone() for t in (x, w1, w2)]

    expected = gradients(body)
    got = gradients(torch.compile(lambda t: remat.checkpoint(region_name="broken")(body)(t), backend="aot_eager"))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def saved_by_the_partitioner(fn, *inputs):
    """The aten targets of what the partitioned forward graph saves for backward."""
    saved = []

    def partition(joint, joint_inputs, **kwargs):
        forward, backward = min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
        outputs = next(node for node in forward.graph.nodes if node.op == "output").args[0]
        user_outputs = kwargs["num_fwd_outputs"]
        saved.extend(str(node.target) for node in outputs[user_outputs:] if hasattr(node, "target"))
        return forward, backward

    def backend(graph, example_inputs):
        return aot_module_simplified(graph, example_inputs, fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g,
                                     partition_fn=partition)

    torch.compile(fn, backend=backend, fullgraph=True)(*inputs).sum().backward()
    return saved


def test_the_partitioner_saves_save_regions_and_recomputes_recompute_regions():
    x, w1, w2 = parameters((16, 32), (32, 32), (32, 32))

    def mlp_saved(t):
        def body(u):
            h = remat.region(lambda v: (v @ w1).tanh(), "attention")(u)
            return remat.region(lambda v: (v @ w2).sigmoid(), "mlp", recompute=False)(h) * 2.0
        return remat.checkpoint(region_name="saved-mlp")(body)(t)

    def attention_saved(t):
        def body(u):
            h = remat.region(lambda v: (v @ w1).tanh(), "attention", recompute=False)(u)
            return remat.region(lambda v: (v @ w2).sigmoid(), "mlp")(h) * 2.0
        return remat.checkpoint(region_name="saved-attention")(body)(t)

    saved = saved_by_the_partitioner(attention_saved, x)
    assert "aten.tanh.default" in saved and "aten.sigmoid.default" not in saved
    torch._dynamo.reset()
    saved = saved_by_the_partitioner(mlp_saved, x)
    assert "aten.sigmoid.default" in saved and "aten.tanh.default" not in saved


def test_a_context_fn_given_to_call_is_torch_checkpoints_own_under_compile(fresh_dynamo):
    """transformers hands gradient_checkpointing_kwargs' context_fn to a checkpoint's .call(): under
    torch.compile that raised inside the compiled function, so Dynamo broke the graph there (4
    breaks) and the step ran eagerly without a word (fullgraph=True: Dynamo's "Observed
    exception"). Now it passes to torch.utils.checkpoint as remat.checkpoint(context_fn=) does:
    the partitioner saves the matmuls the policy names and recomputes the rest."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    x, w = parameters((16, 32), (32, 32))

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    def step(t):
        return remat.checkpoint(region_name="selective").call(
            lambda u: ((u @ w).sin() @ w).cos(), t,
            context_fn=functools.partial(create_selective_checkpoint_contexts, policy))

    saved = saved_by_the_partitioner(step, x)
    assert "aten.mm.default" in saved and "aten.sin.default" not in saved, saved
    x.grad = w.grad = None
    ((x @ w).sin() @ w).cos().sum().backward()
    expected = [x.grad.clone(), w.grad.clone()]
    x.grad = w.grad = None
    torch._dynamo.reset()
    torch.compile(step, backend="aot_eager", fullgraph=True)(x).sum().backward()
    assert torch.equal(x.grad, expected[0]) and torch.equal(w.grad, expected[1])


def test_a_compiled_module_inside_an_eager_checkpoint_works():
    x, w1, w2 = parameters((16, 32), (32, 32), (32, 32))
    attention = torch.compile(lambda u: torch.relu(u @ w1), backend="aot_eager")

    def step(t):
        def body(u):
            h = remat.region(attention, "attention", recompute=False)(u)
            return remat.region(lambda v: (v @ w2).tanh(), "mlp")(h)
        return remat.checkpoint(region_name="inner-compiled")(body)(t)

    got = grads_of(step, (x, w1, w2), x)
    expected = grads_of(save_and_recompute, (x, w1, w2), x, w1, w2)
    assert all(torch.allclose(g, e, **TOLERANCE) for g, e in zip(got, expected))


EAGER_ONLY_OPTIONS = [
    (dict(contexts=[remat.RecomputeReplay("router")]), "the contexts option (replay channels) needs",
     "drop contexts under torch.compile"),
    (dict(verify_recompute=True), "verify_recompute=True needs",
     "drop verify_recompute under torch.compile (verify in an eager run)"),
]


@pytest.mark.parametrize("fullgraph", [False, True], ids=["graph", "fullgraph"])
@pytest.mark.parametrize("option,named,fix", EAGER_ONLY_OPTIONS, ids=["replay-channel", "verify_recompute"])
def test_eager_only_options_of_a_compiled_checkpoint_raise_a_rematerror_naming_the_option_and_the_fix(
        option, named, fix, fullgraph):
    # Not pybind's TypeError (without fullgraph) nor Dynamo's Unsupported with ours in its debug
    # context (fullgraph): the RematError itself.
    x = torch.rand(8, requires_grad=True)
    step = lambda t: remat.checkpoint(region_name="eager-only", **option)(lambda u: u.sin())(t)  # noqa: E731
    with pytest.raises(remat.RematError) as info:
        torch.compile(step, backend="aot_eager", fullgraph=fullgraph)(x)
    assert str(info.value) == (f"checkpoint 'eager-only': {named} recompute to run the Python body again, which a "
                               f"compiled graph never does; {fix}; or compile inside the checkpoint instead: "
                               "remat.checkpoint(...)(torch.compile(block))")


def test_verify_recompute_switched_on_around_a_compiled_step_raises_a_rematerror_and_switched_off_runs():
    x = torch.rand(8, requires_grad=True)
    ckpt = remat.checkpoint(region_name="switched")
    compiled = torch.compile(lambda t: ckpt(lambda u: u.sin().exp())(t), backend="aot_eager", fullgraph=True)
    expected = (x.sin().exp() * x.cos()).detach()
    with remat.verify_recompute(True):
        with pytest.raises(remat.RematError) as info:
            compiled(x)
        with remat.verify_recompute(False):
            compiled(x).sum().backward()
    assert str(info.value) == (
        "checkpoint 'switched': verify_recompute, switched on by remat.verify_recompute(True) around the call, needs "
        "recompute to run the Python body again, which a compiled graph never does; call the compiled function "
        "outside remat.verify_recompute(True) (or inside remat.verify_recompute(False)), or pass "
        "verify_recompute=False to this checkpoint; or compile inside the checkpoint instead: "
        "remat.checkpoint(...)(torch.compile(block))")
    assert torch.allclose(x.grad, expected, **TOLERANCE)


def test_the_torch_remat_readme_block_compiles_fullgraph_with_recompute_needs_tensor_and_names():
    # torch_remat's README pattern: save regions, recompute_needs_tensor on their outputs, a
    # name scope and a named save: under compile the marks are no-ops, the gradients eager's.
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    attention, moe = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            remat.save_for_backward(ctx, {"input": t})
            return t * t

        @staticmethod
        def backward(ctx, grad):
            (t,) = ctx.saved_tensors
            return 2.0 * t * grad

    def block(hidden):
        with remat.name_scope("block.0"):
            attn = remat.region(attention, "attention", recompute=False)(norm(hidden))
        remat.recompute_needs_tensor(attn, attn)
        hidden = hidden + attn
        expert = remat.region(lambda u: Square.apply(moe(u)), "moe", recompute=False)(norm(hidden))
        remat.recompute_needs_tensor(expert)
        return hidden + expert

    def step(x):
        return remat.checkpoint(region_name="layers.0")(block)(x)

    x = torch.rand(4, 16, requires_grad=True)
    tensors = (x, *norm.parameters(), *attention.parameters(), *moe.parameters())
    expected = grads_of(step, tensors, x)
    torch._dynamo.reset()
    got = grads_of(torch.compile(step, backend="aot_eager", fullgraph=True), tensors, x)
    assert all(torch.allclose(g, e, **TOLERANCE) for g, e in zip(got, expected))


def test_a_trace_scope_inside_a_collect_trace_block_compiles_fullgraph_and_gives_the_eager_gradient():
    x, w1, w2 = parameters((16, 32), (32, 32), (32, 32))
    scoped = remat.trace_scope(save_and_recompute, "layer", metadata="l0")
    expected = grads_of(save_and_recompute, (x, w1, w2), x, w1, w2)
    with remat.collect_trace():
        explanation = torch._dynamo.explain(scoped)(x, w1, w2)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    with remat.collect_trace() as trace:
        got = grads_of(torch.compile(scoped, backend="aot_eager", fullgraph=True), (x, w1, w2), x, w1, w2)
    assert all(torch.allclose(g, e, **TOLERANCE) for g, e in zip(got, expected))
    assert trace.entries == []  # collect_trace sees nothing of compiled checkpoints


def test_a_plan_or_a_profile_around_a_compiled_step_is_refused_before_its_forward_naming_torch_compile(fresh_dynamo):
    """A compiled step runs no region as such: use_plan and profile_regions around one refuse it
    at its first compiled checkpoint, before its forward runs, naming torch.compile and the fix
    (as remat.fit does), not another model layout. Dynamo guards on whether such a block is open:
    the graph compiled outside the block is compiled again inside it, and runs again after."""
    w1, w2 = parameters((32, 32), (32, 32))
    forwards = []

    def step(x):
        def block(t):
            h = remat.region(lambda u: torch.relu(u @ w1), "attn", recompute=False)(t)
            return remat.region(lambda u: (u @ w2).tanh(), "mlp")(h) + h
        for index in range(2):
            x = remat.checkpoint(region_name=f"layers.{index}")(block)(x)
        return x.sum()

    x = torch.randn(16, 32, requires_grad=True)
    with remat.profile_regions() as profile:
        step(x).backward()
    plan = profile.plan(profile.base_bytes)
    compiled = torch.compile(step, backend="aot_eager")
    expected = grads_of(compiled, (x, w1, w2), x)  # compiled outside any block: runs
    refusal = (r"checkpoint 'layers.0' runs under torch.compile .* no region runs as such .* so no profile can "
               r"measure it and no plan can apply to it; nothing of the step ran. Profile and plan the eager model")
    for _ in range(2):
        for t in (x, w1, w2):
            t.grad = None
        with pytest.raises(ValueError, match="use_plan: " + refusal) as raised:
            with remat.use_plan(plan):
                forwards.append(compiled(x))
        assert "another model layout" not in str(raised.value)
        with pytest.raises(ValueError, match="profile_regions: " + refusal):
            with remat.profile_regions():
                forwards.append(compiled(x))
        assert forwards == [] and all(t.grad is None for t in (x, w1, w2))
        assert all(torch.equal(g, e) for g, e in zip(grads_of(compiled, (x, w1, w2), x), expected))
    assert not remat._plans.block_open


def test_a_compiled_step_runs_beside_a_plan_on_another_thread_and_under_no_grad_inside_one(fresh_dynamo):
    """The refusal is for the thread in the block, and for steps with gradients: a compiled step
    on another thread runs (gradients as without the block), and so does a compiled forward under
    no_grad inside the block."""
    x, w1, w2 = parameters((16, 32), (32, 32), (32, 32))
    with remat.profile_regions() as profile:
        save_and_recompute(x, w1, w2).sum().backward()
    plan = profile.plan(profile.base_bytes)
    compiled = torch.compile(save_and_recompute, backend="aot_eager")
    expected = grads_of(compiled, (x, w1, w2), x, w1, w2)
    opened, done, got = threading.Event(), threading.Event(), []

    def hold_a_plan():
        with remat.use_plan(plan, strict=False):
            opened.set()
            done.wait(60)

    holder = threading.Thread(target=hold_a_plan)
    holder.start()
    try:
        assert opened.wait(60) and remat._plans.block_open
        got = grads_of(compiled, (x, w1, w2), x, w1, w2)
    finally:
        done.set()
        holder.join(60)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    with remat.use_plan(plan, strict=False):  # (strict: the plan's regions ran nowhere)
        with torch.no_grad():
            out = compiled(x, w1, w2)
        with pytest.raises(ValueError, match="use_plan: checkpoint 'l0' runs under torch.compile"):
            compiled(x, w1, w2)
    assert torch.equal(out, save_and_recompute(x, w1, w2).detach())


def test_a_body_asking_is_recomputing_compiles_whole():
    """torch_remat's pattern (`if not remat.is_recomputing(): ...` for work autograd does not save)
    inside a body: Dynamo could not trace the runtime's call, so fullgraph=True raised; now it reads
    False while tracing, as the compiled graph never runs the body's Python again."""
    x, w = parameters((8, 16), (16, 16))

    def body(t):
        h = remat.region(lambda u: (u @ w).relu(), "attention", recompute=False)(t)
        if not remat.is_recomputing():
            h = h * 1.0  # (forward's work alone; the same values)
        return (h @ w).tanh()

    (expected,) = grads_of(body, (x,), x)
    step = torch.compile(lambda t: remat.checkpoint(region_name="asks")(body)(t), backend="aot_eager", fullgraph=True)
    (got,) = grads_of(step, (x,), x)
    assert torch.allclose(got, expected, **TOLERANCE)
    assert not remat.is_recomputing()
