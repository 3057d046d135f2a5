"""Reference pipeline schedules written by PyTorch itself, for the remat pipeline tests.

Rerun from the repository root with a Python that has torch 2.11 installed (CPU is enough; no
GPU, no process group, no network):

    python3 tests/pipeline/reference/make_reference.py

It rewrites every CSV in this folder, index.csv and grid.csv, and prints the torch version.

How the schedules are built: every class in torch.distributed.pipelining.schedules is
constructed as PyTorch's own tests do, with mock stages that carry only the attributes the
constructors read (num_stages, group_size, group_rank, submod); the constructors build the
whole order for every rank, so one object per shape is enough. Every file is written by
PyTorch's own _dump_csv (Python's csv.writer).

Files for each shape, named <schedule>_r<ranks>_v<stages per rank>_m<microbatches>:
  .compute_only.csv   the compute-only order: pipeline_order of the multi-stage classes; for
                      ScheduleGPipe and Schedule1F1B the timeline _get_pipeline_order builds
                      before its final _add_reduce_grad pass (captured by running it with that
                      pass replaced by the identity), with Schedule1F1B's numbering bug fixed
                      (see fix_1f1b_last_rank).
  .compute_comms.csv  _add_send_recv(compute-only order, stage_to_rank, num_stages).
  .runtime.csv        what _PipelineScheduleRuntime runs: pipeline_order_with_comms, written by
                      _dump_csv(format="compute_comms") (UNSHARD/RESHARD and REDUCE_GRAD passes
                      before _add_send_recv). For GPipe and 1F1B, a _PipelineScheduleRuntime
                      that _load_csv'ed the compute-only file.
  .pipeline_order.csv (GPipe and 1F1B only) the pipeline_order attribute exactly as PyTorch
                      holds it: no idle steps, REDUCE_GRAD appended, 1F1B's bug included.
index.csv lists the shapes and their files.
grid.csv covers many more shapes compactly: for ranks 1-8, stages per rank 1-4 and microbatches
1-16, 20, 24 and 32, whether PyTorch accepts the shape, and if so the 64-bit FNV-1a digest of
each of the three CSVs above.
"""

import contextlib
import csv
import logging
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)

import torch  # noqa: E402
from torch.distributed.pipelining import schedules as S  # noqa: E402
from torch.distributed.pipelining.stage import _PipelineStageBase  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# Our command-line name -> (PyTorch class, single stage?, V-shaped?)
KINDS = {
    "gpipe": (S.ScheduleGPipe, True, False),
    "1f1b": (S.Schedule1F1B, True, False),
    "interleaved-1f1b": (S.ScheduleInterleaved1F1B, False, False),
    "looped-bfs": (S.ScheduleLoopedBFS, False, False),
    "interleaved-zero-bubble": (S.ScheduleInterleavedZeroBubble, False, False),
    "zbv-zero-bubble": (S.ScheduleZBVZeroBubble, False, True),
    "dualpipev": (S.ScheduleDualPipeV, False, True),
}

# (schedule, ranks, stages per rank, microbatches) written out in full.
SHAPES = [
    ("gpipe", 2, 1, 3), ("gpipe", 4, 1, 8), ("gpipe", 8, 1, 5),
    ("1f1b", 2, 1, 2), ("1f1b", 4, 1, 6), ("1f1b", 4, 1, 8), ("1f1b", 8, 1, 12),
    ("interleaved-1f1b", 2, 2, 4), ("interleaved-1f1b", 4, 2, 8), ("interleaved-1f1b", 4, 2, 10),
    ("interleaved-1f1b", 4, 3, 6), ("interleaved-1f1b", 4, 2, 3), ("interleaved-1f1b", 8, 4, 16),
    ("looped-bfs", 2, 2, 4), ("looped-bfs", 4, 2, 6), ("looped-bfs", 8, 3, 5), ("looped-bfs", 4, 4, 8),
    ("interleaved-zero-bubble", 2, 2, 4), ("interleaved-zero-bubble", 4, 2, 8),
    ("interleaved-zero-bubble", 4, 2, 6), ("interleaved-zero-bubble", 4, 2, 3),
    ("interleaved-zero-bubble", 4, 3, 10), ("interleaved-zero-bubble", 8, 2, 16),
    ("zbv-zero-bubble", 2, 2, 4), ("zbv-zero-bubble", 4, 2, 8), ("zbv-zero-bubble", 4, 2, 5),
    ("zbv-zero-bubble", 4, 2, 1), ("zbv-zero-bubble", 8, 2, 16),
    ("dualpipev", 2, 2, 4), ("dualpipev", 4, 2, 8), ("dualpipev", 4, 2, 11), ("dualpipev", 8, 2, 16),
]

