"""remat.fit under inputs of many lengths (dynamic padding: every batch padded to its longest
sequence). Each new length was profiled again where saving everything fit the budget (a profiled
step ran at several times a step's cost: 70 profiles and 3.8x the loop's time over 200 steps of 93
lengths), each was said (109 warnings), and each length growing faster than its scaled prediction
went over the budget once, some again under the next plan. Now a step within twice the nearest
profile's inputs plans from it (a shorter one from a longer profile as it is), the first few new
shapes are said and then one line, a length that went over leaves room for what it took above its
prediction, and other lengths scale by the growth measured. fit() again on a fitted model keeps
what it learned."""

import random

import torch

import fit_loop
import remat
from remat._fit import SHAPES_SAID

WIDTH = 16


class Masked(fit_loop.Layer):
    """A layer whose "attn" region mixes rows through a rows x rows mask the model makes once a
    step, as a causal mask (its bytes grow with the square of the rows, whatever the plan)."""

    def forward(self, x, mask, plain=False):
        def attn(t):
            return mask @ self.attn(t) + t

        def mlp(t):
            return self.down(self.up(t).cos()) + t

        return mlp(attn(x)) if plain else remat.region(mlp, "mlp")(remat.region(attn, "attn")(x))


class Model(torch.nn.Module):
    def __init__(self, checkpointed=True):
        super().__init__()
        self.layers = torch.nn.ModuleList([Masked(WIDTH) for _ in range(3)])
        self.checkpointed = checkpointed

    def forward(self, x):
        rows = x.shape[-2]
        mask = torch.ones(rows, rows).tril() / rows
        for index, layer in enumerate(self.layers):
            if self.checkpointed:
                x = remat.checkpoint(region_name=f"layers.{index}")(layer)(x, mask)
            else:
                x = layer(x, mask, plain=True)
        return x.square().mean()


def batch(step, rows):
    return torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(step), requires_grad=True)


def train(make_model, budget, lengths, refit=None):
    """Per step: (rows, peak, predicted, whether profiled, gradients as bytes); the fit state and
    the fit warnings. `refit`: (step, budget, at every step from there) at which fit() runs again."""
    rows = []
    with fit_loop.fitted(make_model, budget) as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for step, count in enumerate(lengths):
            if refit is not None and step >= refit[0] and (step == refit[0] or refit[2]):
                remat.fit(model, refit[1])
            peak, grads = fit_loop.sgd_step(model, optimizer, batch(step, count))
            state = getattr(model, "remat_fit", None)
            profiled = state is not None and state.plan is None
            rows.append((count, peak, None if state is None else state.predicted_peak_bytes, profiled, grads))
        state = fit_loop.unfit(model, batch(0, 8))
    return rows, state, fit_loop.messages(told, "remat.fit")


def test_lengths_within_twice_the_profile_are_planned_from_it_and_said_a_few_times():
    rng = random.Random(1)
    lengths = [64] + [rng.randint(40, 127) for _ in range(30)]
    plain, _, _ = train(lambda: Model(checkpointed=False), None, lengths)
    rows, state, told = train(Model, "1GiB", lengths)
    assert [row[4] for row in rows] == [row[4] for row in plain]  # bitwise, every step
    assert state.profiled_steps == 1 and [row[3] for row in rows[1:]] == [False] * (len(rows) - 1)
    new_shapes = len(set(lengths)) - 1
    assert new_shapes > SHAPES_SAID + 5
    said = [message for message in told if "inputs changed shape" in message]
    assert len(said) == SHAPES_SAID, told
    assert all("within 2x the nearest profile's inputs, not profiled again" in message or
               "a profile of larger inputs bounds it" in message for message in said), said
    rest = [message for message in told if "keep changing shape" in message]
    assert len(rest) == 1 and f"({SHAPES_SAID + 1} new shapes so far)" in rest[0] and len(told) == SHAPES_SAID + 1


