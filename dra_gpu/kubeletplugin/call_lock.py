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
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from dra_gpu.kubeletplugin.atomicfile import locked as held

__all__ = ["NodeCallLock", "held"]


class NodeCallLock:
    """``with lock():`` holds the node-wide lock file, shared with this process's threads."""

    def __init__(self, path: Path) -> None:
        self._path = path
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
        with self._cond:
            while self._acquiring:  # another thread is waiting for the file: join it
                self._cond.wait()
            if self._users:
                self._users += 1
                return
            self._acquiring = True
        fd: int | None = None
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits for the other instance, not for our threads
        except BaseException:
            if fd is not None:
                os.close(fd)
            with self._cond:
                self._acquiring = False
                self._cond.notify_all()
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
