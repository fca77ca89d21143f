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
older plugin keeps it unchanged when it writes, which the journal's rule below allows for).

Durability: a write that must survive a power loss goes first to the journal
(:mod:`journal`: one in-place write and an ``fdatasync``); its callers are answered then, and
the JSON file is replaced (without fsync) by one background thread that holds the file lock
until it is done, so every reader that takes the lock sees the file with the write. Whenever the
file is read from disk, the journal's newest entry is read too; if its generation is above the
file's, the file lost writes in a power loss and is replaced by the journal's state. An equal
generation means the file is at least as new (an older plugin's write keeps the generation), so
the file wins. A missing file is restored from the journal as well, and a corrupt one is
salvaged on top of the journal's state.

Concurrency: :class:`CheckpointStore` applies mutations as a group commit. Threads queue pure
mutation functions; one of them, holding an ``flock`` on ``checkpoint.lock`` (shared with another
plugin instance during a rolling update), re-reads the file if someone else changed it, applies
every queued mutation in order, writes once (fsynced when any mutation asked for durability)
and wakes the others. A mutation that raises fails alone and changes nothing. Every write of the
file holds that lock, so :meth:`CheckpointStore.remove_temp_files` holding it removes only
temp files of writers that died.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import pydantic
from pydantic import BaseModel, ConfigDict

from dra_gpu.errors import InternalError
from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.prepare.journal import Journal

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 4
FIRST_VERSION: Final = 2  # the first released schema; version 1 never shipped
COMPATIBLE_VERSION: Final = 2  # versions 3 and 4 only added fields: version 2 reads them
FILE_NAME: Final = "checkpoint.json"
LOCK_NAME: Final = "checkpoint.lock"
TOKEN_BYTES: Final = 32
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")

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
    generation: int = 0  # raised by every write (version 4); compared with the journal's

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


@dataclass
class _Cache:
    checkpoint: Checkpoint
    stamp: _Stamp | None  # None: journaled, the file not replaced yet (the next read re-reads)


class _FileWriter:
    """The thread that replaces ``checkpoint.json`` after a durable write's journal entry, so
    that the caller answers without waiting for it (one for the process: commits are rare and
    short, and each holds the file lock until its job is done)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._start:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="checkpoint-file", daemon=True)
                thread.start()
                self._thread = thread
                # A clean exit leaves the file current (not only the journal): the interpreter
                # runs this before it stops daemon threads.
                atexit.register(self.drain)
        self._jobs.put(job)

    def drain(self, timeout: float = 10.0) -> None:
        """Wait until the jobs submitted so far are done (at most ``timeout`` seconds)."""
        done = threading.Event()
        self._jobs.put(done.set)
        done.wait(timeout)

    def _run(self) -> None:
        while True:
            self._jobs.get()()


_FILE_WRITER = _FileWriter()


@dataclass
class CheckpointStore:
    """Loads, caches and group-commits the checkpoint in ``state_dir``.

    ``rebuild`` completes what was salvaged from a corrupt file (runs under the file lock).
    """

    state_dir: Path
    clock: Callable[[], float] = time.time
    rebuild: Mutation = _unchanged
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False)
    _queue: list[_Pending] = field(default_factory=list, init=False)
    _leader: bool = field(default=False, init=False)
    _cache: _Cache | None = field(default=None, init=False)
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

    @functools.cached_property
    def _journal(self) -> Journal:
        return Journal(self.state_dir)

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[int]:
        with atomicfile.locked(self._lock_path) as fd:
            yield fd

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
                moved_to, saved = self._replace_corrupt(lock_fd, data)
                raise CheckpointCorrupt(self.path, moved_to, f"{reason}; {saved}") from exc
        journaled = self._journaled()
        if journaled is not None and journaled[0].generation > checkpoint.generation:
            # The file lost writes the journal made durable (a power loss before the file's own
            # write reached the disk, or the file was deleted): the journal's state is the last
            # one any caller was told is durable.
            newer, data = journaled
            log.warning(
                "checkpoint %s is behind its journal (generation %d, journal %d); restored %d "
                "claim record(s) from the journal",
                self.path,
                checkpoint.generation,
                newer.generation,
                len(newer.claims),
            )
            checkpoint = newer
            self._replace_file(lock_fd, data)
            stamp = self._stamp(lock_fd)
        self._cache = _Cache(checkpoint, stamp)
        return checkpoint

    def _journaled(self) -> tuple[Checkpoint, bytes] | None:
        """The journal's newest state and its bytes; None when it has none this plugin reads."""
        entry = self._journal.read()
        if entry is None:
            return None
        try:
            return decode(entry.data), entry.data
        except (_TooNew, ValueError, pydantic.ValidationError) as exc:
            # Written by a newer plugin before a downgrade: the file is what this plugin uses.
            log.warning("checkpoint journal entry %d not used: %s", entry.generation, exc)
            return None

    def _replace_corrupt(self, lock_fd: int, data: bytes) -> tuple[Path, str]:
        """Move the corrupt file aside and write what can be saved in its place; needs the lock.

        Returns where the file went and what was saved. Raises OSError (the corrupt file back in
        place) when the salvage cannot be written.
        """
        salvaged, dropped = salvage(data)
        restored = 0
        journaled = self._journaled()
        if journaled is not None:
            # The journal holds every record made durable up to its entry; what the file still
            # holds is at least as new, so its records win.
            base = journaled[0]
            restored = len(base.claims.keys() - salvaged.claims.keys())
            salvaged = base.model_copy(
                update={
                    "boot_id": salvaged.boot_id or base.boot_id,
                    "claims": {**base.claims, **salvaged.claims},
                    "generation": max(base.generation, salvaged.generation),
                }
            )
        checkpoint = _next_generation(self.rebuild(salvaged))
        moved_to = self._move_aside()
        try:
            self._write(lock_fd, checkpoint, durable=True)
        except OSError:
            os.replace(moved_to, self.path)
            raise
        kept = len(salvaged.claims) - restored
        saved = f"kept {kept} claim record(s)"
        if restored:
            saved += f", restored {restored} from the journal"
        saved += f", rebuilt {len(checkpoint.claims) - kept - restored}"
        return moved_to, saved + (f", dropped: {'; '.join(dropped)}" if dropped else "")

    def _write(self, lock_fd: int, checkpoint: Checkpoint, *, durable: bool) -> None:
        """Write ``checkpoint`` (its generation above the file's); ``durable``: via the journal."""
        data = encode(checkpoint)
        slot = self._journal.write(checkpoint.generation, data) if durable else None
        try:
            self._replace_file(lock_fd, data)
        except BaseException:
            if slot is not None:
                # Not written after all (a full disk): the journal must not bring it back.
                self._journal.drop(slot)
            raise
        self._cache = _Cache(checkpoint, self._stamp(lock_fd))
        self.writes = (self.writes[0] + 1, self.writes[1] + durable)

    def _replace_file(self, lock_fd: int, data: bytes) -> None:
        # Token before file: a crash in between only makes readers re-read. Not fsynced: the
        # journal is what survives a power loss (see the module docstring).
        os.pwrite(lock_fd, os.urandom(TOKEN_BYTES // 2).hex().encode(), 0)
        atomicfile.write_atomic(self.path, data, durable=False)

    def remove_temp_files(self) -> int:
        """Remove temp files of writers killed mid-write (see the module docstring)."""
        with self._file_lock():
            return atomicfile.remove_temp_files(self.state_dir, FILE_NAME)

    def peek(self) -> Checkpoint:
        """The checkpoint as this process last read or wrote it, without the file lock or I/O
        (:meth:`load` when it has read nothing yet). It may be stale (another instance may
        have written since): only for guesses that are checked again under the lock, so that
        they do not wait for a commit's fsync."""
        cache = self._cache
        return cache.checkpoint if cache is not None else self.load()

    def load(self) -> Checkpoint:
        """The current checkpoint; raises CheckpointCorrupt (after moving the file aside)."""
        cache = self._cache
        if cache is not None and cache.stamp is None:
            # This process's last write, whose file the writer is still replacing under the
            # lock: nobody else can have written since. Waiting for the lock would make a
            # burst of prepares queue behind every rename.
            return cache.checkpoint
        with self._file_lock() as fd:
            return self._read(fd)

    def update(self, mutate: Mutation, *, durable: bool) -> Checkpoint:
        """Apply ``mutate`` to the latest checkpoint and persist it; returns the new value.

        ``durable`` waits until the journal has it (a power loss cannot undo it); the file is
        replaced right after, on the file writer's thread, still under the file lock, so no
        other reader sees the file without it. Without ``durable`` the write of the file itself
        is waited for, atomic but not fsynced: enough for records a reboot makes moot.
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
        fd: int | None = None
        try:
            fd = atomicfile.acquire(self._lock_path)
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
            if applied and any(item.durable for item in applied):
                self._journal_then_file(fd, checkpoint)
                fd = None  # the file writer's now: it releases the lock
            elif applied:
                self._write(fd, checkpoint, durable=False)
        except BaseException as exc:
            for item in batch:
                if item.error is None:
                    item.error = exc
        finally:
            if fd is not None:
                os.close(fd)
            for item in batch:
                item.done = True

    def _journal_then_file(self, lock_fd: int, checkpoint: Checkpoint) -> None:
        """A durable write: the journal entry now (the callers may answer once it is on disk),
        the file on the file writer's thread, which closes ``lock_fd`` when done."""
        data = encode(checkpoint)
        self._journal.write(checkpoint.generation, data)
        self.writes = (self.writes[0] + 1, self.writes[1] + 1)
        self._cache = _Cache(checkpoint, None)  # peek() and load() see it before the file has it
        try:
            _FILE_WRITER.submit(
                functools.partial(self._replace_journaled, lock_fd, checkpoint, data)
            )
        except BaseException:
            self._cache = None  # the file stays behind the journal: the next read repairs it
            raise

    def _replace_journaled(self, lock_fd: int, checkpoint: Checkpoint, data: bytes) -> None:
        try:
            self._replace_file(lock_fd, data)
            self._cache = _Cache(checkpoint, self._stamp(lock_fd))
        except Exception as exc:
            # Durable already: the next read finds the file behind the journal and retries.
            self._cache = None
            log.error(
                "checkpoint %s: generation %d is in the journal but the file was not replaced "
                "(%s); the next read of the checkpoint replaces it",
                self.path,
                checkpoint.generation,
                exc,
            )
        finally:
            os.close(lock_fd)


def _next_generation(checkpoint: Checkpoint) -> Checkpoint:
    return checkpoint.model_copy(update={"generation": checkpoint.generation + 1})


def _first_error(exc: pydantic.ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}"
