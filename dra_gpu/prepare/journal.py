"""The checkpoint's journal: what makes a checkpoint write durable, at the cost of one fdatasync.

Making a replaced file durable costs three waits on the disk: fsync of the new file, the rename,
fsync of the directory (two journal commits on ext4, ~0.5 ms here). Overwriting blocks a file
already has and calling ``fdatasync`` costs one data write and a cache flush (~0.1 ms). So a
durable checkpoint write goes to this journal first, in place, and ``checkpoint.json`` is then
replaced atomically but not fsynced: processes (this plugin, another instance during a rolling
update, an older release) keep reading the JSON file, and after a power loss, whatever state
the JSON file came back in, the journal holds the last durable state.

Two slot files, ``checkpoint.journal-0`` and ``checkpoint.journal-1``. A write overwrites the
slot that does not hold the newest valid entry, so a write torn by a power loss destroys at
most itself, never the entry before it. A slot is a 28-byte header (magic, generation, length,
CRC-32 of generation, length and data) followed by the data (the checkpoint's JSON); bytes after
``length`` are left over from a longer entry and ignored. The CRC finds a torn write, which was
never acknowledged, so dropping it loses nothing.

The generation is the checkpoint's own counter (``Checkpoint.generation``, raised by every
write), which lets :class:`checkpoint.CheckpointStore` tell whether the JSON file lost writes
the journal kept. The callers hold the checkpoint's file lock around every call.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dra_gpu.kubeletplugin import atomicfile

MAGIC: Final = b"DRAGPUJ1"
_FIELDS: Final = struct.Struct("<QQI")  # generation, length, crc32
HEADER_SIZE: Final = len(MAGIC) + _FIELDS.size
SLOT_NAMES: Final = ("checkpoint.journal-0", "checkpoint.journal-1")


@dataclass(frozen=True)
class Entry:
    generation: int
    data: bytes


def _crc(generation: int, data: bytes) -> int:
    """CRC-32 of generation, length and data: a header torn from its data fails it too."""
    return zlib.crc32(data, zlib.crc32(struct.pack("<QQ", generation, len(data))))


def encode_slot(generation: int, data: bytes) -> bytes:
    return MAGIC + _FIELDS.pack(generation, len(data), _crc(generation, data)) + data


def decode_slot(raw: bytes) -> Entry | None:
    """The entry in a slot's bytes; None for an empty, torn or foreign slot."""
    if len(raw) < HEADER_SIZE or not raw.startswith(MAGIC):
        return None
    generation, length, crc = _FIELDS.unpack_from(raw, len(MAGIC))
    data = raw[HEADER_SIZE : HEADER_SIZE + length]
    if len(data) != length:
        return None
    if _crc(generation, data) != crc:
        return None
    return Entry(generation, data)


class Journal:
    """The two slots in ``directory``; one owner (the checkpoint store), under its file lock."""

    def __init__(self, directory: Path) -> None:
        self._paths = tuple(os.fspath(directory / name) for name in SLOT_NAMES)
        self._newest_slot: int | None = None  # which slot holds the newest valid entry
        self._known = False  # _newest_slot was read from the files (see read)

    def read(self) -> Entry | None:
        """The newest valid entry (None when there is none); also what the next write skips.

        Call it whenever another process may have written since (the store does on each read of
        a changed checkpoint file).
        """
        newest: tuple[int, Entry] | None = None
        for slot, path in enumerate(self._paths):
            entry = _read_slot(path)
            if entry is not None and (newest is None or entry.generation > newest[1].generation):
                newest = (slot, entry)
        self._newest_slot = newest[0] if newest is not None else None
        self._known = True
        return newest[1] if newest is not None else None

    def write(self, generation: int, data: bytes) -> int:
        """Make ``data`` durable as ``generation``; returns the slot written (for :meth:`drop`).

        On an error the slot written may be torn; the newest entry before it is intact.
        """
        if not self._known:
            self.read()
        slot = 0 if self._newest_slot is None else 1 - self._newest_slot
        try:
            _write_slot(self._paths[slot], encode_slot(generation, data))
        except OSError:
            # Written but maybe not on disk (the sync failed): no reader may take it as newest.
            self.drop(slot)
            raise
        self._newest_slot = slot
        return slot

    def drop(self, slot: int) -> None:
        """Invalidate what :meth:`write` put in ``slot`` (best effort, not synced: the entry
        was never acknowledged); the entry before it is the newest again."""
        self._known = False  # whatever happens below, read the files again next time
        with contextlib.suppress(OSError):
            _write_slot(self._paths[slot], bytes(HEADER_SIZE), create=False, sync=False)


def _read_slot(path: str) -> Entry | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        return decode_slot(os.pread(fd, size, 0))
    finally:
        os.close(fd)


def _write_slot(path: str, content: bytes, *, create: bool = True, sync: bool = True) -> None:
    """Overwrite the start of ``path`` with ``content`` and (``sync``) wait until it is on
    disk."""
    created = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return
        fd = atomicfile.open_creating_dir(path, os.O_WRONLY | os.O_CLOEXEC, 0o600)
        created = True
    try:
        view, offset = memoryview(content), 0
        while offset < len(content):
            offset += os.pwrite(fd, view[offset:], offset)
        # Overwriting blocks the file has changes no metadata fdatasync must flush: one data
        # write. A new or longer file makes it flush the size as well, which is right.
        if created:
            os.fsync(fd)
        elif sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)
    if created:
        atomicfile.fsync_dir(os.path.dirname(path))
