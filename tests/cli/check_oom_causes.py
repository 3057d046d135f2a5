"""Out-of-memory reports from the real allocator, read back by remat-report: the advice of
`remat-report oom` follows the limit each request actually ran into (the memory_fraction cap,
a full device, a request larger than the device).

usage: check_oom_causes.py REMAT_REPORT   (REMAT_ALLOC_LIBRARY and PYTHONPATH as for remat_alloc)
"""

import json
import pathlib
import subprocess
import sys
import tempfile

import remat_alloc

MiB = 1 << 20


def advice(report: str, dump: pathlib.Path) -> tuple[dict, list[dict]]:
    done = subprocess.run([report, "oom", str(dump), "--json"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"remat-report oom {dump} exited {done.returncode}: {done.stderr}")
    document = json.loads(done.stdout)
    return document["request"], document["suggestions"]


def main() -> int:
    report = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as out:
        remat_alloc.configure(f"backend:host,host_capacity_mb:64,oom_dump_dir:{out},oom_dump_interval_ms:0")
        lib = remat_alloc.load()

        def oom_on(device: int, size: int) -> pathlib.Path:
            before = set(pathlib.Path(out).glob("oom-*.json"))
            assert lib.remat_alloc(size, device, None) is None, "the request was expected to fail"
            (dump,) = set(pathlib.Path(out).glob("oom-*.json")) - before
            return dump

        remat_alloc.set_memory_fraction(0.25, device=1)  # 16 MiB of the 64 MiB device
        capped = oom_on(1, 20 * MiB)
        held = [lib.remat_alloc(30 * MiB, 2, None), lib.remat_alloc(20 * MiB, 2, None)]
        full = oom_on(2, 20 * MiB)
        too_large = oom_on(3, 100 * MiB)

        for name, dump, cause, first in (
            ("cap", capped, "memory_fraction_cap", "raise_memory_fraction"),
            ("full", full, "device_full", None),
            ("too large", too_large, "request_exceeds_device", "request_exceeds_device"),
        ):
            request, suggestions = advice(report, dump)
            kinds = [s["kind"] for s in suggestions]
            text = " ".join(s["message"] for s in suggestions)
            print(f"{name}: cause {request.get('cause')}, suggestions {kinds}")
            if request.get("cause") != cause:
                failures.append(f"{name}: cause {request.get('cause')}, expected {cause}")
            if first is not None and (not kinds or kinds[0] != first):
                failures.append(f"{name}: first suggestion {kinds[:1]}, expected {first}")
            if cause != "memory_fraction_cap" and "memory_fraction" in text:
                failures.append(f"{name}: the advice names memory_fraction, which did not apply: {text}")
            if cause == "memory_fraction_cap":
                message = suggestions[0]["message"]
                if "16777216 bytes" not in message or suggestions[0]["setting"] != "memory_fraction:0.32":
                    failures.append(f"cap: the advice must give the cap in bytes and the setting: {suggestions[0]}")
                if "fragmentation" in kinds:
                    failures.append(f"cap: max_split_size_mb suggested for a cap: {kinds}")
        for p in held:
            lib.remat_free(p, 0, 2, None)
    for failure in failures:
        print("FAILED", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
