"""The node-wide call lock of rolling-update instances, and the lock-file waits under it.

Cases: the threads of one instance are inside together while another holder of the file (the
other instance) cannot take it; an instance waits while the other holds it, and a thread that
comes while its sibling waits for the file goes in with it; the file is free again once the last
thread has left, also after a thread raised inside; start-up recovery (``held``) waits for a
call of its own instance in progress; a holder that keeps the file fails the waiting calls and
recovery after their bounded wait, naming the file and the holder's PID.

Not starving the other instance: once it waits (at the turnstile), new calls of this instance
stop joining and go in after it, also when this instance's calls never pause; a waiter in
another process gets the file within one call's locked section.

How the waits work, checked on the flock calls themselves rather than on timings: a taken lock
is tried once without blocking, then waited for by one blocking flock that returns when the
holder lets go (no sleeps, no repeated tries); every flock is released by the thread that took
it; the node lock's flocks are all taken by its owner thread, which ends when idle.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lock_holder import held_by_another_process, waiting_in_another_process

from dra_gpu.kubeletplugin import atomicfile, call_lock

TIMEOUT_S = 10  # bounds a broken lock only


def other_instance_can_lock(path: Path) -> bool:
    """Whether another holder could take the file right now."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def other_instance_gets_it(path: Path) -> bool:
    """Whether another holder gets the file within the bound: the node lock's owner thread
    releases it just after the last call left, not before that call returns."""
    try:
        with atomicfile.locked(path, timeout_s=TIMEOUT_S):
            return True
    except atomicfile.LockTimeout:
        return False


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
    assert other_instance_gets_it(path)


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
    assert other_instance_gets_it(path)


def test_released_after_a_call_raised(tmp_path: Path) -> None:
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    with pytest.raises(RuntimeError), lock():
        raise RuntimeError("prepare failed")
    assert other_instance_gets_it(path)
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


def test_once_the_other_instance_waits_new_calls_go_in_after_it(tmp_path: Path) -> None:
    """A call is inside; the other instance (recovery, in a thread here: its own open files)
    comes and waits; a call that comes now does not join the first one, it goes in after the
    other instance's turn."""
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    order: list[str] = []
    first_inside, first_leaves = threading.Event(), threading.Event()

    def first() -> None:
        with lock():
            first_inside.set()
            first_leaves.wait(TIMEOUT_S)
            order.append("first")

    def other_instance() -> None:
        with call_lock.held(path):
            order.append("other instance")

    def second() -> None:
        with lock():
            order.append("second")

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert first_inside.wait(TIMEOUT_S)
    before = set(threading.enumerate())
    threads.append(threading.Thread(target=other_instance))
    threads[1].start()
    # It waits at the turnstile once its taker thread holds it: its first, non-blocking try
    # holds the turnstile for a moment too, and a look in that moment would see it held and
    # then free (a test of this once failed so under a loaded `make test`).
    assert wait_until(
        lambda: any(t.name == "flock-taker" for t in set(threading.enumerate()) - before)
    )
    assert wait_until_held(call_lock.turnstile_path(path))
    threads.append(threading.Thread(target=second))
    threads[2].start()
    threads[2].join(0.3)
    assert order == []  # second did not join first
    first_leaves.set()
    for t in threads:
        t.join(TIMEOUT_S)
    assert order == ["first", "other instance", "second"]
    assert lock.yielded == 1


