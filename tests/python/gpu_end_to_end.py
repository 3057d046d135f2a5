"""remat_alloc as PyTorch's CUDA allocator, end to end, in a fresh process on a real GPU.

    gpu_end_to_end.py REMAT_REPORT [--out DIR]

Installs the allocator right after `import torch`, trains a small transformer for a few
steps with every layer's allocations tagged, dumps a snapshot and renders it with
remat-report, checks that torch.cuda.empty_cache() and Tensor.record_stream() reach the
allocator, then forces two out-of-memory errors (the memory-fraction cap, and a request
larger than the device): each must raise torch.OutOfMemoryError, write an OOM report naming
the region that held the most, and leave training able to go on. Exits 77 (skipped) where
torch cannot be imported or no GPU is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

GiB = 1 << 30
MiB = 1 << 20


def skip(reason: str) -> None:
    print(f"{reason}: skipped")
    sys.exit(77)


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        print(("ok      " if ok else "FAILED  ") + what, flush=True)
        if not ok:
            self.failures.append(what)


def run_report(report: str, *args: str) -> tuple[bool, str]:
    """remat-report's exit status (True for 0) and its output, with stderr on failure."""
    done = subprocess.run([report, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        print(f"remat-report {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.returncode == 0, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", help="path to the remat-report executable")
    parser.add_argument("--out", help="keep the dumps here (default: a temporary folder)")
    args = parser.parse_args()

    try:
        import torch
    except Exception as e:  # torch installed without its CUDA dependencies, or not at all
        skip(f"torch cannot be imported ({e})")
    if not torch.cuda.is_available():
        skip("no CUDA device visible")
    import remat_alloc

    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="remat-gpu-e2e-"))
    out.mkdir(parents=True, exist_ok=True)
    checks = Checks()

    remat_alloc.install()
    checks.expect(remat_alloc.pluggable_library_path() is not None, "installed through libremat_pluggable.so")
    checks.expect(torch.cuda.get_allocator_backend() == "pluggable", "PyTorch reports a pluggable allocator")
    remat_alloc.configure(f"oom_dump_dir:{out},oom_dump_interval_ms:0")
    # cuBLAS and cuBLASLt keep a workspace per thread and stream, allocated through the
    # allocator at their first matrix product there and held for the process: made here,
    # untagged, instead of under the first layer's region.
    a = torch.randn(64, 64, device="cuda")
    torch.nn.functional.linear(a @ a, a, a[0])
    del a

    # A small transformer, each layer's allocations tagged layers.<i> through module hooks.
    torch.manual_seed(0)
    width, layers, vocab = 256, 4, 1000
    embed = torch.nn.Embedding(vocab, width).cuda()
    blocks = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True) for _ in range(layers)
    ).cuda()
    head = torch.nn.Linear(width, vocab).cuda()
    scopes = {}
    for i, block in enumerate(blocks):
        def enter(module, inputs, i=i):
            scopes[i] = remat_alloc.region(f"layers.{i}")
            scopes[i].__enter__()

        def leave(module, inputs, output, i=i):
            scopes.pop(i).__exit__(None, None, None)

        block.register_forward_pre_hook(enter)
        block.register_forward_hook(leave)
    parameters = [*embed.parameters(), *blocks.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=1e-3)
    tokens = torch.randint(0, vocab, (8, 128), device="cuda")
    targets = torch.randint(0, vocab, (8, 128), device="cuda")

    def step(snapshot: pathlib.Path | None = None) -> float:
        with remat_alloc.phase("forward"):
            h = embed(tokens)
            for block in blocks:
                h = block(h)
            loss = torch.nn.functional.cross_entropy(head(h).flatten(0, 1), targets.flatten())
        if snapshot is not None:
            kept = {i: remat_alloc.live_bytes(f"layers.{i}") for i in range(layers)}
            checks.expect(all(b > 0 for b in kept.values()), f"every layer keeps tagged activations: {kept}")
            remat_alloc.dump_snapshot(str(snapshot))
        with remat_alloc.phase("backward"):
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    losses = [step() for _ in range(4)]
    losses.append(step(out / "snapshot.json"))
    print("losses:", " ".join(f"{x:.4f}" for x in losses))
    checks.expect(losses[-1] < losses[0], "the loss goes down over five steps")
    live_after = {i: remat_alloc.live_bytes(f"layers.{i}") for i in range(layers)}
    checks.expect(all(b == 0 for b in live_after.values()), f"nothing stays live under layers.* after the step: {live_after}")

    ok, memory_table = run_report(args.report, "memory", str(out / "snapshot.json"), "--by", "region")
    checks.expect(ok and all(f"layers.{i}" in memory_table for i in range(layers)),
                  "remat-report memory lists every layer of the snapshot")
    (out / "snapshot-memory.txt").write_text(memory_table)
    ok, _ = run_report(args.report, "validate", str(out / "snapshot.json"))
    checks.expect(ok, "remat-report validate accepts the snapshot")

    # PyTorch's own memory functions answer from the tagging allocator (docs/pytorch_memory_apis.md).
    torch.cuda.reset_peak_memory_stats()
    logged = []
    for _ in range(2):  # a training loop logging its peak, as Hugging Face's Trainer does
        step()
        logged.append((torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()))
        torch.cuda.reset_peak_memory_stats()
    ours = remat_alloc.memory_stats()
    print("max_memory_allocated per step:", [f"{peak / MiB:.1f} MiB" for peak, _ in logged])
    checks.expect(all(peak > now > 0 for peak, now in logged), f"max_memory_allocated() above memory_allocated(): {logged}")
    checks.expect(torch.cuda.memory_allocated() == ours["allocated_bytes"]
                  and torch.cuda.memory_reserved() == ours["reserved_bytes"]
                  and torch.cuda.max_memory_allocated() == ours["allocated_bytes_peak"],
                  "torch.cuda's figures are remat_alloc.memory_stats()'s")
    checks.expect("Allocated memory" in torch.cuda.memory_summary(), "torch.cuda.memory_summary() renders")

    torch.cuda.memory._record_memory_history(max_entries=200_000)
    torch.cuda.memory._set_memory_metadata("history step")
    step()
    torch.cuda.memory._set_memory_metadata("")
    torch.cuda.memory._dump_snapshot(str(out / "torch-snapshot.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    import pickle
    with open(out / "torch-snapshot.pickle", "rb") as f:
        history = pickle.load(f)
    entries = history["device_traces"][0]
    allocs = [e for e in entries if e["action"] == "alloc"]
    checks.expect(len(allocs) > 100 and all(e.get("frames") for e in allocs),
                  f"_record_memory_history: {len(allocs)} alloc entries, each with its Python stack")
    checks.expect(any('"region":"layers.0"' in e.get("user_metadata", "") for e in allocs)
                  and any("history step" in e.get("user_metadata", "") for e in allocs),
                  "trace entries carry the region tags and the _set_memory_metadata label")
    ok, imported = run_report(args.report, "import", str(out / "torch-snapshot.pickle"), "-o",
                              str(out / "torch-snapshot-imported.json"))
    checks.expect(ok, f"remat-report import reads PyTorch's pickle: {imported[:200]}")

    # torch.cuda.empty_cache() reaches the allocator.
    scratch = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del scratch
    reserved = remat_alloc.memory_stats()["reserved_bytes"]
    torch.cuda.empty_cache()
    checks.expect(remat_alloc.memory_stats()["reserved_bytes"] <= reserved - 256 * MiB,
                  "torch.cuda.empty_cache() returns cached segments")

    # Tensor.record_stream(): the block stays out of the pool while the side stream runs.
    side = torch.cuda.Stream()
    t = torch.ones(3 * MiB, device="cuda")  # 12 MiB
    address = t.data_ptr()
    t.mul_(1)  # loads the kernel now: a first launch may wait for the device
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # keeps the side stream busy for about a second
        t.mul_(2)
    t.record_stream(side)
    before = remat_alloc.memory_stats()
    del t
    stats = remat_alloc.memory_stats()
    freed = before["allocated_bytes"] - stats["allocated_bytes"]
    checks.expect(freed >= 12 * MiB and stats["active_bytes"] == before["active_bytes"],
                  "record_stream: the freed block waits for the side stream")
    pending = torch.empty(3 * MiB, device="cuda")
    checks.expect(pending.data_ptr() != address, "record_stream: not handed out while the side stream runs")
    side.synchronize()
    settled = torch.empty(1, device="cuda")  # an allocation retires completed stream events
    stats = remat_alloc.memory_stats()
    checks.expect(stats["active_bytes"] == stats["allocated_bytes"],
                  "record_stream: back in the pool once the side stream is done")
    del pending, settled

    def forced_oom(label: str, request_bytes: int) -> None:
        before = set(out.glob("oom-*.json"))
        with remat_alloc.region("hold.activations"):
            big = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
        with remat_alloc.region("hold.small"):
            small = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
        raised = None
        try:
            with remat_alloc.region("oom.request"):
                torch.empty(request_bytes, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            raised = e
        except Exception as e:  # noqa: BLE001 - the wrong error type is what this checks
            print(f"{label}: raised {type(e).__name__}: {e}")
        checks.expect(raised is not None, f"{label}: torch.OutOfMemoryError raised")
        if raised is not None:
            print(f"{label}: {str(raised).splitlines()[0][:200]}")
        del big, small
        reports = sorted(set(out.glob("oom-*.json")) - before)
        checks.expect(len(reports) == 1, f"{label}: one OOM report written ({[p.name for p in reports]})")
        if reports:
            report = json.loads(reports[0].read_text())
            top = report["holders"]["by_region"][0]
            checks.expect(top["name"] == "hold.activations" and top["bytes"] == 2 * GiB,
                          f"{label}: the report names hold.activations (2 GiB) as the largest holder: {top}")
            ok, rendered = run_report(args.report, "oom", str(reports[0]))
            checks.expect(ok and "hold.activations" in rendered, f"{label}: remat-report oom names it")
            reports[0].rename(out / f"oom-{label}.json")

    observed = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: observed.append(args))
    torch.cuda.set_per_process_memory_fraction(0.05)  # about 7 GB of an H200
    forced_oom("fraction-cap", 8 * GiB)
    checks.expect(len(observed) == 1 and observed[0][0] == 0 and observed[0][1] >= 8 * GiB,
                  f"PyTorch's OOM observer called with (device, bytes, total, free): {observed}")
    torch.cuda.set_per_process_memory_fraction(1.0)
    forced_oom("device-capacity", torch.cuda.get_device_properties(0).total_memory + GiB)
    stats = remat_alloc.memory_stats()
    checks.expect(stats["num_ooms"] == 2, f"two out-of-memory errors counted ({stats['num_ooms']})")

    after = [step() for _ in range(3)]
    print("losses after the OOMs:", " ".join(f"{x:.4f}" for x in after))
    checks.expect(all(x == x and x < losses[0] for x in after), "training goes on after the OOMs")

    stats = remat_alloc.memory_stats()
    print(f"peak allocated {stats['allocated_bytes_peak'] / GiB:.2f} GiB, "
          f"peak reserved {stats['reserved_bytes_peak'] / GiB:.2f} GiB, dumps in {out}")
    if checks.failures:
        print(f"{len(checks.failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
