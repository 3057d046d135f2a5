"""remat.pipelining.profile_stage and predict against a real 4-rank job: a tiny Llama split over
4 Gloo ranks (127.0.0.1, a free port, bounded by a timeout, every child reaped) under PyTorch's
Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleZBVZeroBubble and ScheduleDualPipeV,
even and uneven splits, stock and pooled receive buffers, with and without checkpointing. Each rank's peak over a
steady step (optimizer step included), measured through the tagging allocator, must be within 5%
of the prediction made from stage profiles measured in this one process beforehand."""

import json
import os
import subprocess

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (scripts/install-deps.sh installs it)")

import pipeline_llama as llama  # noqa: E402
import remat.pipelining  # noqa: E402
from test_pipelining import WORLD, report, run_ranks  # noqa: E402

BOUND = 0.05
CASES = [
    {"schedule": "1f1b", "split": [2, 2, 2, 2], "checkpoint": False, "buffers": "stock", "microbatches": 4},
    {"schedule": "1f1b", "split": [1, 3, 2, 2], "checkpoint": True, "buffers": "pooled", "microbatches": 6},
    {"schedule": "gpipe", "split": [3, 1, 2, 2], "checkpoint": False, "buffers": "pooled", "microbatches": 4},
    # remat.checkpoint keeps little more than each microbatch's output through forward, so what
    # ScheduleGPipe's pending sends hold until step() returns (every sent output, every input
    # gradient) sets the middle ranks' peak at the last backward, and grows with the microbatches.
    {"schedule": "gpipe", "split": [1, 1, 1, 1], "checkpoint": True, "buffers": "pooled", "microbatches": 16},
    {"schedule": "interleaved-1f1b", "split": [1, 1, 1, 1, 1, 1, 1, 1], "checkpoint": True, "buffers": "stock",
     "microbatches": 4},
    {"schedule": "zbv-zero-bubble", "split": [1, 1, 2, 1, 1, 1, 1, 1], "checkpoint": False, "buffers": "pooled",
     "microbatches": 4},
    # The rank holding the V's turn (stages 3 and 4) keeps what the two hand each other: stock,
    # one set per microbatch and direction until the next step; pooled under DualPipeV's full B,
    # each handed activation until the step's end, held through the graph of stage 4's sent output.
    {"schedule": "zbv-zero-bubble", "split": [1, 1, 1, 1, 1, 1, 1, 1], "checkpoint": True, "buffers": "stock",
     "microbatches": 8},
    {"schedule": "dualpipev", "split": [1, 1, 1, 1, 1, 1, 1, 1], "checkpoint": True, "buffers": "pooled",
     "microbatches": 8},
]


def case_name(case):
    return (f"{case['schedule']}-{'even' if len(set(case['split'])) == 1 else 'uneven'}-{case['buffers']}"
            f"{'-checkpoint' if case['checkpoint'] else ''}")


def profiles_of(case, out_dir=None):
    split = case["split"]
    profiles = []
    for index in range(len(split)):
        x, target = llama.example_microbatch(index)
        path = os.path.join(out_dir, f"profile-{index}.json") if out_dir else None
        profiles.append(remat.pipelining.profile_stage(
            llama.stage_module(index, len(split), split, case["checkpoint"]), x, stage_index=index,
            num_stages=len(split), model="llama-" + "-".join(map(str, split)), loss_fn=llama.loss_fn,
            target=target, optimizer=llama.optimizer, path=path))
    return profiles




@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("predict")
    return str(out), run_ranks("pipeline_predict_worker.py", [json.dumps(CASES)], str(out), "prediction job", timeout=300)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_name(c) for c in CASES])
