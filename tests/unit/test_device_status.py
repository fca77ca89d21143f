"""ResourceClaim device status: what a prepared claim's ``status.devices`` says (the driver's
``prepare.device_status``), and how the kit writes it (``kubeletplugin.claim_status``: one
thread, after a settle time, retried with backoff, permanent errors dropped).

Cases: a full GPU's and a dynamically created MIG device's data (the MIG UUID it got at
prepare, which the slices never had); other drivers' entries and our other devices are kept, a
repeat writes nothing; the writer writes after a prepare, retries an unanswered write with
doubling backoff, drops a claim that is gone or replaced (no write) and a Forbidden write
(naming the permission), stops writing where the server drops the field; only successful
prepares are written; a claim unprepared within the settle time is never written, repeated
prepares within it give one write; a full queue drops, never blocks.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from dra_gpu.devices import naming, partitions, simulated
from dra_gpu.devices.model import Device
from dra_gpu.kube import errors
from dra_gpu.kubeletplugin import claim_status
from dra_gpu.kubeletplugin.driver import ClaimRef, PreparedDevice, PrepareResult
from dra_gpu.kubeletplugin.ids import ClaimUID, DeviceName
from dra_gpu.prepare import device_status
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, Checkpoint, ClaimRecord, DeviceRecord

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
NOW = "2026-12-02T00:00:00Z"
REF = ClaimRef(uid=ClaimUID("uid-1"), namespace="ns", name="claim")


def inventory(profile: str = "h200x8", *, dynamic: bool = False) -> dict[str, Device]:
    backend: Any = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES[profile], node_name=NODE
    )
    if dynamic:
        backend = partitions.DynamicMigBackend(backend)
    return {d.name: d for d in naming.build_devices(backend.discover().gpus)}


def gpu_record(dev: Device, *, share_id: str | None = None) -> DeviceRecord:
    return DeviceRecord(
        request_names=("gpu",),
        pool=NODE,
        device=dev.name,
        share_id=share_id,
        type="gpu",
        uuid=dev.uuid,
        minor=dev.gpu.minor,
        product_name=dev.gpu.product_name,
    )


def claim_record(*devices: DeviceRecord) -> ClaimRecord:
    return ClaimRecord(state=PREPARE_COMPLETED, namespace="ns", name="claim", devices=devices)


def test_full_gpu_data_is_what_nvidia_publishes() -> None:
    inv = inventory()
    gpu = inv["gpu-5"]
    (entry,) = device_status.entries(
        driver=DRIVER, record=claim_record(gpu_record(gpu)), inventory=inv, now=NOW
    )
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, "gpu-5")
    assert entry["data"] == {
        "type": "gpu",
        "uuid": gpu.uuid,
        "productName": "NVIDIA H200",
        "driverVersion": "580.159.4",
        "pciBusID": "0000:ab:00.0",
    }
    (ready,) = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    assert "shareID" not in entry


def test_a_created_mig_device_carries_the_uuid_it_got() -> None:
    inv = inventory("h100x8-mig", dynamic=True)
    name = "gpu-2-mig-3g40gb-9-4"
    assert inv[name].uuid is None  # published before it exists: no uuid in the slices
    record = DeviceRecord(
        pool=NODE,
        device=name,
        type="mig",
        uuid="MIG-created-at-prepare",
        minor=2,
        product_name="NVIDIA H100 80GB HBM3",
        mig_profile="3g.40gb",
        gi_id=1,
        ci_id=0,
    )
    (entry,) = device_status.entries(
        driver=DRIVER, record=claim_record(record), inventory=inv, now=NOW
    )
    assert entry["data"]["uuid"] == "MIG-created-at-prepare"
    assert entry["data"]["profile"] == "3g.40gb"
    assert entry["data"]["parentUUID"] == inv["gpu-2-mig-1g10gb-19-0"].gpu.uuid
    assert entry["data"]["type"] == "mig"


def test_a_repeat_at_a_later_time_is_the_same_and_new_data_is_not() -> None:
    inv = inventory()
    record = claim_record(gpu_record(inv["gpu-0"]))
    ours = device_status.entries(driver=DRIVER, record=record, inventory=inv, now=NOW)
    later = device_status.entries(
        driver=DRIVER, record=record, inventory=inv, now="2026-12-02T01:00:00Z"
    )
    assert claim_status.same_entries(ours, later)
    stale: Any = [{**ours[0], "data": {"uuid": "old"}}]
    assert not claim_status.same_entries(stale, later)


def test_shared_allocations_are_told_apart_by_share_id() -> None:
    inv = inventory()
    a, b = (
        device_status.entries(
            driver=DRIVER,
            record=claim_record(gpu_record(inv["gpu-0"], share_id=share)),
            inventory=inv,
            now=NOW,
        )
        for share in ("s-1", "s-2")
    )
    assert [e["shareID"] for e in (*a, *b)] == ["s-1", "s-2"]
    body = claim_status.apply_body(REF, a)
    assert body["status"] == {"devices": a}
    assert body["metadata"]["uid"] == REF.uid


def test_backoff_doubles_from_half_a_second_to_thirty() -> None:
    assert [claim_status.backoff(n) for n in range(1, 9)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
    ]


class FakeClient:
    """The claim in the API server, which merges each apply of ``status.devices`` by entry key
    as the real one does; ``fail``: errors raised by the next requests, in order."""

    def __init__(self, claim: dict[str, Any] | None, *, keeps_devices: bool = True) -> None:
        self.claim = claim
        self.keeps_devices = keeps_devices
        self.fail: list[errors.ApiError] = []
        self.applies: list[dict[str, Any]] = []

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "",
        timeout_s: float = 0.0,
    ) -> dict[str, Any]:
        if self.fail:
            raise self.fail.pop(0)
        assert (method, path, content_type) == (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim/status",
            "application/apply-patch+yaml",
        )
        assert query == {"fieldManager": f"{DRIVER}/kubelet-plugin", "force": "true"}
        if self.claim is None:
            raise errors.NotFound("not found", status=404)
        assert body is not None
        if body["metadata"]["uid"] != self.claim["metadata"]["uid"]:
            raise errors.ApiError(
                f'ResourceClaim "claim" is invalid: metadata.uid: Invalid value: '
                f'"{body["metadata"]["uid"]}": field is immutable',
                status=422,
            )
        self.applies.append(dict(body))
        applied = {claim_status.key(e): e for e in body["status"]["devices"]}
        status = dict(self.claim.get("status") or {})
        kept = [e for e in status.get("devices") or [] if claim_status.key(e) not in applied]
        if self.keeps_devices:
            status["devices"] = kept + list(applied.values())
        self.claim = {**self.claim, "status": status}
        return self.claim


def api_claim(uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"name": "claim", "namespace": "ns", "uid": uid, "resourceVersion": "7"},
        "status": {
            "allocation": {"devices": {"results": []}},
            "devices": [{"driver": "other.example.com", "pool": "p", "device": "d"}],
        },
    }


@pytest.fixture
def results() -> queue.Queue[str]:
    return queue.Queue()


class Records:
    """The checkpoint in memory, as ``entries_of`` reads it."""

    def __init__(self, record: ClaimRecord | None) -> None:
        self.checkpoint = Checkpoint(claims={REF.uid: record} if record is not None else {})

    def peek(self) -> Checkpoint:
        return self.checkpoint


def writer_for(
    client: FakeClient,
    results: queue.Queue[str],
    record: ClaimRecord | Records | None,
    **kw: Any,
) -> claim_status.ClaimStatusWriter:
    inv = inventory()
    records = record if isinstance(record, Records) else Records(record)
    kw.setdefault("settle_s", 0.0)
    return claim_status.ClaimStatusWriter(
        client,
        driver=DRIVER,
        entries_of=device_status.entries_of(records, driver=DRIVER, inventory=lambda: inv),
        observe=results.put,
        forbidden_hint="resourceclaims/driver associated-node:update",
        first_backoff_s=0.001,
        **kw,
    )


@pytest.fixture
def record() -> ClaimRecord:
    return claim_record(gpu_record(inventory()["gpu-3"]))


@pytest.fixture
def running(request: pytest.FixtureRequest) -> Iterator[list[claim_status.ClaimStatusWriter]]:
    started: list[claim_status.ClaimStatusWriter] = []
    yield started
    for w in started:
        w.stop()


def start(
    running: list[claim_status.ClaimStatusWriter], w: claim_status.ClaimStatusWriter
) -> claim_status.ClaimStatusWriter:
    w.start()
    running.append(w)
    return w


def next_result(results: queue.Queue[str]) -> str:
    return results.get(timeout=30)  # bounds a broken writer only


def test_writes_our_entry_beside_the_others_without_reading_the_claim(
    results: queue.Queue[str], record: ClaimRecord, running: list[Any]
) -> None:
    client = FakeClient(api_claim())
    w = start(running, writer_for(client, results, record))
    w.submit(REF)
    assert next_result(results) == "written"
    (applied,) = client.applies
    (ours,) = applied["status"]["devices"]  # only ours: the server keeps the rest
    assert (ours["device"], ours["data"]["uuid"]) == ("gpu-3", record.devices[0].uuid)
    assert client.claim is not None
    other, stored = client.claim["status"]["devices"]
    assert other["driver"] == "other.example.com"
    assert stored == ours
    assert client.claim["status"]["allocation"] == {"devices": {"results": []}}

    w.submit(REF)  # the kubelet's repeated prepare: nothing new to say
    assert next_result(results) == "unchanged"
    assert len(client.applies) == 1


def test_unanswered_writes_are_retried_then_written(
    results: queue.Queue[str], record: ClaimRecord, running: list[Any]
) -> None:
    client = FakeClient(api_claim())
    client.fail = [
        errors.ApiUnavailable("no answer"),
        errors.Conflict("the object has been modified", status=409),
    ]
    w = start(running, writer_for(client, results, record))
    w.submit(REF)
    assert [next_result(results) for _ in range(3)] == ["retry", "retry", "written"]
    assert len(client.applies) == 1


@pytest.mark.parametrize(
    ("claim", "fail"),
    [
        (None, None),
        (api_claim(uid="another"), None),
        (api_claim(), errors.ApiError("forbidden", status=403)),
        (api_claim(), errors.ApiError("invalid", status=422)),
        (
            api_claim(),
            errors.ApiError(
                'status.devices: Forbidden: changing status.devices requires resource="resource'
                'claims/driver" ... permission',
                status=422,
            ),
        ),
        (api_claim(), errors.Gone("gone", status=410)),
    ],
    ids=["not-found", "replaced-uid", "forbidden", "invalid", "driver-permission", "gone"],
)
def test_permanent_failures_are_dropped_with_one_line(
    results: queue.Queue[str],
    record: ClaimRecord,
    running: list[Any],
    caplog: pytest.LogCaptureFixture,
    claim: dict[str, Any] | None,
    fail: errors.ApiError | None,
) -> None:
    client = FakeClient(claim)
    client.fail = [fail] if fail is not None else []
    w = start(running, writer_for(client, results, record))
    with caplog.at_level(logging.WARNING, logger="dra_gpu.kubeletplugin.claim_status"):
        w.submit(REF)
        assert next_result(results) == "dropped"
    assert client.applies == []
    (line,) = [r.getMessage() for r in caplog.records]
    assert "ns/claim" in line
    hinted = fail is not None and (fail.status == 403 or "permission" in fail.message)
    assert ("needs resourceclaims/driver associated-node:update" in line) is hinted


def test_an_unprepared_claim_is_not_written(results: queue.Queue[str], running: list[Any]) -> None:
    client = FakeClient(api_claim())
    w = start(running, writer_for(client, results, None))
    w.submit(REF)
    assert next_result(results) == "dropped"
    assert client.applies == []


def test_a_server_that_drops_the_field_switches_the_writer_off(
    results: queue.Queue[str],
    record: ClaimRecord,
    running: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FakeClient(api_claim(), keeps_devices=False)
    w = start(running, writer_for(client, results, record))
    with caplog.at_level(logging.WARNING, logger="dra_gpu.kubeletplugin.claim_status"):
        w.submit(REF)
        assert next_result(results) == "unsupported"
    assert any("DRAResourceClaimDeviceStatus" in r.getMessage() for r in caplog.records)
    w.submit(REF)
    w.stop()
    assert results.empty() and len(client.applies) == 1


def test_a_full_queue_drops_without_blocking(
    results: queue.Queue[str], record: ClaimRecord
) -> None:
    w = writer_for(FakeClient(api_claim()), results, record, queue_size=1)  # not started
    w.submit(REF)
    w.submit(REF)  # a repeat of a claim waiting: nothing more to keep
    assert results.empty()
    w.submit(ClaimRef(uid=ClaimUID("uid-2"), namespace="ns", name="other"))
    assert results.get_nowait() == "dropped"


def test_only_prepared_claims_are_written_and_unprepared_ones_never(
    results: queue.Queue[str], record: ClaimRecord, running: list[Any]
) -> None:
    client = FakeClient(api_claim())
    records = Records(record)
    w = start(running, writer_for(client, results, records, settle_s=0.3))
    failed = ClaimRef(uid=ClaimUID("uid-2"), namespace="ns", name="bad")
    device = PreparedDevice(("gpu",), NODE, DeviceName("gpu-0"), ())
    answers = {REF.uid: PrepareResult(devices=(device,)), failed.uid: PrepareResult(error="no")}
    for _ in range(3):  # the kubelet's repeats within the settle time: one write
        w.prepared([REF, failed], answers, 0.001)
    assert next_result(results) == "written"
    assert len(client.applies) == 1

    # Prepared again, then unprepared before the settle time is over: nothing is written.
    w.unprepared([REF], {REF.uid: ""}, 0.001)
    w.prepared([REF], answers, 0.001)
    w.unprepared([REF], {REF.uid: ""}, 0.001)
    records.checkpoint = Checkpoint()
    w.prepared([failed], answers, 0.001)
    time.sleep(0.9)  # three settle times: a write due would have been made by now
    assert results.empty() and len(client.applies) == 1


def test_a_due_write_waits_for_the_calls_in_flight_at_most_yield_s(
    results: queue.Queue[str], record: ClaimRecord, running: list[Any]
) -> None:
    """A burst's answers first: the status writes wait until no call is in flight, and a node
    that is never idle still gets its status within the bound."""
    client = FakeClient(api_claim())
    w = start(running, writer_for(client, results, record, yield_s=60.0))
    device = PreparedDevice(("gpu",), NODE, DeviceName("gpu-0"), ())
    w.started("prepare")
    w.started("prepare")  # another call of the burst, still running
    w.prepared([REF], {REF.uid: PrepareResult(devices=(device,))}, 0.001)
    time.sleep(0.5)
    assert results.empty() and client.applies == []
    w.unprepared([], {}, 0.001)  # the last call of the burst ends
    assert next_result(results) == "written"

    bounded = start(running, writer_for(FakeClient(api_claim()), results, record, yield_s=0.3))
    bounded.started("prepare")
    bounded.started("prepare")  # never ends
    bounded.prepared([REF], {REF.uid: PrepareResult(devices=(device,))}, 0.001)
    assert next_result(results) == "written"
