"""remat.pipelining against PyTorch's own pipeline schedules.

The parity job starts 4 ranks (Gloo on 127.0.0.1, a free port, bounded by a timeout, every
child reaped) and trains every schedule with stock and pooled receive buffers in each mode;
losses and every parameter gradient over 3 steps must be bitwise equal. The checks that
need no data between ranks run one rank at a time over PyTorch's fake process group.
"""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

import remat.pipelining

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 4
SCHEDULES = ["gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "interleaved_zero_bubble", "zbv", "dualpipev", "csv"]
MODES = ["ring", "shared_ring", "just_in_time"]
LAYOUTS = [0, 3]
# remat-report's names and lowering for each schedule the worker builds.
REPORT_SCHEDULES = {
    "gpipe": ["--schedule", "gpipe", "--lowering", "step"],
    "1f1b": ["--schedule", "1f1b", "--lowering", "step"],
    "interleaved_1f1b": ["--schedule", "interleaved-1f1b", "--virtual-stages", "2", "--lowering", "runtime"],
    "looped_bfs": ["--schedule", "looped-bfs", "--virtual-stages", "2", "--lowering", "runtime"],
    "interleaved_zero_bubble": ["--schedule", "interleaved-zero-bubble", "--virtual-stages", "2",
                                "--lowering", "runtime"],
    "zbv": ["--schedule", "zbv-zero-bubble", "--lowering", "runtime"],
    "dualpipev": ["--schedule", "dualpipev", "--lowering", "runtime"],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(**extra):
    path = [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(path))
    env.update(extra)
    return env


def run_ranks(worker, args, out_dir, what, timeout, world=WORLD):
    """Runs `worker` (a script beside this file) on `world` Gloo ranks over 127.0.0.1 with
    (out_dir, *args); returns the results each rank wrote to out_dir/rank<r>.json. Every child
    ends: killed at the timeout, and reaped."""
    port = str(free_port())
    children = []
    codes = None
    try:
        for rank in range(world):
            log = open(os.path.join(out_dir, f"rank{rank}.log"), "w")
            env = worker_env(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            children.append((subprocess.Popen([sys.executable, os.path.join(HERE, worker), out_dir, *args], env=env,
                                              stdout=log, stderr=subprocess.STDOUT), log))
        codes = [child.wait(timeout=timeout) for child, _ in children]
    finally:
        for child, log in children:
            if child.poll() is None:
                child.kill()
            child.wait()
            log.close()
    if any(codes):
        logs = "\n".join(open(os.path.join(out_dir, f"rank{r}.log")).read()[-3000:] for r in range(world))
        pytest.fail(f"{what} failed with exit codes {codes}:\n{logs}")
    return [json.load(open(os.path.join(out_dir, f"rank{rank}.json"))) for rank in range(world)]


def run_fake(tmp_path, check, arg=None, timeout=180):
    out = tmp_path / f"{check}.json"
    command = [sys.executable, os.path.join(HERE, "pipelining_fake_worker.py"), check, str(out)]
    if arg is not None:
        command.append(arg)
    done = subprocess.run(command, env=worker_env(), cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks("pipelining_worker.py", [",".join(SCHEDULES)], str(tmp_path_factory.mktemp("pipelining")),
                     "parity job", timeout=420)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pooled_training_is_bitwise_stock(ranks, schedule, layout, mode):
    for rank, results in enumerate(ranks):
        entry = results[f"{schedule}/{layout}"]
        assert entry["modes"][mode]["equal"], f"rank {rank}: losses or gradients differ from stock"
        if any(entry["stock_losses"]):
            assert entry["modes"][mode]["losses"] == entry["stock_losses"]
            assert len(entry["stock_losses"]) == 3 and len(entry["stock_losses"][0]) == 8


def report(*args):
    binary = os.environ.get("REMAT_REPORT") or shutil.which("remat-report")
    if binary is None:
        pytest.skip("remat-report is not built here (REMAT_REPORT unset and not on PATH)")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cli_plan(schedule):
    # The worker's "csv" schedule is Interleaved1F1B's order written by PyTorch's _dump_csv and
    # loaded into the bare runtime, so its plan is Interleaved1F1B's.
    name = "interleaved_1f1b" if schedule == "csv" else schedule
    return report("plan", *REPORT_SCHEDULES[name], "--ranks", str(WORLD), "--microbatches", "8", "--json")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pooled_slots_are_remat_reports_plan(ranks, schedule):
    plan = ranks[0][f"{schedule}/0"]["plan"]
    expected = cli_plan(schedule)
    fields = ("rank", "stage", "direction", "received", "min_slots", "slots")
    assert [{k: e[k] for k in fields} for e in plan["entries"]] == [{k: e[k] for k in fields}
                                                                     for e in expected["entries"]]
    assert plan["shared"] == expected["shared"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_buffers_held_are_the_plans_rings(ranks, schedule):
    for rank, results in enumerate(ranks):
        entry = results[f"{schedule}/0"]
        plan_rings = {(e["stage"], e["direction"]): e["ring_size"] for e in entry["plan"]["entries"]
                      if e["rank"] == rank and e["received"] > 0}
        stock = {(row["stages"][0], row["direction"]): row["sets"] for row in entry["stock_memory"]}
        assert stock == {key: 8 for key in plan_rings}, f"rank {rank}: stock holds one set per microbatch"
        ring = {(row["stages"][0], row["direction"]): row["sets"] for row in entry["modes"]["ring"]["memory"]}
        assert ring == plan_rings
        jit = entry["modes"]["just_in_time"]["memory"]
        assert all(row["sets"] == 0 for row in jit), "just in time holds nothing between steps"
        assert {(row["stages"][0], row["direction"]): row["peak_sets"] for row in jit} == plan_rings
        shared = entry["modes"]["shared_ring"]["memory"]
        expected_shared = {(tuple(r["stages"]), r["direction"]): r["min_slots"] for r in entry["plan"]["shared"]
                           if r["rank"] == rank}
        assert {(tuple(row["stages"]), row["direction"]): row["sets"] for row in shared} == expected_shared


def test_a_ring_one_slot_short_is_caught_by_the_guard_on_every_schedule(tmp_path):
    caught = run_fake(tmp_path, "guard", ",".join(SCHEDULES))
    for schedule in SCHEDULES:
        entry = caught[schedule]
        assert entry is not None, f"{schedule}: no rank has a ring of 2 or more"
        error = entry["error"]
        assert error is not None, f"{schedule}: the ring one slot short ran without the guard noticing"
        assert f"stage {entry['stage']} " in error and f"({entry['direction']}) receive slot " in error
        assert "is handed to microbatch" in error and "still needs it (not yet run:" in error


MICROBATCHES = 8  # per step in the fake worker's schedules


def nemo_rings(rank, slack):
    """NeMo's ring, max(2, min(M, S - s + slack)) sets, per (stage, direction) that receives on `rank`."""
    ring = max(2, min(MICROBATCHES, WORLD - rank + slack))
    return {key: ring for key, receives in (((rank, "F"), rank > 0), ((rank, "B"), rank < WORLD - 1)) if receives}


def sets_by_stage(rows):
    return {(row["stages"][0], row["direction"]): row["sets"] for row in rows}


def assert_nemo_rings_beside_stock(result, stock_key, why_stock):
    """Every rank's pooled rings are NeMo's closed form with slack 2, and result[stock_key]'s
    buffers stay stock (one set per microbatch) for the same stages."""
    for rank in range(WORLD):
        expected = nemo_rings(rank, slack=2)
        assert sets_by_stage(result["rings"][str(rank)]) == expected, f"rank {rank}"
        stock = sets_by_stage(result[stock_key][str(rank)])
        assert stock == {key: MICROBATCHES for key in expected}, why_stock


def test_install_recv_buffer_pool_is_nemos_closed_form_on_1f1b(tmp_path):
    result = run_fake(tmp_path, "nemo", "2")
    assert result["installed"] is True and result["again"] is True
    assert result["negative"] == "install_recv_buffer_pool: slack must be >= 0, got -1"
    assert_nemo_rings_beside_stock(result, "gpipe", "only Schedule1F1B is pooled")


def test_install_recv_buffer_pool_per_stage_pools_the_1f1b_schedule_running_that_stage(tmp_path):
    result = run_fake(tmp_path, "nemo_per_stage", "2")
    assert result["installed"] is True
    assert result["not_a_stage"].startswith("install_recv_buffer_pool: stage must be a torch.distributed.pipelining "
                                            "stage, got str")
    assert_nemo_rings_beside_stock(result, "stock", "a stage not given stays stock")


def test_install_recv_buffer_pool_keeps_stock_buffers_where_torch_differs(tmp_path):
    result = run_fake(tmp_path, "unrecognised")
    assert result["installed"] is False
    assert len(result["warnings"]) == 1 and "receive buffers stay stock" in result["warnings"][0]


def test_bad_input_is_refused_before_anything_changes(tmp_path):
    result = run_fake(tmp_path, "refusals")
    assert result["negative_slack"] == ["ValueError", "pool_recv_buffers: slack must be >= 0, got -1"]
    assert result["bad_mode"][0] == "ValueError" and "'fifo'" in result["bad_mode"][1]
    assert result["not_a_schedule"][0] == "UnsupportedSchedule"
    assert result["untouched_after_refusals"] is True
    assert result["twice"] == ["RuntimeError", "remat.pipelining: this schedule's receive buffers are pooled "
                                               "already; pool a schedule once"]
    assert result["huge_slack"] == ["ValueError", "pool_recv_buffers: slack must be at most 65536 (spare buffer sets "
                                                  "per ring; more than a step's microbatches are never used), got "
                                                  "1000000000000"]
    assert result["second_schedule"][0] == "RuntimeError"
    assert "these stages are pooled by another schedule" in result["second_schedule"][1]
    assert result["after_step"][0] == "RuntimeError" and "before the first step()" in result["after_step"][1]
    assert result["renamed"][0] == "UnsupportedSchedule" and "get_local_bwd_output" in result["renamed"][1]
    assert result["renamed_untouched"] is True
    assert result["own_loop"][0] == "UnsupportedSchedule" and "_step_microbatches" in result["own_loop"][1]


def test_ring_buffers_are_tagged_with_stage_direction_and_slot(tmp_path):
    snapshot = tmp_path / "rank1.json"
    result = run_fake(tmp_path, "tags", str(snapshot))
    rings = {e["direction"]: e["ring_size"] for e in result["plan"] if e["received"]}
    binary = os.environ.get("REMAT_REPORT") or shutil.which("remat-report")
    if binary is None:
        pytest.skip("remat-report is not built here")
    done = subprocess.run([binary, "memory", "--by", "slot", str(snapshot)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for direction, size in rings.items():
        for slot in range(size):
            assert f"stage 1 {direction} slot {slot} " in done.stdout
        assert f"stage 1 {direction} slot {size} " not in done.stdout


def test_schedule_supports_recv_pool_is_nemos_gate():
    assert remat.pipelining.schedule_supports_recv_pool("1f1b")
    assert remat.pipelining.schedule_supports_recv_pool("1F1B")
    for name in ("gpipe", "interleaved_1f1b", "Interleaved1F1B", " 1f1b", "", None):
        assert not remat.pipelining.schedule_supports_recv_pool(name)
