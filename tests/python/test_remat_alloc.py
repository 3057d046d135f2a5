"""The ctypes layer against the host backend, exactly as a PyTorch user calls it."""

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

import remat_alloc

MiB = 1 << 20


class RematAllocCtypes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        remat_alloc.configure("backend:host,host_capacity_mb:64,trace_entries:128")
        cls.lib = remat_alloc.load()

    def alloc(self, size, device=0, stream=0):
        return self.lib.remat_alloc(size, device, stream)

    def free(self, ptr, size, device=0, stream=0):
        self.lib.remat_free(ptr, size, device, stream)

    def test_regions_tag_allocations_and_live_bytes_follow_them(self):
        with remat_alloc.region("layers.0"):
            with remat_alloc.region("attention"):
                p = self.alloc(3000, device=1)
            q = self.alloc(1000, device=1)
        self.assertEqual(remat_alloc.live_bytes("layers.0", device=1), 4000)
        self.assertEqual(remat_alloc.live_bytes("layers.0::attention", device=1), 3000)
        self.free(p, 3000, device=1)
        self.free(q, 1000, device=1)
        self.assertEqual(remat_alloc.live_bytes("layers.0", device=1), 0)

    def test_snapshot_carries_every_tag_kind(self):
        with remat_alloc.region("stage1"), remat_alloc.phase("forward"), remat_alloc.policy("save"), \
                remat_alloc.recv_slot(1, "F", 0), remat_alloc.site("recv_buffer"):
            p = self.alloc(4096, device=2)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.json")
            remat_alloc.dump_snapshot(path, device=2)
            with open(path) as f:
                doc = json.load(f)
        block = doc["segments"][0]["blocks"][0]
        tag = doc["tags"][block["tag"]]
        self.assertEqual(doc["names"][tag["region"]], "stage1")
        self.assertEqual(doc["names"][tag["site"]], "recv_buffer")
        self.assertEqual(tag["phase"], "forward")
        self.assertEqual(tag["policy"], "save")
        self.assertEqual(tag["recv"], {"stage": 1, "direction": "F", "slot": 0})
        self.assertEqual(block["requested_size"], 4096)
        self.free(p, 4096, device=2)

    def test_memory_stats_report_real_figures(self):
        p = self.alloc(5 * MiB, device=3)
        stats = remat_alloc.memory_stats(3)
        self.assertEqual(stats["allocated_bytes"], 5 * MiB)
        self.assertEqual(stats["reserved_bytes"], 20 * MiB)
        self.assertEqual(stats["num_allocs"], 1)
        self.free(p, 5 * MiB, device=3)
        remat_alloc.empty_cache()
        self.assertEqual(remat_alloc.memory_stats(3)["reserved_bytes"], 0)

    def test_out_of_memory_returns_null_and_is_counted(self):
        self.assertIsNone(self.alloc(100 * MiB, device=4))
        self.assertIn("out of memory", self.lib.remat_last_error().decode())
        self.assertEqual(remat_alloc.memory_stats(4)["num_ooms"], 1)

    def test_alloc_status_tells_out_of_memory_apart(self):
        out = ctypes.c_void_p(1)
        status = self.lib.remat_alloc_status(100 * MiB, 6, None, ctypes.byref(out))
        self.assertEqual(status, 3)  # REMAT_ERR_OUT_OF_MEMORY
        self.assertIsNone(out.value)
        self.assertEqual(self.lib.remat_alloc_status(4096, 6, None, ctypes.byref(out)), 0)
        self.assertIsNotNone(out.value)
        self.free(out.value, 4096, device=6)
        self.assertEqual(self.lib.remat_alloc_status(0, 6, None, ctypes.byref(out)), 0)
        self.assertIsNone(out.value)
        self.assertEqual(self.lib.remat_alloc_status(512, 6, None, None), 1)  # REMAT_ERR_INVALID_ARGUMENT
        self.assertIn("output is NULL", self.lib.remat_last_error().decode())

    def test_memory_fraction_caps_reserved_bytes(self):
        remat_alloc.set_memory_fraction(0.25, device=7)  # 16 MiB of the 64 MiB capacity
        self.assertIsNone(self.alloc(20 * MiB, device=7))
        remat_alloc.set_memory_fraction(1.0, device=7)
        p = self.alloc(20 * MiB, device=7)
        self.assertIsNotNone(p)
        self.free(p, 20 * MiB, device=7)
        for bad in (0.0, -1.0, 1.5):
            with self.assertRaisesRegex(remat_alloc.RematError, r"outside \(0, 1\]"):
                remat_alloc.set_memory_fraction(bad, device=7)

    def test_a_malformed_environment_is_reported_and_configure_recovers(self):
        script = textwrap.dedent('''
            import remat_alloc
            lib = remat_alloc.load()
            assert lib.remat_alloc(4096, 0, None) is None
            error = lib.remat_last_error().decode()
            assert "REMAT_ALLOC_CONF" in error and "'bogus'" in error, error
            remat_alloc.configure("backend:host,host_capacity_mb:64")
            p = lib.remat_alloc(4096, 0, None)
            assert p is not None, lib.remat_last_error()
            lib.remat_free(p, 4096, 0, None)
            print("recovered")
        ''')
        env = dict(os.environ, REMAT_ALLOC_CONF="backend:host,bogus:1")
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("recovered", done.stdout)
        self.assertIn("applies over the defaults", done.stderr)

    def test_huge_values_are_quoted_in_part(self):
        for text in ("oom_dump_dir:/" + "d" * (1 << 20), "backend:" + "x" * (1 << 20)):
            with self.assertRaises(remat_alloc.RematError) as caught:
                remat_alloc.configure(text)
            self.assertLess(len(str(caught.exception)), 400)
            self.assertIn("bytes)", str(caught.exception))

    def test_errors_raise_with_the_library_message(self):
        with self.assertRaisesRegex(remat_alloc.RematError, "unknown key 'nonsense'"):
            remat_alloc.configure("nonsense:1")
        with self.assertRaisesRegex(remat_alloc.RematError, "empty tag stack"):
            with remat_alloc.region("x"):
                self.lib.remat_pop_region()
        with self.assertRaisesRegex(remat_alloc.RematError, "'F'"):
            remat_alloc.recv_slot(0, "Z", 0)
        with self.assertRaisesRegex(remat_alloc.RematError, "cannot write"):
            remat_alloc.dump_snapshot("/nonexistent-dir/snap.json")

    def test_bad_free_is_refused_without_crashing(self):
        p = self.alloc(512, device=5)
        self.free(p, 512, device=5)
        self.free(p, 512, device=5)
        self.assertIn("double free", self.lib.remat_last_error().decode())
        self.assertEqual(remat_alloc.memory_stats(5)["num_invalid_frees"], 1)

    def test_trace_dump_is_json_lines(self):
        p = self.alloc(512)
        self.free(p, 512)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.jsonl")
            remat_alloc.dump_trace(path)
            with open(path) as f:
                lines = [json.loads(line) for line in f]
        self.assertEqual(lines[0]["kind"], "trace")
        self.assertEqual(lines[0]["event_count"], len(lines) - 1)
        self.assertIn("free_completed", [e["action"] for e in lines[1:]])

    def test_memory_is_writable_through_ctypes(self):
        p = self.alloc(1024)
        ctypes.memset(p, 0x5A, 1024)
        self.assertEqual(ctypes.string_at(p + 1000, 4), b"\x5a" * 4)
        self.free(p, 1024)


if __name__ == "__main__":
    unittest.main()
