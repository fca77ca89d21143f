"""Upgrade from the release that made durable writes through ``checkpoint.journal-0``/``-1``.

That release was killed (SIGKILL) after a journal entry and before its file thread replaced
``checkpoint.json``: the journal is ahead of the file. The slots are written here as that release
wrote them. Cases:
- a journal entry newer than the file is adopted once, with a log line; the file has it, on
  disk, and the journal files are gone; later writes are not undone by it;
- the same when ``checkpoint.json`` is missing;
- an older or equal entry, and a torn one (its CRC fails), are ignored; the files go all the same;
- a corrupt ``checkpoint.json`` beside the journal is salvaged on top of the journal's records,
  none lost, and the journal goes;
- the journal files stay while the file cannot be written (a full disk), and the migration
  happens on the next read;
- a journal whose deletion a power loss undid is below the file's generation and never wins
  (also what the previous release would find after a downgrade).
"""

from __future__ import annotations

import errno
import json
import logging
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    ClaimRecord,
    DeviceRecord,
    encode,
)

RECORD = ClaimRecord(
    state=PREPARE_COMPLETED,
    namespace="ns",
    name="c",
    devices=(DeviceRecord(request_names=("gpu",), pool="node-a", device="gpu-0"),),
)
SLOTS = ("checkpoint.journal-0", "checkpoint.journal-1")


def legacy_slot(generation: int, data: bytes) -> bytes:
    """A slot as the previous release wrote it: magic, generation, length, CRC-32, data."""
    crc = zlib.crc32(data, zlib.crc32(struct.pack("<QQ", generation, len(data))))
    return b"DRAGPUJ1" + struct.pack("<QQI", generation, len(data), crc) + data


def state(generation: int, *uids: str) -> Checkpoint:
    return Checkpoint(generation=generation, claims=dict.fromkeys(uids, RECORD))


def write_journal(state_dir: Path, *entries: Checkpoint | bytes) -> None:
    for name, entry in zip(SLOTS, entries, strict=False):
        raw = entry if isinstance(entry, bytes) else legacy_slot(entry.generation, encode(entry))
        (state_dir / name).write_bytes(raw)


def write_file(state_dir: Path, checkpoint: Checkpoint) -> None:
    (state_dir / "checkpoint.json").write_bytes(encode(checkpoint))


def on_disk(state_dir: Path) -> Checkpoint:
    """The file as an operator reads it (no lock)."""
    return Checkpoint.model_validate_json((state_dir / "checkpoint.json").read_bytes())


def journal_files(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.glob("checkpoint.journal-*"))


def add(uid: str) -> Callable[[Checkpoint], Checkpoint]:
    return lambda cp: cp.with_claim(uid, RECORD)


def test_a_newer_journal_entry_is_adopted_once_and_the_journal_goes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_file(tmp_path, state(3, "a"))
    write_journal(tmp_path, state(3, "a"), state(4, "a", "b"))  # killed before the file had b
    writes: list[bool] = []  # durable or not, per write of the file
    real = atomicfile.write_atomic

    def recording(path: Path, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
        writes.append(durable)
        real(path, data, durable=durable, mode=mode)

    monkeypatch.setattr(atomicfile, "write_atomic", recording)
    with caplog.at_level(logging.WARNING):
        store = CheckpointStore(tmp_path)
        assert set(store.load().claims) == {"a", "b"}
    assert "behind the previous release's journal (generation 3, journal 4): adopted" in caplog.text
    assert writes == [True], "the adopted state is written durably"
    assert journal_files(tmp_path) == []
    assert on_disk(tmp_path).generation == 5 and set(on_disk(tmp_path).claims) == {"a", "b"}

    store.update(lambda cp: cp.without_claim("b"), durable=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert set(CheckpointStore(tmp_path).load().claims) == {"a"}, "not adopted again"
    assert caplog.text == ""


def test_a_missing_file_is_taken_from_the_journal(tmp_path: Path) -> None:
    write_journal(tmp_path, state(2, "a"))
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}
    assert set(on_disk(tmp_path).claims) == {"a"}
    assert journal_files(tmp_path) == []


@pytest.mark.parametrize(
    "journal",
    [
        pytest.param((state(4, "old"), state(5, "older")), id="older"),
        pytest.param((state(6, "same-generation"),), id="equal"),
    ],
)
def test_an_older_or_equal_journal_entry_is_ignored(
    tmp_path: Path, journal: tuple[Checkpoint, ...]
) -> None:
    write_file(tmp_path, state(6, "a"))
    write_journal(tmp_path, *journal)
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}
    assert set(on_disk(tmp_path).claims) == {"a"}
    assert journal_files(tmp_path) == []


def test_a_torn_journal_entry_is_ignored(tmp_path: Path) -> None:
    write_file(tmp_path, state(3, "a"))
    torn = bytearray(legacy_slot(9, encode(state(9, "a", "never-acknowledged"))))
    torn[len(torn) // 2] ^= 0xFF  # a sector that never reached the disk
    write_journal(tmp_path, state(2, "a"), bytes(torn))
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}
    assert journal_files(tmp_path) == []


def test_a_corrupt_file_beside_the_journal_is_salvaged_and_loses_nothing(tmp_path: Path) -> None:
    raw = json.loads(encode(state(4, "a", "b")))
    raw["claims"]["b"]["devices"] = "garbage"  # this record is lost from the file
    (tmp_path / "checkpoint.json").write_text(json.dumps(raw))
    write_journal(tmp_path, state(4, "a", "b"))
    with pytest.raises(CheckpointCorrupt) as info:
        CheckpointStore(tmp_path).load()
    assert (
        "kept 1 claim record(s), restored 1 from the previous release's journal, rebuilt 0"
        in str(info.value)
    )
    assert journal_files(tmp_path) == []
    assert CheckpointStore(tmp_path).load().claims == {"a": RECORD, "b": RECORD}


def test_the_journal_stays_until_the_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_file(tmp_path, state(1))
    write_journal(tmp_path, state(2, "a"))

    def full_disk(path: Path, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    store = CheckpointStore(tmp_path)
    with monkeypatch.context() as patched:
        patched.setattr(atomicfile, "write_atomic", full_disk)
        with pytest.raises(OSError, match="No space left"):
            store.load()
    assert journal_files(tmp_path) == ["checkpoint.journal-0"]
    assert set(store.load().claims) == {"a"}
    assert journal_files(tmp_path) == []


def test_a_journal_back_after_its_deletion_was_lost_never_wins(tmp_path: Path) -> None:
    write_file(tmp_path, state(3, "a"))
    write_journal(tmp_path, state(4, "a", "b"))
    journal = (tmp_path / SLOTS[0]).read_bytes()
    store = CheckpointStore(tmp_path)
    store.load()
    store.update(lambda cp: cp.without_claim("b"), durable=True)
    (tmp_path / SLOTS[0]).write_bytes(journal)  # a power loss undid the deletion
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}
    assert journal_files(tmp_path) == []
