"""One instance of the plugin at a time on a node works on claims (rolling update).

During a rolling update two plugin instances serve the same node; the kubelet may send
prepare to one and unprepare to the other. A ``flock`` on a file in the plugin data directory,
which both instances share, keeps them apart: :class:`NodeCallLock`, held by
``state.DeviceState`` around each call's transaction (``main.device_state`` gives it one in
rolling-update mode); the claims are read from the API before it is taken.

Between processes the lock is exclusive; the threads of one instance share it. Within an
instance concurrent calls are already safe (per-claim locks, the checkpoint's group commit), as
they are for a lone instance, so a burst of calls to one instance runs in parallel and commits
its checkpoint writes together, instead of one fsynced call at a time. The other instance waits
until this one has no call left in its locked section.

:func:`held` (:func:`dra_gpu.kubeletplugin.atomicfile.locked`) takes the same file exclusively
for one block, against the threads of its own process too: its own open file description
conflicts with the one :class:`NodeCallLock` holds. Start-up recovery holds it
(``node_plugin``), so no DRA call of either instance runs during recovery, and a new instance
does not mistake the other instance's call in progress for a crash's leftovers.

Both wait at most :data:`TIMEOUT_S`, then raise ``atomicfile.LockTimeout`` naming the file and
the holder: a DRA call fails its claims with that message (the kubelet retries), a start-up
fails (the process restarts).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final

from dra_gpu.kubeletplugin import atomicfile

__all__ = ["TIMEOUT_S", "NodeCallLock", "held"]

# Longer than the slowest call the other instance can hold the lock for: a prepare whose
# sharing commands run into their own bounds (an ``nvidia-smi`` call or an MPS daemon's start
# may take 30 s each, ``dra_gpu.prepare.sharing``), plus the checkpoint's bounded wait; a
# holder that keeps it longer is stuck, and failing the call (the kubelet retries) says so.
TIMEOUT_S: Final = 120.0


def held(path: Path, *, timeout_s: float = TIMEOUT_S) -> AbstractContextManager[int]:
    """The lock file held exclusively for one block, also against this process's
    :class:`NodeCallLock`; raises ``atomicfile.LockTimeout`` after ``timeout_s``."""
    return atomicfile.locked(path, timeout_s=timeout_s)


class NodeCallLock:
    """``with lock():`` holds the node-wide lock file, shared with this process's threads."""

    def __init__(self, path: Path, *, timeout_s: float = TIMEOUT_S) -> None:
        self._path = path
        self._timeout_s = timeout_s
        self._cond = threading.Condition()
        self._users = 0
        self._acquiring = False
        self._fd: int | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        self._enter()
        try:
            yield
        finally:
            self._exit()

    def _enter(self) -> None:
        deadline = time.monotonic() + self._timeout_s  # one bound per call, joined or not
        with self._cond:
            # Another thread is waiting for the file: join it, until this call's own bound.
            while self._acquiring and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            joined = not self._acquiring
            if joined and self._users:
                self._users += 1
                return
            if joined:
                self._acquiring = True
        if not joined:  # the error is built here: it reads /proc/locks, not under the condition
            raise atomicfile.timed_out(self._path, self._timeout_s)
        try:
            # Waits for the other instance, not for our threads (they join above).
            fd = atomicfile.acquire(self._path, timeout_s=max(0.0, deadline - time.monotonic()))
        except BaseException as exc:
            with self._cond:
                self._acquiring = False
                self._cond.notify_all()
            if isinstance(exc, atomicfile.LockTimeout):  # this call's whole bound, joined or not
                raise atomicfile.LockTimeout(exc.path, self._timeout_s, exc.holder) from None
            raise
        with self._cond:
            self._fd, self._users, self._acquiring = fd, 1, False
            self._cond.notify_all()

    def _exit(self) -> None:
        with self._cond:
            self._users -= 1
            if self._users == 0 and self._fd is not None:
                os.close(self._fd)  # closing releases the lock
                self._fd = None