def wait_until(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within the bound (a thread this test started gets there)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():  # a test's wait for another thread: polls, briefly
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def wait_until_held(path: Path) -> bool:
    """Whether ``path`` gets taken within the bound (by a thread this test started)."""
    deadline = time.monotonic() + TIMEOUT_S
    while other_instance_can_lock(path):  # a test's wait for another thread: polls, briefly
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_waiter_in_another_process_gets_it_while_this_instance_never_pauses(
    tmp_path: Path,
) -> None:
    """Four threads keep calling, each holding the lock a few milliseconds, so that some call of
    this instance is always inside: the other process, once at the turnstile, still gets the
    file within one call's locked section (a bound of seconds here, for busy test machines),
    and this instance's calls go on after its turn."""
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    stop = threading.Event()
    calls = [0] * 4

    def call_in_a_loop(i: int) -> None:
        while not stop.is_set():
            with lock():
                time.sleep(0.005)
            calls[i] += 1

    threads = [threading.Thread(target=call_in_a_loop, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        assert calls_reach(calls, 40), "the calls did not get under way"
        with waiting_in_another_process(path, call_lock.turnstile_path(path)) as other:
            assert other.says("held", 5), "the other process did not get the file in time"
            before = sum(calls)
            time.sleep(0.1)
            assert sum(calls) - before <= len(threads), "calls went on during its turn"
        assert calls_reach(calls, sum(calls) + 40), "this instance's calls did not go on after"
    finally:
        stop.set()
        for t in threads:
            t.join(TIMEOUT_S)
    assert lock.yielded >= 1


def calls_reach(calls: list[int], n: int) -> bool:
    """Whether the threads' calls add up to ``n`` within the bound (the test polls them)."""
    deadline = time.monotonic() + TIMEOUT_S
    while sum(calls) < n:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@dataclass(frozen=True)
class Flock:
    thread: str
    name: str  # the lock file's name
    op: str  # "try", "wait", "unlock" or "close"
    ok: bool = True


@pytest.fixture
def flocks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Flock]]:
    """Every flock and close on the lock files under ``tmp_path``, with the calling thread."""
    recorded: list[Flock] = []
    real_flock, real_close = fcntl.flock, os.close

    def name_of(fd: int) -> str | None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        return Path(target).name if target.startswith(str(tmp_path)) else None

    def flock(fd: int, op: int) -> None:
        name = name_of(fd)
        kind = "unlock" if op == fcntl.LOCK_UN else "try" if op & fcntl.LOCK_NB else "wait"
        try:
            real_flock(fd, op)
        except BlockingIOError:
            if name:
                recorded.append(Flock(threading.current_thread().name, name, kind, ok=False))
            raise
        if name:
            recorded.append(Flock(threading.current_thread().name, name, kind))

    def close(fd: int) -> None:
        if name := name_of(fd):
            recorded.append(Flock(threading.current_thread().name, name, "close"))
        real_close(fd)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(os, "close", close)
    yield recorded


def test_a_taken_lock_is_waited_for_by_one_blocking_flock_which_its_release_wakes(
    tmp_path: Path, flocks: list[Flock]
) -> None:
    """One try, then one blocking flock on the taker thread (no sleeps between tries: there is
    no second try); the taker releases the lock itself when the block ends."""
    path = tmp_path / "checkpoint.lock"
    got = threading.Event()
    with held_by_another_process(path):

        def wait_for_it() -> None:
            with atomicfile.locked(path, timeout_s=TIMEOUT_S):
                got.set()

        waiter = threading.Thread(target=wait_for_it, name="caller")
        waiter.start()
        assert not got.wait(0.2)
    assert got.wait(TIMEOUT_S)  # woken by the holder's exit
    waiter.join(TIMEOUT_S)
    assert [(f.thread, f.op, f.ok) for f in flocks] == [
        ("caller", "try", False),
        ("flock-taker", "wait", True),
        ("flock-taker", "close", True),  # the release: the thread that took it
    ]


def test_a_free_lock_is_taken_and_released_by_the_callers_thread(
    tmp_path: Path, flocks: list[Flock]
) -> None:
    path = tmp_path / "checkpoint.lock"
    with atomicfile.locked(path, timeout_s=TIMEOUT_S):
        pass
    me = threading.current_thread().name
    assert [(f.thread, f.op) for f in flocks] == [(me, "try"), (me, "close")]


def test_a_wait_that_ran_out_leaves_the_release_to_the_taker_thread(
    tmp_path: Path, flocks: list[Flock]
) -> None:
    path = tmp_path / "checkpoint.lock"
    before = set(threading.enumerate())  # not a taker another test left waiting
    with held_by_another_process(path) as pid:
        timeout = pytest.raises(atomicfile.LockTimeout, match=f"held by PID {pid}")
        with timeout, atomicfile.locked(path, timeout_s=0.1):
            pass
        (taker,) = [t for t in set(threading.enumerate()) - before if t.name == "flock-taker"]
        assert [(f.thread, f.op) for f in flocks] == [(threading.current_thread().name, "try")]
    taker.join(TIMEOUT_S)  # it took the lock once the holder let go, and let it go
    assert [(f.thread, f.op) for f in flocks[1:]] == [
        ("flock-taker", "wait"),
        ("flock-taker", "close"),
    ]
    assert other_instance_can_lock(path)


def test_the_node_lock_is_taken_and_released_by_its_owner_thread_only(
    tmp_path: Path, flocks: list[Flock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls come and go on several threads; ``calls.lock`` is taken and released by the owner
    thread alone, and the turnstile only looked at (taken and released at once) by callers.
    The owner ends when idle, closing its files; the next call starts another."""
    monkeypatch.setattr(call_lock, "IDLE_S", 0.2)
    path = tmp_path / "calls.lock"
    lock = call_lock.NodeCallLock(path)
    both_inside = threading.Barrier(2, timeout=TIMEOUT_S)

    def call() -> None:
        with lock():
            both_inside.wait()

    threads = [threading.Thread(target=call, name=f"call-{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    owner = lock._owner
    assert owner is not None
    owner.join(TIMEOUT_S)  # idle: it ends
    assert not owner.is_alive() and lock._owner is None
    with lock():
        pass
    assert other_instance_gets_it(path)  # once the owner has released it
    on_lock = [(f.thread, f.op) for f in flocks if f.name == "calls.lock"]
    # One turn for both calls (they were inside at once), the owner's end, the next turn.
    owners = [op for thread, op in on_lock if thread == "node-call-lock"]
    assert owners == ["wait", "unlock", "close", "wait", "unlock"]
    # Nobody else but this test's own look; no call thread.
    assert {thread for thread, _ in on_lock} <= {"node-call-lock", "MainThread", "flock-taker"}
    by_callers = [f.op for f in flocks if f.name == "calls.wait" and f.thread.startswith("call-")]
    assert by_callers in (["try", "unlock"], [])  # the second call joined, or came in the turn
    assert lock.turns == 2 and lock.yielded == 0


def test_a_lock_file_that_cannot_be_opened_fails_the_calls_at_once(tmp_path: Path) -> None:
    """The owner thread cannot open the file: the waiting calls raise its error rather than
    waiting out their bound, and the next call tries anew."""
    (tmp_path / "not-a-dir").write_text("")
    lock = call_lock.NodeCallLock(tmp_path / "not-a-dir" / "calls.lock", timeout_s=TIMEOUT_S)
    for _ in range(2):
        began = time.monotonic()
        with pytest.raises(OSError, match=r"calls\.lock not taken: NotADirectoryError"), lock():
            pass
        assert time.monotonic() - began < TIMEOUT_S
