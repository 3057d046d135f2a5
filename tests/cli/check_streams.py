#!/usr/bin/env python3
"""Standard input and FIFOs through real pipes: every subcommand that reads one dump reads `-`
and a FIFO given by path exactly as it reads the file; `diff` takes `-` for one side only; and
memory stays bounded on large or zero-filled input, from a file or a pipe.

usage: check_streams.py REMAT_REPORT
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE / "data"
ENV = {"PATH": "/usr/bin:/bin", "NO_COLOR": "1"}

# Runs a command, feeding `stdin_path` (or nothing) through a real pipe, and prints the peak RSS
# of that command alone (KiB) on the last line of stderr.
MEASURE = r"""
import resource, subprocess, sys
source = open(sys.argv[1], "rb") if sys.argv[1] != "" else subprocess.DEVNULL
run = subprocess.run(sys.argv[2:], stdin=source, capture_output=True)
sys.stdout.buffer.write(run.stdout)
sys.stderr.buffer.write(run.stderr)
sys.stderr.write("\nmaxrss_kib=%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(run.returncode)
"""


def run(args, stdin=None):
    """Runs remat-report with `stdin` (bytes-producing command list, or None) piped in."""
    if stdin is None:
        return subprocess.run([BINARY, *args], capture_output=True, text=True, env=ENV, cwd=HERE)
    producer = subprocess.Popen(stdin, stdout=subprocess.PIPE)
    result = subprocess.run([BINARY, *args], stdin=producer.stdout, capture_output=True, text=True, env=ENV, cwd=HERE)
    producer.stdout.close()
    producer.wait()
    return result


def measure(args, stdin_path=""):
    run = subprocess.run([sys.executable, "-c", MEASURE, str(stdin_path), BINARY, *args], capture_output=True,
                         text=True, env=ENV, cwd=HERE)
    lines = run.stderr.rstrip("\n").split("\n")
    rss = int(lines[-1].split("=")[1])
    return run.returncode, run.stdout, "\n".join(lines[:-2]) + "\n", rss


def expect(condition, message):
    if not condition:
        print("FAIL", message)
        sys.exit(1)


# A sanitized build (REMAT_SANITIZED set by CMake) carries shadow memory and quarantine that
# no bound on the program's own memory can allow for: there the figure is printed, not checked.
def expect_bounded(rss_kib, limit_kib, what):
    if os.environ.get("REMAT_SANITIZED"):
        print(f"not checked under a sanitizer: {what}: peak RSS {rss_kib} KiB")
        return
    expect(rss_kib < limit_kib, f"{what}: peak RSS {rss_kib} KiB (at most {limit_kib} KiB)")


def same_through_a_pipe(command, fixture, outputs=()):
    """`command` on `fixture` by path, through `-` and through a FIFO: same exit code and output."""
    path = str(DATA / fixture)
    by_path = run([*command[:1], path, *command[1:]])
    piped = run([*command[:1], "-", *command[1:]], stdin=["cat", path])
    expected = by_path.stdout.replace(path, "<stdin>")
    expect(by_path.returncode == 0, f"{command} {fixture}: exit {by_path.returncode}: {by_path.stderr}")
    expect(piped.returncode == 0, f"{command} - < {fixture}: exit {piped.returncode}: {piped.stderr}")
    expect(piped.stdout == expected, f"{command} - < {fixture}: output differs\n{piped.stdout}\n---\n{expected}")
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "dump.fifo")
        os.mkfifo(fifo)
        writer = threading.Thread(target=lambda: pathlib.Path(fifo).write_bytes(pathlib.Path(path).read_bytes()))
        writer.start()
        through_fifo = run([*command[:1], fifo, *command[1:]])
        writer.join()
        expect(through_fifo.returncode == 0, f"{command} FIFO: {through_fifo.stderr}")
        expect(through_fifo.stdout == by_path.stdout.replace(path, fifo), f"{command} FIFO: output differs")
    print(f"ok {' '.join(command)} {fixture}: same by path, through `-` and through a FIFO")


def output_that_cannot_be_written():
    # A full disk or a closed standard output loses the output: that is a failure, never exit 0.
    for args in (["schedule", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "8"],
                 ["plan", "--schedule", "1f1b", "--ranks", "4", "--microbatches", "8", "--json"],
                 ["summary", str(DATA / "snapshot-end.json")], ["trace", str(DATA / "trace.jsonl")],
                 ["whatif", str(DATA / "trace.jsonl")]):
        if os.path.exists("/dev/full"):
            with open("/dev/full", "w") as full:
                result = subprocess.run([BINARY, *args], stdout=full, stderr=subprocess.PIPE, text=True, env=ENV)
            expect(result.returncode == 2 and "cannot write the output to standard output" in result.stderr,
                   f"{args[0]} > /dev/full: exit {result.returncode}: {result.stderr}")
        closed = subprocess.run(["sh", "-c", '"$0" "$@" >&-', BINARY, *args], stderr=subprocess.PIPE, text=True, env=ENV)
        expect(closed.returncode == 2 and "cannot write the output to standard output" in closed.stderr,
               f"{args[0]} with standard output closed: exit {closed.returncode}: {closed.stderr}")
        print(f"ok {args[0]}: output that cannot be written exits 2 and says so")


# Writes the start of a snapshot, then one key after another, never ending (until the pipe closes).
ENDLESS_DOCUMENT = r"""
import sys
try:
    sys.stdout.buffer.write(b'{"kind": "snapshot",\n')
    line = b'"x": 1,\n' * 65536
    while True:
        sys.stdout.buffer.write(line)
except (BrokenPipeError, OSError):
    pass
"""


def a_document_without_end_through_a_pipe():
    """A document read whole from a stream is bounded as a file is by its size."""
    endless = run(["summary", "-"], stdin=[sys.executable, "-c", ENDLESS_DOCUMENT])
    expect(endless.returncode == 2 and endless.stderr.startswith("remat-report: <stdin>: byte ") and
           "more than 256 MiB of one JSON document (or line) from a stream" in endless.stderr and
           "save the dump to a file" in endless.stderr, f"an endless document: {endless.returncode} {endless.stderr}")
    print("ok a document that never ends is refused after 256 MiB of a pipe")


def output_is_synced_before_rename(tmp):
    """-o files: written to a temporary file, fsync'ed, then renamed (strace shows the order)."""
    if subprocess.run(["sh", "-c", "command -v strace"], capture_output=True).returncode != 0:
        print("not checked without strace: fsync before rename")
        return
    out = tmp / "synced.svg"
    log = tmp / "strace.log"
    traced = subprocess.run(["strace", "-f", "-o", str(log), "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
                             BINARY, "timeline", str(DATA / "snapshot-end.json"), "-o", str(out)],
                            capture_output=True, text=True, env=ENV, cwd=HERE)
    if traced.returncode != 0 and not log.exists():
        print(f"not checked: strace cannot trace here: {traced.stderr.strip()}")
        return
    calls = [line.split("(")[0].split()[-1] for line in log.read_text().splitlines() if "(" in line]
    expect(traced.returncode == 0, f"timeline under strace: {traced.stderr}")
    renames = [i for i, call in enumerate(calls) if call.startswith("rename")]
    expect(len(renames) == 1 and "fsync" in calls[:renames[0]], f"fsync before the rename: {calls}")
    expect("fsync" in calls[renames[0]:], f"the directory synced after the rename: {calls}")
    print("ok an -o file is synced before its rename, and its directory after")


def main():
    output_that_cannot_be_written()
    a_document_without_end_through_a_pipe()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for fixture in ("trace.jsonl", "snapshot-end.json"):
            for command in (["summary"], ["summary", "--json"], ["memory", "--by", "site"], ["segments"],
                            ["trace", "--limit", "20"], ["validate"], ["diff", str(DATA / "snapshot-peak.json")],
                            ["timeline", "-o", str(tmp / "t.svg")],
                            ["export", "--to", "torch-snapshot", "-o", str(tmp / "t.pickle")],
                            ["whatif", "--conf", "expandable_segments:True"]):
                same_through_a_pipe(command, fixture)
        same_through_a_pipe(["whatif", "--conf", "expandable_segments:True"], "torch-snapshot.pickle")
        for fixture in ("oom.json", "memory-report.json", "saved-report.json", "remat-trace.json"):
            same_through_a_pipe(["summary"], fixture)
        same_through_a_pipe(["oom"], "oom.json")

        # diff: `-` on either side, never both.
        after = run(["diff", str(DATA / "snapshot-peak.json"), "-"], stdin=["cat", str(DATA / "trace.jsonl")])
        before = run(["diff", "-", str(DATA / "trace.jsonl")], stdin=["cat", str(DATA / "snapshot-peak.json")])
        expect(after.returncode == 0 and before.returncode == 0, f"diff with `-`: {after.stderr}{before.stderr}")
        expect(after.stdout.splitlines()[1:] == before.stdout.splitlines()[1:], "diff with `-` on either side differs")
        both = run(["diff", "-", "-"], stdin=["cat", str(DATA / "trace.jsonl")])
        expect(both.returncode == 1 and both.stderr ==
               "remat-report diff: BEFORE and AFTER are both `-`, but standard input holds one dump; save one of "
               "them to a file and pass its path\n", f"diff - -: {both.stderr}")
        aliased = run(["diff", "/dev/stdin", "-"], stdin=["cat", str(DATA / "trace.jsonl")])
        expect(aliased.returncode == 1 and aliased.stderr ==
               "remat-report diff: BEFORE (/dev/stdin) and AFTER (-) read the same stream, which holds one dump; save "
               "one of them to a file and pass its path\n", f"diff /dev/stdin -: {aliased.stderr}")
        print("ok diff takes `-` for one side, and refuses it for both, under any name")

        # import reads a pickle from standard input.
        imported = run(["import", "-", "-o", str(tmp / "imported.json"), "--json"],
                       stdin=["cat", str(DATA / "torch-snapshot.pickle")])
        expect(imported.returncode == 0, f"import -: {imported.stderr}")
        expect(json.loads((tmp / "imported.json").read_text())["kind"] == "snapshot", "import - wrote no snapshot")
        print("ok import reads a pickle from `-`")
        output_is_synced_before_rename(tmp)

        # Bounded memory: a 2 GiB zero-filled file, the same through a pipe, and a large trace
        # through a pipe.
        zeros = tmp / "zeros.json"
        with open(zeros, "wb") as f:
            f.truncate(2 << 30)
        message = ("byte 0: starts with NUL bytes (4096 or more of them): not a JSON dump (a preallocated or "
                   "zero-filled file, or one whose writer stopped before writing?)\n")
        code, _, err, rss = measure(["summary", str(zeros)])
        expect(code == 2 and err == f"remat-report: {zeros}: {message}", f"zero-filled file: {err}")
        expect_bounded(rss, 32 << 10, "zero-filled file")
        print(f"ok a 2 GiB zero-filled file is refused at byte 0 in {rss} KiB")
        code, _, err, rss = measure(["summary", "-"], zeros)
        expect(code == 2 and err == f"remat-report: <stdin>: {message}", f"zero-filled pipe: {err}")
        expect_bounded(rss, 32 << 10, "zero-filled pipe")
        print(f"ok 2 GiB of zeros through a pipe are refused at byte 0 in {rss} KiB")
        zeros.unlink()

        trace = tmp / "big.jsonl"
        events = 1_000_000
        with open(DATA / "trace.jsonl") as source:
            header = json.loads(source.readline())
        header["event_count"] = events
        with open(trace, "w") as out:
            out.write(json.dumps(header) + "\n")
            for i in range(events // 2):
                address = 0x10000000 + (i % 4096) * 4096
                out.write('{"action":"alloc","time_us":%d,"address":%d,"size":4096,"stream":0,"tag":1}\n'
                          '{"action":"free_requested","time_us":%d,"address":%d,"size":4096,"stream":0,"tag":1}\n'
                          % (2 * i, address, 2 * i + 1, address))
        size = trace.stat().st_size
        code, out, err, rss = measure(["memory", "-", "--json"], trace)
        expect(code == 0, f"large trace through a pipe: {err}")
        expect(json.loads(out)["memory_total"]["allocations"] == events // 2, "large trace: wrong allocation count")
        expect_bounded(rss, 48 << 10, f"large trace through a pipe ({size >> 20} MiB)")
        print(f"ok a {size >> 20} MiB trace streams through a pipe in {rss} KiB")
        # whatif on the same trace: its frees never complete, so each block is held after its
        # free (allocated bytes fall there, as the recorded allocator's did) until its address is
        # handed out again, and the pools stay as small as the recorded one.
        code, out, err, rss = measure(["whatif", "-", "--json", "--conf", "expandable_segments:True"], trace)
        expect(code == 0, f"whatif of a large trace through a pipe: {err}")
        replayed = json.loads(out)
        expect(replayed["input"]["allocs"] == events // 2, f"whatif: {replayed['input']}")
        expect(all(run["peak_allocated"] == 4096 for run in replayed["runs"]),
               f"whatif: peak allocated {[run['peak_allocated'] for run in replayed['runs']]}, expected 4 KiB")
        expect(all(run["peak_reserved"] <= 18 << 20 for run in replayed["runs"]),
               f"whatif: peak reserved {[run['peak_reserved'] for run in replayed['runs']]}, expected the 16 MiB "
               "the held blocks cover and no more than a segment beside")
        expect(any("free_requested but no free_completed" in note for note in replayed["notes"]),
               f"whatif: no note on frees that never completed: {replayed['notes']}")
        expect_bounded(rss, 48 << 10, f"whatif of a large trace through a pipe ({size >> 20} MiB)")
        print(f"ok whatif replays a {size >> 20} MiB trace from a pipe in {rss} KiB")

        ranks_of_a_large_snapshot(tmp)


def ranks_of_a_large_snapshot(tmp: pathlib.Path) -> None:
    """`ranks` reads a snapshot as it streams: a 1M-event trace costs no more memory than a short one."""
    snapshot = json.loads((DATA / "snapshot-peak.json").read_text())
    events = snapshot["trace"]["events"]
    start = events[0]["time_us"] - 1_000_000
    pairs = []
    for i in range(500_000):  # freed at once: the snapshot's figures stay what they were
        address = 0x700000000000 + (i % 4096) * 4096
        pairs.append('{"action":"alloc","time_us":%d,"address":%d,"size":4096,"stream":0,"tag":1},'
                     '{"action":"free_requested","time_us":%d,"address":%d,"size":4096,"stream":0,"tag":1}'
                     % (start + 2 * i, address, start + 2 * i + 1, address))
    snapshot["trace"]["events"] = []
    head, tail = json.dumps(snapshot, separators=(",", ":")).rsplit('"events":[]', 1)
    big = tmp / "snapshot-rank0.json"
    big.write_text(head + '"events":[' + ",".join(pairs) + ("," if events else "")
                   + ",".join(json.dumps(e, separators=(",", ":")) for e in events) + "]" + tail)
    size = big.stat().st_size
    code, out, err, rss = measure(["ranks", str(big), "--by", "region", "--json"])
    expect(code == 0, f"ranks of a large snapshot: {err}")
    small = run(["ranks", str(DATA / "snapshot-peak.json"), "--by", "region", "--json"])
    figures = {key: value for key, value in json.loads(out).items() if key not in ("created_at", "pid")}
    expected = {key: value for key, value in json.loads(small.stdout).items() if key not in ("created_at", "pid")}
    for entry in figures.get("ranks", []) + expected.get("ranks", []):
        entry.pop("path", None)
    expect(figures == expected, "ranks of the large snapshot: its figures are the short snapshot's")
    expect_bounded(rss, 32 << 10, f"ranks of a large snapshot ({size >> 20} MiB)")
    print(f"ok ranks reads a {size >> 20} MiB snapshot in {rss} KiB")


if __name__ == "__main__":
    BINARY = sys.argv[1]
    main()
