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

Durability: every write replaces the file atomically (temp file, rename), on the committing
thread, under the file lock. A durable write also fsyncs the temp file before the rename and the
directory after it (``atomicfile.write_atomic(durable=True)``), so when its caller is answered the
file on disk has the write, for a power loss as for anyone reading ``checkpoint.json`` (another
instance, an operator), with or without the lock. A write that is not durable is atomic but not
fsynced: only for records a power loss makes moot (see :meth:`CheckpointStore.update`).

Concurrency: :class:`CheckpointStore` applies mutations as a group commit. Threads queue pure
mutation functions; one of them (the leader, chosen in memory under the store's condition, so the
threads of one process never queue for the file lock) takes an ``flock`` on ``checkpoint.lock``
(for the other plugin instance of a rolling update only), re-reads the file if the other instance
changed it, applies every queued mutation in order, writes once (fsynced when any mutation asked
for durability), releases the lock and wakes the others. A mutation that raises fails alone and
changes nothing. The wait for the lock is bounded (:data:`LOCK_TIMEOUT_S`, then
``atomicfile.LockTimeout`` naming the holder).

Reads take no lock: the file is only ever replaced by a rename, so a reader sees a whole file, old
or new. :meth:`CheckpointStore.load` returns the copy in memory while the file is unchanged: every
commit writes a fresh token into the lock file before it replaces the file, and a read compares
(token, the file's inode, mtime and size) with what it saw when it last read; the token catches an
inode reused within one timestamp tick, the file's identity an edit made without the lock. Only a
file that does not parse is handled under the lock (moved aside and salvaged, once, by whoever gets
the lock first); :meth:`CheckpointStore.remove_temp_files` holds it too, so it removes only temp
files of writers that died.
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


# Claim UID -> a record and its JSON: what the last commit encoded (see ``encode``).
EncodedRecords = dict[str, tuple["ClaimRecord", str]]


def encode(checkpoint: Checkpoint, encoded: EncodedRecords | None = None) -> bytes:
    """The file content; always written with this plugin's versions.

    ``encoded``: the records' JSON from the previous call, reused for each record that is the
    same object, and replaced by this call's. Every commit writes every claim's record, and a
    burst's commits re-encoded the same records: ``model_dump_json`` of the whole checkpoint was
    7 % of the plugin's GIL time in 64-at-once rounds (py-spy --gil, bench/prepare.py). Each
    record is still encoded by pydantic; only the object around them is put together here, and
    ``decode`` reads it as any JSON (key order does not matter).
    """
    current = checkpoint
    if (checkpoint.version, checkpoint.compatible_version) != (SCHEMA_VERSION, COMPATIBLE_VERSION):
        # Only a file of another release needs the copy; every write encodes the checkpoint.
        current = checkpoint.model_copy(
            update={"version": SCHEMA_VERSION, "compatible_version": COMPATIBLE_VERSION}
        )
    if encoded is None:
        # Compact: indenting took 2.4 times as long (0.40 against 0.16 ms for 64 claims);
        # ``jq . checkpoint.json`` shows it indented.
        return (current.model_dump_json() + "\n").encode()
    fresh: EncodedRecords = {}
    for uid, record in current.claims.items():
        known = encoded.get(uid)
        text = known[1] if known is not None and known[0] is record else record.model_dump_json()
        fresh[uid] = (record, text)
    encoded.clear()
    encoded.update(fresh)
    head = current.model_dump_json(exclude={"claims"})  # the other fields, and a newer's extras
    claims = ",".join(f"{json.dumps(uid)}:{text}" for uid, (_, text) in fresh.items())
    return f'{head[:-1]},"claims":{{{claims}}}}}\n'.encode()


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
    _token: int | None = field(default=None, init=False)  # see _token_fd
    # The token of this process's commit in flight (set and cleared by the leader, under the
    # file lock); None between commits.
    _committing: bytes | None = field(default=None, init=False)
    # The last commit's records and their JSON (``encode``): the leader's only, one at a time.
    _encoded: EncodedRecords = field(default_factory=dict, init=False)
    # Files written since start, (all, fsynced): read by /metrics at scrape time. Only the
    # leader writes (one at a time), so plain integers are enough.
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

    def _stamp(self) -> _Stamp:
        """What identifies the file's current content without reading it or taking the lock
        (see the module docstring: the token, then the file's identity)."""
        try:
            token = os.pread(self._token_fd(), TOKEN_BYTES, 0)
        except OSError:
            token = b""  # no lock file yet: nobody has written
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return (token, None)
        return (token, (st.st_ino, st.st_mtime_ns, st.st_size))

    def _token_fd(self) -> int:
        """The lock file, open for reading its token (never locked through this descriptor)."""
        fd = self._token
        if fd is None:
            fd = atomicfile.open_creating_dir(self._lock_path, os.O_RDONLY | os.O_CLOEXEC, 0o600)
            with self._cond:
                if self._token is None:
                    self._token = fd
                else:  # another thread opened it first
                    os.close(fd)
                    fd = self._token
        return fd

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

    def _read(self, lock_fd: int | None) -> Checkpoint:
        """The on-disk checkpoint, from memory while the file is unchanged.

        ``lock_fd`` None: without the lock; a file that does not parse is then read again under
        it, where it is moved aside and salvaged. Raises CheckpointCorrupt, CheckpointTooNew.
        """
        stamp = self._stamp()
        cache = self._cache
        if cache is not None and (cache.stamp == stamp or stamp[0] == self._committing):
            # Unchanged; or changed by this process's commit in flight, which holds the file
            # lock and refreshed the copy under it: the copy is the state just before that
            # commit, as a read a moment earlier would have returned (parsing the file here
            # instead was a tenth of a burst's GIL time, py-spy --gil on a 16-core node).
            return cache.checkpoint
        if stamp[1] is None:
            checkpoint = Checkpoint()
        else:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:  # removed since the stamp: read under the lock
                data = b""
            try:
                checkpoint = decode(data)
            except _TooNew as exc:
                raise CheckpointTooNew(self.path, exc.compatible_version) from None
            except (ValueError, pydantic.ValidationError) as exc:
                if lock_fd is None:
                    with self._file_lock() as fd:
                        return self._read(fd)
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if isinstance(exc, pydantic.ValidationError):
                    reason = f"{exc.error_count()} schema error(s), first: {_first_error(exc)}"
                moved_to, saved = self._replace_corrupt(lock_fd, data)
                raise CheckpointCorrupt(self.path, moved_to, f"{reason}; {saved}") from exc
        self._cache = _Cache(checkpoint, stamp)
        return checkpoint

    def _replace_corrupt(self, lock_fd: int, data: bytes) -> tuple[Path, str]:
        """Move the corrupt file aside and write what can be saved in its place; needs the lock.

        Returns where the file went and what was saved. Raises OSError (the corrupt file back in
        place) when the salvage cannot be written.
        """
        salvaged, dropped = salvage(data)
        checkpoint = _next_generation(self.rebuild(salvaged))
        moved_to = self._move_aside()
        try:
            self._write(lock_fd, checkpoint, durable=True)
        except OSError:
            os.replace(moved_to, self.path)
            raise
        saved = f"kept {len(salvaged.claims)} claim record(s)"
        saved += f", rebuilt {len(checkpoint.claims) - len(salvaged.claims)}"
        return moved_to, saved + (f", dropped: {'; '.join(dropped)}" if dropped else "")

    def _write(self, lock_fd: int, checkpoint: Checkpoint, *, durable: bool) -> None:
        """Replace the file with ``checkpoint`` (its generation above the file's); needs the
        lock. ``durable``: on disk when this returns (fsynced file and directory)."""
        data = encode(checkpoint)
        os.pwrite(lock_fd, self._new_token(), 0)  # as _commit does
        atomicfile.write_atomic(self.path, data, durable=durable)
        self._written(checkpoint, durable)

    def _new_token(self) -> bytes:
        """A fresh write token, marked as this process's commit in flight until
        :meth:`_written` (see :meth:`_read`)."""
        token = os.urandom(TOKEN_BYTES // 2).hex().encode()
        self._committing = token
        return token

    def _written(self, checkpoint: Checkpoint, durable: bool) -> None:
        self._cache = _Cache(checkpoint, self._stamp())
        self._committing = None  # after the copy: a reader meanwhile gets the one before
        self.writes = (self.writes[0] + 1, self.writes[1] + durable)

    def remove_temp_files(self) -> int:
        """Remove temp files of writers killed mid-write (see the module docstring)."""
        with self._file_lock():
            return atomicfile.remove_temp_files(self.state_dir, FILE_NAME)

    def peek(self) -> Checkpoint:
        """The checkpoint as this process last read or wrote it, without any I/O (:meth:`load`
        when it has read nothing yet). It may be stale (another instance may have written
        since): only for guesses that are checked again before they count."""
        cache = self._cache
        return cache.checkpoint if cache is not None else self.load()

    def load(self) -> Checkpoint:
        """The current checkpoint (from memory when the file is unchanged), without waiting for
        a commit in progress; raises CheckpointCorrupt (after moving the file aside),
        CheckpointTooNew, ``atomicfile.LockTimeout`` (only for a corrupt file)."""
        return self._read(None)

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
        """Apply and write ``batch`` under the file lock, taken and released on this thread.

        The write is spelled out here rather than through :meth:`_write`: a prepare's path from
        the kubelet's call to the file stays six frames deep (docs/concepts/architecture.md)."""
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
                    durable = any(item.durable for item in applied)
                    data = encode(checkpoint, self._encoded)
                    # Token before file: a crash in between only makes readers re-read.
                    os.pwrite(fd, self._new_token(), 0)
                    atomicfile.write_atomic(self.path, data, durable=durable)
                    self._written(checkpoint, durable)
        except BaseException as exc:
            for item in batch:
                if item.error is None:
                    item.error = exc
        finally:
            for item in batch:
                item.done = True


def _next_generation(checkpoint: Checkpoint) -> Checkpoint:
    return checkpoint.model_copy(update={"generation": checkpoint.generation + 1})


def _first_error(exc: pydantic.ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    return f"{where}: {error['msg']}"
