"""The plugin's checkpoint: which claims are prepared on this node, kept across restarts.

File ``<state dir>/checkpoint.json``; JSON, replaced atomically. Per claim a state
``PrepareStarted`` → ``PrepareCompleted``, its name/namespace and what was prepared (enough to
answer a repeated prepare and to rebuild its CDI spec without the API server or discovery).

Format versions and the rules for upgrading and downgrading
----------------------------------------------------------
- ``version`` is the schema the writer used; ``compatible_version`` the oldest schema a reader
  must understand to use the file. A reader accepts any file whose ``compatible_version`` is
  at most its own :data:`SCHEMA_VERSION` (so newer files load in older plugins as long as the
  change was additive), and refuses the others with :class:`CheckpointTooNew` without touching
  the file (a downgrade across a breaking change must not destroy state).
- Fields are only ever added, each with a default, so an older file loads. Unknown fields are
  kept (``extra="allow"``) and written back unchanged, so a downgrade followed by an upgrade
  loses nothing; a record an older plugin rewrites simply lacks the newer fields.
- There is no checksum: a checksum over exact bytes broke every upgrade of NVIDIA's driver.
  A file that is not JSON or not this schema is *corrupt*: it is renamed to
  ``checkpoint.json.corrupt-<UTC timestamp>``, never overwritten, and what can be saved is
  written in its place: every claim record that is valid on its own (:func:`salvage`: one bad
  field drops that record, not the file), completed by the store's ``rebuild`` (the plugin adds
  records rebuilt from its CDI specs). Then :class:`CheckpointCorrupt` is raised naming both
  paths so the caller can report it (log and Node event). If the salvage cannot be written
  (a full disk), the corrupt file is put back, so nothing is lost and the next read tries again.

History: version 1 (no boot ID, no per-device facts) was never released; such a file is
corrupt, and its records are salvaged like any other (they answer repeated prepares and
unprepare, but their CDI spec cannot be rebuilt: ``records.RecordIncomplete``). Version 2 (the
first released) has ``compatible_version``, ``boot_id``, device facts, ``share_id`` and
``admin_access``. Version 3 added ``from_spec``: a record rebuilt from a CDI spec after the
checkpoint lost it, which lacks request names, share IDs and config (an older plugin reads it as
a plain completed record). Version 4 (current) added ``generation``, raised by every write (an
older plugin keeps it unchanged when it writes). A device's ``consumed`` (what a consumable share
consumed, ``prepare.shares``) came within version 4: optional and additive, an older plugin
keeps it as an unknown field.

The previous release made its durable writes through a journal beside the file
(``checkpoint.journal-0``/``-1``) and replaced the file afterwards; whenever it read the file, a
journal entry with a higher generation than the file's replaced it. The first read of a store
under the lock migrates such a journal once (:mod:`legacy_journal`): its newest entry is adopted
when its generation is above the file's, the file is written durably, and only then are the
journal files deleted. Every write here still raises the generation, so after a downgrade to
that release a journal entry left behind (its deletion lost in a power loss) is below the file
and never wins over it; normally none is left. The schema stays 4: the file's fields and their
meaning are unchanged, only where durability comes from changed.

Durability: every write replaces the file atomically (temp file, rename), on the committing
thread, under the file lock. A durable write also fsyncs the temp file before the rename and the
directory after it (``atomicfile.write_atomic(durable=True)``), so when its caller is answered the
file on disk has the write, for a power loss as for anyone reading ``checkpoint.json`` (another
instance, an operator), with or without the lock. A write that is not durable is atomic but not
fsynced: only for records a power loss makes moot (see :meth:`CheckpointStore.update`).

Concurrency: :class:`CheckpointStore` applies mutations as a group commit. Threads queue pure
mutation functions; one of them, holding an ``flock`` on ``checkpoint.lock`` (shared with another
plugin instance during a rolling update), re-reads the file if someone else changed it, applies
every queued mutation in order, writes once (fsynced when any mutation asked for durability),
releases the lock and wakes the others. A mutation that raises fails alone and changes nothing.
Every read and write of the file holds that lock (waiting at most :data:`LOCK_TIMEOUT_S`, then
``atomicfile.LockTimeout`` naming the holder), so :meth:`CheckpointStore.remove_temp_files`
holding it removes only temp files of writers that died, and :meth:`CheckpointStore.load`'s copy
in memory is used only when the lock file's write token and the file's identity show it current.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import pydantic
from pydantic import BaseModel, ConfigDict

from dra_gpu.errors import InternalError
from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.prepare import legacy_journal

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 4
FIRST_VERSION: Final = 2  # the first released schema; version 1 never shipped
COMPATIBLE_VERSION: Final = 2  # versions 3 and 4 only added fields: version 2 reads them
FILE_NAME: Final = "checkpoint.json"
LOCK_NAME: Final = "checkpoint.lock"
TOKEN_BYTES: Final = 32
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
# A commit holds the lock for a read, its batch's mutations and one write with its fsyncs; a
# holder that keeps it this long is stuck (a hung state disk, a stopped process): the calls
# waiting for it fail naming it, and the kubelet retries them, instead of hanging.
LOCK_TIMEOUT_S: Final = 30.0

PREPARE_STARTED: Final = "PrepareStarted"
PREPARE_COMPLETED: Final = "PrepareCompleted"
ClaimState = Literal["PrepareStarted", "PrepareCompleted"]


class CheckpointError(InternalError, RuntimeError):
    """Base of the checkpoint's errors."""