GRID_RANKS = range(1, 9)
GRID_STAGES_PER_RANK = range(1, 5)
GRID_MICROBATCHES = list(range(1, 17)) + [20, 24, 32]


class MockStage(_PipelineStageBase):
    """The attributes the schedule constructors read, and nothing that needs a process group."""

    def __init__(self, num_stages, group_size, group_rank=0):
        self.submod = None
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.group = None

    def _create_grad_recv_info(self, *args, **kwargs):
        return None

    def _prepare_forward_infra(self, n_microbatches):
        pass

    def _prepare_backward_infra(self, n_microbatches):
        pass


@contextlib.contextmanager
def reduce_grad_pass_skipped():
    """GPipe's and 1F1B's _get_pipeline_order end with _add_reduce_grad (drops idle steps, adds
    REDUCE_GRAD); with it replaced by the identity they return the timeline it was given."""
    original = S._add_reduce_grad
    S._add_reduce_grad = lambda actions, n_microbatches: list(actions)
    try:
        yield
    finally:
        S._add_reduce_grad = original


def fix_1f1b_last_rank(order, ranks):
    """Schedule1F1B._get_pipeline_order (torch 2.11) numbers the last rank's forwards 1..M
    instead of 0..M-1: that rank has no warm-up forwards, so its counter starts one ahead.
    PyTorch's own _validate_schedule refuses that order (B0 without F0), and _add_send_recv
    deadlocks on it, so the reference is the order with exactly that bug undone."""
    last = ranks - 1
    order[last] = [
        S._Action(a.stage_index, a.computation_type, a.microbatch_index - 1)
        if a is not None and a.computation_type == S.F
        else a
        for a in order[last]
    ]
    return order


def runtime(ranks, stages_per_rank, microbatches):
    stages = [MockStage(ranks * stages_per_rank, ranks) for _ in range(stages_per_rank)]
    return S._PipelineScheduleRuntime(stages=stages, n_microbatches=microbatches)


def build(kind, ranks, stages_per_rank, microbatches):
    """Returns (compute-only order, stage_to_rank, runtime-lowered order, pipeline_order attribute
    or None); raises what PyTorch raises for a shape it refuses."""
    cls, single, _ = KINDS[kind]
    if single:
        if stages_per_rank != 1:
            raise ValueError("single-stage schedule")
        stage = MockStage(ranks, ranks)
        attribute = cls(stage, microbatches).pipeline_order
        with reduce_grad_pass_skipped():
            order = cls(stage, microbatches).pipeline_order
        if kind == "1f1b":
            order = fix_1f1b_last_rank(order, ranks)
        stage_to_rank = {s: s for s in range(ranks)}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "compute_only.csv")
            dump_compute_only(order, ranks, 1, microbatches, path)
            rt = runtime(ranks, 1, microbatches)
            rt._load_csv(path, format="compute_only")
        return order, stage_to_rank, rt.pipeline_order_with_comms, attribute
    stages = [MockStage(ranks * stages_per_rank, ranks) for _ in range(stages_per_rank)]
    sched = cls(stages, microbatches)
    return sched.pipeline_order, dict(sched.stage_index_to_group_rank), sched.pipeline_order_with_comms, None


