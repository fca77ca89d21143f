"""The checkpoint's journal: what a power loss, a torn write or a full disk leaves.

A power loss is played by putting back the bytes ``checkpoint.json`` had before the writes it
lost (the file is replaced without fsync; the journal is fsynced). Cases:
- writes the file lost come back from the journal, and the file is rewritten with them;
- a missing file comes back from the journal; a corrupt one is salvaged on top of it;
- a torn journal write falls back to the entry before it, and the next write spares that entry;
- an older plugin's write (it keeps the generation) wins over the journal's equal generation;
- a write that failed (a full disk) is not brought back by its journal entry;
- a write that was not durable is not in the journal (a reboot makes it moot).
"""

from __future__ import annotations

import errno
import json
import logging
import os
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


def claims_on_disk(state_dir: Path) -> set[str]:
    return set(json.loads((state_dir / "checkpoint.json").read_bytes())["claims"])


def slot(state_dir: Path, n: int) -> journal.Entry | None:
    return journal.decode_slot((state_dir / journal.SLOT_NAMES[n]).read_bytes())


def test_writes_the_file_lost_come_back_from_the_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    before_power_loss = (tmp_path / "checkpoint.json").read_bytes()
    store.update(add("b"), durable=True)
    store.update(add("c"), durable=True)
    (tmp_path / "checkpoint.json").write_bytes(before_power_loss)  # the renames never hit disk

    with caplog.at_level(logging.WARNING):
        assert set(CheckpointStore(tmp_path).load().claims) == {"a", "b", "c"}
    assert claims_on_disk(tmp_path) == {"a", "b", "c"}, "the file is rewritten"
    assert "behind its journal (generation 1, journal 3); restored 3 claim record(s)" in caplog.text


def test_a_missing_file_comes_back_from_the_journal(tmp_path: Path) -> None:
    CheckpointStore(tmp_path).update(add("a"), durable=True)
    (tmp_path / "checkpoint.json").unlink()
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}


def test_a_corrupt_file_is_salvaged_on_top_of_the_journal(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    store.update(add("b"), durable=True)
    raw = json.loads((tmp_path / "checkpoint.json").read_bytes())
    raw["claims"]["b"]["devices"] = "garbage"  # this record is lost from the file
    (tmp_path / "checkpoint.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointCorrupt) as info:
        CheckpointStore(tmp_path).load()
    assert "kept 1 claim record(s), restored 1 from the journal, rebuilt 0" in str(info.value)
    assert CheckpointStore(tmp_path).load().claims == {"a": RECORD, "b": RECORD}


def test_a_torn_journal_write_falls_back_to_the_entry_before_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)  # journal-0
    before_power_loss = (tmp_path / "checkpoint.json").read_bytes()
    store.update(add("b"), durable=True)  # journal-1
    torn = tmp_path / journal.SLOT_NAMES[1]
    data = bytearray(torn.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a sector of the new entry never reached the disk
    torn.write_bytes(bytes(data))
    (tmp_path / "checkpoint.json").write_bytes(before_power_loss)  # nor did the file's rename

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
    raw = json.loads((tmp_path / "checkpoint.json").read_bytes())
    raw["claims"]["old"] = raw["claims"].pop("a")
    with atomicfile.locked(tmp_path / "checkpoint.lock") as fd:
        os.pwrite(fd, b"0" * 32, 0)
        data = json.dumps(raw).encode()
        atomicfile.write_atomic(tmp_path / "checkpoint.json", data, durable=True)
    assert set(CheckpointStore(tmp_path).load().claims) == {"old"}


def test_a_write_that_failed_is_not_brought_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    real = atomicfile.write_atomic

    def full_disk(path: Path, data: bytes, *, durable: bool, mode: int = 0o644) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomicfile, "write_atomic", full_disk)
    with pytest.raises(OSError, match="No space left"):
        store.update(add("b"), durable=True)
    monkeypatch.setattr(atomicfile, "write_atomic", real)
    assert set(store.load().claims) == {"a"}
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}, "after a restart too"
    store.update(add("c"), durable=True)
    assert set(CheckpointStore(tmp_path).load().claims) == {"a", "c"}


def test_a_write_that_was_not_durable_is_not_journaled(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("a"), durable=True)
    before_power_loss = (tmp_path / "checkpoint.json").read_bytes()
    store.update(add("started"), durable=False)
    (tmp_path / "checkpoint.json").write_bytes(before_power_loss)
    assert set(CheckpointStore(tmp_path).load().claims) == {"a"}