class CheckpointCorrupt(CheckpointError):
    def __init__(self, path: Path, moved_to: Path, reason: str) -> None:
        self.path, self.moved_to, self.reason = path, moved_to, reason
        super().__init__(f"checkpoint {path} is corrupt ({reason}); moved aside to {moved_to}")


class CheckpointTooNew(CheckpointError):
    def __init__(self, path: Path, compatible_version: int) -> None:
        super().__init__(
            f"checkpoint {path} needs a plugin that reads schema {compatible_version}; this one "
            f"reads up to {SCHEMA_VERSION} (downgraded across an incompatible change?)"
        )


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class DeviceRecord(_Record):
    request_names: tuple[str, ...] = ()
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None
    # A shared device: what this share consumed of each capacity (prepare.shares).
    consumed: dict[str, int] | None = None
    admin_access: bool = False
    # Facts to rebuild the CDI spec; None in a record salvaged without them.
    type: Literal["gpu", "mig"] | None = None
    uuid: str | None = None
    minor: int | None = None
    product_name: str | None = None
    mig_profile: str | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    # The applied (normalized) opaque config as JSON; parsed only when used, so a newer
    # plugin's config fields cannot make the whole checkpoint unreadable.
    config: dict[str, Any] | None = None


class ClaimRecord(_Record):
    state: ClaimState
    namespace: str
    name: str
    devices: tuple[DeviceRecord, ...] = ()
    # Rebuilt from the claim's CDI spec after the checkpoint lost the record (version 3): its
    # devices are known, its request names, share IDs and config are not.
    from_spec: bool = False


class Checkpoint(_Record):
    version: int = SCHEMA_VERSION
    compatible_version: int = COMPATIBLE_VERSION
    boot_id: str = ""  # "" = unknown (a salvaged file without one)
    claims: dict[str, ClaimRecord] = {}
    generation: int = 0  # raised by every write (version 4); see the module docstring

    def with_claim(self, uid: str, record: ClaimRecord) -> Checkpoint:
        return self.model_copy(update={"claims": {**self.claims, uid: record}})

    def without_claim(self, uid: str) -> Checkpoint:
        return self.model_copy(
            update={"claims": {k: v for k, v in self.claims.items() if k != uid}}
        )

    def with_boot_id(self, boot_id: str) -> Checkpoint:
        return self.model_copy(update={"boot_id": boot_id})


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    return path.read_text().strip()


def encode(checkpoint: Checkpoint) -> bytes:
    """The file content; always written with this plugin's versions."""
    current = checkpoint
    if (checkpoint.version, checkpoint.compatible_version) != (SCHEMA_VERSION, COMPATIBLE_VERSION):
        # Only a file of another release needs the copy; every write encodes the checkpoint.
        current = checkpoint.model_copy(
            update={"version": SCHEMA_VERSION, "compatible_version": COMPATIBLE_VERSION}
        )
    return (current.model_dump_json(indent=1) + "\n").encode()


