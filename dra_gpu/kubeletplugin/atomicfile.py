"""Replace a file so that readers see the old or the new content, never a mix.

``write_atomic`` writes a temp file next to the target and renames it over the target; rename
is atomic on POSIX file systems, so a reader (or a process killed mid-write) never observes a
partial file. The temp name starts with a dot and ends in ``.tmp-<pid>``, so a CDI runtime
watching the directory (it loads only ``*.json``/``*.yaml``) ignores it; a writer killed before
the rename leaves it behind, and ``remove_temp_files`` sweeps such leftovers at start-up.

``durable=True`` also survives a power loss: the data is fsynced before the rename and the
directory after it. Callers skip that only for files that are rebuilt after a reboot anyway
(CDI specs live on tmpfs on real nodes and are rewritten from the checkpoint on a new boot).

``locked`` holds an exclusive ``flock`` on a lock file, the one way the plugin serializes with
another instance of itself (checkpoint commits, DRA calls during a rolling update). The lock
belongs to the open file description and each call opens the file anew. It is meant for the
other process: the threads of one process coordinate in memory before they get here (the
checkpoint's condition, the MIG ledger's lock, ``call_lock``'s owner thread). Two threads of one
process on one file would still be kept apart, each waiting as another process would.

Every wait is bounded (``timeout_s``, chosen by each caller for what its holders do) and wakes
when the lock is freed, not after a sleep. ``flock`` has no timeout and a thread blocked in it
cannot be interrupted, so the lock is first tried without blocking on the caller's thread; only
when it is taken does a thread of its own (:class:`_Taker`) block in ``flock`` while the caller
waits for it on a condition with its bound. Which thread takes and releases each lock:

- free at the first try: the caller's thread takes it, and releases it (closes the file) when
  its block ends;
- taken: the taker thread takes it when it is freed, holds it for the caller's block, then
  releases it itself; the caller only signals the end of its block and waits for the release;
- the caller's wait ran out: the caller raises :class:`LockTimeout`, naming the file and its
  holder as ``/proc/locks`` shows it (a hung disk, a stopped process: the message says whom to
  look at), and the taker thread, still blocked, releases the lock itself as soon as it gets it.

A *turnstile* (``locked(..., turnstile=...)``, :func:`take`, :func:`waited_for`) is a second lock
file that a waiter holds while it waits for the lock and releases once it has it. Holders that
let more work in under a lock they already hold (``call_lock.NodeCallLock``) look at it first:
held means the other process waits, and they stop letting work in until it has had its turn.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from dra_gpu.errors import InternalError

PROC_LOCKS: Final = "/proc/locks"


class LockTimeout(InternalError, TimeoutError):
    """A lock file's ``flock`` not taken within the caller's bound; the message names the file
    and its holder. A ``TimeoutError``, so an ``OSError``: callers that fail a call on I/O
    errors fail it on this one too."""

    def __init__(self, path: Path | str, timeout_s: float, holder: str) -> None:
        self.path, self.timeout_s, self.holder = Path(path), timeout_s, holder
        super().__init__(f"lock {path} not taken within {timeout_s:g} s: {holder}")


def fsync_dir(directory: Path | str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path | str) -> tuple[str, str]:
    """(directory, temp file) of a write of ``path``; strings, not Paths: building Paths was a
    measurable part of a prepare, which writes several files."""
    directory, name = os.path.split(os.fspath(path))
    return directory or ".", os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def remove_temp_files(directory: Path, name: str) -> int:
    """Remove temp files that writers of targets matching the glob ``name`` left behind when
    killed between write and rename; returns how many.

    Safe only while the caller holds the lock every writer of those targets holds: the PID in
    the name tells nothing about a live writer, since instances in different pods have their own
    PID namespaces (both may well be PID 1).
    """
    count = 0
    if directory.is_dir():
        for path in directory.glob(f".{name}.tmp-*"):
            count += remove(path)
    return count


def open_creating_dir(path: Path | str, flags: int, mode: int) -> int:
    """``os.open(path, flags | O_CREAT, mode)``, creating the missing parent directories.

    They are created only when the open finds them missing: asking first costs a failing
    ``mkdir``, an exception and a ``stat`` per file written, on the prepare path.
    """
    try:
        return os.open(path, flags | os.O_CREAT, mode)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return os.open(path, flags | os.O_CREAT, mode)


def write_atomic(path: Path, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``; see the module docstring for ``durable``."""
    directory, tmp = temp_name(path)
    fd = open_creating_dir(tmp, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(directory)


def remove(path: Path) -> bool:
    """Remove ``path`` (not fsynced); ``False`` when it did not exist."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def open_lock(path: Path | str) -> int:
    """An fd of the lock file ``path`` (created, with its directory, if missing)."""
    return open_creating_dir(path, os.O_RDWR | os.O_CLOEXEC, 0o600)


def take(fd: int, turnstile_fd: int | None = None) -> None:
    """Block until ``fd`` holds its file's lock, holding the turnstile meanwhile if one is given
    (it is released again before this returns). Blocks without a bound: only for threads whose
    callers wait for them with one (:class:`_Taker`, ``call_lock``'s owner thread)."""
    if turnstile_fd is not None:
        fcntl.flock(turnstile_fd, fcntl.LOCK_EX)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        if turnstile_fd is not None:
            fcntl.flock(turnstile_fd, fcntl.LOCK_UN)


def try_take(fd: int, turnstile_fd: int | None = None) -> bool:
    """Take ``fd``'s lock if that needs no wait; with a turnstile, only if nobody waits on it
    either (a free lock is not taken from under a waiter that is about to get it)."""
    if turnstile_fd is not None and not _try(turnstile_fd):
        return False
    try:
        return _try(fd)
    finally:
        if turnstile_fd is not None:
            fcntl.flock(turnstile_fd, fcntl.LOCK_UN)


def waited_for(turnstile_fd: int) -> bool:
    """Whether another open file description holds the turnstile, i.e. waits for its lock.
    Takes it for a moment when it is free, so ``turnstile_fd`` must not hold it already."""
    if not _try(turnstile_fd):
        return True
    fcntl.flock(turnstile_fd, fcntl.LOCK_UN)
    return False


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path, *, timeout_s: float, turnstile: Path | None = None) -> Iterator[int]:
    """Hold the exclusive lock on ``path`` for the block; yields an fd of the lock file (to
    read and write it, not to close). Raises :class:`LockTimeout` after ``timeout_s``. With
    ``turnstile``, it is held while waiting (see the module docstring)."""
    fd = open_lock(path)
    try:
        turnstile_fd = None if turnstile is None else open_lock(turnstile)
    except BaseException:
        os.close(fd)
        raise
    try:
        taken = try_take(fd, turnstile_fd)
    except BaseException:
        _close(fd, turnstile_fd)
        raise
    if taken:
        try:
            yield fd
        finally:
            _close(fd, turnstile_fd)  # closing releases the lock
        return
    taker = _Taker(fd, turnstile_fd)  # the files are the taker's from here
    if not taker.wait(timeout_s):
        raise timed_out(path, timeout_s)
    try:
        yield fd
    finally:
        taker.release()


def _close(fd: int, turnstile_fd: int | None) -> None:
    os.close(fd)
    if turnstile_fd is not None:
        os.close(turnstile_fd)


class _Taker(threading.Thread):
    """Waits in a blocking ``flock`` for a caller that waits with a bound (see the module
    docstring): takes the lock, then holds it until the caller's block ends or the caller gave
    up, releases it and closes the files."""

    def __init__(self, fd: int, turnstile_fd: int | None) -> None:
        super().__init__(name="flock-taker", daemon=True)
        self._fd, self._turnstile_fd = fd, turnstile_fd
        self._cond = threading.Condition()
        self._taken = self._abandoned = self._done = False
        self._error: OSError | None = None
        self.start()

    def run(self) -> None:
        try:
            take(self._fd, self._turnstile_fd)
        except OSError as exc:
            error: OSError | None = exc
        else:
            error = None
        with self._cond:
            self._taken, self._error = error is None, error
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._abandoned or self._done)
        _close(self._fd, self._turnstile_fd)  # closing releases the lock

    def wait(self, timeout_s: float) -> bool:
        """Whether the lock was taken within ``timeout_s``; if not, it is given up (the thread
        releases it when it gets it). Raises the ``flock``'s error if it failed."""
        with self._cond:
            try:
                self._cond.wait_for(lambda: self._taken or self._error is not None, timeout_s)
            finally:
                if not self._taken:
                    self._abandoned = True
                    self._cond.notify_all()
            if self._error is not None:
                raise OSError(self._error.errno, self._error.strerror) from self._error
            return self._taken

    def release(self) -> None:
        """The caller's block ended: the thread releases the lock; returns once it has."""
        with self._cond:
            self._done = True
            self._cond.notify_all()
        self.join()


