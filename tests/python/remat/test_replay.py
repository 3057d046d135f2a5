"""Record and replay of forward decisions across recompute (remat.RecomputeReplay), checkpoint
contexts, and verify_recompute catching a region that is not deterministic."""

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
    assert message.endswith("The region is not deterministic: add a remat.RecomputeStateHook for the state it depends "
                            "on (RNG: remat.cpu_rng_state_hook())")


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