def test_predicted_peak_is_within_5_percent_of_measured_on_every_rank(measured, index, tmp_path):
    out_dir, per_rank = measured
    case = CASES[index]
    prediction = remat.pipelining.predict(profiles_of(case, str(tmp_path)), case["schedule"], ranks=WORLD,
                                          microbatches=case["microbatches"], buffers=case["buffers"])
    rows = []
    for rank in range(WORLD):
        predicted = prediction["per_rank"][rank]["peak_bytes"]
        actual = per_rank[rank][index]
        rows.append((rank, actual, predicted, (predicted - actual) / actual))
    print(case_name(case), rows)
    assert all(abs(error) <= BOUND for *_, error in rows), f"{case_name(case)}: {rows}"
    # The CLI reads the same profiles and the job's snapshots to the same figures.
    args = ["--schedule", case["schedule"], "--ranks", str(WORLD), "--microbatches", str(case["microbatches"]),
            "--buffers", case["buffers"], "--json"]
    cli = report("predict", *[str(tmp_path / f"profile-{i}.json") for i in range(len(case["split"]))], *args)
    assert [r["peak_bytes"] for r in cli["per_rank"]] == [r["peak_bytes"] for r in prediction["per_rank"]]
    # And `ranks --predicted` reads the job's snapshots to the same measured peaks.
    predicted = tmp_path / "predicted.json"
    predicted.write_text(json.dumps(cli))
    svg = tmp_path / "predicted.svg"
    check = report("ranks", os.path.join(out_dir, f"case{index}"), "--predicted", str(predicted), "--svg", str(svg),
                   "--json")
    print(json.dumps(check))
    assert svg.read_text().count('class="measured"') == WORLD


def report_fails(*args):
    import shutil

    binary = os.environ.get("REMAT_REPORT") or shutil.which("remat-report")
    if binary is None:
        pytest.skip("remat-report is not built here (REMAT_REPORT unset and not on PATH)")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr


@pytest.fixture(scope="module")
def even_profiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    profiles_of(CASES[0], str(out))
    return [str(out / f"profile-{i}.json") for i in range(4)]


def test_bad_inputs_are_refused_with_exit_2_naming_the_problem_and_bad_options_with_1(even_profiles, tmp_path):
    schedule = ["--schedule", "1f1b", "--ranks", "4", "--microbatches", "4"]
    code, message = report_fails("predict", *even_profiles, *schedule)
    assert code == 0, message
    other = profiles_of({"split": [1, 3, 2, 2], "checkpoint": False}, str(tmp_path))
    assert other[1]["model"] != json.load(open(even_profiles[1]))["model"]
    mixed = [even_profiles[0], str(tmp_path / "profile-1.json"), *even_profiles[2:]]
    code, message = report_fails("predict", *mixed, *schedule)
    assert code == 2 and "model" in message
    code, message = report_fails("predict", *even_profiles[:3], *schedule)
    assert code == 2 and "4 stages and 3 stage profiles" in message
    code, message = report_fails("predict", *even_profiles, "--schedule", "interleaved-1f1b", "--ranks", "4",
                                 "--microbatches", "4")
    assert code == 2 and "8 stages" in message
    code, message = report_fails("predict", *even_profiles, "--schedule", "1f1b", "--ranks", "4", "--microbatches", "0")
    assert code == 1 and message.startswith("remat-report predict: ") and "--microbatches" in message, message
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(open(even_profiles[2]).read()[:-40])
    code, message = report_fails("predict", *even_profiles[:2], str(corrupt), even_profiles[3], *schedule)
    assert code == 2 and "the file is cut short" in message, message
    with pytest.raises(ValueError, match="model"):
        remat.pipelining.predict([json.load(open(p)) for p in mixed], "1f1b", ranks=4, microbatches=4)


def test_64_ranks_by_256_microbatches_are_predicted_in_under_a_second(even_profiles):
    import time

    profile = json.load(open(even_profiles[1]))
    profiles = []
    for stage in range(64):
        p = json.loads(json.dumps(profile))
        p["stage"], p["num_stages"] = stage, 64
        if stage == 0:
            p["bytes"]["input_grad_bytes"] = 0
            p["bytes"]["input_bytes"] = p["bytes"]["output_bytes"]
        profiles.append(p)
    start = time.perf_counter()
    prediction = remat.pipelining.predict(profiles, "1f1b", ranks=64, microbatches=256)
    seconds = time.perf_counter() - start
    print(f"64 ranks x 256 microbatches: {seconds:.3f} s")
    assert len(prediction["per_rank"]) == 64 and seconds < 1.0