def timed_out(path: Path | str, timeout_s: float) -> LockTimeout:
    """The error for a wait for ``path``'s lock that ran out, with its holder if it is found."""
    try:
        st = os.stat(path)
        pids = holders(_read_proc_locks(), os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    except OSError as exc:
        return LockTimeout(path, timeout_s, f"its holder could not be looked up ({exc})")
    if not pids:
        # /proc/locks lists only locks of processes this PID namespace can see.
        holder = "held by a process not visible here (another pod's PID namespace?)"
    else:
        holder = "held by PID " + ", ".join(
            f"{pid} (this process)" if pid == os.getpid() else str(pid) for pid in pids
        )
    return LockTimeout(path, timeout_s, holder)


def holders(proc_locks: str, major: int, minor: int, inode: int) -> list[int]:
    """PIDs holding an ``flock`` on the file (device ``major:minor``, ``inode``), from the text
    of ``/proc/locks`` (lines like ``1: FLOCK ADVISORY WRITE 1234 08:01:5678 0 EOF``; waiters,
    marked ``->``, are not holders)."""
    want = f"{major:02x}:{minor:02x}:{inode}"
    pids = []
    for line in proc_locks.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != want:
            continue
        with contextlib.suppress(ValueError):
            if (pid := int(fields[4])) > 0:
                pids.append(pid)
    return pids


def _read_proc_locks() -> str:
    with open(PROC_LOCKS) as f:
        return f.read()
