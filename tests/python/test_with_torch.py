"""remat_alloc where the real PyTorch imports: PyTorch accepts the allocator, the tag scopes,
statistics and dumps work in a process that imported torch, and PyTorch's own memory viewer
reads remat-report's export. On a machine without a GPU a CUDA allocation then fails with
PyTorch's own no-driver error. Each case runs in a fresh process (an allocator is installed
once per process). Skipped, with the reason, where torch cannot be imported.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

try:
    import torch
except Exception as error:  # noqa: BLE001 - any failure to import means: no usable torch here
    torch = None
    TORCH_MISSING = f"torch cannot be imported here ({type(error).__name__}: {error})"
else:
    TORCH_MISSING = ""

try:
    import remat_alloc
    HOOKS_LIBRARY = remat_alloc.pluggable_library_path()
except Exception:  # noqa: BLE001 - the allocator's own tests say why it does not load
    HOOKS_LIBRARY = None
# PyTorch's memory calls reach the allocator through libremat_pluggable.so, which is built only where
# CMake finds LibTorch's CUDA libraries and the CUDA toolkit (REMAT_HAVE_TORCH_CUDA).
HOOKS_MISSING = ("libremat_pluggable.so is not built here (it needs the CUDA toolkit and torch's CUDA libraries "
                 "at configure time); install() then falls back to PyTorch's plain CUDAPluggableAllocator")


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})})


def remat_report() -> str | None:
    return os.environ.get("REMAT_REPORT") or shutil.which("remat-report")


@unittest.skipIf(torch is None, TORCH_MISSING)
class WithRealTorch(unittest.TestCase):
    @unittest.skipIf(HOOKS_LIBRARY is None, HOOKS_MISSING)
    def test_pytorch_accepts_the_allocator_and_reports_its_own_error_without_a_gpu(self):
        if torch.cuda.is_available():
            self.skipTest("a GPU is visible: gpu_end_to_end.py covers allocations on it")
        done = run_python("""
            import warnings
            import torch
            import remat_alloc
            warnings.simplefilter("error", RuntimeWarning)  # the hooks library must be found: no fallback
            print("installed before", remat_alloc.is_installed())
            remat_alloc.install()
            print("backend", torch.cuda.get_allocator_backend(), "installed", remat_alloc.is_installed())
            try:
                torch.empty(16, device="cuda")
            except RuntimeError as e:
                print("cuda error:", str(e).splitlines()[0])
            else:
                raise SystemExit("a CUDA tensor was created on a machine without a GPU")
        """)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("installed before False", done.stdout)
        self.assertIn("backend pluggable installed True", done.stdout)
        self.assertIn("cuda error: Found no NVIDIA driver on your system", done.stdout)

    def test_without_the_hooks_library_install_falls_back_and_warns(self):
        import remat_alloc

        with tempfile.TemporaryDirectory() as alone:
            library = pathlib.Path(alone) / "libremat_alloc.so"
            shutil.copy(remat_alloc.library_path(), library)
            done = run_python("""
                import torch
                import remat_alloc
                remat_alloc.install()
                print("backend", torch.cuda.get_allocator_backend(), "installed", remat_alloc.is_installed())
            """, env={"REMAT_ALLOC_LIBRARY": str(library)})
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("backend pluggable installed True", done.stdout)
        self.assertIn("libremat_pluggable.so was not found", done.stderr)
        self.assertIn("RuntimeWarning", done.stderr)

    def test_a_hooks_library_that_cannot_load_is_a_clear_error(self):
        done = run_python("""
            import torch
            import remat_alloc
            try:
                remat_alloc.install()
            except remat_alloc.RematError as e:
                print("refused:", e)
        """, env={"REMAT_PLUGGABLE_LIBRARY": "/nonexistent/libremat_pluggable.so"})
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("refused: cannot load /nonexistent/libremat_pluggable.so", done.stdout)

    def test_tags_statistics_and_dumps_work_with_torch_imported(self):
        with tempfile.TemporaryDirectory() as out:
            done = run_python(f"""
                import json
                import torch
                import remat_alloc
                remat_alloc.configure("backend:host,host_capacity_mb:64")
                lib = remat_alloc.load()
                with remat_alloc.region("layers.0"), remat_alloc.phase("forward"), remat_alloc.site("attn"):
                    p = lib.remat_alloc(3 << 20, 0, None)
                with remat_alloc.recv_slot(stage=1, direction="F", slot=0):
                    q = lib.remat_alloc(1 << 20, 0, None)
                assert remat_alloc.live_bytes("layers.0") == 3 << 20, remat_alloc.live_bytes("layers.0")
                stats = remat_alloc.memory_stats()
                assert stats["allocated_bytes"] == 4 << 20, stats
                remat_alloc.dump_snapshot({out!r} + "/snap.json")
                remat_alloc.dump_trace({out!r} + "/trace.jsonl")
                lib.remat_free(p, 3 << 20, 0, None)
                lib.remat_free(q, 1 << 20, 0, None)
                print("peak", remat_alloc.memory_stats()["allocated_bytes_peak"])
            """)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn(f"peak {4 << 20}", done.stdout)
            snapshot = json.loads((pathlib.Path(out) / "snap.json").read_text())
            self.assertEqual(snapshot["kind"], "snapshot")
            self.assertIn("layers.0", snapshot["names"])
            first = json.loads((pathlib.Path(out) / "trace.jsonl").read_text().splitlines()[0])
            self.assertEqual(first["kind"], "trace")

    def test_pytorchs_memory_viewer_reads_the_export(self):
        report = remat_report()
        if report is None:
            self.skipTest("remat-report is neither on PATH nor named by REMAT_REPORT")
        with tempfile.TemporaryDirectory() as out:
            done = run_python(f"""
                import torch
                import remat_alloc
                remat_alloc.configure("backend:host,host_capacity_mb:64")
                lib = remat_alloc.load()
                with remat_alloc.region("layers.3"):
                    p = lib.remat_alloc(5 << 20, 0, None)
                remat_alloc.dump_snapshot({out!r} + "/snap.json")
            """)
            self.assertEqual(done.returncode, 0, done.stderr)
            pickle_path = os.path.join(out, "snap.pickle")
            exported = subprocess.run([report, "export", os.path.join(out, "snap.json"), "--to", "torch-snapshot",
                                       "-o", pickle_path], capture_output=True, text=True, timeout=60)
            self.assertEqual(exported.returncode, 0, exported.stderr)
            viewed = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", pickle_path],
                                    capture_output=True, text=True, timeout=120)
            self.assertEqual(viewed.returncode, 0, viewed.stderr)
            self.assertIn("total_allocated: 5.0MiB", viewed.stdout)

    @unittest.skipIf(HOOKS_LIBRARY is None, HOOKS_MISSING)
    def test_pytorchs_memory_calls_answer_from_the_allocator_under_install(self):
        if torch.cuda.is_available():
            self.skipTest("a GPU is visible: gpu_end_to_end.py covers these calls there")
        done = run_python("""
            import torch
            import remat_alloc
            remat_alloc.configure("backend:host,host_capacity_mb:64")
            remat_alloc.install()
            lib = remat_alloc.load()
            small = lib.remat_alloc(1000, 0, None)
            large = lib.remat_alloc(3 << 20, 0, None)
            lib.remat_free(small, 1000, 0, None)
            theirs = torch._C._cuda_memoryStats(0)
            ours = remat_alloc.memory_stats()
            assert theirs["allocated_bytes"]["all"]["current"] == ours["allocated_bytes"] == 3 << 20, (theirs, ours)
            assert theirs["allocated_bytes"]["all"]["peak"] == ours["allocated_bytes_peak"] == (3 << 20) + 1024
            assert theirs["allocated_bytes"]["small_pool"]["freed"] == 1024, theirs["allocated_bytes"]
            assert theirs["allocated_bytes"]["large_pool"]["current"] == 3 << 20
            assert theirs["reserved_bytes"]["all"]["current"] == ours["reserved_bytes"], (theirs, ours)
            assert theirs["requested_bytes"]["all"]["peak"] == ours["requested_bytes_peak"]
            assert theirs["num_ooms"] == 0 and theirs["num_device_alloc"] == 2, theirs
            torch._C._cuda_resetPeakMemoryStats(0)
            assert torch._C._cuda_memoryStats(0)["allocated_bytes"]["all"]["peak"] == 3 << 20
            assert remat_alloc.memory_stats()["allocated_bytes_peak"] == 3 << 20
            torch._C._cuda_resetAccumulatedMemoryStats(0)
            assert torch._C._cuda_memoryStats(0)["allocation"]["all"]["allocated"] == 0
            assert torch._C._cuda_getMemoryFraction(0) == 1.0
            torch.cuda.set_per_process_memory_fraction  # reached through the pluggable hook, not tested here
            lib.remat_free(large, 3 << 20, 0, None)
            print("ok")
        """)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("ok", done.stdout)

    @unittest.skipIf(HOOKS_LIBRARY is None, HOOKS_MISSING)
    def test_pytorchs_snapshot_holds_the_tags_and_its_memory_viewer_and_import_read_it(self):
        if torch.cuda.is_available():
            self.skipTest("a GPU is visible: gpu_end_to_end.py covers these calls there")
        with tempfile.TemporaryDirectory() as out:
            done = run_python(f"""
                import json
                import pickle
                import torch
                from torch.cuda import _memory_viz
                import remat_alloc
                remat_alloc.configure("backend:host,host_capacity_mb:64")
                remat_alloc.install()
                lib = remat_alloc.load()
                with remat_alloc.region("layers.0"), remat_alloc.phase("forward"):
                    kept = lib.remat_alloc(3 << 20, 0, None)
                torch.cuda.memory._set_memory_metadata("step 3")
                assert torch.cuda.memory._get_memory_metadata() == "step 3"
                labelled = lib.remat_alloc(4096, 0, None)
                torch.cuda.memory._set_memory_metadata("")
                snapshot = torch.cuda.memory._snapshot()
                allocs = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
                print("metadata", json.dumps([e["user_metadata"] for e in allocs]))
                blocks = [b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
                print("blocks", sorted(b["size"] for b in blocks))
                with open({out!r} + "/torch.pickle", "wb") as f:
                    pickle.dump(snapshot, f)
                # The flame graphs' folded lines (rendering them fetches flamegraph.pl from the network).
                folded = _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
                assert f"active_allocated;<non-python> {{3 << 20}}" in folded, folded
                assert "active_allocated;<non-python> 4096" in _memory_viz.memory(snapshot, lambda lines: lines)
                assert "<html" in _memory_viz.trace_plot(snapshot).lower()
                remat_alloc.dump_snapshot({out!r} + "/ours.json")
            """)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn('metadata ["{\\"region\\":\\"layers.0\\",\\"phase\\":\\"forward\\"}", "step 3"]',
                          done.stdout)
            self.assertIn(f"blocks [4096, {3 << 20}]", done.stdout)
            viewed = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats",
                                     os.path.join(out, "torch.pickle")], capture_output=True, text=True, timeout=120)
            self.assertEqual(viewed.returncode, 0, viewed.stderr)
            self.assertIn("total_allocated: 3.0MiB", viewed.stdout)
            report = remat_report()
            if report is None:
                self.skipTest("remat-report is neither on PATH nor named by REMAT_REPORT")
            imported = os.path.join(out, "imported.json")
            done = subprocess.run([report, "import", os.path.join(out, "torch.pickle"), "-o", imported],
                                  capture_output=True, text=True, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            for by, expected in (("region", "layers.0"), ("label", "step 3")):
                table = subprocess.run([report, "memory", imported, "--by", by], capture_output=True, text=True,
                                       timeout=60)
                self.assertEqual(table.returncode, 0, table.stderr)
                self.assertIn(expected, table.stdout)
            ours = json.loads(pathlib.Path(out, "ours.json").read_text())
            theirs = json.loads(pathlib.Path(imported).read_text())
            blocks = lambda dump: sorted((b["address"], b["size"], b["state"])  # noqa: E731
                                         for s in dump["segments"] for b in s["blocks"])
            self.assertEqual(blocks(theirs), blocks(ours))


if __name__ == "__main__":
    unittest.main()