DATA = os.path.join(os.path.dirname(__file__), "..", "..", "cli", "data")
TORCH_PROFILES = [os.path.join(DATA, f"stage-profile-{i}.json") for i in range(2)]
REMAT_PROFILES = [os.path.join(DATA, f"pipeline-train-stage-profile-{i}.json") for i in range(4)]


def test_profile_stage_measures_the_first_backward_with_the_gradients_it_creates(even_profiles):
    figures = [json.load(open(path))["bytes"] for path in even_profiles]
    # The step's first backward keeps each gradient it makes (the activations it frees make room);
    # a later one adds each into the gradient held and lets it go, so it peaks no higher.
    assert all(f["first_backward_transient"] >= f["backward_transient"] > 0 for f in figures), figures
    assert any(f["first_backward_transient"] > f["backward_transient"] for f in figures), figures


@pytest.mark.parametrize("arguments, error, words", [
    ({"ranks": 4.0}, TypeError, "ranks must be an int (pipeline ranks), got float"),
    ({"ranks": True}, TypeError, "ranks must be an int (pipeline ranks), got bool"),
    ({"ranks": 2**40}, ValueError, "ranks=1099511627776 is out of range; give pipeline ranks, from 1 to 65536"),
    ({"ranks": -2}, ValueError, "ranks=-2 is out of range"),
    ({"microbatches": 2**31}, ValueError, "microbatches=2147483648 is out of range; give microbatches per step, "
                                          "from 1 to 1048576"),
    ({"spare_sets": 2.5, "buffers": "pooled"}, TypeError, "spare_sets must be an int"),
    ({"spare_sets": -1, "buffers": "pooled"}, ValueError, "spare_sets=-1 is out of range"),
    ({"optimizer_step": "no"}, TypeError, "optimizer_step must be True or False, got str"),
    ({"buffers": "POOLED"}, ValueError, "buffers is 'POOLED'; give \"stock\""),
    ({"slack": 1, "buffers": "pooled"}, ValueError, "slack sizes remat::pipeline's rings; these profiles are of "
                                                    "torch.distributed.pipelining stages, whose pooled rings take "
                                                    "spare_sets="),
])
def test_predict_refuses_bad_arguments_naming_the_argument_and_the_fix(arguments, error, words):
    given = {"ranks": 2, "microbatches": 4, **arguments}
    with pytest.raises(error) as raised:
        remat.pipelining.predict(TORCH_PROFILES, "1f1b", **given)
    assert words in str(raised.value)


def test_predict_names_a_missing_profile_file(tmp_path):
    missing = str(tmp_path / "stage-1.json")
    with pytest.raises(FileNotFoundError, match=r"profiles\[1\]: no file .*stage-1.json'; give the path "
                                                r"profile_stage\(\.\.\., path=\.\.\.\) wrote"):
        remat.pipelining.predict([TORCH_PROFILES[0], missing], "1f1b", ranks=2, microbatches=4)


def test_spare_sets_are_refused_for_remat_pipeline_stages_whose_rings_take_slack():
    for spare in (0, 1, -1):
        with pytest.raises(ValueError, match="spare_sets|out of range"):
            remat.pipelining.predict(REMAT_PROFILES, "1f1b", ranks=4, microbatches=16, buffers="pooled",
                                     spare_sets=spare)
    with pytest.raises(ValueError, match="whose rings take slack="):
        remat.pipelining.predict(REMAT_PROFILES, "1f1b", ranks=4, microbatches=16, buffers="pooled", spare_sets=0)


