"""The checkpoint's journal: what a power loss, a torn write or a full disk leaves.

A power loss is played by putting back the bytes ``checkpoint.json`` had before the writes it
lost (the file is replaced without fsync; the journal is fsynced). Cases:
- writes the file lost come back from the journal, and the file is rewritten with them;
- a missing file comes back from the journal; a corrupt one is salvaged on top of it;
- a torn journal write falls back to the entry before it, and the next write spares that entry;
- an older plugin's write (it keeps the generation) wins over the journal's equal generation;
- a journal write that failed changes nothing; a file that could not be replaced after its
  journal entry (a full disk) is replaced by the next read;
- a write that was not durable is not in the journal (a reboot makes it moot).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.prepare import journal
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    ClaimRecord,
    DeviceRecord,
)

RECORD = ClaimRecord(
    state=PREPARE_COMPLETED,
    namespace="ns",
    name="c",
    devices=(DeviceRecord(request_names=("gpu",), pool="node-a", device="gpu-0"),),
)


def add(uid: str) -> Callable[[Checkpoint], Checkpoint]:
    return lambda cp: cp.with_claim(uid, RECORD)


def file_bytes(state_dir: Path) -> bytes:
    """The file as another instance reads it: under the lock, which a durable write holds until
    the file is replaced."""
    with atomicfile.locked(state_dir / "checkpoint.lock"):
        return (state_dir / "checkpoint.json").read_bytes()


def put_file(state_dir: Path, data: bytes | None) -> None:
    """Put ``data`` in place of the file (None: delete it) as a power loss would leave it, once
    the last durable write's file replacement is done."""
    with atomicfile.locked(state_dir / "checkpoint.lock"):
        if data is None:
            (state_dir / "checkpoint.json").unlink()
        else:
            (state_dir / "checkpoint.json").write_bytes(data)


def claims_on_disk(state_dir: Path) -> set[str]:
    return set(json.loads(file_bytes(state_dir))["claims"])


def slot(state_dir: Path, n: int) -> journal.Entry | None:
    return journal.decode_slot((state_dir / journal.SLOT_NAMES[n]).read_bytes())


def test_writes_the_file_lost_come_back_from_the_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    before_power_loss = file_bytes(tmp_path)
    store.update(add("b"), durable=True)
    store.update(add("c"), durable=True)
    put_file(tmp_path, before_power_loss)  # the renames never reached the disk

    with caplog.at_level(logging.WARNING):
        assert set(CheckpointStore(tmp_path).load().claims) == {"a", "b", "c"}
    assert claims_on_disk(tmp_path) == {"a", "b", "c"}, "the file is rewritten"
    assert "behind its journal (generation 1, journal 3); restored 3 claim record(s)" in caplog.text


def test_a_missing_file_comes_back_from_the_journal(tmp_path: Path) -> None:
    CheckpointStore(tmp_path).update(add("a"), durable=True)
    put_file(tmp_path, None)
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}


def test_a_corrupt_file_is_salvaged_on_top_of_the_journal(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    store.update(add("b"), durable=True)
    raw = json.loads(file_bytes(tmp_path))
    raw["claims"]["b"]["devices"] = "garbage"  # this record is lost from the file
    put_file(tmp_path, json.dumps(raw).encode())
    with pytest.raises(CheckpointCorrupt) as info:
        CheckpointStore(tmp_path).load()
    assert "kept 1 claim record(s), restored 1 from the journal, rebuilt 0" in str(info.value)
    assert CheckpointStore(tmp_path).load().claims == {"a": RECORD, "b": RECORD}


def test_a_torn_journal_write_falls_back_to_the_entry_before_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)  # journal-0
    before_power_loss = file_bytes(tmp_path)
    store.update(add("b"), durable=True)  # journal-1
    torn = tmp_path / journal.SLOT_NAMES[1]
    data = bytearray(torn.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a sector of the new entry never reached the disk
    torn.write_bytes(bytes(data))
    put_file(tmp_path, before_power_loss)  # nor did the file's rename

    restarted = CheckpointStore(tmp_path)
    assert set(restarted.load().claims) == {"a"}, "the entry before the torn one"
    assert slot(tmp_path, 1) is None
    kept = slot(tmp_path, 0)
    restarted.update(add("c"), durable=True)
    assert slot(tmp_path, 0) == kept, "the next write goes to the torn slot, not over this one"
    assert set(CheckpointStore(tmp_path).load().claims) == {"a", "c"}


def test_an_older_plugins_write_wins_over_the_journal(tmp_path: Path) -> None:
    """During a rolling update the other instance may be a release without the journal: it
    writes the file (fsynced) and keeps the generation it read."""
    CheckpointStore(tmp_path).update(add("a"), durable=True)
    raw = json.loads(file_bytes(tmp_path))
    raw["claims"]["old"] = raw["claims"].pop("a")
    with atomicfile.locked(tmp_path / "checkpoint.lock") as fd:
        os.pwrite(fd, b"0" * 32, 0)
        data = json.dumps(raw).encode()
        atomicfile.write_atomic(tmp_path / "checkpoint.json", data, durable=True)
    assert set(CheckpointStore(tmp_path).load().claims) == {"old"}


def test_a_journal_write_that_failed_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    assert claims_on_disk(tmp_path) == {"a"}

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fdatasync", failing)
        patched.setattr(os, "fsync", failing)
        with pytest.raises(OSError, match="Input/output error"):
            store.update(add("b"), durable=True)
    assert set(store.load().claims) == {"a"}
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}, "after a restart too"
    store.update(add("c"), durable=True)
    assert set(CheckpointStore(tmp_path).load().claims) == {"a", "c"}


def test_a_file_that_cannot_be_replaced_after_the_journal_is_repaired_by_the_next_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk: the journal slot is overwritten in place, the file's temp copy needs new
    blocks. The caller was told the write is durable, and it is."""
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    assert claims_on_disk(tmp_path) == {"a"}
    real = atomicfile.write_atomic

    def full_disk(path: Path, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomicfile, "write_atomic", full_disk)
    with caplog.at_level(logging.ERROR):
        store.update(add("b"), durable=True)
        assert claims_on_disk(tmp_path) == {"a"}
    assert "generation 2 is in the journal but the file was not replaced" in caplog.text
    monkeypatch.setattr(atomicfile, "write_atomic", real)
    assert set(store.load().claims) == {"a", "b"}
    assert claims_on_disk(tmp_path) == {"a", "b"}


def test_a_write_that_was_not_durable_is_not_journaled(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    before_power_loss = file_bytes(tmp_path)
    store.update(add("started"), durable=False)
    put_file(tmp_path, before_power_loss)
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}


def test_another_instance_never_reads_the_file_without_an_acknowledged_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller is answered once the journal has the write; the file is replaced afterwards,
    under the lock, so an instance that reads meanwhile waits for it instead of missing it."""
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    assert claims_on_disk(tmp_path) == {"a"}
    release = threading.Event()
    real = atomicfile.write_atomic

    def slow(path: Path, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
        release.wait(10)
        real(path, data, durable=durable, mode=mode)

    monkeypatch.setattr(atomicfile, "write_atomic", slow)
    store.update(add("b"), durable=True)  # returns while the file is still being replaced
    assert "b" in store.peek().claims
    seen: list[set[str]] = []
    other = threading.Thread(
        target=lambda: seen.append(set(CheckpointStore(tmp_path).load().claims))
    )
    other.start()
    other.join(0.3)
    assert other.is_alive(), "the other instance waits for the file"
    release.set()
    other.join(10)
    assert seen == [{"a", "b"}]
