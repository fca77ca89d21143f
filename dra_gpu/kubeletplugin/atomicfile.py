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
belongs to the open file description and each call opens the file anew, so it also serializes
threads of one process. Every wait for it is bounded (``timeout_s``, chosen by each caller for
what its holders do): ``flock`` itself has no timeout, so the lock is tried without blocking,
with short sleeps in between, on the caller's own thread. A wait that runs out raises
:class:`LockTimeout` naming the file and its holder as ``/proc/locks`` shows it: a process whose
holder never lets go (a hung disk, a stopped process) fails the caller's work with a message
that says whom to look at, instead of hanging it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from dra_gpu.errors import InternalError

# The first sleep between two tries of a taken lock, doubled up to the last: a commit holds the
# checkpoint's lock for about a millisecond, so the first tries come soon; a holder that keeps
# it longer costs a try every few milliseconds, not a busy loop.
FIRST_PAUSE_S: Final = 0.0005
LAST_PAUSE_S: Final = 0.01
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


def acquire(path: Path, *, timeout_s: float) -> int:
    """An fd holding the exclusive lock on ``path`` (created, with its directory, if missing);
    closing it releases the lock. Raises :class:`LockTimeout` after ``timeout_s``."""
    fd = open_creating_dir(path, os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        pause = FIRST_PAUSE_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise timed_out(path, timeout_s)
            time.sleep(min(pause, left))
            pause = min(2 * pause, LAST_PAUSE_S)
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def locked(path: Path, *, timeout_s: float) -> Iterator[int]:
    """Hold the exclusive lock on ``path`` for the block (see :func:`acquire`); yields its fd."""
    fd = acquire(path, timeout_s=timeout_s)
    try:
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


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
