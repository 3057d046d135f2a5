"""remat.pipelining's shared_ring mode on a rank whose stages receive tensors of different shapes
(an uneven split): those stages cannot share one ring, so each holds its own, as mode "ring" gives.
The first stage to set up its buffers had allocated the shared ring (sized for the whole group)
before the next found its shapes differ: that rank held more than under "ring", and more than
stock PyTorch (2240 bytes against 1600 on rank 3 of ScheduleLoopedBFS). One rank at a time over
PyTorch's fake process group, in a fresh process."""

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, schedules
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import remat.pipelining

    WIDTHS = [8, 12, 6, 10, 8, 5, 9, 7, 8]  # stage i maps WIDTHS[i] features to WIDTHS[i + 1]
    RANK, WORLD, MICROBATCHES, ROWS = int(sys.argv[1]), 4, 8, 2

    def receive_bytes(mode, name):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=RANK, world_size=WORLD, store=FakeStore())
        stages = [PipelineStage(nn.Linear(WIDTHS[i], WIDTHS[i + 1]), i, 8, torch.device("cpu"),
                                input_args=(torch.zeros(ROWS, WIDTHS[i], device="meta"),),
                                output_args=(torch.zeros(ROWS, WIDTHS[i + 1], device="meta"),))
                  for i in (RANK, RANK + WORLD)]
        schedule = getattr(schedules, name)(stages, MICROBATCHES, loss_fn=lambda o, t: ((o - t) ** 2).mean())
        if mode != "stock":
            remat.pipelining.pool_recv_buffers(schedule, mode=mode)
        schedule.step(target=torch.zeros(MICROBATCHES * ROWS, WIDTHS[-1]))
        return sum(row["bytes"] for row in remat.pipelining.recv_buffer_memory(schedule))

    print(json.dumps({name: {mode: receive_bytes(mode, name) for mode in ("stock", "ring", "shared_ring")}
                      for name in ("ScheduleLoopedBFS", "ScheduleInterleaved1F1B")}))
""")


@pytest.mark.parametrize("rank", [1, 3])
def test_stages_of_other_shapes_each_hold_their_own_ring(rank):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(rank)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    held = json.loads(done.stdout.splitlines()[-1])
    for name, modes in held.items():
        assert modes["shared_ring"] == modes["ring"] <= modes["stock"], (name, modes)
