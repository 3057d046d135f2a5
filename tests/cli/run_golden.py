#!/usr/bin/env python3
"""Golden tests for remat-report: runs every case in golden_cases.txt from tests/cli/ and
compares stdout, stderr and the exit code with golden/<name>.txt. A case with a fourth field
`mask-header` prints a dump made now (whatif --json, advise --json): its created_at, host and pid
are masked.

usage: run_golden.py REMAT_REPORT [--update]
"""
import pathlib
import re
import shlex
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def render(code, stdout, stderr):
    text = f"exit {code}\n--- stdout\n{stdout}"
    if stderr:
        text += f"--- stderr\n{stderr}"
    return text


def main():
    binary = sys.argv[1]
    update = "--update" in sys.argv[2:]
    failures = []
    cases = 0
    for line in (HERE / "golden_cases.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split("|")]
        name, args, expected_code = parts[:3]
        mask_header = parts[3:] == ["mask-header"]
        cases += 1
        run = subprocess.run([binary, *shlex.split(args)], cwd=HERE, capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"})
        stdout = run.stdout
        if mask_header:
            stdout = re.sub(r'^(  "(?:created_at|host)": )"[^"]*"', r'\1"<masked>"', stdout, flags=re.M)
            stdout = re.sub(r'^(  "pid": )\d+', r'\1"<masked>"', stdout, flags=re.M)
            # Compact dumps (advise --json) on one line.
            stdout = re.sub(r'("(?:created_at|host)":)"[^"]*"', r'\1"<masked>"', stdout)
            stdout = re.sub(r'("pid":)\d+', r'\1"<masked>"', stdout)
        actual = render(run.returncode, stdout, run.stderr)
        golden = HERE / "golden" / f"{name}.txt"
        if run.returncode != int(expected_code):
            failures.append(f"{name}: exit {run.returncode}, expected {expected_code}\n{run.stderr}")
            continue
        if update:
            golden.write_text(actual)
            continue
        if not golden.exists():
            failures.append(f"{name}: no golden file {golden} (run with --update)")
        elif golden.read_text() != actual:
            import difflib
            diff = "".join(difflib.unified_diff(golden.read_text().splitlines(True), actual.splitlines(True),
                                                f"golden/{name}.txt", "actual"))
            failures.append(f"{name}: output differs\n{diff}")
    for failure in failures:
        print("FAIL", failure)
    print(f"{cases - len(failures)}/{cases} golden cases pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