def decode(data: bytes) -> Checkpoint:
    """Parse file content; raises ValueError (corrupt) or _TooNew."""
    raw = json.loads(data)
    if not isinstance(raw, dict):
        raise ValueError(f"top level is a {type(raw).__name__}, not an object")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"no valid schema version (got {version!r})")
    if version < FIRST_VERSION:
        raise ValueError(
            f"schema version {version} was never released (the first is {FIRST_VERSION})"
        )
    compatible = raw.get("compatible_version", COMPATIBLE_VERSION)
    if isinstance(compatible, int) and compatible > SCHEMA_VERSION:
        raise _TooNew(compatible)
    return Checkpoint.model_validate(raw)


def salvage(data: bytes) -> tuple[Checkpoint, tuple[str, ...]]:
    """What a corrupt file still holds: its boot ID and each claim record valid on its own;
    plus one line per part dropped."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        return Checkpoint(), (f"not JSON: {exc}",)
    if not isinstance(raw, dict):
        return Checkpoint(), (f"top level is a {type(raw).__name__}, not an object",)
    boot_id = raw.get("boot_id")
    generation = raw.get("generation")
    facts: dict[str, Any] = {
        "boot_id": boot_id if isinstance(boot_id, str) else "",
        "generation": generation if isinstance(generation, int) and generation >= 0 else 0,
    }
    claims = raw.get("claims")
    if not isinstance(claims, dict):
        return Checkpoint(**facts), ("no claims object",)
    kept: dict[str, ClaimRecord] = {}
    dropped: list[str] = []
    for uid, record in claims.items():
        try:
            kept[uid] = ClaimRecord.model_validate(record)
        except pydantic.ValidationError as exc:
            dropped.append(f"claim {uid}: {_first_error(exc)}")
    return Checkpoint(**facts, claims=kept), tuple(dropped)


class _TooNew(Exception):
    def __init__(self, compatible_version: int) -> None:
        self.compatible_version = compatible_version


Mutation = Callable[[Checkpoint], Checkpoint]


def _unchanged(checkpoint: Checkpoint) -> Checkpoint:
    return checkpoint


@dataclass
class _Pending:
    mutate: Mutation
    durable: bool
    done: bool = False
    result: Checkpoint | None = None
    error: BaseException | None = None


_Stamp = tuple[bytes, tuple[int, int, int] | None]  # (write token, file identity)


@dataclass(frozen=True)
class _Cache:
    checkpoint: Checkpoint
    stamp: _Stamp  # what the file was when this process last read or wrote it


@dataclass
class CheckpointStore:
    """Loads, caches and group-commits the checkpoint in ``state_dir``.

    ``rebuild`` completes what was salvaged from a corrupt file (runs under the file lock).
    ``lock_timeout_s`` bounds every wait for the file lock.
    """

    state_dir: Path
    clock: Callable[[], float] = time.time
    rebuild: Mutation = _unchanged
    lock_timeout_s: float = LOCK_TIMEOUT_S
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False)
    _queue: list[_Pending] = field(default_factory=list, init=False)
    _leader: bool = field(default=False, init=False)
    _cache: _Cache | None = field(default=None, init=False)
    _legacy_checked: bool = field(default=False, init=False)  # see legacy_journal
    # Files written since start, (all, fsynced): read by /metrics at scrape time. Only the
    # committing thread writes (under the file lock), so plain integers are enough.
    writes: tuple[int, int] = field(default=(0, 0), init=False)

    # Built once: every call reads and writes these several times, and building a Path (and
    # its string) each time was a tenth of a prepare's Python CPU (py-spy --gil, bench/).
    @functools.cached_property
    def path(self) -> Path:
        return self.state_dir / FILE_NAME

    @functools.cached_property
    def _lock_path(self) -> Path:
        return self.state_dir / LOCK_NAME

    def _file_lock(self) -> contextlib.AbstractContextManager[int]:
        return atomicfile.locked(self._lock_path, timeout_s=self.lock_timeout_s)

    def _stamp(self, lock_fd: int) -> _Stamp:
        """What identifies the file's current content without reading it.

        Every commit first writes a fresh token into the lock file, so a change by another
        instance is seen even if inode numbers are reused within one timestamp tick; the file's
        identity catches edits made without the lock.
        """
        token = os.pread(lock_fd, TOKEN_BYTES, 0)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return (token, None)
        return (token, (st.st_ino, st.st_mtime_ns, st.st_size))

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        target = self.path.with_name(f"{FILE_NAME}.corrupt-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = self.path.with_name(f"{FILE_NAME}.corrupt-{stamp}-{n}")
        os.replace(self.path, target)
        atomicfile.fsync_dir(self.state_dir)
        return target

    def _read(self, lock_fd: int) -> Checkpoint:
        """The on-disk checkpoint (cached while the file is unchanged); needs the file lock."""
        stamp = self._stamp(lock_fd)
        if self._cache is not None and self._cache.stamp == stamp:
            return self._cache.checkpoint
        legacy = None if self._legacy_checked else legacy_journal.find(self.state_dir)
        if stamp[1] is None:
            checkpoint = Checkpoint()
        else:
            data = self.path.read_bytes()
            try:
                checkpoint = decode(data)
            except _TooNew as exc:
                raise CheckpointTooNew(self.path, exc.compatible_version) from None
            except (ValueError, pydantic.ValidationError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if isinstance(exc, pydantic.ValidationError):
                    reason = f"{exc.error_count()} schema error(s), first: {_first_error(exc)}"
                moved_to, saved = self._replace_corrupt(lock_fd, data, legacy)
                raise CheckpointCorrupt(self.path, moved_to, f"{reason}; {saved}") from exc
        if legacy is not None:
            return self._migrate(lock_fd, checkpoint, legacy)
        self._legacy_checked = True
        self._cache = _Cache(checkpoint, stamp)
        return checkpoint

    def _migrate(
        self, lock_fd: int, checkpoint: Checkpoint, legacy: legacy_journal.Journal
    ) -> Checkpoint:
        """Take over the previous release's journal: its newest entry when it is newer than the
        file, written durably; then the journal files go (see the module docstring)."""
        journaled = _legacy_state(legacy)
        if journaled is not None and journaled.generation > checkpoint.generation:
            # That release was killed after its journal entry, before the file had it.
            log.warning(
                "checkpoint %s is behind the previous release's journal (generation %d, journal "
                "%d): adopted the journal's %d claim record(s)",
                self.path,
                checkpoint.generation,
                journaled.generation,
                len(journaled.claims),
            )
            checkpoint = journaled
        checkpoint = _next_generation(checkpoint)
        self._write(lock_fd, checkpoint, durable=True)  # an error: the journal stays, for next time
        legacy_journal.remove(legacy)
        self._legacy_checked = True
        return checkpoint

    def _replace_corrupt(
        self, lock_fd: int, data: bytes, legacy: legacy_journal.Journal | None
    ) -> tuple[Path, str]:
        """Move the corrupt file aside and write what can be saved in its place; needs the lock.

        Returns where the file went and what was saved. Raises OSError (the corrupt file back in
        place) when the salvage cannot be written.
        """
        salvaged, dropped = salvage(data)
        restored = 0
        journaled = _legacy_state(legacy) if legacy is not None else None
        if journaled is not None:
            # The previous release's journal holds every record it made durable up to its entry:
            # records the file no longer has come back; where both have one, the newer wins.
            older, newer = (
                (salvaged, journaled)
                if journaled.generation > salvaged.generation
                else (journaled, salvaged)
            )
            restored = len(journaled.claims.keys() - salvaged.claims.keys())
            salvaged = salvaged.model_copy(
                update={
                    "boot_id": salvaged.boot_id or journaled.boot_id,
                    "claims": {**older.claims, **newer.claims},
                    "generation": newer.generation,
                }
            )
        checkpoint = _next_generation(self.rebuild(salvaged))
        moved_to = self._move_aside()
        try:
            self._write(lock_fd, checkpoint, durable=True)
        except OSError:
            os.replace(moved_to, self.path)
            raise
        if legacy is not None:
            legacy_journal.remove(legacy)
        self._legacy_checked = True
        kept = len(salvaged.claims) - restored
        saved = f"kept {kept} claim record(s)"
        if restored:
            saved += f", restored {restored} from the previous release's journal"
        saved += f", rebuilt {len(checkpoint.claims) - kept - restored}"
        return moved_to, saved + (f", dropped: {'; '.join(dropped)}" if dropped else "")

    def _write(self, lock_fd: int, checkpoint: Checkpoint, *, durable: bool) -> None:
        """Replace the file with ``checkpoint`` (its generation above the file's); needs the
        lock. ``durable``: on disk when this returns (fsynced file and directory)."""
        data = encode(checkpoint)
        # Token before file: a crash in between only makes readers re-read.
        os.pwrite(lock_fd, os.urandom(TOKEN_BYTES // 2).hex().encode(), 0)
        atomicfile.write_atomic(self.path, data, durable=durable)
        self._cache = _Cache(checkpoint, self._stamp(lock_fd))
        self.writes = (self.writes[0] + 1, self.writes[1] + durable)

    def remove_temp_files(self) -> int:
        """Remove temp files of writers killed mid-write (see the module docstring)."""
        with self._file_lock():
            return atomicfile.remove_temp_files(self.state_dir, FILE_NAME)

    def peek(self) -> Checkpoint:
        """The checkpoint as this process last read or wrote it, without the file lock or I/O
        (:meth:`load` when it has read nothing yet). It may be stale (another instance may
        have written since): only for guesses that are checked again under the lock, so that
        they do not wait for a commit's fsyncs."""
        cache = self._cache
        return cache.checkpoint if cache is not None else self.load()

    def load(self) -> Checkpoint:
        """The current checkpoint, read under the file lock (from memory when the file is
        unchanged); raises CheckpointCorrupt (after moving the file aside), CheckpointTooNew,
        ``atomicfile.LockTimeout``."""
        with self._file_lock() as fd:
            return self._read(fd)

    def update(self, mutate: Mutation, *, durable: bool) -> Checkpoint:
        """Apply ``mutate`` to the latest checkpoint and persist it; returns the new value.

        When this returns, the file has the write (a reader without the lock sees it too).
        ``durable``: it is also on disk (a power loss cannot undo it). Without it the write is
        atomic but not fsynced, which is enough only for records a power loss makes moot: a
        power loss reboots the node, and what such a record is about does not outlive a reboot
        (a ``PrepareStarted`` record guards a MIG device or a GPU's sharing settings, which a
        reboot resets, for a prepare the kubelet never got an answer for; a roll-back's removal
        that is lost brings that record back, and the next start rolls it back again).
        Exceptions from ``mutate`` propagate and leave the checkpoint unchanged.
        """
        pending = _Pending(mutate, durable)
        with self._cond:
            self._queue.append(pending)
            while not pending.done and self._leader:
                self._cond.wait()
            if not pending.done:
                self._leader = True
                batch, self._queue = self._queue, []
        if not pending.done:
            try:
                self._commit(batch)
            finally:
                with self._cond:
                    self._leader = False
                    self._cond.notify_all()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def _commit(self, batch: list[_Pending]) -> None:
        """Apply and write ``batch`` under the file lock, taken and released on this thread."""
        try:
            with self._file_lock() as fd:
                checkpoint = _next_generation(self._read(fd))
                applied: list[_Pending] = []
                for item in batch:
                    try:
                        checkpoint = item.mutate(checkpoint)
                    except Exception as exc:  # one mutation's failure is its caller's only
                        item.error = exc
                    else:
                        item.result = checkpoint
                        applied.append(item)
                if applied:
                    self._write(fd, checkpoint, durable=any(item.durable for item in applied))
        except BaseException as exc:
            for item in batch:
                if item.error is None:
                    item.error = exc
        finally:
            for item in batch:
                item.done = True


def _legacy_state(legacy: legacy_journal.Journal) -> Checkpoint | None:
    """The state of the previous release's newest journal entry; None when it has none this
    plugin reads."""
    entry = legacy.newest
    if entry is None:
        return None
    try:
        return decode(entry.data)
    except (_TooNew, ValueError, pydantic.ValidationError) as exc:
        log.warning("checkpoint journal entry %d not used: %s", entry.generation, exc)
        return None


def _next_generation(checkpoint: Checkpoint) -> Checkpoint:
    return checkpoint.model_copy(update={"generation": checkpoint.generation + 1})


def _first_error(exc: pydantic.ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}"
