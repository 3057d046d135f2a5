#!/usr/bin/env python3
"""remat-launch against the programs users really start: ones that leave children behind, print
megabytes without a newline or binary bytes, ignore SIGTERM, or outlive a launcher that is
interrupted or killed. Ranks are shell commands; the launcher listens on 127.0.0.1 only, and
every run is bounded by a timeout.

    check_launch.py --launcher remat-launch CASE
"""

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

RUN_TIMEOUT_S = 60


def expect(condition, message):
    if not condition:
        print(f"FAILED: {message}")
        sys.exit(1)


def run(args, launcher_args, timeout=RUN_TIMEOUT_S, text=True):
    command = [args.launcher, *launcher_args]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=text, timeout=timeout)
    elapsed = time.monotonic() - started
    shown = result.stderr if text else result.stderr.decode(errors="replace")
    print(f"$ {' '.join(command)}\n(exit {result.returncode} after {elapsed:.1f} s)\n{shown[-2000:]}")
    return result, elapsed


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def pids_in(directory):
    pids = []
    for name in os.listdir(directory):
        with open(os.path.join(directory, name)) as f:
            pids.extend(int(word) for word in f.read().split())
    return pids


def expect_all_gone(pids, what):
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    expect(not left, f"{what}: no process is left behind (left: {left})")


def check_leftover_children(args):
    # Each rank starts a child that holds the rank's output for a minute, then exits.
    with tempfile.TemporaryDirectory() as pids:
        script = f'sleep 60 & echo $! > {pids}/$RANK; echo started'
        result, elapsed = run(args, ["--nproc", "2", "--", "sh", "-c", script])
        expect(result.returncode == 0, "the ranks succeeded")
        expect(elapsed < 15, f"the launcher does not wait for what the ranks left running (took {elapsed:.1f} s)")
        expect("processes they started still hold their output" in result.stderr, "the launcher says why it stops them")
        expect_all_gone(pids_in(pids), "children of exited ranks")


def check_timeout_with_children(args):
    # A rank that runs past --timeout with a child of its own, and one that has exited leaving one.
    with tempfile.TemporaryDirectory() as pids:
        script = (f'sleep 60 & echo $! > {pids}/$RANK; if [ "$RANK" = 0 ]; then exit 0; fi; '
                  f'echo $$ >> {pids}/$RANK; sleep 60')
        result, elapsed = run(args, ["--nproc", "2", "--timeout", "2", "--", "sh", "-c", script])
        expect(result.returncode == 124, "a job past --timeout exits 124")
        expect(elapsed < 15, f"--timeout bounds the job (took {elapsed:.1f} s)")
        expect_all_gone(pids_in(pids), "ranks and their children after --timeout")


def check_long_line(args):
    size = 50 << 20
    script = f"head -c {size} /dev/zero | tr '\\0' a"
    result, elapsed = run(args, ["--nproc", "1", "--", "sh", "-c", script], text=False)
    expect(result.returncode == 0, "the rank succeeded")
    lines = result.stdout.split(b"\n")[:-1]
    expect(all(line.startswith(b"[rank 0] ") for line in lines), "every piece carries the rank prefix")
    expect(sum(len(line) - len(b"[rank 0] ") for line in lines) == size, "every byte is forwarded once")
    expect(max(len(line) for line in lines) <= 65536 + len(b"[rank 0] "), "pieces of at most 64 KiB")
    expect(elapsed < 20, f"forwarded in linear time (took {elapsed:.1f} s)")


def check_binary_output(args):
    result, _ = run(args, ["--nproc", "1", "--", "printf", "ab\\000cd\\nxy\\000z"], text=False)
    expect(result.stdout == b"[rank 0] ab\0cd\n[rank 0] xy\0z\n", f"NUL bytes are forwarded: {result.stdout!r}")


def check_whole_numbers(args):
    for flag, value in [("--nproc", "1.5"), ("--nproc", "1e1"), ("--nproc", "0"), ("--nproc", "1025"),
                        ("--master-port", "80.5"), ("--master-port", "70000")]:
        extra = [] if flag == "--nproc" else ["--nproc", "1"]
        result, _ = run(args, [*extra, flag, value, "--", "true"])
        expect(result.returncode == 2, f"{flag} {value} is a usage error")
        expect(f"{flag} '{value}' is not a whole number in " in result.stderr, f"the message names {flag} and {value}")


