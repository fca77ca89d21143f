"""The node-wide call lock of rolling-update instances.

Cases: the threads of one instance are inside together while another holder of the file (the
other instance) cannot take it; an instance waits while the other holds it, and a thread that
comes while its sibling waits for the file goes in with it; the file is free again once the last
thread has left, also after a thread raised inside; start-up recovery (``held``) waits for a
call of its own instance in progress; a holder that keeps the file fails the waiting calls and
recovery after their bounded wait, naming the file and the holder's PID.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest
from lock_holder import held_by_another_process

from dra_gpu.kubeletplugin import atomicfile, call_lock

TIMEOUT_S = 10  # bounds a broken lock only


def other_instance_can_lock(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_threads_of_one_instance_share_it_and_keep_the_other_out(tmp_path: Path) -> None:
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    inside = threading.Barrier(3, timeout=TIMEOUT_S)
    leave = threading.Event()

    def call() -> None:
        with lock():
            inside.wait()  # both threads at once: a serializing lock would time out here
            leave.wait(TIMEOUT_S)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert not other_instance_can_lock(path)
    leave.set()
    for t in threads:
        t.join(TIMEOUT_S)
    assert other_instance_can_lock(path)


def test_waits_for_the_other_instance_then_all_waiting_threads_go_in(tmp_path: Path) -> None:
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    entered: list[int] = []

    def call(i: int) -> None:
        with lock():
            entered.append(i)

    with call_lock.held(path):
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        threads[0].join(0.3)
        assert entered == []
    for t in threads:
        t.join(TIMEOUT_S)
    assert sorted(entered) == [0, 1, 2]
    assert other_instance_can_lock(path)


def test_released_after_a_call_raised(tmp_path: Path) -> None:
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    with pytest.raises(RuntimeError), lock():
        raise RuntimeError("prepare failed")
    assert other_instance_can_lock(path)
    with lock():
        assert not other_instance_can_lock(path)


def test_recovery_waits_for_every_call_in_progress_of_its_own_instance_too(tmp_path: Path) -> None:
    # Start-up recovery takes ``held``: exclusive, never shared with a NodeCallLock's threads.
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    inside, leave, recovered = threading.Event(), threading.Event(), threading.Event()

    def call() -> None:
        with lock():
            inside.set()
            leave.wait(TIMEOUT_S)

    def recovery() -> None:
        with call_lock.held(path):
            recovered.set()

    caller, recoverer = threading.Thread(target=call), threading.Thread(target=recovery)
    caller.start()
    assert inside.wait(TIMEOUT_S)
    recoverer.start()
    assert not recovered.wait(0.3)
    leave.set()
    caller.join(TIMEOUT_S)
    recoverer.join(TIMEOUT_S)
    assert recovered.is_set()


def test_a_call_waits_a_bounded_time_then_fails_naming_the_file_and_holder(
    tmp_path: Path,
) -> None:
    """The other instance (here another process) keeps the lock: the call, and a thread that
    joined its wait, fail after the timeout with the file and the holder's PID; the lock works
    again once the holder lets go."""
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path, timeout_s=0.3)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            with lock():
                pass
        except atomicfile.LockTimeout as exc:
            errors.append(exc)

    with held_by_another_process(path) as pid:
        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        with pytest.raises(atomicfile.LockTimeout) as recovery, call_lock.held(path, timeout_s=0.1):
            pass
    assert len(errors) == 2
    for exc in (*errors, recovery.value):
        assert f"lock {path} not taken within" in str(exc)
        assert f"held by PID {pid}" in str(exc)
    with lock():
        assert not other_instance_can_lock(path)
