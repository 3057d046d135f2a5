"""Per-op plans: profile_regions(ops=True) measures each region's ATen ops (index, name, output
bytes, time); profile.plan(budget_bytes, ops=True) may recompute a region yet keep chosen ops'
outputs, which recompute then takes instead of running the ops again. Gradients are bitwise those
without checkpointing (dropout too, with the RNG hook), what the checkpoints keep is at most the
plan's kept_bytes at every budget, and a region whose ops differ from the plan's is refused
naming the first difference."""

import itertools
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import remat
from remat._kept_ops import RegionKeep, held_storages
from remat._plans import live_checkpoint_bytes

REPO = pathlib.Path(__file__).resolve().parents[3]
WIDTH = 64
LAYERS = 3
ACTIVATION = 8 * WIDTH * 4  # one [8, 64] float32 activation

runs = {"mm": 0}


@torch.library.custom_op("remat_op_plans::counted_mm", mutates_args=())
def counted_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, counting the times it runs: what a kept op's recompute must not do."""
    runs["mm"] += 1
    return a @ b


@counted_mm.register_fake
def _(a, b):
    return a.new_empty(a.shape[0], b.shape[1])


def _counted_mm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    return grad @ b.T, a.T @ grad


def _counted_mm_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


counted_mm.register_autograd(_counted_mm_backward, setup_context=_counted_mm_context)


def make_weights():
    generator = torch.Generator().manual_seed(5)
    return [(torch.randn(WIDTH, WIDTH, generator=generator) / 8).requires_grad_() for _ in range(2 * LAYERS)]


def block(x, w1, w2, dropout=0.0):
    h = remat.region(lambda t: torch.tanh(counted_mm(t, w1)), "attn")(x)
    return remat.region(lambda t: torch.nn.functional.dropout(torch.sigmoid(counted_mm(t, w2)) * t, dropout).sin(),
                        "mlp")(h)


def plain_block(x, w1, w2, dropout=0.0):
    h = torch.tanh(counted_mm(x, w1))
    return torch.nn.functional.dropout(torch.sigmoid(counted_mm(h, w2)) * h, dropout).sin()


def model(x, weights, dropout=0.0, hooks=()):
    for layer in range(LAYERS):
        x = remat.checkpoint(region_name=f"layers.{layer}", recompute_state_hooks=list(hooks))(block)(
            x, weights[2 * layer], weights[2 * layer + 1], dropout)
    return x.square().sum()


def plain(x, weights, dropout=0.0):
    for layer in range(LAYERS):
        x = plain_block(x, weights[2 * layer], weights[2 * layer + 1], dropout)
    return x.square().sum()


def take_gradients(x, weights):
    """The gradients of x and the weights, which are cleared for the next backward."""
    gradients = [x.grad] + [w.grad for w in weights]
    x.grad = None
    for w in weights:
        w.grad = None
    return gradients


def assert_gradients_equal(x, weights, expected):
    """The gradients of x and the weights are bitwise `expected` (and are cleared)."""
    gradients = take_gradients(x, weights)
    assert len(gradients) == len(expected)
    for got, want in zip(gradients, expected):
        assert torch.equal(got, want)


def batch():
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1), requires_grad=True)


@pytest.fixture(scope="module")
def measured():
    weights = make_weights()
    with remat.profile_regions(ops=True) as profile:
        model(batch(), weights).backward()
    return profile


def matmuls_dear(profile):
    """The profile with every matmul priced far above the other ops (measured times are noise at
    this size): the plans below then keep the matmuls' outputs and recompute the rest."""
    doc = json.loads(profile.to_json())
    for region in doc["regions"]:
        if "ops" not in region:
            continue
        for op in region["ops"]:
            op["seconds"] = 1.0 if op["op"] == "remat_op_plans::counted_mm" else 1e-6
        region["seconds"] = sum(op["seconds"] for op in region["ops"]) + 1e-6
        region["op_overhead_seconds"] = 1e-5
    return remat.RegionProfile(json.dumps(doc))


def test_profile_lists_each_regions_ops_with_index_name_bytes_and_time(measured):
    assert measured.has_ops
    assert sorted(measured.ops) == sorted(f"layers.{i}::{r}" for i in range(LAYERS) for r in ("attn", "mlp"))
    mlp = measured.ops["layers.0::mlp"]
    # counted_mm, sigmoid, mul, then sin (dropout of 0 in training returns its input's clone or
    # runs as native_dropout, a random op that is never listed).
    names = [op["op"] for op in mlp]
    assert names[0] == "remat_op_plans::counted_mm"
    assert names[1:3] == ["aten::sigmoid", "aten::mul.Tensor"]
    assert names[-1] == "aten::sin"
    assert [op["index"] for op in mlp] == sorted(op["index"] for op in mlp)
    assert all(op["bytes"] == ACTIVATION for op in mlp)
    assert all(op["seconds"] >= 0 for op in mlp)
    assert "aten::native_dropout" not in names and "aten::bernoulli_.float" not in names
    for name, ops in measured.ops.items():
        region = next(r for r in measured.regions if r.name == name)
        assert sum(op["seconds"] for op in ops) <= region.seconds * (1 + 1e-9)
    # The dump keeps them.
    again = remat.RegionProfile.from_json(measured.to_json())
    assert again.ops == measured.ops


