"""remat-report on a snapshot of a long trace ring, as a job that raised trace_entries writes it:
`trace` prints its events as they stream by; `summary`, `memory`, `segments`, `timeline` and
`diff` gather what they show as its segments and events stream by; `validate` checks each against
its schema as it goes by, `export` writes the pickle as they go by and `whatif` replays them: all
in memory that does not grow with the file (read whole, a 685 MB snapshot took 2.7 GB, 4.8 GB
under `diff`)."""

import os
import subprocess
import sys
import textwrap

import pytest

from test_oom_observer import remat_report


@pytest.fixture(scope="module")
def large_snapshot(tmp_path_factory):
    """A 68 MB snapshot whose ring holds 400,000 records (all 200,000 allocations and frees)."""
    path = tmp_path_factory.mktemp("large") / "snapshot.json"
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
    return path


def run_measured(*args):
    """remat-report's stdout lines and its peak resident set in KiB, measured from a process of its
    own whose only child it is (a child's peak is the largest of its parent's children's)."""
    measure = textwrap.dedent(f"""
        import resource, subprocess, sys
        done = subprocess.run({[remat_report(), *map(str, args)]!r}, capture_output=True, text=True, timeout=300)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        sys.exit(done.returncode)
    """)
    done = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, timeout=330)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    return lines[:-1], int(lines[-1])


def assert_bounded(peak_kib, path):
    """Far below the file's size: a quarter of it (read whole, the peak was 4 times it)."""
    size = os.path.getsize(path)
    assert peak_kib * 1024 < size // 4, (peak_kib, size)


def field(lines, name):
    """The value of a key-value table's row `name`."""
    values = [line.split(None, 1)[1] for line in lines if line.split(None, 1)[:1] == [name]]
    assert len(values) == 1, (name, lines)
    return values[0]


def test_trace_of_a_large_snapshot_reads_it_in_bounded_memory(large_snapshot):
    lines, peak_kib = run_measured("trace", "--limit", "3", large_snapshot)
    assert sum(" alloc " in line or "segment_alloc" in line for line in lines) == 3, lines
    assert_bounded(peak_kib, large_snapshot)


def test_summary_of_a_large_snapshot_reads_it_in_bounded_memory(large_snapshot):
    lines, peak_kib = run_measured("summary", large_snapshot)
    assert int(field(lines, "trace_events")) > 390000, lines
    assert int(field(lines, "blocks_allocated")) >= 4000, lines
    assert any(line.startswith("Largest regions by peak") for line in lines), lines
    assert_bounded(peak_kib, large_snapshot)


def test_memory_of_a_large_snapshot_reads_it_in_bounded_memory(large_snapshot):
    lines, peak_kib = run_measured("memory", "--by", "stream", large_snapshot)
    # Every allocation since the allocator started is in the ring: the peaks are the replay's.
    total = next(line for line in lines if line.startswith("total "))
    assert total.split()[-1] == "200000", lines
    assert_bounded(peak_kib, large_snapshot)


def test_segments_of_a_large_snapshot_reads_it_in_bounded_memory(large_snapshot):
    lines, peak_kib = run_measured("segments", large_snapshot)
    assert int(field(lines, "segments")) > 0, lines
    assert field(lines, "blocks_outside_segments") == "0", lines
    assert_bounded(peak_kib, large_snapshot)


def test_timeline_of_a_large_snapshot_reads_it_in_bounded_memory(large_snapshot, tmp_path):
    picture = tmp_path / "timeline.svg"
    lines, peak_kib = run_measured("timeline", large_snapshot, "-o", picture)
    assert int(field(lines, "events")) > 390000, lines
    assert picture.read_text().startswith("<svg"), picture.read_text()[:100]
    assert_bounded(peak_kib, large_snapshot)


def test_diff_of_large_snapshots_reads_each_in_bounded_memory(large_snapshot):
    lines, peak_kib = run_measured("diff", large_snapshot, large_snapshot, "--by", "stream", "--csv")
    total = next(line for line in lines if line.startswith("total,")).split(",")
    assert total[2] == total[3] != "0" and total[4] == "0", lines  # live before, after, change
    # Every allocation since the allocator started is in the ring: the peaks are the replay's.
    assert total[5] == total[6] != "" and total[7] == "0", lines
    assert_bounded(peak_kib, large_snapshot)


def test_validate_of_a_large_snapshot_reads_it_in_bounded_memory(large_snapshot):
    lines, peak_kib = run_measured("validate", large_snapshot)
    assert lines == [f"{large_snapshot}: valid snapshot dump (schema_version 1, snapshot.schema.json)"], lines
    assert_bounded(peak_kib, large_snapshot)


def test_validate_of_a_large_snapshot_still_refuses_a_bad_event(large_snapshot, tmp_path):
    """The last event breaks the schema only (a request of 0 bytes): found as it streams by, and told
    as a whole read tells it."""
    text = large_snapshot.read_text()
    at = text.rindex('"requested":') + len('"requested":')
    bad = tmp_path / "bad.json"
    bad.write_text(text[:at] + "0" + text[at:].lstrip("0123456789"))
    done = subprocess.run([remat_report(), "validate", bad], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith(f"invalid: {bad}: $.trace.events["), done.stderr
    assert done.stderr.endswith("].requested: 0 is below the minimum 1\n"), done.stderr


def test_export_of_a_large_snapshot_writes_it_in_bounded_memory(large_snapshot, tmp_path):
    pickle_path = tmp_path / "snapshot.pickle"
    lines, peak_kib = run_measured("export", large_snapshot, "--to", "torch-snapshot", "-o", pickle_path)
    assert int(field(lines, "trace_events")) > 390000, lines
    # The pickle is larger than the memory it was written in.
    assert pickle_path.stat().st_size > 40 * 2**20, pickle_path.stat().st_size
    with open(pickle_path, "rb") as f:
        assert f.read(2) == b"\x80\x02"
    assert_bounded(peak_kib, large_snapshot)


def test_whatif_of_a_large_snapshot_replays_it_in_bounded_memory(large_snapshot):
    lines, peak_kib = run_measured("whatif", large_snapshot, "--conf", "expandable_segments:True")
    assert int(field(lines, "allocs")) == 200000, lines
    assert field(lines, "recorded_config_from") == "the snapshot's config.text", lines
    assert_bounded(peak_kib, large_snapshot)
