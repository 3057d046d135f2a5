"""Record and replay of forward decisions across recompute (remat.RecomputeReplay), checkpoint
contexts, and verify_recompute catching a region that is not deterministic."""

import gc
import json

import pytest
import torch

import remat


def test_decision_is_computed_in_forward_only_and_replayed_in_recompute():
    channel = remat.RecomputeReplay("counter")
    computed = []
    taken = []
    x = torch.rand(4, requires_grad=True)

    def body(t):
        decision = channel.record_or_replay(lambda: computed.append(remat.is_recomputing()) or len(computed) * 10)
        taken.append((remat.is_recomputing(), decision))
        return (t * float(decision)).exp().sum()

    loss = remat.checkpoint(region_name="replay.counter", contexts=[channel])(body)(x)
    loss.backward()
    assert computed == [False]  # compute() ran in forward only
    assert taken == [(False, 10), (True, 10)]
    assert torch.equal(x.grad, (x.detach() * 10.0).exp() * 10.0)
    assert channel.name == "counter"


def test_when_the_log_runs_out_recompute_falls_back_to_computing():
    channel = remat.RecomputeReplay("misses")
    computed = []
    taken = []
    x = torch.rand(4, requires_grad=True)

    def body(t):
        calls = 3 if remat.is_recomputing() else 1  # recompute asks for more than forward recorded
        for _ in range(calls):
            taken.append(channel.record_or_replay(lambda: computed.append(len(computed)) or 100 + len(computed)))
        return t.exp().sum()

    remat.checkpoint(region_name="replay.misses", contexts=[channel])(body)(x).backward()
    assert taken == [101, 101, 102, 103]  # forward's record replayed, then two misses computed
    assert computed == [0, 1, 2]


def test_outside_a_checkpoint_record_or_replay_just_computes():
    channel = remat.RecomputeReplay("plain")
    values = [channel.record_or_replay(lambda i=i: i * 2) for i in range(3)]
    assert values == [0, 2, 4]


def test_a_channel_not_passed_in_contexts_computes_in_forward_and_in_recompute():
    channel = remat.RecomputeReplay("unbound")
    computed = []
    x = torch.rand(4, requires_grad=True)

    def body(t):
        channel.record_or_replay(lambda: computed.append(remat.is_recomputing()))
        return t.exp().sum()

    remat.checkpoint(region_name="replay.unbound")(body)(x).backward()
    assert computed == [False, True]


def test_compute_runs_without_autograd():
    channel = remat.RecomputeReplay("no-grad")
    x = torch.rand(4, requires_grad=True)
    grad_enabled = []

    def body(t):
        chosen = channel.record_or_replay(lambda: grad_enabled.append(torch.is_grad_enabled()) or t.argmax())
        return (t * t[chosen]).sum()

    loss = remat.checkpoint(region_name="replay.no-grad", contexts=[channel])(body)(x)
    loss.backward()
    assert grad_enabled == [False]


class Router:
    """A frozen router: the top-k choice is a decision recompute can take back."""

    TOP = 2

    def __init__(self, channel=None):
        torch.manual_seed(3)
        self.router_weight = torch.randn(8, 16)  # frozen
        self.experts = (torch.randn(8, 16, 16) * 0.1).requires_grad_(True)
        self.channel = channel
        self.topk_calls = 0

    def forward(self, x):
        logits = torch.matmul(x, self.router_weight.t())

        def compute():
            self.topk_calls += 1
            return logits.topk(self.TOP, -1)[1]

        if self.channel is not None:
            indices = self.channel.record_or_replay(compute)
        else:
            with torch.no_grad():  # the same decision, made the same way, without a channel
                indices = compute()
        gates = torch.softmax(logits.gather(-1, indices), -1)  # [T, k]
        chosen = self.experts.index_select(0, indices.flatten()).view(x.size(0), self.TOP, x.size(1), x.size(1))
        outputs = torch.matmul(x.unsqueeze(1).unsqueeze(2), chosen).squeeze(2)  # [T, k, D]
        return (outputs * gates.unsqueeze(-1)).sum(1)

    def grads(self, x_in, checkpointed, contexts=()):
        x = x_in.detach().clone().requires_grad_(True)
        self.experts.grad = None
        if checkpointed:
            out = remat.checkpoint(region_name="moe", contexts=contexts)(lambda t: self.forward(t).tanh())(x)
        else:
            out = self.forward(x).tanh()
        out.pow(2).sum().backward()
        return x.grad.clone(), self.experts.grad.clone()