class CountRecomputed(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen ops that run to their end while the runtime recomputes, by op."""

    def __init__(self):
        super().__init__()
        self.ran = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if remat.is_recomputing():
            self.ran[func] = self.ran.get(func, 0) + 1
        return out


def last_region_layers():
    """Layers whose last region ends in a projection (mm, sigmoid, mm), and what follows it in the
    checkpoint: a residual add (saves nothing), a tanh (keeps its output), nothing."""
    w = (torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(2)) / 8).requires_grad_()

    def mlp(x):
        return remat.region(lambda t: torch.sigmoid(t @ w) @ w, "mlp")(x)

    return w, {"residual": lambda x: x + mlp(x), "tanh": lambda x: torch.tanh(mlp(x)), "bare": mlp}


def test_a_last_regions_ops_recompute_does_not_run_are_left_out_of_its_price():
    """Recompute stops once the last tensor backward needs is saved again, and an op saves its
    inputs before it runs: the last projection of a layer's last region (its input kept, its
    output kept by nothing) never runs again when a node follows it (the residual add). The
    profile leaves it out of the region's ops and seconds there, and there only."""
    w, layers = last_region_layers()
    for kind, layer in layers.items():
        with remat.profile_regions(ops=True) as profile:
            remat.checkpoint(region_name="layer")(layer)(batch()).sum().backward()
        w.grad = None
        names = [op["op"] for op in profile.ops["layer::mlp"]]
        assert names == (["aten::mm", "aten::sigmoid"] if kind == "residual" else
                         ["aten::mm", "aten::sigmoid", "aten::mm"]), kind
        region = profile.regions[0]
        assert sum(op["seconds"] for op in profile.ops["layer::mlp"]) <= region.seconds * (1 + 1e-9)

        # What recompute runs, every region recomputed: the left-out mm is the one it does not run.
        plan = profile.plan(budget_bytes=profile.base_bytes)
        assert plan.decisions == {"layer::mlp": "recompute"}
        x = batch()
        layer(x).sum().backward()
        expected = [x.grad, w.grad]
        x.grad, w.grad = None, None
        count = CountRecomputed()
        with remat.use_plan(plan):
            loss = remat.checkpoint(region_name="layer")(layer)(x).sum()
            with count:
                loss.backward()
        assert count.ran[torch.ops.aten.mm.default] == (1 if kind == "residual" else 2), kind
        assert torch.equal(x.grad, expected[0]) and torch.equal(w.grad, expected[1])
        w.grad = None


def test_profile_without_ops_has_none_and_refuses_per_op_plans():
    weights = make_weights()
    with remat.profile_regions() as profile:
        model(batch(), weights).backward()
    assert not profile.has_ops and "ops" not in profile.to_json()
    with pytest.raises(ValueError, match=r"profile_regions\(ops=True\)"):
        profile.plan(budget_bytes=profile.all_saved_bytes, ops=True)


def test_a_profile_with_ops_none_of_which_a_plan_could_keep_is_refused_saying_why():
    """Profiled with ops=True, the region's mm is written into later and its mul_ is in place: no op
    is listed, and a per-op plan is refused saying so (before: "profile with ops=True", as it was)."""
    w = torch.randn(WIDTH, WIDTH, requires_grad=True)
    with remat.profile_regions(ops=True) as profile:
        body = remat.region(lambda t: (t @ w).mul_(0.5), "r")
        remat.checkpoint(region_name="c")(body)(torch.randn(2, 8, WIDTH)).sum().backward()
    assert not profile.has_ops
    with pytest.raises(ValueError, match=r"lists no op a plan could keep.*writes into later.*plan without ops"):
        profile.plan(budget_bytes=profile.all_saved_bytes, ops=True)


