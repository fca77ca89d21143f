"""One instance of the plugin at a time on a node works on claims (rolling update).

During a rolling update two plugin instances serve the same node; the kubelet may send
prepare to one and unprepare to the other. A ``flock`` on ``calls.lock`` in the plugin data
directory, which both instances share, keeps them apart: :class:`NodeCallLock`, held by
``state.DeviceState`` around each call's transaction (``main.device_state`` gives it one in
rolling-update mode); the claims are read from the API before it is taken.

Between processes the lock is exclusive; the calls of one instance share it. Within an instance
concurrent calls are already safe (per-claim locks, the checkpoint's group commit), as they are
for a lone instance, so a burst of calls to one instance runs in parallel and commits its
checkpoint writes together, instead of one fsynced call at a time. A *turn* is the time one
instance holds the file: it begins when a call finds the file not held by its instance, and
ends when no call of the turn is left in its locked section.

Turns alternate; neither instance starves the other. Sharing alone would let a busy instance
keep the file for ever (some call of it is always inside), so an instance that must wait for the
file first takes a second one, ``calls.wait`` beside it (the turnstile, ``atomicfile.take``),
and holds it until it has ``calls.lock``. A call that comes while its instance holds the file
looks at the turnstile (``atomicfile.waited_for``): free, the call joins the turn; held, the
other instance waits, so the call does not join: it waits, in memory, for its instance's next
turn, and that turn's take queues behind the other instance at the turnstile. The other instance
therefore gets the file once the calls already inside have left, whatever the load: its wait is
bounded by the longest locked section of one call.

Who takes and releases each flock (every one is released by the thread that took it):

- ``calls.lock`` and ``calls.wait`` of :class:`NodeCallLock`: one owner thread per instance (the
  ``node-call-lock`` thread) opens both files, takes the turnstile and then ``calls.lock`` for
  each turn (blocking, without a bound of its own: the calls waiting for the turn have theirs),
  releases the turnstile once it has the file, releases the file when the turn's last call has
  left, and closes both when it ends (after :data:`IDLE_S` without a call; the next call starts
  another). A turn taken after all its calls gave up is released at once by the owner.
- the look at the turnstile: the calling thread takes it without blocking and releases it at
  once, under the instance's mutex, while the owner is between two takes and does not hold it.
- :func:`held`: ``atomicfile.locked`` with the turnstile; its docstring says which thread.

Threads of one instance coordinate in memory (the mutex and two conditions); the flocks are for
the other instance, and their waits wake when the file is freed.

:func:`held` takes the file exclusively for one block, through the turnstile, with open files
of its own, so it also keeps this process's :class:`NodeCallLock` out as another instance would.
Start-up recovery holds it (``node_plugin``), before its instance serves: no DRA call of either
instance runs during recovery, and a new instance does not mistake the other instance's call
in progress for a crash's leftovers. Tests run two instances in one process: their lock objects
have open files of their own, so they conflict exactly as two processes do.

Every call and :func:`held` wait at most :data:`TIMEOUT_S`, then raise
``atomicfile.LockTimeout`` naming the file and the holder: a DRA call fails its claims with that
message (the kubelet retries), a start-up fails (the process restarts). A call must not take the
lock again inside its locked section: once the other instance waits, the inner call would wait
for a turn that cannot come before the outer call leaves.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final

from dra_gpu.kubeletplugin import atomicfile

__all__ = ["IDLE_S", "TIMEOUT_S", "NodeCallLock", "held", "turnstile_path"]

# Longer than the slowest call the other instance can hold the lock for: a prepare whose
# sharing commands run into their own bounds (an ``nvidia-smi`` call or an MPS daemon's start
# may take 30 s each, ``dra_gpu.prepare.sharing``), plus the checkpoint's bounded wait; a
# holder that keeps it longer is stuck, and failing the call (the kubelet retries) says so.
TIMEOUT_S: Final = 120.0

# An owner thread ends after this long without a call; starting one costs a few hundred
# microseconds, handing a turn to a running one tens.
IDLE_S: Final = 30.0


def turnstile_path(path: Path) -> Path:
    """The turnstile of the lock file ``path``: ``calls.lock`` -> ``calls.wait``."""
    return path.with_suffix(".wait")


def held(path: Path, *, timeout_s: float = TIMEOUT_S) -> AbstractContextManager[int]:
    """The lock file held exclusively for one block, also against this process's
    :class:`NodeCallLock`; raises ``atomicfile.LockTimeout`` after ``timeout_s``."""
    return atomicfile.locked(path, timeout_s=timeout_s, turnstile=turnstile_path(path))


class _Turn:
    """The calls waiting for their instance's next turn, and how its take went."""

    __slots__ = ("begun", "callers", "error")

    def __init__(self) -> None:
        self.callers = 0  # those still waiting; the owner lets them all in at once
        self.begun = False
        self.error: BaseException | None = None