def test_a_length_that_went_over_its_scaled_prediction_leaves_room_for_it_at_the_next_step():
    """The mask grows with the square of the rows: scaled by the token count, a 60-row step planned
    from the 32-row profile under-counts it. After the first step at a length goes over (said), the
    next at that length is within the budget, whatever plan it takes (it went over again under the
    next plan, which recomputed more of what scales and so counted less of what grew)."""
    _, profiled, _ = train(Model, "1GiB", [60, 60])
    at_60 = profiled.profiles[(((60, WIDTH), torch.float32, "cpu"),)].profile
    budget = at_60.least_peak_bytes() + (at_60.step_peak_bytes - at_60.least_peak_bytes()) * 4 // 5
    lengths = [32, 60, 60, 60, 56, 56, 56, 44, 44, 60]
    plain, _, _ = train(lambda: Model(checkpointed=False), None, lengths)
    rows, state, told = train(Model, budget, lengths)
    assert [row[4] for row in rows] == [row[4] for row in plain]
    assert state.profiled_steps == 1
    over = [message for message in told if "peaked at" in message and "over the budget" in message]
    assert len(over) <= 1 and all("grows faster than the token count. Steps with these inputs now leave" in message
                                  for message in over), told
    for step, (count, peak, predicted, _, _) in enumerate(rows[2:], 2):
        assert peak <= budget, (step, count, peak, budget, told)  # 60 rows again, and 56 and 44 as estimated


def test_fit_again_with_a_smaller_budget_plans_from_what_it_learned():
    """fit() again (another budget) keeps the profiles: the next step is planned within the new
    budget, not profiled again saving everything (28% over a re-fit's budget before)."""
    lengths = [64, 64, 64, 64, 64]
    _, profiled, _ = train(Model, "1GiB", lengths[:2])
    at_64 = profiled.profiles[(((64, WIDTH), torch.float32, "cpu"),)].profile
    smaller = at_64.least_peak_bytes() + (at_64.step_peak_bytes - at_64.least_peak_bytes()) // 2
    plain, _, _ = train(lambda: Model(checkpointed=False), None, lengths)
    rows, state, told = train(Model, "1GiB", lengths, refit=(3, smaller, False))
    assert [row[4] for row in rows] == [row[4] for row in plain]
    assert state.profiled_steps == 0 and state.budget == smaller and len(state.profiles) == 1
    assert [row[3] for row in rows] == [True, False, False, False, False]
    assert all(peak <= smaller for _, peak, _, _, _ in rows[3:]), (rows, smaller)
    assert not [message for message in told if "over the budget" in message], told


def test_fit_again_before_every_step_keeps_the_profile_the_first_step_made():
    """A loop that applies its budget before every step (fit() each time): the first step's
    profile, still open when the second fit() ran, was dropped, so every step was profiled again
    with every region saved, over the budget, without a word."""
    lengths = [64] * 5
    _, profiled, _ = train(Model, "1GiB", lengths[:2])
    at_64 = profiled.profiles[(((64, WIDTH), torch.float32, "cpu"),)].profile
    budget = at_64.least_peak_bytes() + (at_64.step_peak_bytes - at_64.least_peak_bytes()) // 2
    plain, _, _ = train(lambda: Model(checkpointed=False), None, lengths)
    rows, state, told = train(Model, budget, lengths, refit=(1, budget, True))
    assert [row[4] for row in rows] == [row[4] for row in plain]
    assert [row[3] for row in rows] == [True, False, False, False, False] and len(state.profiles) == 1
    assert all(peak <= budget for _, peak, _, _, _ in rows[1:]), (rows, budget)
    assert not [message for message in told if "micro-batch" in message], told


def test_a_longer_sequence_at_the_same_token_count_is_profiled_not_bounded_by_a_shorter_one():
    """Token batching: 1 x 64 rows after 4 x 16 holds as many tokens, but whatever grows with the
    square of the sequence (the mask here) grows 4 times: it was planned from the 4 x 16 profile as
    it is, said to be bounded by it. Stretched 2x or more along a dimension, it is profiled again
    where saving everything fits; 2 x 16 is bounded by 4 x 16 and plans from it."""
    shapes = [(4, 16), (4, 16), (2, 16), (1, 64)]
    batches = [torch.randn(b, s, WIDTH, generator=torch.Generator().manual_seed(i), requires_grad=True)
               for i, (b, s) in enumerate(shapes)]
    with fit_loop.fitted(Model, "1GiB") as (model, told):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        profiled = []
        for x in batches:
            fit_loop.sgd_step(model, optimizer, x)
            profiled.append(model.remat_fit.plan is None)
        state = fit_loop.unfit(model, batches[0])
    assert profiled == [True, False, False, True], profiled
    assert sorted(signature[0][0] for signature in state.profiles) == [(1, 64, WIDTH), (4, 16, WIDTH)]
    said = fit_loop.messages(told, "inputs changed shape")
    assert "a profile of larger inputs bounds it" in said[0] and "profiling this step again" in said[1], said
