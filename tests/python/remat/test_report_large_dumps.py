"""remat-report on a snapshot of a long trace ring, as a job that raised trace_entries writes it:
`trace` prints its events as they stream by, in memory that does not grow with the file (read
whole, a 685 MB snapshot took 2.7 GB)."""

import os
import subprocess
import sys
import textwrap

from test_oom_observer import remat_report


def test_trace_of_a_large_snapshot_reads_it_in_bounded_memory(tmp_path):
    path = tmp_path / "snapshot.json"
    # In a process of its own: the allocator's trace ring is sized when it is first configured
    script = textwrap.dedent(f"""
        import torch, remat, remat_alloc
        remat_alloc.configure("trace_entries:400000")
        with remat.tag_cpu_tensors():
            kept = []
            for i in range(200000):
                t = torch.empty(64 + (i % 7) * 512)
                if i % 50 == 0:
                    kept.append(t)
            remat_alloc.dump_snapshot({str(path)!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    size = os.path.getsize(path)
    assert size > 50 * 2**20, size
    # Measured from a process of its own, whose only child it is (a child's peak is the largest of
    # its parent's children's)
    measure = textwrap.dedent(f"""
        import resource, subprocess, sys
        done = subprocess.run({[remat_report(), "trace", "--limit", "3", str(path)]!r}, capture_output=True,
                              text=True, timeout=300)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        sys.exit(done.returncode)
    """)
    done = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, timeout=330)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(" alloc " in line or "segment_alloc" in line for line in lines[:-1]) == 3, done.stdout
    peak_kib = int(lines[-1])
    assert peak_kib * 1024 < size // 4, (peak_kib, size)