def test_per_op_plan_keeps_the_matmuls_and_recompute_does_not_run_them(measured):
    profile = matmuls_dear(measured)
    # Room for two activations a layer: attn saved (tanh keeps its output), mlp recomputed keeping
    # its matmul's output (saving it keeps three activations).
    budget = profile.base_bytes + 2 * LAYERS * ACTIVATION
    plan = profile.plan(budget_bytes=budget, ops=True)
    assert plan.exact
    assert plan.decisions == {f"layers.{i}::{r}": "save" if r == "attn" else "recompute"
                              for i in range(LAYERS) for r in ("attn", "mlp")}
    assert plan.kept_ops == {f"layers.{i}::mlp": [(0, "remat_op_plans::counted_mm")] for i in range(LAYERS)}
    assert plan.kept_bytes == budget
    assert remat.load_plan(plan.to_json()).kept_ops == plan.kept_ops

    weights = make_weights()
    x = batch()
    runs["mm"] = 0
    plain(x, weights).backward()
    assert runs["mm"] == 2 * LAYERS
    expected = take_gradients(x, weights)
    runs["mm"] = 0
    with remat.use_plan(plan):
        loss = model(x, weights)
        kept = live_checkpoint_bytes()
        assert sum(held_storages().values()) == LAYERS * ACTIVATION  # each mlp's matmul output
        assert runs["mm"] == 2 * LAYERS
        loss.backward()
    assert runs["mm"] == 2 * LAYERS  # recompute took every matmul's output from forward
    assert kept <= plan.kept_bytes
    assert live_checkpoint_bytes() == 0 and not held_storages()
    assert_gradients_equal(x, weights, expected)


def test_without_kept_ops_recompute_runs_the_matmuls_again(measured):
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes, ops=True)
    assert not plan.kept_ops
    weights = make_weights()
    runs["mm"] = 0
    with remat.use_plan(plan):
        model(batch(), weights).backward()
    assert runs["mm"] == 4 * LAYERS


def test_measured_kept_bytes_are_at_most_the_prediction_at_every_budget(measured):
    profile = matmuls_dear(measured)
    weights = make_weights()
    x = batch()
    plain(x, weights).backward()
    expected = take_gradients(x, weights)
    low, high = profile.base_bytes, profile.all_saved_bytes
    kinds = set()
    for step in range(7):
        budget = low + (high - low) * step // 6
        plan = profile.plan(budget_bytes=budget, ops=True)
        kinds.add((bool(plan.kept_ops), "save" in plan.decisions.values()))
        with remat.use_plan(plan):
            loss = model(x, weights)
            kept = live_checkpoint_bytes()
            loss.backward()
        assert kept <= plan.kept_bytes <= budget, (step, plan.format())
        assert_gradients_equal(x, weights, expected)
    assert (True, True) in kinds  # some plans save regions and keep ops of others


def test_dropout_gradients_are_bitwise_with_kept_ops(measured):
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    assert plan.kept_ops
    weights = make_weights()
    x = batch()
    torch.manual_seed(11)
    plain(x, weights, dropout=0.3).backward()
    expected = take_gradients(x, weights)
    torch.manual_seed(11)
    with remat.use_plan(plan):
        model(x, weights, dropout=0.3, hooks=[remat.cpu_rng_state_hook()]).backward()
    assert_gradients_equal(x, weights, expected)


def test_a_region_whose_ops_differ_is_refused_naming_the_first_difference(measured):
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    weights = make_weights()

    def other_block(x, w1, w2, dropout=0.0):
        h = remat.region(lambda t: torch.tanh(counted_mm(t, w1)), "attn")(x)
        return remat.region(lambda t: (torch.relu(t) + counted_mm(t, w2)).sin(), "mlp")(h)

    with remat.use_plan(plan, strict=False):
        with pytest.raises(ValueError, match=r"region 'layers\.0::mlp': op 0 is aten::relu, but the plan keeps "
                                             r"remat_op_plans::counted_mm there"):
            remat.checkpoint(region_name="layers.0")(other_block)(batch(), weights[0], weights[1])

    def short_block(x, w1, w2, dropout=0.0):
        return remat.region(lambda t: t, "mlp")(x)

    with remat.use_plan(plan, strict=False):
        with pytest.raises(ValueError, match=r"region 'layers\.0::mlp' ran 0 ops, but the plan keeps op 0 "
                                             r"\(remat_op_plans::counted_mm\)"):
            remat.checkpoint(region_name="layers.0")(short_block)(batch(), weights[0], weights[1])


def test_recompute_taking_another_path_is_refused(measured):
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    weights = make_weights()

    def branching_block(x, w1, w2, dropout=0.0):
        h = remat.region(lambda t: torch.tanh(counted_mm(t, w1)), "attn")(x)
        body = (lambda t: torch.sigmoid(counted_mm(t, w2)).cos()) if remat.is_recomputing() else \
            (lambda t: (torch.sigmoid(counted_mm(t, w2)) * t).sin())
        return remat.region(body, "mlp")(h)

    with remat.use_plan(plan, strict=False):
        y = remat.checkpoint(region_name="layers.0")(branching_block)(batch(), weights[0], weights[1])
        with pytest.raises(ValueError, match=r"region 'layers\.0::mlp': recompute ran aten::cos as op 2, where "
                                             r"forward ran aten::mul\.Tensor"):
            y.sum().backward()


