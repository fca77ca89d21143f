"""Checkpoint: round trip, old and new formats, corruption, concurrent commits.

Cases:
- what one store writes another loads unchanged; no temp file is left behind;
- a version-1 file (never released) is refused as corrupt: moved aside, its records salvaged;
- a file with unknown fields (a newer plugin's) loads and keeps those fields when rewritten;
- a file needing a newer reader is refused and left untouched;
- garbage and schema violations are reported as corruption, the file moved aside, not lost;
- one bad record drops only itself: the valid records of a corrupt file are saved in its place,
  completed by the store's ``rebuild``;
- temp files of a writer killed mid-write are removed, never a live writer's;
- a failing mutation changes nothing while others in the same batch commit;
- two stores on one directory (rolling update) see each other's writes;
- when a write returns, ``checkpoint.json`` has it for a reader that takes no lock;
- a lock held by another process fails reads and writes after the store's bounded wait, naming
  the lock file and the holder's PID; they work again once it is released.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from lock_holder import held_by_another_process

from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    SCHEMA_VERSION,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointStore,
    CheckpointTooNew,
    ClaimRecord,
    DeviceRecord,
    EncodedRecords,
    decode,
    encode,
    read_boot_id,
)

DEVICE = DeviceRecord(
    request_names=("gpu",),
    pool="node-a",
    device="gpu-0",
    cdi_device_ids=("k8s.gpu.nvidia.com/claim=uid-1-gpu-0",),
    type="gpu",
    uuid="GPU-1",
    minor=0,
    product_name="NVIDIA H200",
    config={"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
)
RECORD = ClaimRecord(state=PREPARE_COMPLETED, namespace="ns", name="c", devices=(DEVICE,))


def file_text(state_dir: Path) -> str:
    """The file as an operator (or anything that takes no lock) reads it."""
    return (state_dir / "checkpoint.json").read_text()


def add(uid: str, record: ClaimRecord = RECORD) -> Callable[[Checkpoint], Checkpoint]:
    return lambda cp: cp.with_claim(uid, record)


def test_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.load() == Checkpoint()
    store.update(lambda cp: cp.with_boot_id("boot-1"), durable=False)
    written = store.update(add("uid-1"), durable=True)
    loaded = CheckpointStore(tmp_path).load()
    assert loaded == written
    assert loaded.claims["uid-1"].devices[0].uuid == "GPU-1"
    assert loaded.boot_id == "boot-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "checkpoint.lock"]
    assert json.loads(file_text(tmp_path))["version"] == SCHEMA_VERSION


VERSION_1 = {
    "version": 1,
    "claims": {
        "uid-1": {
            "state": "PrepareCompleted",
            "namespace": "ns",
            "name": "c",
            "devices": [
                {
                    "request_names": ["gpu"],
                    "pool": "node-a",
                    "device": "gpu-0",
                    "cdi_device_ids": ["k8s.gpu.nvidia.com/claim=uid-1-gpu-0"],
                }
            ],
        }
    },
}


def test_version_1_file_is_refused_and_its_records_salvaged(tmp_path: Path) -> None:
    content = json.dumps(VERSION_1)
    (tmp_path / "checkpoint.json").write_text(content)
    store = CheckpointStore(tmp_path, clock=lambda: 0.0)
    with pytest.raises(CheckpointCorrupt, match="schema version 1 was never released") as info:
        store.load()
    assert info.value.moved_to.read_text() == content
    loaded = store.load()
    assert loaded.boot_id == ""
    device = loaded.claims["uid-1"].devices[0]
    assert (device.device, device.uuid, device.config) == ("gpu-0", None, None)


def test_unknown_fields_load_and_survive_a_rewrite(tmp_path: Path) -> None:
    newer = json.loads(
        CheckpointStore(tmp_path).update(add("uid-1"), durable=False).model_dump_json()
    )
    newer["version"] = SCHEMA_VERSION + 1
    newer["futureTopLevel"] = {"x": 1}
    newer["claims"]["uid-1"]["futureClaimField"] = "kept"
    newer["claims"]["uid-1"]["devices"][0]["futureDeviceField"] = 7
    (tmp_path / "checkpoint.json").write_text(json.dumps(newer))
    store = CheckpointStore(tmp_path)
    assert store.load().claims["uid-1"].state == PREPARE_COMPLETED
    store.update(add("uid-2"), durable=True)
    rewritten = json.loads(file_text(tmp_path))
    assert rewritten["futureTopLevel"] == {"x": 1}
    assert rewritten["claims"]["uid-1"]["futureClaimField"] == "kept"
    assert rewritten["claims"]["uid-1"]["devices"][0]["futureDeviceField"] == 7
    assert set(rewritten["claims"]) == {"uid-1", "uid-2"}


def test_incompatible_newer_file_is_refused_and_kept(tmp_path: Path) -> None:
    content = json.dumps({"version": 9, "compatible_version": 9, "claims": {}})
    (tmp_path / "checkpoint.json").write_text(content)
    with pytest.raises(CheckpointTooNew, match="reads schema 9"):
        CheckpointStore(tmp_path).load()
    assert (tmp_path / "checkpoint.json").read_text() == content


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(b'{"version": 2, "claims": {', "Expecting", id="truncated"),
        pytest.param(b"\x00\x00\x00", "Expecting value", id="zeros"),
        pytest.param(b"[]", "top level is a list", id="not-object"),
        pytest.param(b'{"claims": {}}', "no valid schema version", id="no-version"),
        pytest.param(
            b'{"version": 2, "claims": {"u": {"state": "Bogus", "namespace": "n", "name": "c"}}}',
            "claims.u.state",
            id="bad-state",
        ),
    ],
)
def test_corruption_is_reported_and_file_moved_aside(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    (tmp_path / "checkpoint.json").write_bytes(content)
    store = CheckpointStore(tmp_path, clock=lambda: 0.0)
    with pytest.raises(CheckpointCorrupt) as info:
        store.load()
    assert reason in str(info.value)
    assert info.value.moved_to == tmp_path / "checkpoint.json.corrupt-19700101T000000Z"
    assert info.value.moved_to.read_bytes() == content
    assert store.load().claims == {}  # keeps serving with what could be saved: nothing
    assert CheckpointStore(tmp_path).load().claims == {}, "the salvage is on disk"
    (tmp_path / "checkpoint.json").write_bytes(content)
    with pytest.raises(CheckpointCorrupt) as again:
        store.load()
    assert again.value.moved_to.name.endswith("-2"), "a second corrupt file never overwrites"


def test_one_bad_record_drops_only_itself(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, clock=lambda: 0.0)
    store.update(add("good-1"), durable=True)
    store.update(add("good-2"), durable=True)
    raw = json.loads(file_text(tmp_path))
    raw["claims"]["bad"] = {**raw["claims"]["good-1"], "devices": [{"device": 7}]}
    (tmp_path / "checkpoint.json").write_text(json.dumps(raw))
    rebuilt = RECORD.model_copy(update={"name": "from-elsewhere", "from_spec": True})
    store = CheckpointStore(tmp_path, rebuild=add("extra", rebuilt))
    with pytest.raises(CheckpointCorrupt) as info:
        store.load()
    assert "kept 2 claim record(s), rebuilt 1, dropped: claim bad: devices.0.pool" in str(
        info.value
    )
    on_disk = CheckpointStore(tmp_path).load()
    assert on_disk.claims == {"good-1": RECORD, "good-2": RECORD, "extra": rebuilt}
    assert on_disk.boot_id == raw["boot_id"]


def test_failing_mutation_changes_nothing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(add("uid-1"), durable=True)

    def boom(cp: Checkpoint) -> Checkpoint:
        raise ValueError("device taken")

    with pytest.raises(ValueError, match="device taken"):
        store.update(boom, durable=True)
    assert set(CheckpointStore(tmp_path).load().claims) == {"uid-1"}


def test_concurrent_updates_all_commit(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            started = ClaimRecord(state=PREPARE_STARTED, namespace="ns", name=f"c{i}")
            store.update(add(f"uid-{i}", started), durable=False)
            if i % 5 == 0:
                with pytest.raises(KeyError):
                    store.update(lambda cp: (_ for _ in ()).throw(KeyError(i)), durable=True)
            store.update(add(f"uid-{i}"), durable=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    claims = CheckpointStore(tmp_path).load().claims
    assert set(claims) == {f"uid-{i}" for i in range(32)}
    assert {c.state for c in claims.values()} == {PREPARE_COMPLETED}


def test_two_stores_see_each_others_writes(tmp_path: Path) -> None:
    a, b = CheckpointStore(tmp_path), CheckpointStore(tmp_path)
    a.update(add("uid-a"), durable=True)
    assert set(b.load().claims) == {"uid-a"}
    b.update(add("uid-b"), durable=True)
    a.update(lambda cp: cp.without_claim("uid-b"), durable=True)
    assert set(b.load().claims) == {"uid-a"}


def test_boot_id(tmp_path: Path) -> None:
    assert len(read_boot_id()) == 36
    (tmp_path / "boot_id").write_text("abc\n")
    assert read_boot_id(tmp_path / "boot_id") == "abc"


def test_change_with_same_file_identity_is_seen_through_the_token(tmp_path: Path) -> None:
    """Inode numbers are reused and timestamps are coarse: the lock file's token decides."""
    a = CheckpointStore(tmp_path)
    a.update(add("uid-1"), durable=False)
    path = tmp_path / "checkpoint.json"
    before = path.stat()
    # Another instance writes same-size content; the file keeps inode, size and mtime.
    with open(tmp_path / "checkpoint.lock", "r+b") as lock:
        lock.write(b"f" * 32)
    with open(path, "r+b") as f:
        f.write(path.read_bytes().replace(b"uid-1", b"uid-2"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert set(a.load().claims) == {"uid-2"}


def test_temp_files_of_a_live_writer_are_kept(tmp_path: Path) -> None:
    """Another instance (its own PID namespace, maybe the same PID) is mid-commit: its temp file
    goes only when the sweep gets the lock, and by then the writer has renamed it."""
    store = CheckpointStore(tmp_path)
    store.update(add("uid-1"), durable=True)
    theirs = CheckpointStore(tmp_path).load().without_claim("uid-1").with_claim("uid-2", RECORD)
    dead = tmp_path / f".checkpoint.json.tmp-{os.getpid()}"
    dead.write_bytes(b"{half a fi")
    live = tmp_path / ".checkpoint.json.tmp-1"
    swept: list[int] = []
    sweeper = threading.Thread(target=lambda: swept.append(store.remove_temp_files()))
    with atomicfile.locked(tmp_path / "checkpoint.lock", timeout_s=10):  # the other writer's
        live.write_bytes(encode(theirs))
        sweeper.start()
        sweeper.join(0.5)
        assert sweeper.is_alive() and live.exists() and dead.exists()
        os.replace(live, tmp_path / "checkpoint.json")
    sweeper.join(10)
    assert swept == [1] and not dead.exists()
    assert set(CheckpointStore(tmp_path).load().claims) == {"uid-2"}


def test_every_returned_write_is_in_the_file_for_a_reader_without_the_lock(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for durable in (True, False):
        store.update(add("uid-1"), durable=durable)
        assert "uid-1" in json.loads(file_text(tmp_path))["claims"]
        store.update(lambda cp: cp.without_claim("uid-1"), durable=durable)
        assert "uid-1" not in json.loads(file_text(tmp_path))["claims"]


def test_a_lock_held_elsewhere_fails_a_write_after_the_bounded_wait_naming_its_holder(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path, lock_timeout_s=0.2)
    store.update(add("uid-1"), durable=True)
    lock = tmp_path / "checkpoint.lock"
    with held_by_another_process(lock) as pid:
        with pytest.raises(atomicfile.LockTimeout) as info:
            store.update(add("uid-2"), durable=True)
        assert str(info.value) == f"lock {lock} not taken within 0.2 s: held by PID {pid}"
        # A reader never waits for a commit: the file is replaced by a rename, whole.
        assert set(CheckpointStore(tmp_path, lock_timeout_s=0.2).load().claims) == {"uid-1"}
    store.update(add("uid-2"), durable=True)
    assert set(CheckpointStore(tmp_path).load().claims) == {"uid-1", "uid-2"}


def test_a_commit_reusing_records_json_writes_what_a_full_encode_writes() -> None:
    """The store's commits keep each record's JSON while the record is unchanged: what they
    write must read back as the checkpoint, a newer plugin's extra fields included."""
    device = DeviceRecord(pool="node", device="gpu-0", uuid="GPU-0", type="gpu")
    first = Checkpoint(boot_id="b", generation=3).with_claim(
        "uid-1", ClaimRecord(state="PrepareCompleted", namespace="ns", name="a", devices=(device,))
    )
    encoded: EncodedRecords = {}
    assert decode(encode(first, encoded)) == first
    changed = ClaimRecord(state="PrepareCompleted", namespace="ns", name="b", devices=(device,))
    second = first.with_claim("uid-2", changed).with_claim(
        "uid-1", first.claims["uid-1"].model_copy(update={"name": "renamed"})
    )
    newer = Checkpoint.model_validate({**second.model_dump(), "future_field": {"x": 1}})
    for cp in (second, newer, first.without_claim("uid-1")):
        data = encode(cp, encoded)
        assert decode(data) == cp
        assert json.loads(data) == json.loads(encode(cp))
        assert set(encoded) == set(cp.claims)
