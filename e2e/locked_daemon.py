"""A daemon the harness runs while holding a file lock: one instance per lock at a time.

``start()`` takes the lock (waiting for another holder to finish), spawns the process in its own
process group (``e2e.procs``) and waits until ``ready()`` says so; a daemon that exits first ends
the wait with its log's tail, and a failed start stops it again. ``stop()`` is idempotent.
``leftovers`` removes what a killed instance leaves behind (processes of its own that outlive it):
it runs under the lock, before each start and after each stop, so it never touches a running
instance of another holder.
"""

from __future__ import annotations

import fcntl
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from e2e import procs, waiting


class LockedDaemon:
    def __init__(
        self,
        name: str,
        *,
        lock_path: Path,
        log_path: Path,
        leftovers: Callable[[], None] = lambda: None,
    ) -> None:
        self.name, self.lock_path, self.log_path = name, lock_path, log_path
        self._leftovers = leftovers
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None

    def start(
        self,
        argv: Sequence[str],
        *,
        ready: Callable[[], bool],
        what: str,
        timeout: float,
        every: float = 0.3,
    ) -> None:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.lock_path, "w")  # noqa: SIM115 (held until stop())
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            self._leftovers()  # of an instance killed before its stop()
        except BaseException:
            self.stop()
            raise
        self._proc = procs.spawn(argv, log_path=self.log_path)

        def probe() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                tail = procs.log_tail(self.log_path)
                raise RuntimeError(f"{self.name} exited with {self._proc.returncode}:\n{tail}")
            return ready()

        try:
            waiting.wait_for(what, probe, timeout=timeout, every=every)
        except BaseException:
            self.stop()
            raise

    @property
    def running(self) -> bool:
        return self._proc is not None

    def stop(self, *, grace_s: float = 5.0) -> None:
        if self._proc is not None:
            procs.stop(self._proc, grace_s=grace_s)
            self._proc = None
            self._leftovers()  # of a daemon that needed SIGKILL
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