def replayed_decision_block(channel, wd):
    """A region that makes a decision under torch.no_grad, as NeMo's frozen indexers do: forward
    records it on the channel and recompute takes it back instead of running its matmul again.
    The decision's matmul is the region's matmul's twin (same op, same shapes)."""

    def mlp(t, w):
        bound = channel.current()
        taken = bound[0].take() if bound is not None and bound[1] == "replay" else None
        if taken is None:
            with torch.no_grad():
                taken = counted_mm(t, wd) * 0.5
            if bound is not None and bound[1] == "record":
                bound[0].record(taken)
        return torch.sigmoid(counted_mm(t, w)) * taken

    def replayed(x, w1, w2):
        h = remat.region(lambda t: torch.tanh(counted_mm(t, w1)), "attn")(x)
        return remat.region(lambda t: mlp(t, w2), "mlp")(h)

    def plain_replayed(x, w1, w2):
        return mlp(torch.tanh(counted_mm(x, w1)), w2)

    return replayed, plain_replayed


def test_a_region_recording_a_replayed_decision_keeps_no_op(measured):
    """Recompute takes the decision back and skips its matmul, so the region's matmul runs as op 0
    there, where forward ran the decision's: the profile lists no op of the region, plans keep
    none (gradients bitwise), and a plan keeping one is refused in forward."""
    weights = make_weights()
    wd = torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(9)) / 8
    channel = remat.RecomputeReplay("decision")
    replayed, plain_replayed = replayed_decision_block(channel, wd)
    checkpointed = remat.checkpoint(region_name="layers.0", contexts=[channel])(replayed)

    x = batch()
    plain_replayed(x, weights[0], weights[1]).square().sum().backward()
    expected = take_gradients(x, weights[:2])
    with remat.profile_regions(ops=True) as profile:
        checkpointed(batch(), weights[0], weights[1]).square().sum().backward()
    take_gradients(batch(), weights)
    assert "layers.0::mlp" not in profile.ops
    assert [op["op"] for op in profile.ops["layers.0::attn"]] == ["remat_op_plans::counted_mm", "aten::tanh"]
    for budget in (profile.base_bytes, profile.base_bytes + ACTIVATION, profile.all_saved_bytes):
        plan = matmuls_dear(profile).plan(budget_bytes=budget, ops=True)
        assert "layers.0::mlp" not in plan.kept_ops
        with remat.use_plan(plan):
            x = batch()
            checkpointed(x, weights[0], weights[1]).square().sum().backward()
        assert_gradients_equal(x, weights[:2], expected)

    keeping = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    assert (0, "remat_op_plans::counted_mm") in keeping.kept_ops["layers.0::mlp"]
    with remat.use_plan(keeping, strict=False):
        with pytest.raises(ValueError, match=r"region 'layers\.0::mlp' records a decision on a RecomputeReplay "
                                             r"channel.*a per-op plan keeps no op of such a region"):
            checkpointed(batch(), weights[0], weights[1])
    assert held_storages() == {}


def test_a_kept_op_recomputed_on_inputs_of_other_shapes_is_refused(measured):
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    weights = make_weights()

    def narrowing_block(x, w1, w2, dropout=0.0):
        h = remat.region(lambda t: torch.tanh(counted_mm(t, w1)), "attn")(x)
        rows = 4 if remat.is_recomputing() else 8
        return remat.region(lambda t: (torch.sigmoid(counted_mm(t[:rows], w2)) * t[:rows]).sin(), "mlp")(h)

    with remat.use_plan(plan, strict=False):
        y = remat.checkpoint(region_name="layers.0")(narrowing_block)(batch(), weights[0], weights[1])
        with pytest.raises(ValueError, match=r"region 'layers\.0::mlp': recompute ran op 0 "
                                             r"\(remat_op_plans::counted_mm\) on inputs \[4, 64\] float32, "
                                             r"\[64, 64\] float32, where forward ran it on \[8, 64\] float32"):
            y.sum().backward()


def test_a_checkpoint_run_without_gradients_under_a_per_op_plan_keeps_nothing(measured):
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    weights = make_weights()
    x = batch()
    with torch.no_grad():
        expected = plain(x, weights)
        with remat.use_plan(plan):
            got = model(x, weights)
            assert held_storages() == {}
    assert torch.equal(got, expected)


def test_per_op_plans_refuse_grouped_budgets_and_peaks_without_the_steps_memory(measured):
    # measured was profiled without the step's tensors counted (test_op_peak_plans.py plans by peak).
    with pytest.raises(ValueError, match=r"no step memory.*remat\.tag_cpu_tensors\(\)"):
        measured.plan(peak_bytes="1 GiB", ops=True)
    with pytest.raises(ValueError, match="ops=True keeps ops of regions as measured: drop group=True"):
        measured.plan(budget_bytes=measured.all_saved_bytes, ops=True, group=True)
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    with pytest.raises(ValueError, match="no step memory"):
        measured.predict_peak(plan)


