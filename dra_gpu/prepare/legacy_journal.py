"""Read-only decoding of the checkpoint journal the previous release wrote, for the upgrade.

The release before this one made a durable checkpoint write through two slot files beside the
checkpoint, ``checkpoint.journal-0`` and ``-1`` (each overwritten in place and ``fdatasync``ed),
and replaced ``checkpoint.json`` afterwards without fsync, on a background thread. A process of
that release killed between the two left its newest durable state only in the journal, with a
generation above the file's. :class:`checkpoint.CheckpointStore` reads the journal once, on its
first read under the checkpoint's lock, adopts that state when it is newer than the file, writes
the file durably and then deletes the journal files.

A slot is a 28-byte header (magic ``DRAGPUJ1``, then little-endian generation u64, data length
u64, CRC-32 u32 of generation, length and data), then the data (the checkpoint's JSON); bytes
after ``length`` are left over from a longer entry. A slot whose CRC fails was torn by a power
loss and was never acknowledged: it is ignored.

Delete this module (and its call in ``checkpoint``) once no node runs the release that wrote
the journal.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAGIC: Final = b"DRAGPUJ1"
_FIELDS: Final = struct.Struct("<QQI")  # generation, length, crc32
HEADER_SIZE: Final = len(MAGIC) + _FIELDS.size
SLOT_NAMES: Final = ("checkpoint.journal-0", "checkpoint.journal-1")


@dataclass(frozen=True)
class Entry:
    generation: int
    data: bytes


@dataclass(frozen=True)
class Journal:
    """The journal files found in a state directory and their newest intact entry."""

    paths: tuple[Path, ...]
    newest: Entry | None


def decode_slot(raw: bytes) -> Entry | None:
    """The entry in a slot's bytes; None for an empty, torn or foreign slot."""
    if len(raw) < HEADER_SIZE or not raw.startswith(MAGIC):
        return None
    generation, length, crc = _FIELDS.unpack_from(raw, len(MAGIC))
    data = raw[HEADER_SIZE : HEADER_SIZE + length]
    if len(data) != length:
        return None
    if zlib.crc32(data, zlib.crc32(struct.pack("<QQ", generation, length))) != crc:
        return None
    return Entry(generation, data)


def find(state_dir: Path) -> Journal | None:
    """The journal in ``state_dir``; None when it has no journal file."""
    paths, newest = [], None
    for name in SLOT_NAMES:
        path = state_dir / name
        try:
            entry = decode_slot(path.read_bytes())
        except FileNotFoundError:
            continue
        paths.append(path)
        if entry is not None and (newest is None or entry.generation > newest.generation):
            newest = entry
    return Journal(tuple(paths), newest) if paths else None


def remove(journal: Journal) -> None:
    """Delete the journal files (not fsynced: one that comes back after a power loss holds
    nothing newer than the file, which was written durably before, and is deleted again)."""
    for path in journal.paths:
        path.unlink(missing_ok=True)
