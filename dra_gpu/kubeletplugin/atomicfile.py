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
threads of one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


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


def acquire(path: Path) -> int:
    """An fd holding the exclusive lock on ``path`` (created, with its directory, if missing);
    closing it releases the lock, whichever thread closes it."""
    fd = open_creating_dir(path, os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def locked(path: Path) -> Iterator[int]:
    """Hold the exclusive lock on ``path`` for the block (see :func:`acquire`); yields its fd."""
    fd = acquire(path)
    try:
        yield fd
    finally:
        os.close(fd)  # closing releases the lock
