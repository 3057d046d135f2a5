"""The ctypes layer against the host backend, exactly as a PyTorch user calls it."""

import ctypes
import json
import os
import subprocess
import sys
import pathlib
import re
import tempfile
import textwrap
import threading
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

    @staticmethod
    def snapshot(device):
        """The device's snapshot as dump_snapshot writes it, read back."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snap.json")
            remat_alloc.dump_snapshot(path, device=device)
            with open(path) as f:
                return json.load(f)

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

    def test_peak_windows_nest_and_leave_the_peak_statistics_alone(self):
        remat_alloc.reset_peak_stats(3)
        outer = remat_alloc.PeakWindow(3)
        p = self.alloc(4 * MiB, device=3)
        self.free(p, 4 * MiB, device=3)
        with remat_alloc.PeakWindow(3) as inner:
            q = self.alloc(MiB, device=3)
            self.free(q, MiB, device=3)
            self.assertEqual(inner.take(), MiB)
            self.assertEqual(inner.take(), 0)
        self.assertEqual(outer.take(), 4 * MiB)  # the inner window's takes did not end the outer one
        self.assertEqual(remat_alloc.memory_stats(3)["requested_bytes_peak"], 4 * MiB)
        outer.close()
        with self.assertRaisesRegex(RuntimeError, "the window is closed"):
            outer.take()

    def test_snapshot_carries_every_tag_kind(self):
        with remat_alloc.region("stage1"), remat_alloc.phase("forward"), remat_alloc.policy("save"), \
                remat_alloc.recv_slot(1, "F", 0), remat_alloc.site("recv_buffer"):
            p = self.alloc(4096, device=2)
        doc = self.snapshot(device=2)
        block = doc["segments"][0]["blocks"][0]
        tag = doc["tags"][block["tag"]]
        self.assertEqual(doc["names"][tag["region"]], "stage1")
        self.assertEqual(doc["names"][tag["site"]], "recv_buffer")
        self.assertEqual(tag["phase"], "forward")
        self.assertEqual(tag["policy"], "save")
        self.assertEqual(tag["recv"], {"stage": 1, "direction": "F", "slot": 0})
        self.assertEqual(block["requested_size"], 4096)
        self.free(p, 4096, device=2)

    def test_a_label_tags_allocations_on_every_thread_and_labelled_restores_the_previous_one(self):
        self.assertEqual(remat_alloc.label(), "")
        remat_alloc.set_label("epoch 1")
        try:
            seen = []
            worker = threading.Thread(target=lambda: seen.append(remat_alloc.label()))
            worker.start()
            worker.join()
            self.assertEqual(seen, ["epoch 1"])
            with remat_alloc.labelled("eval step"):
                self.assertEqual(remat_alloc.label(), "eval step")
                with remat_alloc.region("head"):
                    p = self.alloc(2048, device=12)
            self.assertEqual(remat_alloc.label(), "epoch 1")
            q = self.alloc(1024, device=12)
        finally:
            remat_alloc.set_label("")
        self.assertEqual(remat_alloc.label(), "")
        r = self.alloc(512, device=12)
        doc = self.snapshot(device=12)
        tags = {block["requested_size"]: doc["tags"][block["tag"]]
                for segment in doc["segments"] for block in segment["blocks"] if block["state"] == "active_allocated"}
        self.assertEqual(doc["names"][tags[2048]["label"]], "eval step")
        self.assertEqual(doc["names"][tags[2048]["region"]], "head")
        self.assertEqual(doc["names"][tags[1024]["label"]], "epoch 1")
        self.assertEqual(tags[1024]["region"], 0)
        self.assertNotIn("label", tags[512])
        for ptr, size in ((p, 2048), (q, 1024), (r, 512)):
            self.free(ptr, size, device=12)

    def test_categories_are_set_per_thread_counted_and_read_back_by_address(self):
        device = 13
        with remat_alloc.categorized("gradient", "head.weight"):
            self.assertEqual(remat_alloc.category(), ("gradient", "head.weight"))
            seen = []
            worker = threading.Thread(target=lambda: seen.append(remat_alloc.category()))
            worker.start()
            worker.join()
            self.assertEqual(seen, [("none", "")])  # per thread, unlike the label
            p = self.alloc(4096, device=device)
        self.assertEqual(remat_alloc.category(), ("none", ""))
        self.assertEqual(remat_alloc.block_category(p), ("gradient", "head.weight"))
        self.assertEqual(remat_alloc.category_bytes(device)["gradient"], 4096)
        self.assertEqual(remat_alloc.category_bytes(device, requested=True)["gradient"], 4096)
        self.assertIsNone(remat_alloc.block_category(ctypes.addressof(ctypes.c_int())))
        self.free(p, 4096, device=device)
        self.assertEqual(remat_alloc.category_bytes(device)["gradient"], 0)
        self.assertEqual(remat_alloc.category_bytes(device, at_peak=True)["gradient"], 4096)
        with self.assertRaisesRegex(ValueError, r"^set_category: category 'grads' is not one of none, parameter"):
            remat_alloc.set_category("grads")
        with self.assertRaisesRegex(remat_alloc.RematError, r"module path 'mmm.*' \(4097 bytes\) is longer than"):
            remat_alloc.set_category("temporary", "m" * 4097)
        self.assertEqual(remat_alloc.category(), ("none", ""))

    def test_labels_are_checked_like_site_names(self):
        remat_alloc.set_label("kept")
        try:
            with self.assertRaisesRegex(remat_alloc.RematError, r"^label 'xxxx.*' \(4097 bytes\) is longer than 4096 bytes; "
                                                    r"pass a shorter label$"):
                remat_alloc.set_label("x" * 4097)
            with self.assertRaisesRegex(ValueError, r"^set_label: text 'a\\x00b' contains a NUL character"):
                remat_alloc.set_label("a\0b")
            with self.assertRaisesRegex(TypeError, r"^set_label: text must be a str, got NoneType None$"):
                remat_alloc.set_label(None)
            self.assertEqual(remat_alloc.label(), "kept")
            remat_alloc.set_label("ü" * 300)  # longer than a first guess of the buffer would be
            self.assertEqual(remat_alloc.label(), "ü" * 300)
        finally:
            remat_alloc.set_label("")

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

    def test_oom_observers_see_each_failure_until_removed(self):
        events = []
        observer_id = remat_alloc.add_oom_observer(
            lambda event: events.append((event.device, event.requested_bytes, event.device_total_bytes)))
        try:
            self.assertIsNone(self.alloc(100 * MiB, device=7))
        finally:
            remat_alloc.remove_oom_observer(observer_id)
        self.assertEqual(events, [(7, 100 * MiB, 64 * MiB)])
        self.assertIsNone(self.alloc(100 * MiB, device=7))
        self.assertEqual(len(events), 1)  # removed: not called again
        self.assertFalse(remat_alloc.is_installed())  # not PyTorch's allocator in this process
        with self.assertRaisesRegex(TypeError, "observer must be callable, got int"):
            remat_alloc.add_oom_observer(3)

    def test_removing_an_observer_that_is_not_there_raises_naming_the_id(self):
        observer_id = remat_alloc.add_oom_observer(lambda event: None)
        remat_alloc.remove_oom_observer(observer_id)
        for unknown in (observer_id, 12345, -1):
            with self.assertRaisesRegex(remat_alloc.RematError, f"no out-of-memory observer has id {unknown}"):
                remat_alloc.remove_oom_observer(unknown)
        with self.assertRaisesRegex(TypeError, "observer_id must be an int, got str"):
            remat_alloc.remove_oom_observer("3")
        with self.assertRaisesRegex(ValueError, "observer_id=4294967296 does not fit a C int"):
            remat_alloc.remove_oom_observer(2**32)

    def test_an_oom_event_kept_by_its_observer_stays_valid_after_more_allocations_and_ooms(self):
        kept = []
        with tempfile.TemporaryDirectory() as dump_dir:
            remat_alloc.configure(f"oom_dump_dir:{dump_dir}")
            observer_id = remat_alloc.add_oom_observer(kept.append)
            try:
                held = self.alloc(40 * MiB, device=12)
                self.assertIsNone(self.alloc(30 * MiB + 5, device=12))
                self.free(held, 40 * MiB, device=12)
                for size in (1000, 5 * MiB, 17):  # reuse the memory the C event lived in
                    self.free(self.alloc(size, device=12), size, device=12)
                self.assertIsNone(self.alloc(100 * MiB, device=12))
            finally:
                remat_alloc.remove_oom_observer(observer_id)
                remat_alloc.configure("oom_dump_dir:")
            reports = os.listdir(dump_dir)
        self.assertEqual(len(kept), 2)
        first = kept[0]
        self.assertEqual((first.device, first.requested_bytes, first.rounded_bytes),
                         (12, 30 * MiB + 5, 30 * MiB + 512))
        self.assertEqual((first.device_free_bytes, first.device_total_bytes), (24 * MiB, 64 * MiB))
        self.assertEqual((first.reserved_bytes, first.allocated_bytes), (40 * MiB, 40 * MiB))
        self.assertTrue(first.message.startswith("out of memory on device 12 (host): tried to allocate 30.00 MiB "
                                                 "(a 32.00 MiB segment): 24.00 MiB free of 64.00 MiB"), first.message)
        self.assertEqual(os.path.dirname(first.dump_path), dump_dir)
        self.assertIn(os.path.basename(first.dump_path), reports)
        self.assertEqual((kept[1].device, kept[1].requested_bytes, kept[1].reserved_bytes), (12, 100 * MiB, 0))
        with self.assertRaises(AttributeError):  # a record of what happened, not a handle to change
            first.requested_bytes = 0

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

    def test_pytorchs_expandable_segments_setting_applies_through_the_library(self):
        # A job tuned for PyTorch's allocator keeps its setting: one segment that grows.
        script = textwrap.dedent('''
            import json, sys, remat_alloc
            lib = remat_alloc.load()
            a = lib.remat_alloc(30 << 20, 0, None)
            b = lib.remat_alloc(15 << 20, 0, None)
            assert a and b, lib.remat_last_error()
            assert b == a + (30 << 20), (a, b)
            remat_alloc.dump_snapshot(sys.argv[1])
            lib.remat_free(b, 15 << 20, 0, None)
            lib.remat_free(a, 30 << 20, 0, None)
            remat_alloc.empty_cache()
            print(remat_alloc.memory_stats()["reserved_bytes"])
        ''')
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "snapshot.json")
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,release_lock_on_cudamalloc:True")
            env.pop("REMAT_ALLOC_CONF", None)
            env.pop("PYTORCH_ALLOC_CONF", None)
            done = subprocess.run([sys.executable, "-c", script, path], env=env, capture_output=True, text=True,
                                  timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("release_lock_on_cudamalloc:True is a setting of PyTorch's own allocator", done.stderr)
            self.assertEqual(done.stdout.split()[-1], "0")
            with open(path) as f:
                snapshot = json.load(f)
        self.assertTrue(snapshot["config"]["expandable_segments"])
        [segment] = snapshot["segments"]
        self.assertTrue(segment["is_expandable"])
        self.assertEqual(segment["total_size"], 60 << 20)

    def test_an_oom_dump_dir_that_cannot_take_reports_is_said_when_set(self):
        # It was found only at the OOM, whose report was then lost
        script = textwrap.dedent('''
            import remat_alloc
            lib = remat_alloc.load()
            p = lib.remat_alloc(4096, 0, None)
            lib.remat_free(p, 4096, 0, None)
            remat_alloc.configure("oom_dump_dir:" + __import__("sys").argv[1])
        ''')
        with tempfile.TemporaryDirectory() as folder:
            a_file = os.path.join(folder, "a-file")
            pathlib.Path(a_file).write_text("")
            env = dict(os.environ, REMAT_ALLOC_CONF=f"backend:host,oom_dump_dir:{folder}/missing")
            done = subprocess.run([sys.executable, "-c", script, a_file], env=env, capture_output=True, text=True,
                                  timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn(f"oom_dump_dir '{folder}/missing' (REMAT_ALLOC_CONF) does not exist", done.stderr)
            self.assertIn(f"oom_dump_dir '{a_file}' (remat_configure) is not a directory", done.stderr)
            env["REMAT_ALLOC_CONF"] = f"backend:host,oom_dump_dir:{folder}"
            done = subprocess.run([sys.executable, "-c", script, folder], env=env, capture_output=True, text=True,
                                  timeout=60)
            self.assertEqual(done.stderr, "")

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

    # Arguments ctypes would convert silently: ints wrap modulo 2**32, strings end at a NUL.

    def test_ints_beyond_a_c_int_are_refused_naming_the_argument_instead_of_wrapping(self):
        int_range = "pass an int in [-2147483648, 2147483647]"
        cases = [
            (lambda: remat_alloc.memory_stats(2**32),
             f"memory_stats: device=4294967296 does not fit a C int; {int_range}"),
            (lambda: remat_alloc.reset_peak_stats(-2**31 - 1),
             f"reset_peak_stats: device=-2147483649 does not fit a C int; {int_range}"),
            (lambda: remat_alloc.live_bytes("x", device=2**40),
             f"live_bytes: device=1099511627776 does not fit a C int; {int_range}"),
            (lambda: remat_alloc.dump_snapshot("/nonexistent-dir/unused.json", device=2**32 + 2),
             f"dump_snapshot: device=4294967298 does not fit a C int; {int_range}"),
            (lambda: remat_alloc.recv_slot(stage=2**31, direction="F", slot=0),
             f"recv_slot: stage=2147483648 does not fit a C int; {int_range}"),
            (lambda: remat_alloc.recv_slot(stage=0, direction="F", slot=2**32 + 3),
             f"recv_slot: slot=4294967299 does not fit a C int; {int_range}"),
            (lambda: remat_alloc.record_stream(-1, 0),
             "record_stream: ptr=-1 does not fit an address; pass an int in [0, 18446744073709551615]"),
            (lambda: remat_alloc.record_stream(4096, 2**64),
             "record_stream: stream=18446744073709551616 does not fit an address; "
             "pass an int in [0, 18446744073709551615]"),
        ]
        for call, message in cases:
            with self.subTest(message=message), self.assertRaisesRegex(ValueError, "^" + re.escape(message) + "$"):
                call()

    def test_a_device_beyond_a_c_int_does_not_cap_the_device_it_would_wrap_to(self):
        with self.assertRaisesRegex(ValueError, r"^set_memory_fraction: device=4294967304 does not fit a C int"):
            remat_alloc.set_memory_fraction(0.25, device=2**32 + 8)
        p = self.alloc(20 * MiB, device=8)  # device 8 keeps its whole 64 MiB
        self.assertIsNotNone(p, self.lib.remat_last_error())
        self.free(p, 20 * MiB, device=8)

    def test_bools_floats_and_strings_where_an_int_is_meant_are_type_errors(self):
        cases = [
            (lambda: remat_alloc.memory_stats(1.0), "memory_stats: device must be an int, got float 1.0"),
            (lambda: remat_alloc.memory_stats(True), "memory_stats: device must be an int, got bool True"),
            (lambda: remat_alloc.recv_slot(1.5, "F", 0), "recv_slot: stage must be an int, got float 1.5"),
            (lambda: remat_alloc.recv_slot(1, "F", "0"), "recv_slot: slot must be an int, got str '0'"),
            (lambda: remat_alloc.set_memory_fraction(0.5, device=None),
             "set_memory_fraction: device must be an int, got NoneType None"),
            (lambda: remat_alloc.set_memory_fraction("0.5"),
             "set_memory_fraction: fraction must be a float in (0, 1], got str '0.5'"),
            (lambda: remat_alloc.set_memory_fraction(True),
             "set_memory_fraction: fraction must be a float in (0, 1], got bool True"),
        ]
        for call, message in cases:
            with self.subTest(message=message), self.assertRaisesRegex(TypeError, "^" + re.escape(message) + "$"):
                call()

    def test_strings_with_a_nul_are_refused_instead_of_cut(self):
        nul_name = "contains a NUL character; C strings end there, so pass it without one"
        cases = [
            (lambda: remat_alloc.configure("backend:host\0,no_such_key:1"),
             f"configure: conf 'backend:host\\x00,no_such_key:1' {nul_name}"),
            (lambda: remat_alloc.region("layers.0\0.attention"), f"region: name 'layers.0\\x00.attention' {nul_name}"),
            (lambda: remat_alloc.site("recv\0buffer"), f"site: name 'recv\\x00buffer' {nul_name}"),
            (lambda: remat_alloc.phase("forward\0"), f"phase: name 'forward\\x00' {nul_name}"),
            (lambda: remat_alloc.policy("\0save"), f"policy: name '\\x00save' {nul_name}"),
            (lambda: remat_alloc.live_bytes("layers\0"), f"live_bytes: region_prefix 'layers\\x00' {nul_name}"),
        ]
        for call, message in cases:
            with self.subTest(message=message), self.assertRaisesRegex(ValueError, "^" + re.escape(message) + "$"):
                call()
        with tempfile.TemporaryDirectory() as tmp:
            for dump in (remat_alloc.dump_snapshot, remat_alloc.dump_trace):
                path = os.path.join(tmp, "snap\0shot.json")
                with self.assertRaisesRegex(ValueError, f"^{dump.__name__}: path '.*snap\\\\x00shot.json' contains "
                                                        "a NUL character; a path cannot hold one$"):
                    dump(path)
            self.assertEqual(os.listdir(tmp), [])  # no "snap" written

    def test_names_that_are_not_str_are_type_errors(self):
        with self.assertRaisesRegex(TypeError, r"^region: name must be a str, got NoneType None$"):
            remat_alloc.region(None)
        with self.assertRaisesRegex(TypeError,
                                    r"^region: name must be a str \(decode bytes first\), got bytes b'layers.0'$"):
            remat_alloc.region(b"layers.0")
        with self.assertRaisesRegex(TypeError, r"^configure: conf must be a str, got dict \{'backend': 'host'\}$"):
            remat_alloc.configure({"backend": "host"})
        with self.assertRaisesRegex(TypeError, r"^dump_snapshot: path must be a str, bytes or os.PathLike path, "
                                               r"got int 5$"):
            remat_alloc.dump_snapshot(5)
        with self.assertRaisesRegex(ValueError, r"^region: name 'layers\\udc80' is not valid Unicode "
                                                r"\(surrogates not allowed\); pass text that encodes as UTF-8$"):
            remat_alloc.region("layers\udc80")

    def test_dump_paths_may_be_bytes_or_path_objects(self):
        with tempfile.TemporaryDirectory() as tmp:
            remat_alloc.dump_snapshot(os.fsencode(os.path.join(tmp, "bytes.json")))
            remat_alloc.dump_snapshot(pathlib.Path(tmp) / "pathlib.json")
            remat_alloc.dump_trace(os.fsencode(os.path.join(tmp, "trace.jsonl")))
            self.assertEqual(sorted(os.listdir(tmp)), ["bytes.json", "pathlib.json", "trace.jsonl"])
            with open(os.path.join(tmp, "bytes.json")) as f:
                self.assertEqual(json.load(f)["kind"], "snapshot")

    # Scopes: the C tag stack belongs to the thread and pops in reverse order of pushes.

    def assert_tag_stack_empty(self):
        self.assertEqual(self.lib.remat_pop_region(), 5)  # REMAT_ERR_TAG_STACK
        self.assertIn("empty tag stack", self.lib.remat_last_error().decode())

    def test_a_scope_exited_before_the_one_entered_after_it_is_refused_and_pops_nothing(self):
        outer, inner = remat_alloc.region("outer"), remat_alloc.region("inner")
        outer.__enter__()
        inner.__enter__()
        with self.assertRaises(RuntimeError) as raised:
            outer.__exit__(None, None, None)
        self.assertEqual(str(raised.exception),
                         "remat_alloc.region('outer') exited while remat_alloc.region('inner'), entered after it on "
                         "this thread, is still entered; exit remat_alloc.region('inner') first (scopes exit in the "
                         "reverse order of entry, as nested `with` blocks do). Nothing was popped")
        p = self.alloc(700, device=9)  # still tagged outer::inner
        self.assertEqual(remat_alloc.live_bytes("outer::inner", device=9), 700)
        inner.__exit__(None, None, None)
        outer.__exit__(None, None, None)
        self.assert_tag_stack_empty()
        self.free(p, 700, device=9)

    def test_out_of_order_exit_is_caught_across_scope_kinds(self):
        region, phase = remat_alloc.region("stage0"), remat_alloc.phase("forward")
        region.__enter__()
        phase.__enter__()
        with self.assertRaisesRegex(RuntimeError, r"^remat_alloc.region\('stage0'\) exited while "
                                                  r"remat_alloc.phase\('forward'\), entered after it"):
            region.__exit__(None, None, None)
        phase.__exit__(None, None, None)
        region.__exit__(None, None, None)
        self.assert_tag_stack_empty()

    def test_a_scope_can_be_entered_again_and_nested_in_itself(self):
        scope = remat_alloc.region("again")
        with scope:
            with scope:
                p = self.alloc(300, device=10)
            q = self.alloc(200, device=10)
        with scope:
            r = self.alloc(100, device=10)
        self.assertEqual(remat_alloc.live_bytes("again::again", device=10), 300)
        self.assertEqual(remat_alloc.live_bytes("again", device=10), 600)
        self.assert_tag_stack_empty()
        with self.assertRaisesRegex(RuntimeError, r"^remat_alloc.region\('again'\) exited without being entered "
                                                  r"\(or exited once more than entered\)$"):
            scope.__exit__(None, None, None)
        for ptr, size in ((p, 300), (q, 200), (r, 100)):
            self.free(ptr, size, device=10)

    def test_a_scope_exited_on_another_thread_says_its_tag_stays_on_the_entering_thread(self):
        scope = remat_alloc.region("threaded")
        scope.__enter__()
        errors = []

        def exit_here():
            try:
                scope.__exit__(None, None, None)
            except RuntimeError as e:
                errors.append(str(e))

        worker = threading.Thread(target=exit_here, name="worker")
        worker.start()
        worker.join()
        main = threading.current_thread().name
        self.assertEqual(errors, [f"remat_alloc.region('threaded') was entered on thread {main!r} and exited on "
                                  f"thread 'worker'; a tag stack belongs to its thread, so this thread cannot pop it "
                                  f"and the tag stays pushed on {main!r} until that thread exits the scope"])
        p = self.alloc(400, device=11)
        self.assertEqual(remat_alloc.live_bytes("threaded", device=11), 400)
        scope.__exit__(None, None, None)  # the entering thread can still exit it
        self.assert_tag_stack_empty()
        self.free(p, 400, device=11)


if __name__ == "__main__":
    unittest.main()
