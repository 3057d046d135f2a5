#!/usr/bin/env python3
"""Multi-process checks of the pipeline runtime: real ranks over Gloo on 127.0.0.1, started by
remat-launch with a free port, every run bounded by a timeout and every child reaped.

    check_runtime.py --launcher remat-launch --worker pipeline_check CASE [worker options]

CASE: parity, pass-through, undersized, unguarded, kill, stall, world-size, wrong-stages,
wrong-output-shape, mismatched-settings, port-in-use, bad-environment, store-on-loopback, refused-shape.
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import time

RUN_TIMEOUT_S = 240


def launch(args, nproc, worker_args, extra=(), timeout=RUN_TIMEOUT_S):
    command = [args.launcher, "--nproc", str(nproc), "--timeout", str(timeout - 20), *extra, "--",
               args.worker, *worker_args]
    started = time.monotonic()
    # remat-launch reaps its ranks itself; the outer timeout only guards against the launcher.
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    print(f"$ {' '.join(command)}\n(exit {result.returncode} after {elapsed:.1f} s)\n{output}")
    return result.returncode, output, elapsed


def expect(condition, message):
    if not condition:
        print(f"FAILED: {message}")
        sys.exit(1)


def rank_lines(output, rank, word):
    return [line for line in output.splitlines() if line.startswith(f"[rank {rank}] rank {rank}: {word}")]


def check_parity(args, worker_args):
    code, output, _ = launch(args, args.nproc, ["--check", "parity", *worker_args])
    expect(code == 0, "every rank passes")
    for rank in range(args.nproc):
        expect(rank_lines(output, rank, "PASS"), f"rank {rank} reports PASS")
        expect(rank_lines(output, rank, "parity: ") and "DIFFER" not in "".join(rank_lines(output, rank, "parity")),
               f"rank {rank}: stock and pooled runs are bitwise equal")
        for line in rank_lines(output, rank, "sets: "):
            tagged, planned = map(int, re.search(r"tagged (\d+), planned (\d+)", line).groups())
            expect(tagged == planned, f"rank {rank}: tagged sets equal the plan: {line}")


def check_pass_through(args, worker_args):
    code, output, _ = launch(args, args.nproc, ["--check", "pass-through", "--pass-through-stages", *worker_args])
    expect(code == 0, "every rank trains with stages that return views of their receive buffers")
    for rank in range(args.nproc):
        expect(rank_lines(output, rank, "pass-through: pooled bitwise equal to stock"),
               f"rank {rank}: pooled and stock runs are bitwise equal")


def check_undersized(args, worker_args):
    code, output, _ = launch(args, args.nproc, ["--check", "undersized", *worker_args])
    expect(code == 0, "ranks report and exit cleanly")
    errors = re.findall(r"ownership error: (.*)", output)
    expect(errors, "at least one rank raises the ownership error")
    for message in errors:
        expect(re.search(r"stage \d+ [FB] receive slot \d+ \(of \d+\) is needed by microbatch \d+ while microbatch \d+ "
                         r"still holds it", message), f"the error names stage, direction, slot and both microbatches: {message}")
    expect("completed without an ownership error" not in output or errors, "the clash is caught")


def check_unguarded(args, worker_args):
    code, output, _ = launch(args, args.nproc, ["--check", "unguarded", *worker_args])
    expect(code == 0, "the unguarded run completes")
    expect("differs from stock" in output, "with the guard off, an undersized ring changes the results")


def check_kill(args, worker_args):
    die_rank = 2
    code, output, elapsed = launch(args, args.nproc,
                                   ["--check", "kill", "--die-rank", str(die_rank), "--timeout", "20", *worker_args],
                                   extra=["--grace", "90"], timeout=150)
    expect(code != 0, "the job fails")
    expect(f"remat-launch: rank {die_rank} was killed by signal 9" in output, "the killed rank is reported")
    for rank in range(args.nproc):
        if rank == die_rank:
            continue
        expect(rank_lines(output, rank, "failed: "), f"rank {rank} fails on its own, with an error")
        expect(f"remat-launch: rank {rank} exited with status 1" in output, f"rank {rank} exits with status 1")
    expect("did not exit within --grace" not in output, "no rank had to be stopped by the launcher")
    expect(elapsed < 60, f"the others fail within the transfer timeout (took {elapsed:.1f} s)")


def check_stall(args, worker_args):
    stalled_rank = 1
    code, output, elapsed = launch(args, args.nproc,
                                   ["--check", "kill", "--die-rank", str(stalled_rank), "--die-signal", "STOP",
                                    "--timeout", "10", *worker_args], extra=["--grace", "5"], timeout=150)
    expect(code != 0, "the job fails")
    for rank in range(args.nproc):
        if rank != stalled_rank:
            expect(rank_lines(output, rank, "failed: "), f"rank {rank} fails on its own when its transfers time out")
    expect(f"remat-launch: rank {stalled_rank} was killed by signal 9" in output,
           "the launcher stops the stalled rank after the grace period")
    expect(elapsed < 60, f"the job ends within the transfer timeout plus the grace period (took {elapsed:.1f} s)")


def check_world_size(args, worker_args):
    code, output, _ = launch(args, 2, ["--check", "fit", "--schedule-ranks", "4", *worker_args])
    expect(code == 1, "the job fails")
    expect("the schedule has 4 ranks but the job has WORLD_SIZE=2" in output, "the error names both counts")


def check_wrong_output_shape(args, worker_args):
    code, output, _ = launch(args, args.nproc, ["--check", "fit", "--wrong-output-shape", *worker_args])
    expect(code == 1, "the job fails")
    expect(re.search(r"rank 0: failed: rank 0, position \d+ \(0SEND_F0\): stage 0 has a forward output of shape "
                     r"\[\d+, (\d+)\] and type Float but the receive buffers hold \[\d+, (\d+)\] Float; set "
                     r"RuntimeOptions::activation_shape", output),
           "rank 0 names the action, the stage and both shapes")


def check_wrong_stages(args, worker_args):
    code, output, _ = launch(args, args.nproc, ["--check", "fit", "--wrong-stages", *worker_args])
    expect(code == 1, "the job fails")
    # Every rank refuses its stages; whichever fails first may end the others' rendezvous.
    expect(re.search(r"rank (\d+) runs stages \{(\d+)\} of this schedule \(\d+ stages over \d+ ranks\) but was given "
                     r"stages \{\d+\}", output), "the error names the stages expected and given")


def check_mismatched_settings(args, worker_args):
    # One rank started with another width, microbatch count or schedule than the rest: every rank
    # fails at once naming that rank and the setting, long before the 60 s transfer timeout; no rank
    # is killed by a signal (Gloo aborts a process that receives a larger message than it expects).
    mismatched_rank = 1
    expected = {
        "width": "activation shape (RuntimeOptions::activation_shape): rank 1 has [4, 16], ranks 0, 2, 3 have [4, 32]",
        "microbatches": "microbatches: rank 1 has 5, ranks 0, 2, 3 have 4",
        "schedule": "schedule (RuntimeOptions::schedule_name): rank 1 has gpipe, ranks 0, 2, 3 have 1f1b",
    }
    for setting, sentence in expected.items():
        code, output, elapsed = launch(args, args.nproc,
                                       ["--check", "fit", "--timeout", "60", "--mismatch-rank", str(mismatched_rank),
                                        "--mismatch", setting, *worker_args], extra=["--grace", "30"], timeout=150)
        expect(code == 1, f"{setting}: the job fails")
        expect("signal" not in output and "terminate called" not in output, f"{setting}: no rank is killed by a signal")
        for rank in range(args.nproc):
            lines = rank_lines(output, rank, "failed: ")
            expect(lines and f"rank {rank}: the ranks do not run the same pipeline: {sentence}" in lines[0],
                   f"{setting}: rank {rank} names the rank and the setting that differ")
            expect(f"remat-launch: rank {rank} exited with status 1" in output, f"{setting}: rank {rank} exits with 1")
        expect("did not exit within --grace" not in output, f"{setting}: no rank had to be stopped by the launcher")
        expect(elapsed < 30, f"{setting}: the ranks fail at start, not after the transfer timeout (took {elapsed:.1f} s)")


def check_port_in_use(args, worker_args):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, output, _ = launch(args, 2, ["--check", "fit", *worker_args], extra=["--master-port", str(port)], timeout=60)
        expect(code == 2, "remat-launch refuses a port in use")
        expect(f"port {port} on 127.0.0.1 is in use" in output, "the message names the port")
        # A rank started by another launcher with that port: the store cannot be served.
        env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PATH": "/usr/bin"}
        result = subprocess.run([args.worker, "--check", "fit", "--timeout", "5", *worker_args], env=env,
                                capture_output=True, text=True, timeout=60)
        print(result.stdout + result.stderr)
        expect(result.returncode == 1, "the rank fails")
        expect(f"could not serve the rendezvous store on 127.0.0.1:{port}" in result.stdout, "the error names the address")


def run_rank(args, environment, worker_args, timeout=60):
    env = {"PATH": "/usr/bin:/bin", **environment}
    started = time.monotonic()
    result = subprocess.run([args.worker, "--check", "fit", *worker_args], env=env, capture_output=True, text=True,
                            timeout=timeout)
    elapsed = time.monotonic() - started
    print(f"{environment} (exit {result.returncode} after {elapsed:.1f} s)\n{result.stdout}")
    return result, elapsed


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_bad_environment(args, worker_args):
    # Ranks started by hand with the launcher's variables wrong: each fails at once, naming the variable.
    port = str(free_port())
    cases = [
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
         "RANK='2' is not a whole number in 0..1"),
        ({"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
         "WORLD_SIZE='0' is not a whole number"),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"},
         "MASTER_PORT='70000' is not a whole number in 1..65535"),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT is not set"),
        ({"WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}, "RANK is not set"),
        # Once a timeout in connection retries and a message about timing out.
        ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "no.such.host.invalid", "MASTER_PORT": port},
         "MASTER_ADDR='no.such.host.invalid' does not resolve"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "no.such.host.invalid", "MASTER_PORT": port},
         "MASTER_ADDR='no.such.host.invalid' does not resolve"),
    ]
    for environment, message in cases:
        result, elapsed = run_rank(args, environment, ["--timeout", "30", *worker_args])
        expect(result.returncode == 1, f"{environment}: the rank fails")
        expect(message in result.stdout, f"{environment}: the error says {message!r}")
        expect(elapsed < 20, f"{environment}: it fails at once, not after the 30 s timeout (took {elapsed:.1f} s)")


def listening_addresses(port):
    """Local addresses of the sockets listening on `port`, from /proc/net/tcp and tcp6."""
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                addresses.append(address)
    return addresses


def check_store_on_loopback(args, worker_args):
    if not os.path.exists("/proc/net/tcp"):
        print("skipped: reads the listening sockets from Linux's /proc/net/tcp")
        return
    # Rank 0 started by hand, as torchrun-less jobs do: with MASTER_ADDR=127.0.0.1 its store must
    # not listen on every interface (it accepts any client that reaches it).
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    rank = subprocess.Popen([args.worker, "--check", "fit", "--timeout", "10", *worker_args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        addresses = []
        while not addresses and time.monotonic() < deadline and rank.poll() is None:
            time.sleep(0.05)
            addresses = listening_addresses(port)
    finally:
        rank.kill()
        rank.communicate(timeout=60)
    print(f"listening on port {port}: {addresses}")
    expect(addresses, "rank 0 serves the store")
    expect(all(address == "0100007F" for address in addresses), f"only on 127.0.0.1 (got {addresses})")


def check_refused_shape(args, worker_args):
    # Every rank refuses the schedule alike; none is left waiting for the others and blames WORLD_SIZE.
    code, output, _ = launch(args, args.nproc, ["--check", "fit", *worker_args])
    expect(code == 1, "the job fails")
    for rank in range(args.nproc):
        expect(rank_lines(output, rank, "failed: 1F1B needs at least as many microbatches as stages"),
               f"rank {rank} names the shape 1F1B refuses")
    expect("could not join" not in output, "no rank fails in the rendezvous instead")


CASES = {
    "parity": check_parity,
    "pass-through": check_pass_through,
    "undersized": check_undersized,
    "unguarded": check_unguarded,
    "kill": check_kill,
    "stall": check_stall,
    "world-size": check_world_size,
    "wrong-stages": check_wrong_stages,
    "wrong-output-shape": check_wrong_output_shape,
    "mismatched-settings": check_mismatched_settings,
    "port-in-use": check_port_in_use,
    "bad-environment": check_bad_environment,
    "store-on-loopback": check_store_on_loopback,
    "refused-shape": check_refused_shape,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("case", choices=sorted(CASES))
    args, worker_args = parser.parse_known_args()
    CASES[args.case](args, worker_args)
    print("OK")


if __name__ == "__main__":
    main()
