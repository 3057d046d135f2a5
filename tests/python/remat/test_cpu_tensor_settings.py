"""Where the devices are CUDA, tag_cpu_tensors() counts CPU tensors in an allocator of their own
(host_capacity_mb); remat_alloc.configure() reaches it as it reaches the devices: a new capacity
applies to the next CPU tensor, a new OOM report directory to the next report. Each case runs in
a fresh process with backend:cuda, which a machine without a GPU accepts for this."""

import os
import subprocess
import sys
import textwrap

PRELUDE = """
import os, sys, torch, remat, remat_alloc
remat_alloc.configure("backend:cuda")

def allocate_8_mib():
    try:
        with remat.tag_cpu_tensors():
            torch.empty(8 << 20, dtype=torch.uint8)
        return "allocated"
    except torch.OutOfMemoryError:
        return "out of memory"
"""


def run(code):
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_new_host_capacity_reaches_the_cpu_tensors_allocator():
    assert run("""
        remat_alloc.configure("host_capacity_mb:4,oom_dump_interval_ms:0")
        print(allocate_8_mib().replace(" ", "_"))
        remat_alloc.configure("host_capacity_mb:64")
        print(allocate_8_mib().replace(" ", "_"))
    """) == ["out_of_memory", "allocated"]


def test_a_new_report_directory_reaches_the_cpu_tensors_allocator(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    run(f"""
        remat_alloc.configure("host_capacity_mb:4,oom_dump_interval_ms:0,oom_dump_dir:{first}")
        allocate_8_mib()
        remat_alloc.configure("oom_dump_dir:{second}")
        allocate_8_mib()
    """)
    assert len(os.listdir(first)) == 1 and len(os.listdir(second)) == 1, (os.listdir(first), os.listdir(second))