def test_frozen_router_top_k_runs_once_in_forward_and_never_in_recompute_with_bitwise_gradients():
    x = torch.randn(32, 16)
    reference = Router().grads(x, checkpointed=False)
    recomputed_router = Router()
    recomputed = recomputed_router.grads(x, checkpointed=True)
    channel = remat.RecomputeReplay("router.topk")
    replaying_router = Router(channel)
    replayed = replaying_router.grads(x, checkpointed=True, contexts=[channel])

    assert recomputed_router.topk_calls == 2  # forward and recompute
    assert replaying_router.topk_calls == 1  # forward only
    assert torch.equal(replayed[0], reference[0]) and torch.equal(replayed[1], reference[1])
    assert torch.equal(recomputed[0], reference[0]) and torch.equal(recomputed[1], reference[1])


def test_each_call_gets_its_own_recorder_even_with_two_microbatches_in_flight():
    torch.manual_seed(4)
    channel = remat.RecomputeReplay("router.topk")
    forward_choice, recompute_choice = [], []

    def body(t):
        choice = channel.record_or_replay(lambda: t.topk(1, -1)[1])
        (recompute_choice if remat.is_recomputing() else forward_choice).append(choice)
        return (t * 2.0).exp().sum()

    x1 = torch.randn(4, 6, requires_grad=True)
    x2 = torch.randn(4, 6, requires_grad=True)
    loss1 = remat.checkpoint(region_name="replay.microbatches", contexts=[channel])(body)(x1)
    loss2 = remat.checkpoint(region_name="replay.microbatches", contexts=[channel])(body)(x2)
    loss2.backward()  # recompute of call 2 first
    loss1.backward()
    assert len(forward_choice) == 2 and len(recompute_choice) == 2
    assert not torch.equal(forward_choice[0], forward_choice[1])
    assert recompute_choice[0] is forward_choice[1]  # the recorded object itself, taken back
    assert recompute_choice[1] is forward_choice[0]


class RoutedLayers:
    """Layers that record their top-k into one channel, each in its own region of one checkpoint
    (the MoE layers of docs/python.md). Recompute skips a save region, so the decision it
    recorded is never asked for: the recomputed region after it must take back its own."""

    def __init__(self, channel, layers=2):
        torch.manual_seed(0)
        self.channel = channel
        self.weights = [torch.rand(8, 8, requires_grad=True) for _ in range(layers)]
        self.decided = []  # every decision computed, none taken back

    def layer(self, t, i):
        scores = t @ self.weights[i]
        bound = self.channel.current()
        if bound is not None and bound[1] == "replay":
            indices = bound[0].take()
        else:
            with torch.no_grad():
                indices = scores.topk(2, dim=-1).indices
            self.decided.append(indices)
            if bound is not None:
                bound[0].record(indices)
        return torch.gather(scores, -1, indices).repeat(1, 4)

    def grads(self, body, checkpointed=True, plan=None, use_plan=None, backwards=1):
        for w in self.weights:
            w.grad = None
        self.decided = []
        torch.manual_seed(1)
        x = torch.rand(4, 8, requires_grad=True)
        if not checkpointed:
            y = body(x, lambda f, name, recompute=True: f)
        else:
            run = remat.checkpoint(region_name="c", context_fn=self.channel.checkpoint_context_fn(),
                                   plan=plan)(lambda t: body(t, remat.region))
            if use_plan is None:
                y = run(x)
            else:
                with remat.use_plan(use_plan):
                    y = run(x)
        loss = (y * torch.arange(8.0)).sum()
        for i in range(backwards):
            loss.backward(retain_graph=i + 1 < backwards)
        return [x.grad.clone()] + [w.grad.clone() for w in self.weights]


def plan_of(decisions):
    return remat.load_plan(json.dumps({"kind": "remat-plan", "schema_version": 1, "budget_bytes": 0, "base_bytes": 0,
                                       "kept_bytes": 0, "recompute_seconds": 0, "decisions": decisions}))


def assert_equal_grads(actual, expected):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert torch.equal(a, e), f"gradient {i} differs by {(a - e).abs().max().item()}"


