#!/usr/bin/env python3
"""The pipeline example as a user runs it: 4 ranks under remat-launch, checkpointing inside the
stages, then remat-report on what each rank wrote. The receive slots in each rank's snapshot
must be the rings `remat-report plan` gives for the same schedule, and every dump must carry
its rank in its name and header. `remat-report ranks` over the output folder must agree with
each rank's own summary. Each rank's peak predicted beforehand (the example's --profile-stages,
then `remat-report predict`) must be within 5% of the peak its snapshot measured, and GPipe with
1 microbatch (each stage's only backward creates its gradients) must be predicted to the byte.

    check_example.py --launcher remat-launch --example remat-pipeline-train --report remat-report
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

RANKS = 4
SCHEDULE = ["--schedule", "1f1b", "--microbatches", "16"]


def run(command, timeout=240):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    print(f"$ {' '.join(map(str, command))}\n(exit {result.returncode})\n{result.stdout}{result.stderr}")
    return result


def expect(condition, message):
    if not condition:
        print(f"FAILED: {message}")
        sys.exit(1)


def check_ranks_report(report, out):
    """One report over the four ranks: each rank's peaks, OOM count and largest region are its
    own summary's, and each receive slot's max is on the rank whose snapshot holds it."""
    job = run([report, "ranks", out, "--by", "slot", "--json"])
    expect(job.returncode == 0, "remat-report ranks reads the example's output folder")
    document = json.loads(job.stdout)
    expect(document["unreadable"] == [] and document["missing_ranks"] == [], "every rank's snapshot is read")
    expect(document["skipped"] == {"remat-trace": RANKS, "trace": RANKS}, f"the traces are skipped: {document['skipped']}")
    ranks = {entry["rank"]: entry for entry in document["ranks"]}
    expect(sorted(ranks) == list(range(RANKS)), f"one entry a rank: {sorted(ranks)}")
    peaks = [entry["peak_allocated_bytes"] for entry in document["ranks"]]
    expect(peaks == sorted(peaks, reverse=True), "ranks are listed by peak, highest first")
    for rank, entry in ranks.items():
        summary = json.loads(run([report, "summary", Path(out, f"snapshot-rank{rank}.json"), "--json"]).stdout)
        expect(entry["peak_allocated_bytes"] == summary["stats"]["allocated.peak"], f"rank {rank}: peak allocated")
        expect(entry["peak_reserved_bytes"] == summary["stats"]["reserved.peak"], f"rank {rank}: peak reserved")
        expect(entry["ooms"] == summary["stats"]["ooms"], f"rank {rank}: OOMs")
        expect(entry["composition_known"], f"rank {rank}: the whole trace shows what the peak held")
        at_peak = sum(group["at_peak_bytes"] for group in entry["groups"])
        expect(at_peak == entry["peak_allocated_bytes"], f"rank {rank}: the slots at the peak add up to it")
        by_slot = json.loads(run([report, "memory", Path(out, f"snapshot-rank{rank}.json"), "--by", "slot",
                                  "--json"]).stdout)["memory"]
        expect({g["name"]: g["bytes"] for g in entry["groups"]} == {m["slot"]: m["peak_bytes"] for m in by_slot if m["peak_bytes"] > 0},
               f"rank {rank}: each slot's peak is the memory report's")
    for group in document["groups"]:
        if group["placeholder"]:
            continue
        stage = int(group["name"].split()[1])
        expect(group["max_rank"] == stage and group["ranks_with_group"] == 1,
               f"{group['name']} lives on rank {stage} only: {group}")
    median = document["median_peak_allocated_bytes"]
    ordered = sorted(peaks)
    expect(median == (ordered[1] + ordered[2]) // 2, f"the median of four ranks is the mean of the middle two: {median}")
    expect(abs(document["imbalance"] - max(peaks) / median) < 1e-9, "imbalance is max / median")


PREDICTION_BOUND = 0.05


def check_prediction(example, report, out):
    """Stage profiles made in one process before the job, each rank's peak predicted from them for
    the job's schedule and rings, set beside the peaks the job's snapshots measured."""
    profiles = Path(out, "profiles")
    made = run([example, "--profile-stages", str(RANKS), "--checkpoint", "--out", profiles])
    expect(made.returncode == 0, "the example profiles its stages in one process")
    paths = sorted(profiles.glob("stage-profile-stage*.json"))
    expect(len(paths) == RANKS, f"one stage profile a stage: {[p.name for p in paths]}")
    predicted = run([report, "predict", *paths, *SCHEDULE, "--ranks", str(RANKS), "--buffers", "pooled", "--json"])
    expect(predicted.returncode == 0, "remat-report predict reads the example's stage profiles")
    prediction = Path(out, "prediction.json")
    prediction.write_text(predicted.stdout)
    check = run([report, "ranks", out, "--predicted", prediction, "--json"])
    expect(check.returncode == 0, "remat-report ranks --predicted reads the job's dumps beside the prediction")
    document = json.loads(check.stdout)
    expect(document["kind"] == "prediction-check" and document["unpredicted_ranks"] == [],
           f"a prediction-check of every rank: {document['kind']}, unpredicted {document['unpredicted_ranks']}")
    rows = {row["rank"]: row for row in document["ranks"]}
    expect(sorted(rows) == list(range(RANKS)), f"one row a rank: {sorted(rows)}")
    for rank, row in rows.items():
        snapshot = json.loads(Path(out, f"snapshot-rank{rank}.json").read_text())
        measured = snapshot["stats"]["allocated_bytes"]["peak"]
        expect(row["measured_bytes"] == measured, f"rank {rank}: the measured peak is its snapshot's ({measured})")
        error = (row["predicted_bytes"] - measured) / measured
        expect(abs(error - row["error"]) < 1e-9, f"rank {rank}: the error is (predicted - measured) / measured")
        expect(abs(error) <= PREDICTION_BOUND,
               f"rank {rank}: predicted {row['predicted_bytes']} bytes against {measured} measured ({error:+.1%})")


def check_one_microbatch(launcher, example, report, out):
    """GPipe with 1 microbatch: each stage's only backward is the step's first, which creates the
    parameter gradients, so that backward (not the optimizer step) is every rank's peak, and the
    prediction from the profiles' first_backward_transient is the measured peak to the byte."""
    job = Path(out, "gpipe-m1")
    profiles = Path(job, "profiles")
    made = run([example, "--profile-stages", str(RANKS), "--out", profiles])
    expect(made.returncode == 0, "the example profiles its stages without checkpointing")
    paths = sorted(profiles.glob("stage-profile-stage*.json"))
    schedule = ["--schedule", "gpipe", "--microbatches", "1"]
    predicted = run([report, "predict", *paths, *schedule, "--ranks", str(RANKS), "--json"])
    expect(predicted.returncode == 0, "remat-report predict reads the profiles for GPipe at M=1")
    prediction = Path(job, "prediction.json")
    prediction.write_text(predicted.stdout)
    trained = run([launcher, "--nproc", str(RANKS), "--timeout", "200", "--", example, *schedule, "--buffers",
                   "stock", "--out", job])
    expect(trained.returncode == 0, "the example trains GPipe with 1 microbatch")
    document = json.loads(run([report, "ranks", job, "--predicted", prediction, "--json"]).stdout)
    for row in document["ranks"]:
        expect(row["measured_bytes"] == row["predicted_bytes"],
               f"GPipe M=1, rank {row['rank']}: predicted {row['predicted_bytes']} bytes at {row['action']}, "
               f"measured {row['measured_bytes']}")
        expect(row["action"] == f"{row['rank']}B0", f"GPipe M=1, rank {row['rank']}: the peak is the backward, "
               f"not {row['action']}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--example", required=True)
    parser.add_argument("--report", required=True)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as out:
        trained = run([args.launcher, "--nproc", str(RANKS), "--timeout", "200", "--", args.example, *SCHEDULE,
                       "--checkpoint", "--out", out])
        expect(trained.returncode == 0, "the example trains")
        losses = re.findall(r"\[rank 3\] step (\d+): loss ([0-9.]+)", trained.stdout)
        expect([int(step) for step, _ in losses] == [0, 1, 2], "the last rank prints the loss of every step")

        plan = run([args.report, "plan", *SCHEDULE, "--ranks", str(RANKS), "--json"])
        expect(plan.returncode == 0, "remat-report plan runs")
        planned = {(e["rank"], e["stage"], e["direction"]): e["ring_size"] for e in json.loads(plan.stdout)["entries"]
                   if e["ring_size"] is not None}

        for rank in range(RANKS):
            snapshot = Path(out, f"snapshot-rank{rank}.json")
            expect(json.loads(snapshot.read_text())["rank"] == rank, f"{snapshot.name} carries rank {rank}")
            trace_header = json.loads(Path(out, f"trace-rank{rank}.jsonl").read_text().splitlines()[0])
            expect(trace_header["rank"] == rank, f"trace-rank{rank}.jsonl carries rank {rank}")
            remat_trace = Path(out, f"remat-trace-rank{rank}.json")
            expect(json.loads(remat_trace.read_text())["rank"] == rank, f"{remat_trace.name} carries rank {rank}")
            regions = run([args.report, "summary", remat_trace])
            expect(f"stages.{rank}" in regions.stdout, f"the remat trace of rank {rank} shows its stage's regions")

            by_slot = run([args.report, "memory", snapshot, "--by", "slot"])
            expect(by_slot.returncode == 0, "remat-report memory --by slot runs")
            slots = Counter(re.findall(r"^stage (\d+) ([FB]) slot \d+ ", by_slot.stdout, re.MULTILINE))
            mine = {(stage, direction): size for (r, stage, direction), size in planned.items() if r == rank}
            expect({(int(s), d): n for (s, d), n in slots.items()} == mine,
                   f"rank {rank}: receive slots in the snapshot {dict(slots)} are the planned rings {mine}")

        check_ranks_report(args.report, out)
        check_prediction(args.example, args.report, out)
        check_one_microbatch(args.launcher, args.example, args.report, out)
    print("OK")


if __name__ == "__main__":
    main()