def send_recv(order, stage_to_rank):
    copy = {rank: list(actions) for rank, actions in order.items()}
    return S._add_send_recv(copy, stage_to_rank=lambda s: stage_to_rank[s], num_stages=len(stage_to_rank))


def dump_compute_only(order, ranks, stages_per_rank, microbatches, path):
    rt = runtime(ranks, stages_per_rank, microbatches)
    rt.pipeline_order = order
    rt._dump_csv(path, format="compute_only")


def dump_compute_comms(order, ranks, stages_per_rank, microbatches, path):
    rt = runtime(ranks, stages_per_rank, microbatches)
    rt.pipeline_order_with_comms = order
    rt._dump_csv(path, format="compute_comms")


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def write_shape(kind, ranks, v, m, directory):
    """Writes the shape's files into `directory`; returns their names."""
    order, stage_to_rank, lowered_runtime, attribute = build(kind, ranks, v, m)
    base = f"{kind}_r{ranks}_v{v}_m{m}"
    names = {
        "compute_only": base + ".compute_only.csv",
        "compute_comms": base + ".compute_comms.csv",
        "runtime": base + ".runtime.csv",
        "pipeline_order": base + ".pipeline_order.csv" if attribute is not None else "",
    }
    dump_compute_only(order, ranks, v, m, os.path.join(directory, names["compute_only"]))
    dump_compute_comms(send_recv(order, stage_to_rank), ranks, v, m, os.path.join(directory, names["compute_comms"]))
    dump_compute_comms(lowered_runtime, ranks, v, m, os.path.join(directory, names["runtime"]))
    if attribute is not None:
        dump_compute_only(attribute, ranks, v, m, os.path.join(directory, names["pipeline_order"]))
    return names


def main():
    for name in os.listdir(HERE):
        if name.endswith(".csv"):
            os.remove(os.path.join(HERE, name))

    with open(os.path.join(HERE, "index.csv"), "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        f.write(f"# made by make_reference.py with torch {torch.__version__}\n")
        writer.writerow(["schedule", "ranks", "virtual_stages", "microbatches", "compute_only", "compute_comms",
                         "runtime", "pipeline_order"])
        for kind, ranks, v, m in SHAPES:
            names = write_shape(kind, ranks, v, m, HERE)
            writer.writerow([kind, ranks, v, m, names["compute_only"], names["compute_comms"], names["runtime"],
                             names["pipeline_order"]])

    with open(os.path.join(HERE, "grid.csv"), "w", newline="") as f, tempfile.TemporaryDirectory() as tmp:
        writer = csv.writer(f, lineterminator="\n")
        f.write(f"# made by make_reference.py with torch {torch.__version__}; digests are FNV-1a 64 of the CSV bytes\n")
        writer.writerow(["schedule", "ranks", "virtual_stages", "microbatches", "compute_only", "compute_comms",
                         "runtime"])
        for kind, (_, single, _) in KINDS.items():
            for ranks in GRID_RANKS:
                for v in [1] if single else GRID_STAGES_PER_RANK:
                    for m in GRID_MICROBATCHES:
                        try:
                            names = write_shape(kind, ranks, v, m, tmp)
                        except (ValueError, AssertionError):
                            writer.writerow([kind, ranks, v, m, "refused", "refused", "refused"])
                            continue
                        digests = []
                        for key in ("compute_only", "compute_comms", "runtime"):
                            path = os.path.join(tmp, names[key])
                            with open(path, "rb") as data:
                                digests.append(fnv1a64(data.read()))
                            os.remove(path)
                        if names["pipeline_order"]:
                            os.remove(os.path.join(tmp, names["pipeline_order"]))
                        writer.writerow([kind, ranks, v, m] + digests)
    print(f"reference schedules written with torch {torch.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