@pytest.mark.parametrize("saved_by", ["code", "use_plan", "checkpoint(plan=)"])
def test_a_recomputed_region_replays_its_own_decision_after_a_saved_one(saved_by):
    layers = RoutedLayers(remat.RecomputeReplay("router.topk"))

    def body(x, region, first_recomputes=saved_by != "code"):
        h = region(lambda t: layers.layer(t, 0), "moe1", recompute=first_recomputes)(x)
        return region(lambda t: layers.layer(t, 1), "moe2", recompute=True)(h)

    expected = layers.grads(body, checkpointed=False)
    assert not torch.equal(layers.decided[0], layers.decided[1])  # a misplaced decision would show
    plan = plan_of({"c::moe1": "save", "c::moe2": "recompute"})
    actual = layers.grads(body, plan=plan if saved_by == "checkpoint(plan=)" else None,
                          use_plan=plan if saved_by == "use_plan" else None)
    assert_equal_grads(actual, expected)
    assert len(layers.decided) == 2  # forward's; recompute took moe2's back
    twice = layers.grads(body, plan=plan if saved_by == "checkpoint(plan=)" else None,
                         use_plan=plan if saved_by == "use_plan" else None, backwards=2)
    assert_equal_grads(twice, [g * 2 for g in expected])  # the second recompute replays again
    assert len(layers.decided) == 2


def test_a_save_region_nested_in_a_recomputed_one_leaves_the_outer_decisions_in_order():
    layers = RoutedLayers(remat.RecomputeReplay("router.topk"), layers=4)

    def body(x, region):
        def outer(t):
            a = layers.layer(t, 0)
            b = region(lambda u: layers.layer(u, 1), "inner", recompute=False)(a)
            return layers.layer(b, 2)  # the outer region's second decision, after the skipped one

        return layers.layer(region(outer, "outer")(x), 3)  # in the body, outside regions

    expected = layers.grads(body, checkpointed=False)
    assert not torch.equal(layers.decided[1], layers.decided[2])
    assert_equal_grads(layers.grads(body), expected)
    assert len(layers.decided) == 4


class RoutedModel(torch.nn.Module):
    """Checkpointed layers of two routed regions each: moe1 keeps little, moe2 much (a wide
    body), so remat.fit under a budget between saves moe1 and recomputes moe2."""

    LAYERS = 4

    def __init__(self, channel):
        super().__init__()
        self.channel = channel
        self.w1 = torch.nn.ParameterList(torch.nn.Parameter(torch.rand(64, 64)) for _ in range(self.LAYERS))
        self.w2 = torch.nn.ParameterList(torch.nn.Parameter(torch.rand(64, 64)) for _ in range(self.LAYERS))

    def layer(self, t, w, wide):
        scores = (t @ w) * 0.05
        indices = self.channel.record_or_replay(lambda: scores.topk(8, dim=-1).indices)
        return torch.gather(scores, -1, indices).repeat(1, 8 * wide).sin().cos().sin()[:, :64]

    def forward(self, x, plain=False):
        region = (lambda f, name: f) if plain else remat.region
        for k in range(self.LAYERS):
            def body(t, k=k):
                h = region(lambda u: self.layer(u, self.w1[k], 1), "moe1")(t)
                return region(lambda u: self.layer(u, self.w2[k], 8), "moe2")(h)
            x = body(x) if plain else remat.checkpoint(region_name=f"layers.{k}",
                                                       context_fn=self.channel.checkpoint_context_fn())(body)(x)
        return x.sum()


def test_under_fit_a_recomputed_region_replays_its_own_decision_after_a_saved_one():
    import fit_loop

    channel = remat.RecomputeReplay("router.topk")
    inputs = [torch.rand(64, 64, generator=torch.Generator().manual_seed(step)) for step in range(3)]

    def train(budget):
        rows = []
        with fit_loop.fitted(lambda: RoutedModel(channel), budget) as (model, _):
            for x in inputs:
                for p in model.parameters():
                    p.grad = None
                peak = fit_loop.peak_of(lambda: model(x, plain=budget is None).backward())
                state = getattr(model, "remat_fit", None)
                plan = None if state is None or state.plan is None else dict(state.plan.decisions)
                rows.append((peak, [p.grad.numpy().tobytes() for p in model.parameters()], plan))
            fit_loop.unfit(model, inputs[0])  # the last step ended and fit taken off, for the tests after
        del model
        gc.collect()  # the model's reference cycles freed now, not in a later test's measured step
        return rows

    expected = train(None)
    profiled_peak = train(10 << 30)[0][0]  # the first step, every region saved
    # The case at stake: moe1 saved, moe2 recomputed in one checkpoint. Which budget plans it
    # depends on the regions' measured times, so budgets are tried until one does.
    for fraction in (0.7, 0.8, 0.6, 0.9, 0.5):
        fitted = train(int(profiled_peak * fraction))
        plans = [plan for _, _, plan in fitted[1:]]
        mixed = [f"layers.{k}" for k in range(RoutedModel.LAYERS)
                 if plans[0][f"layers.{k}::moe1"] == "save" and plans[0][f"layers.{k}::moe2"] == "recompute"]
        if mixed:
            break
    assert mixed, plans[0]
    for step, ((_, grads, _), (_, want, _)) in enumerate(zip(fitted, expected)):
        assert grads == want, f"step {step}: gradients differ from no checkpointing under {plans}"