def check_interrupted(args):
    # A rank that ignores SIGTERM: a second SIGINT kills it at once.
    with tempfile.TemporaryDirectory() as pids:
        script = f'echo $$ > {pids}/$RANK; trap "" TERM INT; sleep 60 & echo $! >> {pids}/$RANK; wait'
        launcher = subprocess.Popen([args.launcher, "--nproc", "2", "--", "sh", "-c", script],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while len(os.listdir(pids)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.3)
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=RUN_TIMEOUT_S)
        print(stderr)
        expect(launcher.returncode == 130, f"an interrupted launcher exits 130 (got {launcher.returncode})")
        expect("interrupted; stopping every rank" in stderr, "it says it was interrupted")
        expect_all_gone(pids_in(pids), "ranks and their children after two interrupts")


def check_launcher_killed(args):
    if not sys.platform.startswith("linux"):
        print("skipped: ranks die with the launcher through a Linux prctl")
        return
    with tempfile.TemporaryDirectory() as pids:
        # The rank itself dies with the launcher (a Linux parent-death signal); a child it started
        # would outlive it, since a launcher killed outright cannot stop its group, so it execs.
        script = f"echo $$ > {pids}/$RANK; exec sleep 60"
        launcher = subprocess.Popen([args.launcher, "--nproc", "2", "--", "sh", "-c", script],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while len(os.listdir(pids)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        launcher.kill()
        launcher.wait(timeout=RUN_TIMEOUT_S)
        expect_all_gone(pids_in(pids), "ranks of a launcher killed by SIGKILL")


def check_spawn_failure(args):
    # Too few descriptors for 100 ranks: the launcher refuses the job and stops the ranks it started.
    def few_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    with tempfile.TemporaryDirectory() as pids:
        script = f"echo $$ > {pids}/$RANK; sleep 60 & echo $! >> {pids}/$RANK; wait"
        started = time.monotonic()
        result = subprocess.run([args.launcher, "--nproc", "100", "--", "sh", "-c", script], capture_output=True,
                                text=True, timeout=RUN_TIMEOUT_S, preexec_fn=few_descriptors)
        print(f"(exit {result.returncode} after {time.monotonic() - started:.1f} s)\n{result.stderr}")
        expect(result.returncode == 1, "a job that cannot start every rank fails")
        expect("cannot start rank" in result.stderr and "raise ulimit -n" in result.stderr,
               "the message names the rank, the cause and the fix")
        expect("usage:" not in result.stderr, "it is not reported as a usage error")
        time.sleep(0.5)
        expect_all_gone(pids_in(pids), "the ranks started before the failure, and their children")


def check_release_port(args):
    # A program that opens the rendezvous port itself, as torch.distributed.init_process_group's
    # env:// store does on rank 0: it cannot while the launcher's socket (handed to rank 0) holds it
    bind = ("import os, socket; s = socket.socket(); "
            "s.bind(('127.0.0.1', int(os.environ['MASTER_PORT']))); s.listen(); "
            "print('listening', 'REMAT_MASTER_LISTEN_FD' in os.environ)")
    program = ["--", sys.executable, "-c", bind]
    held, _ = run(args, ["--nproc", "1", "--timeout", "30", *program])
    expect(held.returncode != 0 and "Address already in use" in held.stderr, "the held port cannot be bound again")
    released, _ = run(args, ["--nproc", "1", "--timeout", "30", "--release-port", *program])
    expect(released.returncode == 0 and released.stdout == "[rank 0] listening False\n",
           f"with --release-port rank 0 binds the port itself: {released.stdout!r}")


CASES = {
    "leftover-children": check_leftover_children,
    "timeout-with-children": check_timeout_with_children,
    "long-line": check_long_line,
    "binary-output": check_binary_output,
    "whole-numbers": check_whole_numbers,
    "interrupted": check_interrupted,
    "launcher-killed": check_launcher_killed,
    "spawn-failure": check_spawn_failure,
    "release-port": check_release_port,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", required=True)
    parser.add_argument("case", choices=sorted(CASES))
    args = parser.parse_args()
    CASES[args.case](args)
    print("OK")


if __name__ == "__main__":
    main()