@pytest.mark.parametrize("slack", [None, 0, 5])
def test_python_and_the_cli_agree_on_remat_pipeline_stages_slack_and_lowering_included(slack):
    python = remat.pipelining.predict(REMAT_PROFILES, "1f1b", ranks=4, microbatches=16, buffers="pooled",
                                      slack=slack)
    cli = report("predict", *REMAT_PROFILES, "--schedule", "1f1b", "--ranks", "4", "--microbatches", "16",
                 "--buffers", "pooled", *([] if slack is None else ["--slack", str(slack)]), "--json")
    assert python["lowering"] == cli["lowering"] == "add-send-recv"
    assert python["per_rank"] == cli["per_rank"]
    # NeMo's closed form, max(2, min(M, S - s + slack)) sets of 1 KiB per stage and direction it
    # receives: stage 0 receives gradients, stage 3 activations, stages 1 and 2 both.
    given = 2 if slack is None else slack
    ring = [max(2, min(16, 4 - stage + given)) * 1024 for stage in range(4)]
    assert [r["parts"]["receive_buffers"] for r in python["per_rank"]] == [ring[0], 2 * ring[1], 2 * ring[2], ring[3]]


def test_ranks_measured_but_not_predicted_are_listed(measured, tmp_path):
    out_dir, _ = measured
    # A 2-rank prediction beside the 4-rank job's dumps: ranks 2 and 3 are measured only.
    prediction = tmp_path / "two-ranks.json"
    prediction.write_text(json.dumps(remat.pipelining.predict(TORCH_PROFILES, "1f1b", ranks=2, microbatches=4)))
    check = report("ranks", os.path.join(out_dir, "case0"), "--predicted", str(prediction), "--json")
    assert [row["rank"] for row in check["ranks"]] == [0, 1]
    assert check["unpredicted_ranks"] == [2, 3]


def snapshots_copied(out_dir, tmp_path):
    """A folder of its own holding the first case's rank snapshots (a test may spoil them)."""
    job = tmp_path / "job"
    job.mkdir()
    for name in os.listdir(os.path.join(out_dir, "case0")):
        if name.startswith("snapshot"):
            (job / name).write_bytes(open(os.path.join(out_dir, "case0", name), "rb").read())
    return job


def test_a_cut_short_rank_dump_is_listed_beside_the_prediction_and_strict_fails(measured, tmp_path):
    # It showed as a rank with no dump ("-"), unlisted, and --strict exited 0
    job = snapshots_copied(measured[0], tmp_path)
    cut = sorted(job.iterdir())[1]
    cut.write_bytes(cut.read_bytes()[:1000])
    prediction = tmp_path / "prediction.json"
    prediction.write_text(json.dumps(remat.pipelining.predict(TORCH_PROFILES, "1f1b", ranks=2, microbatches=4)))
    check = report("ranks", str(job), "--predicted", str(prediction), "--json")
    assert [dump["path"] for dump in check["unreadable"]] == [str(cut)]
    assert "cut short" in check["unreadable"][0]["reason"]
    assert [row["measured_bytes"] is None for row in check["ranks"]].count(True) == 1
    code, message = report_fails("ranks", str(job), "--predicted", str(prediction), "--strict")
    assert code == 2 and "--strict: 1 of the dumps are unreadable" in message, message


def test_a_dump_write_a_killed_process_left_unfinished_is_skipped_not_unreadable(measured, tmp_path):
    # The atomic write's temporary file (".remat-<pid>-<n>.tmp") of a job killed mid-dump was read
    # as a rank's dump cut short, and --strict failed the whole job's report for it
    job = snapshots_copied(measured[0], tmp_path)
    (job / ".remat-4242-0.tmp").write_bytes(next(job.glob("snapshot*")).read_bytes()[:1000])
    check = report("ranks", str(job), "--json", "--strict")
    assert check["unreadable"] == [] and check["skipped"] == {"unfinished write": 1}
