"""The guards remat's Python API hands out (tag_cpu_tensors, track_saved_tensors,
verify_recompute) entered, nested, exited out of order, entered again and exited from
another thread: what is in force afterwards is what the guards still entered ask for."""

import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import remat
import remat_alloc

FLOAT = 4


def exact(message):
    return "^" + re.escape(message) + "$"


def cpu_tensors_are_tagged():
    with remat_alloc.region("guards.probe"):
        probe = torch.empty(25)
    tagged = remat.live_bytes("guards.probe") == 25 * FLOAT
    del probe
    return tagged


def saved_tensors_are_tracked():
    x = torch.rand(3, requires_grad=True)
    loss = x.sin().sum()  # sin saves x: 12 B
    return remat._C.saved_report(loss).total_bytes == 3 * FLOAT  # the runtime alone, without the graph walk


def noisy_block(t):
    return remat.region(lambda u: (u + torch.rand_like(u)).exp(), "noisy")(t).sum()


def recompute_is_verified(name):
    loss = remat.checkpoint(region_name=name)(noisy_block)(torch.rand(8, requires_grad=True))
    try:
        loss.backward()
    except RuntimeError as error:
        assert str(error).startswith("verify_recompute: ")
        return True
    return False


def run_on_another_thread(call):
    errors = []

    def body():
        try:
            call()
        except RuntimeError as error:
            errors.append(str(error))

    worker = threading.Thread(target=body, name="worker")
    worker.start()
    worker.join()
    return errors


def test_tag_cpu_tensors_guards_exited_out_of_order_leave_no_tagging_allocator_behind():
    first, second = remat.tag_cpu_tensors(), remat.tag_cpu_tensors()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert cpu_tensors_are_tagged()  # second is still entered
    second.__exit__(None, None, None)
    assert not cpu_tensors_are_tagged()


def test_tag_cpu_tensors_is_process_wide_so_any_thread_may_exit_it():
    guard = remat.tag_cpu_tensors()
    guard.__enter__()
    assert run_on_another_thread(lambda: guard.__exit__(None, None, None)) == []
    assert not cpu_tensors_are_tagged()


def test_a_tag_cpu_tensors_guard_can_be_entered_again_and_not_exited_more_than_entered():
    guard = remat.tag_cpu_tensors()
    with guard:
        with guard:
            assert cpu_tensors_are_tagged()
        assert cpu_tensors_are_tagged()
    assert not cpu_tensors_are_tagged()
    with pytest.raises(RuntimeError, match=exact(
            "tag_cpu_tensors: exited without being entered (or exited once more than entered)")):
        guard.__exit__(None, None, None)
    assert not cpu_tensors_are_tagged()


def test_a_call_before_the_last_guard_exits_that_raises_leaves_the_guard_exited():
    # remat.fit checks a model's last step as the last guard exits: a warning made an error there
    # left the guard entered for good (every later CPU tensor counted), and replaced the body's own error
    calls = remat.tag_cpu_tensors.before_last_exit
    made = []

    def check():
        made.append(torch.ones(4).untyped_storage().nbytes())  # while CPU tensors are still counted
        raise UserWarning("a warning made an error")

    calls.append(check)
    try:
        with pytest.raises(UserWarning, match="made an error"):
            with remat.tag_cpu_tensors():
                pass
        assert made == [16] and remat.tag_cpu_tensors._entered == 0
        with pytest.raises(KeyError, match="the body's own"):
            with remat.tag_cpu_tensors():
                raise KeyError("the body's own")
        assert made == [16] and remat.tag_cpu_tensors._entered == 0  # not called while the body's error propagates
    finally:
        calls.remove(check)


def test_tag_cpu_tensors_documents_the_host_capacity_cap_and_how_to_raise_it():
    doc = remat.tag_cpu_tensors.__doc__
    assert "host_capacity_mb (default 4096 MiB, 4 GiB)" in doc
    assert "torch.OutOfMemoryError" in doc
    assert 'REMAT_ALLOC_CONF="host_capacity_mb:16384"' in doc
    assert 'remat_alloc.configure("host_capacity_mb:16384")' in doc


def test_track_saved_tensors_guards_exited_out_of_order_turn_tracking_off_with_the_last():
    first, second = remat.track_saved_tensors(), remat.track_saved_tensors()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert saved_tensors_are_tracked()
    second.__exit__(None, None, None)
    assert not saved_tensors_are_tracked()


def test_track_saved_tensors_exited_on_another_thread_says_it_stays_on_for_the_entering_one():
    guard = remat.track_saved_tensors()
    guard.__enter__()
    errors = run_on_another_thread(lambda: guard.__exit__(None, None, None))
    main = threading.current_thread().name
    assert errors == [f"track_saved_tensors: entered on thread {main!r} and exited on thread 'worker'; tracking is "
                      f"per thread, so it stays on for {main!r} until that thread exits the guard"]
    assert saved_tensors_are_tracked()
    guard.__exit__(None, None, None)
    assert not saved_tensors_are_tracked()
    with pytest.raises(RuntimeError, match=exact(
            "track_saved_tensors: exited without being entered (or exited once more than entered)")):
        guard.__exit__(None, None, None)


def test_verify_recompute_scopes_exited_out_of_order_leave_the_remaining_setting_in_force():
    on, off = remat.verify_recompute(True), remat.verify_recompute(False)
    on.__enter__()
    off.__enter__()
    on.__exit__(None, None, None)
    assert not recompute_is_verified("guards.off-remains")
    off.__exit__(None, None, None)
    assert not recompute_is_verified("guards.none-remains")


def test_a_verify_recompute_scope_can_be_entered_again():
    scope = remat.verify_recompute()
    with scope:
        assert recompute_is_verified("guards.first")
    with scope:
        assert recompute_is_verified("guards.second")
    assert not recompute_is_verified("guards.after")


def test_an_out_of_memory_error_reads_as_pytorch_s_to_code_that_retries_with_a_smaller_batch():
    # accelerate's find_executable_batch_size (transformers.Trainer's auto_find_batch_size) halves
    # the batch on an error whose text holds " out of memory." (PyTorch's "CUDA out of memory."):
    # remat's began "out of memory on device 0", and the job died at its first batch size
    script = textwrap.dedent("""
        import torch, remat, remat_alloc
        remat_alloc.configure("host_capacity_mb:2,oom_dump_interval_ms:0")
        with remat.tag_cpu_tensors():
            try:
                torch.empty(3 << 20, dtype=torch.uint8)
            except torch.OutOfMemoryError as error:
                print(str(error).splitlines()[0])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    first = done.stdout.strip()
    assert first.startswith("Host out of memory. remat: device 0 (host): tried to allocate 3.00 MiB"), first
    assert " out of memory." in first and "host_capacity_mb" in first


def test_tag_cpu_tensors_caps_cpu_tensors_at_host_capacity_mb_configured_before_the_first():
    # A fresh process: the capacity can change only before the first tagged tensor.
    script = textwrap.dedent("""
        import torch, remat, remat_alloc
        remat_alloc.configure("host_capacity_mb:2")
        with remat.tag_cpu_tensors():
            fits = torch.empty(1 << 20, dtype=torch.uint8)
            try:
                torch.empty(3 << 20, dtype=torch.uint8)
            except torch.OutOfMemoryError as error:
                print("refused:", "host_capacity_mb" in str(error))
            try:
                remat_alloc.configure("host_capacity_mb:8")
            except remat_alloc.RematError as error:
                print("reconfigure:", "live blocks" in str(error))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused: True", "reconfigure: True"]