def test_per_op_profile_and_plan_dumps_validate_against_their_schemas(measured, tmp_path):
    report = os.environ.get("REMAT_REPORT") or str(REPO / "build" / "cli" / "remat-report")
    if not os.access(report, os.X_OK):
        pytest.skip("remat-report is not built (build/cli/remat-report); build the cli target or set REMAT_REPORT")
    measured.to_json(tmp_path / "profile.json")
    plan = matmuls_dear(measured).plan(budget_bytes=measured.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    assert plan.kept_ops
    plan.to_json(tmp_path / "plan.json")
    for name, kind in (("profile.json", "region-profile"), ("plan.json", "remat-plan")):
        run = subprocess.run([report, "validate", str(tmp_path / name)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and f"valid {kind} dump" in run.stdout, run.stdout + run.stderr


def test_hugging_face_llama_under_per_op_plans_keeps_at_most_the_prediction_with_bitwise_gradients():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=128, vocab_size=128, max_position_embeddings=64,
                                      use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    weights = transformers.LlamaForCausalLM(config).state_dict()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))

    def fresh(**options):
        model = transformers.LlamaForCausalLM(config)
        model.load_state_dict(weights)
        return remat.wrap_decoder_layers(model.train(), **options)

    plain = transformers.LlamaForCausalLM(config)
    plain.load_state_dict(weights)
    plain.train()(input_ids=ids, labels=ids).loss.backward()
    reference = [p.grad for p in plain.parameters()]
    profiled = fresh()
    with remat.profile_regions(ops=True) as profile:
        profiled(input_ids=ids, labels=ids).loss.backward()
    assert any(op["op"] == "aten::mm" for ops in profile.ops.values() for op in ops)
    low, high = profile.base_bytes, profile.all_saved_bytes
    # Which ops a plan keeps follows the measured times; beside the profile as measured, one where
    # regions with matmuls take 100 times as long, half of it in their matmuls, and the others
    # next to no time, so that keeping a matmul outweighs what watching the region's ops costs and
    # some plan surely keeps ops.
    doc = json.loads(profile.to_json())
    for region in doc["regions"]:
        matmuls = [op for op in region.get("ops", []) if op["op"] == "aten::mm"]
        if not matmuls:
            region["seconds"] = 1e-6
            for op in region.get("ops", []):
                op["seconds"] = 1e-6 / (1 + len(region["ops"]))
            continue
        region["seconds"] *= 100
        for op in matmuls:
            op["seconds"] = region["seconds"] / (2 * len(matmuls))
    heavy = remat.RegionProfile.from_json(json.dumps(doc))
    kept_some = False
    for source, share in itertools.product((profile, heavy), (0, 1, 2, 3)):
        plan = source.plan(budget_bytes=low + (high - low) * share // 4, ops=True)
        kept_some |= bool(plan.kept_ops)
        model = fresh(plan=plan)
        loss = model(input_ids=ids, labels=ids).loss
        kept = live_checkpoint_bytes()
        loss.backward()
        assert kept <= plan.kept_bytes, (share, plan.format())
        assert all(torch.equal(got.grad, want) for got, want in zip(model.parameters(), reference))
        assert not held_storages()
    assert kept_some


def test_a_kept_output_written_in_place_in_forward_is_recomputed_not_handed_back():
    weights = make_weights()

    def written_block(x, w1, w2, dropout=0.0):
        h = remat.region(lambda t: torch.tanh(counted_mm(t, w1)), "attn")(x)
        # writes into the matmul's output after it ran: a handed-back output would be doubled twice
        return remat.region(lambda t: counted_mm(t, w2).mul_(2).sin(), "mlp")(h)

    def written_model(x):
        for layer in range(LAYERS):
            x = remat.checkpoint(region_name=f"layers.{layer}")(written_block)(x, weights[2 * layer],
                                                                              weights[2 * layer + 1])
        return x.square().sum()

    def written_plain(x):
        for layer in range(LAYERS):
            x = counted_mm(torch.tanh(counted_mm(x, weights[2 * layer])), weights[2 * layer + 1]).mul_(2).sin()
        return x.square().sum()

    with remat.profile_regions(ops=True) as measured:
        written_model(batch()).backward()
    # The profile does not list an op whose output the region writes into later (keeping it would spare
    # nothing): mlp's matmul is put back below, as a plan from other code would name it
    assert all(op["op"] != "remat_op_plans::counted_mm" for name, ops in measured.ops.items()
               if name.endswith("::mlp") for op in ops)
    doc = json.loads(matmuls_dear(measured).to_json())
    for region in doc["regions"]:  # saving a region priced out: the plan keeps each mlp's matmul
        region["saved_bytes"] = 100 * ACTIVATION
        if region["name"].endswith("::mlp"):
            region["ops"].insert(0, {"index": 0, "op": "remat_op_plans::counted_mm", "bytes": ACTIVATION,
                                     "seconds": 1.0})
            region["seconds"] += 1.0
    doc.pop("all_saved_bytes")
    profile = remat.RegionProfile(json.dumps(doc))
    plan = profile.plan(budget_bytes=profile.base_bytes + 2 * LAYERS * ACTIVATION, ops=True)
    assert all(choice == "recompute" for choice in plan.decisions.values())
    assert [name for name, ops in plan.kept_ops.items() if ops == [(0, "remat_op_plans::counted_mm")]] == \
        [f"layers.{i}::{r}" for i in range(LAYERS) for r in ("attn", "mlp")]
    x = batch()
    for w in weights:
        w.grad = None
    written_plain(x).backward()
    expected = take_gradients(x, weights)
    runs["mm"] = 0
    with remat.use_plan(plan):
        written_model(x).backward()
    # attn's matmul handed back; mlp's, written into after it ran, run again
    assert runs["mm"] == 2 * LAYERS + LAYERS
    assert_gradients_equal(x, weights, expected)


@pytest.mark.parametrize("where", ["in the region", "after the region"])
def test_a_kept_matmul_written_through_the_3d_tensor_over_its_output_is_recomputed_not_handed_back(where):
    """x @ w on a 3-d x runs aten::mm and returns its output as another tensor over the same
    storage, with a version counter of its own (aten::_unsafe_view): a write through that tensor,
    in the region or after it, leaves the mm's output's version as it was. The runtime watches such
    tensors too, so recompute runs the mm again instead of handing back what the write changed (it
    handed back the scaled output: gradients differed). The plan keeping the mm comes from a
    profile of the code without the write; a profile of the code writing in the region does not
    list the mm (keeping it would spare nothing)."""
    w = (torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(5)) / 8).requires_grad_()

    def step(x, write, ck=True):
        def region_body(t):
            q = t @ w
            return q.mul_(0.5) if write == "in the region" else q

        def body(t):
            q = remat.region(region_body, "r")(t) if ck else region_body(t)
            return (q.mul_(0.5) if write == "after the region" else q).sin()

        (remat.checkpoint(region_name="c")(body)(x) if ck else body(x)).square().sum().backward()

    x = torch.randn(2, 8, WIDTH, generator=torch.Generator().manual_seed(1), requires_grad=True)
    step(x, where, ck=False)
    expected = [x.grad, w.grad]
    x.grad = w.grad = None
    with remat.profile_regions(ops=True) as written:
        step(x, "in the region")
    assert written.ops.get("c::r", []) == []  # (before, it listed the mm)
    with remat.profile_regions(ops=True) as profile:
        step(x, None)
    x.grad = w.grad = None
    doc = json.loads(profile.to_json())
    (region,) = doc["regions"]
    assert [op["op"] for op in region["ops"]] == ["aten::mm"]
    region["ops"][0]["seconds"] = region["seconds"] = 1.0  # the mm priced far above saving the region
    region["saved_bytes"] = 100 * ACTIVATION
    doc.pop("all_saved_bytes")
    plan = remat.RegionProfile(json.dumps(doc)).plan(budget_bytes=profile.base_bytes + 2 * 8 * WIDTH * 4, ops=True)
    assert plan.decisions == {"c::r": "recompute"} and plan.kept_ops["c::r"] == [(0, "aten::mm")]
    with remat.use_plan(plan):
        step(x, where)
    assert torch.equal(x.grad, expected[0]) and torch.equal(w.grad, expected[1])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_kept_ops_are_held_on_the_regions_device_and_handed_back(device):
    """The runtime carries kept ops out below autograd on the region's device: forward holds the
    kept matmul's output where it was made, recompute takes it instead of running the matmul again,
    and the gradients are bitwise those without checkpointing."""
    generator = torch.Generator().manual_seed(4)
    w = (torch.randn(WIDTH, WIDTH, generator=generator) / 8).to(device).requires_grad_()
    x = torch.randn(8, WIDTH, generator=generator).to(device).requires_grad_()

    def mlp(t):
        return (torch.sigmoid(counted_mm(t, w)) * t).sin()

    mlp(x).square().sum().backward()
    expected = [x.grad.clone(), w.grad.clone()]
    x.grad = w.grad = None
    keep = RegionKeep("c::mlp", {0: "remat_op_plans::counted_mm"})

    def kept(t):
        return keep.wrap(mlp, remat.is_recomputing())(t)

    runs["mm"] = 0
    y = remat.checkpoint(region_name="c")(lambda t: remat.region(kept, "mlp")(t))(x)
    assert runs["mm"] == 1
    held = held_storages()
    assert list(held.values()) == [ACTIVATION]
    assert [held_device for held_device, _ in held] == [str(y.device)]
    y.square().sum().backward()
    assert runs["mm"] == 1  # recompute took the matmul's output from forward
    assert held_storages() == {}
    assert torch.equal(x.grad, expected[0]) and torch.equal(w.grad, expected[1])


def test_threads_keeping_ops_at_once_neither_block_each_other_nor_mix_their_outputs():
    """Four threads each run checkpoints keeping ops, 100 steps each, while a fifth reads the held
    outputs: each gets its gradients bitwise, and none waits on another forever (a thread letting
    its held outputs go must not hold the runtime's lock while a freed tensor takes the GIL that a
    thread waiting for the lock holds). In a child process, so that a hang ends at its timeout."""
    script = textwrap.dedent("""
        import threading, time, torch, remat
        from remat._kept_ops import RegionKeep, held_storages

        def plain(a, b):
            return (torch.sigmoid(torch.tanh(a @ b) @ b) * a).sin()

        def gradients(step, x, w):
            x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
            step(x, w).square().sum().backward()
            return x.grad, w.grad

        def kept_step(x, w):
            keep = RegionKeep("c::r", {0: "aten::mm", 2: "aten::mm", 3: "aten::sigmoid"})
            body = lambda a, b: keep.wrap(plain, remat.is_recomputing())(a, b)
            return remat.checkpoint(region_name="c")(lambda a, b: remat.region(body, "r")(a, b))(x, w)

        wrong, done = [], []

        def worker(seed):
            generator = torch.Generator().manual_seed(seed)
            x, w = torch.randn(16, 32, generator=generator), torch.randn(32, 32, generator=generator) / 4
            expected = gradients(plain, x, w)
            for _ in range(100):
                got = gradients(kept_step, x, w)
                wrong.extend(i for i in range(2) if not torch.equal(got[i], expected[i]))
            done.append(seed)

        reading = True

        def reader():  # a pause between reads: a loop that never lets go of the GIL starves the workers
            while reading:
                held_storages()
                time.sleep(0.001)

        poller = threading.Thread(target=reader)
        poller.start()
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        reading = False
        poller.join()
        print(sorted(done), len(wrong), held_storages())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[0, 1, 2, 3] 0 {}"]


def kept_region_step(keep, body, x, w):
    """The gradients of x and w through checkpoint 'c' whose region 'r' runs body keeping `keep`'s ops."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()

    def kept(t):
        return keep.wrap(lambda u: body(u, w), remat.is_recomputing())(t)

    remat.checkpoint(region_name="c")(lambda t: remat.region(kept, "r")(t))(x).square().sum().backward()
    return x.grad, w.grad


def test_a_function_compiled_inside_a_region_keeping_ops_is_numbered_as_it_runs_not_as_it_is_traced():
    """torch.compile tracing a function inside the region (its first call, and again after
    torch._dynamo.reset(), which drops every compile hook) runs fake and traced ops that the
    profile's mode never sees: the runtime sets kept ops aside while it compiles, and numbers the
    compiled code's ops as it runs them (mm, sigmoid, mul, mm, sin)."""
    generator = torch.Generator().manual_seed(6)
    x, w = torch.randn(4, 8, generator=generator), torch.randn(8, 8, generator=generator)

    def inner(a, b):
        return torch.sigmoid(a @ b) * a

    def plain_body(a, b):
        return (inner(a, b) @ b).sin()

    expected = kept_region_step(RegionKeep("c::r", {0: "aten::mm"}), plain_body, x, w)  # nothing compiled
    compiled = torch.compile(inner, backend="aot_eager")

    def body(a, b):
        return (compiled(a, b) @ b).sin()

    for kept in ({0: "aten::mm"}, {3: "aten::mm"}, {1: "aten::sigmoid", 2: "aten::mul.Tensor"}):
        for _ in range(2):  # the first call compiles inside the region, the second runs compiled
            got = kept_region_step(RegionKeep("c::r", kept), body, x, w)
            assert all(torch.equal(g, e) for g, e in zip(got, expected)), kept
            assert held_storages() == {}
        torch._dynamo.reset()


def test_a_region_run_without_gradients_inside_a_checkpoint_keeps_nothing_and_recomputes_plainly():
    """A region the checkpoint's body runs under torch.no_grad: forward keeps nothing of it (no
    backward reads it), and its recompute, which runs it again all the same, runs it plainly
    instead of checking its ops against a forward that numbered none."""
    generator = torch.Generator().manual_seed(7)
    x, w = torch.randn(4, 8, generator=generator), torch.randn(8, 8, generator=generator)
    gate_weight = torch.randn(8, 8, generator=generator)
    gate_keep, mlp_keep = RegionKeep("c::gate", {0: "aten::mm"}), RegionKeep("c::mlp", {0: "aten::mm"})

    def body(t, weight):
        with torch.no_grad():
            gate = remat.region(lambda u: gate_keep.wrap(lambda v: torch.sigmoid(v @ gate_weight),
                                                         remat.is_recomputing())(u), "gate")(t)
        mlp = remat.region(lambda u: mlp_keep.wrap(lambda v: (v @ weight).tanh(), remat.is_recomputing())(u), "mlp")
        return mlp(t) * gate

    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    (((xg @ wg).tanh()) * torch.sigmoid(x @ gate_weight)).square().sum().backward()
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    remat.checkpoint(region_name="c")(body)(xc, wc).square().sum().backward()
    assert torch.equal(xc.grad, xg.grad) and torch.equal(wc.grad, wg.grad)
    assert held_storages() == {}


def test_a_kept_op_reading_a_list_of_tensors_of_other_shapes_in_recompute_is_refused():
    generator = torch.Generator().manual_seed(8)
    x, w = torch.randn(4, 8, generator=generator), torch.randn(8, 8, generator=generator)

    def body(t, weight):
        rows = 2 if remat.is_recomputing() else 4
        return (torch.cat([t[:rows], t[:rows]]) @ weight).sin()

    with pytest.raises(ValueError, match=r"region 'c::r': recompute ran op 0 \(aten::cat\) on inputs \[2, 8\] "
                                         r"float32, \[2, 8\] float32, where forward ran it on \[4, 8\] float32, "
                                         r"\[4, 8\] float32"):
        kept_region_step(RegionKeep("c::r", {0: "aten::cat"}), body, x, w)
    assert held_storages() == {}


def test_a_forward_only_probe_of_the_same_op_shifts_no_kept_output_onto_another_op():
    """A probe forward alone runs (`if not is_recomputing()`, under no_grad: work autograd does not
    save) is an aten::mm among aten::mm ops of one shape: recompute runs one op fewer, and the op at
    a kept index is another matmul. Its held output was handed back there, gradients silently wrong;
    now the difference in gradient mode is refused."""
    generator = torch.Generator().manual_seed(9)
    x, w = torch.randn(4, 8, generator=generator), torch.randn(8, 8, generator=generator)
    probe_weight = torch.randn(8, 8, generator=generator)

    def body(t, weight):
        a = t @ weight
        if not remat.is_recomputing():
            with torch.no_grad():
                a @ probe_weight  # a forward-only probe: logged, read by nothing
        return (a @ weight) @ weight

    with pytest.raises(ValueError, match=r"region 'c::r': recompute ran op 1 \(aten::mm\) with gradients on, where "
                                         r"forward ran it under no_grad: the region's code takes another path"):
        kept_region_step(RegionKeep("c::r", {1: "aten::mm"}), body, x, w)
    assert held_storages() == {}


def test_a_kept_op_that_reads_another_trained_weight_in_recompute_is_refused():
    """The same shift with gradients on (the probe's result kept by nothing): op 1 in recompute is a
    matmul by another weight than forward's op 1 read. (Its input takes no gradient, so autograd
    saves no weight there for the runtime's check of swapped weights to see.)"""
    generator = torch.Generator().manual_seed(10)
    x, w = torch.randn(4, 8, generator=generator), torch.randn(8, 8, generator=generator)
    probe_weight = torch.randn(8, 8, generator=generator).requires_grad_()

    def body(t, weight):
        a = t.detach() * 2
        if not remat.is_recomputing():
            a @ probe_weight
        return (a @ weight).sin() * t

    with pytest.raises(ValueError, match=r"region 'c::r': recompute ran op 1 \(aten::mm\) on another tensor as its "
                                         r"input 1, where forward read a weight that takes gradients there"):
        kept_region_step(RegionKeep("c::r", {1: "aten::mm"}), body, x, w)
    assert held_storages() == {}


def test_a_kept_op_whose_weight_storage_is_swapped_before_backward_is_handed_back():
    """A sharded parameter gathered again for backward (`weight.data` swapped, the same values):
    the same weight, so no other path; it was refused as "another tensor"."""
    generator = torch.Generator().manual_seed(11)
    x, w = torch.randn(4, 8, generator=generator), torch.randn(8, 8, generator=generator)
    expected = kept_region_step(RegionKeep("c::r", {0: "aten::mm"}), lambda t, weight: (t @ weight).sin(), x, w)
    keep = RegionKeep("c::r", {0: "aten::mm"})
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()

    def kept(t):
        return keep.wrap(lambda u: (u @ wg).sin(), remat.is_recomputing())(t)

    y = remat.checkpoint(region_name="c")(lambda t: remat.region(kept, "r")(t))(xg)
    wg.data = wg.data.clone()  # gathered again: another storage, the same values
    y.square().sum().backward()
    assert torch.equal(xg.grad, expected[0]) and torch.equal(wg.grad, expected[1])
    assert held_storages() == {}