class NodeCallLock:
    """``with lock():`` holds the node-wide lock file, shared with this instance's calls.

    ``turns`` counts the turns taken, ``yielded`` those whose calls stopped joining because the
    other instance waited (the rolling-update tests check that it happens)."""

    def __init__(self, path: Path, *, timeout_s: float = TIMEOUT_S) -> None:
        self._path = path
        self._timeout_s = timeout_s
        mutex = threading.Lock()
        self._for_turn = threading.Condition(mutex)  # calls wait for their turn to begin
        self._for_owner = threading.Condition(mutex)  # the owner, for calls to come or leave
        self._owner: threading.Thread | None = None
        self._next = _Turn()
        self._inside = 0  # calls in their locked section
        self._joinable = False  # a turn is on and nobody waits at the turnstile (yet)
        self._turnstile_fd = -1  # the owner's, while a turn is on
        self.turns = 0
        self.yielded = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self._enter()
        try:
            yield
        finally:
            self._exit()

    def _enter(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        with self._for_turn:
            if self._joins():
                self._inside += 1
                return
            turn = self._next
            turn.callers += 1
            if self._owner is None:
                self._owner = threading.Thread(target=self._own, name="node-call-lock", daemon=True)
                self._owner.start()
            else:
                self._for_owner.notify()
            while not turn.begun and (left := deadline - time.monotonic()) > 0:
                self._for_turn.wait(left)
            if not turn.begun:
                turn.callers -= 1
        if turn.error is not None:  # shared by the turn's calls: each raises its own
            raise OSError(f"lock {self._path} not taken: {turn.error!r}") from turn.error
        if not turn.begun:  # the error is built here: it reads /proc/locks, not under the mutex
            raise atomicfile.timed_out(self._path, self._timeout_s)

    def _joins(self) -> bool:
        """Whether a call may join the turn on (under the mutex); stops the joining once the
        other instance waits."""
        if not self._joinable:
            return False
        if atomicfile.waited_for(self._turnstile_fd):
            self._joinable = False
            self.yielded += 1
            return False
        return True

    def _exit(self) -> None:
        with self._for_owner:
            self._inside -= 1
            if self._inside == 0:
                self._for_owner.notify()

    def _own(self) -> None:
        """The owner thread: takes the file for each turn, holds it while the turn's calls are
        inside, releases it; ends after :data:`IDLE_S` without a call, or when a take failed
        (that turn's calls raise its error)."""
        fds: list[int] = []
        try:
            fds.append(atomicfile.open_lock(self._path))
            fds.append(atomicfile.open_lock(turnstile_path(self._path)))
            lock_fd, turnstile_fd = fds
            while True:
                with self._for_owner:
                    if not self._for_owner.wait_for(lambda: self._next.callers > 0, IDLE_S):
                        self._owner = None
                        return
                atomicfile.take(lock_fd, turnstile_fd)  # as long as the other instance needs
                with self._for_owner:
                    turn, self._next = self._next, _Turn()
                    turn.begun = True
                    self._inside += turn.callers
                    self._turnstile_fd, self._joinable = turnstile_fd, True
                    self.turns += 1
                    self._for_turn.notify_all()
                    self._for_owner.wait_for(lambda: self._inside == 0)
                    self._joinable = False
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
        except BaseException as exc:  # the waiting calls fail with it, the next call starts anew
            with self._for_owner:
                self._next.error, self._next.begun = exc, True
                self._next = _Turn()
                self._owner = None
                self._for_turn.notify_all()
            if not isinstance(exc, OSError):
                raise
        finally:
            for fd in fds:
                os.close(fd)