def test_contexts_enter_in_order_and_exit_in_reverse_around_forward_and_recompute():
    events = []

    class Event:
        def __init__(self, name):
            self.name = name

        def enter_forward(self):
            events.append(f"{self.name} forward enter")

        def exit_forward(self):
            events.append(f"{self.name} forward exit")

        def enter_recompute(self):
            events.append(f"{self.name} recompute enter")

        def exit_recompute(self):
            events.append(f"{self.name} recompute exit")

    x = torch.rand(4, requires_grad=True)

    def body(t):
        events.append("body recompute" if remat.is_recomputing() else "body forward")
        return t.exp().sum()

    loss = remat.checkpoint(region_name="replay.contexts", contexts=[lambda: Event("A"), lambda: Event("B")])(body)(x)
    loss.backward()
    assert events == ["A forward enter", "B forward enter", "body forward", "B forward exit", "A forward exit",
                      "A recompute enter", "B recompute enter", "body recompute", "B recompute exit",
                      "A recompute exit"]


def noisy_block(t):
    return remat.region(lambda u: (u + torch.rand_like(u)).exp(), "noisy")(t).sum()


def test_verify_recompute_catches_a_region_that_is_not_deterministic():
    loss = remat.checkpoint(region_name="verify", verify_recompute=True)(noisy_block)(torch.rand(16, requires_grad=True))
    with pytest.raises(remat.RematError) as raised:
        loss.backward()
    message = str(raised.value)
    assert message.startswith("verify_recompute: checkpoint 'verify': saved tensor #0 of region 'verify::noisy' "
                              "(shape [16]) differs between forward and recompute: sum ")
    assert "(difference " in message
    assert message.endswith("The region is not deterministic, or what it reads changed between forward and backward: "
                            "add a remat.RecomputeStateHook for the state it depends on (RNG: "
                            "remat.cpu_rng_state_hook()); parameters swapped in for the forward alone "
                            "(torch.func.functional_call around the checkpoint) must stay in place until its backward")


def test_verify_recompute_catches_parameters_swapped_in_for_the_forward_alone_where_no_op_saved_them():
    # torch.func.functional_call around a checkpointed model puts the module's own parameters back
    # before backward, so recompute reads other weights: values differ, shapes do not. The linear's
    # input takes no gradient, so it saves no weight the runtime could see swapped
    # (test_functional_call.py): the values differ.
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            body = remat.region(lambda t: self.linear(t).sin(), "linear")
            return remat.checkpoint(region_name="swapped", verify_recompute=True)(lambda t: body(t).cos())(x)

    model = Model()
    doubled = {name: (p.detach() * 2).requires_grad_() for name, p in model.named_parameters()}
    out = torch.func.functional_call(model, doubled, (torch.rand(4, 8),))
    with pytest.raises(remat.RematError, match=r"verify_recompute: checkpoint 'swapped': .* differs between forward "
                                               r"and recompute: .*torch.func.functional_call around the checkpoint"):
        out.sum().backward()


def test_verify_recompute_context_manager_turns_it_on_for_checkpoints_started_inside():
    x = torch.rand(16, requires_grad=True)
    with remat.verify_recompute():
        loss = remat.checkpoint(region_name="verify.context")(noisy_block)(x)
    with pytest.raises(RuntimeError, match=r"^verify_recompute: checkpoint 'verify.context': saved tensor #0 "):
        loss.backward()
    unverified = remat.checkpoint(region_name="verify.after-context")(noisy_block)(x)  # off again outside
    unverified.backward()


def test_verify_recompute_passes_with_the_rng_state_hook_and_gradients_match():
    x = torch.rand(16, requires_grad=True)
    torch.manual_seed(11)
    loss = remat.checkpoint(region_name="verify.hooked", verify_recompute=True, recompute_state_hooks=[remat.cpu_rng_state_hook()])(noisy_block)(x)
    loss.backward()
    x_ref = x.detach().clone().requires_grad_(True)
    torch.manual_seed(11)
    noisy_block(x_ref).backward()
    assert torch.equal(x.grad, x_ref.grad)
