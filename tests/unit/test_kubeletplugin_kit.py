"""The kubelet plugin kit (``dra_gpu.kubeletplugin``) driven by a fake driver, no GPU code.

That the kit imports none of the GPU driver's packages (devices, prepare, plugin, config), so
another DRA driver can use it as it is, is a contract of ``lint-imports`` (pyproject.toml).

Cases:
- the DRA gRPC adapter hands the kubelet's claims to the driver (deduplicated, in order) and
  its per-claim answers back: devices with CDI IDs, the share ID only in v1, a failed claim's
  error, an error for a claim without a name; unprepare answers every claim;
- the publisher publishes what the kit's slice encoder makes of the driver's devices (names,
  attribute kinds, quantities, the Node as owner) and republishes on a new inventory.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from fake_slice_store import FakeSliceStore

from dra_gpu.kubeletplugin import dra_service, grpcio_server, publisher, slices
from dra_gpu.kubeletplugin.driver import ClaimRef, PreparedDevice, PrepareResult
from dra_gpu.kubeletplugin.ids import CDIDeviceID, ClaimUID, DeviceName
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from e2e import waiting

NODE = "node-a"
DRIVER = "example.com"
WAIT_S = 20.0  # only bounds a broken test

wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S, every=0.01)


class FakeDriver:
    """Prepares every claim as one device, except claims named ``broken``; records the calls."""

    def __init__(self) -> None:
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []

    def prepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, PrepareResult]:
        self.prepared.append(list(refs))
        return {ref.uid: self._result(ref) for ref in refs}

    def unprepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, str]:
        self.unprepared.append(list(refs))
        return {ref.uid: "busy" if ref.name == "broken" else "" for ref in refs}

    @staticmethod
    def _result(ref: ClaimRef) -> PrepareResult:
        if ref.name == "broken":
            return PrepareResult(error=f"claim {ref}: broken", kind="Broken")
        device = PreparedDevice(
            request_names=("req",),
            pool_name=NODE,
            device_name=DeviceName(f"dev-{ref.uid}"),
            cdi_device_ids=(CDIDeviceID(f"example.com/dev=claim-{ref.uid}"),),
            share_id=f"share-{ref.uid}",
        )
        return PrepareResult(devices=(device,))


@dataclasses.dataclass
class Served:
    channel: grpc.Channel
    driver: FakeDriver


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    driver = FakeDriver()
    server = grpcio_server.GrpcioServer(
        dra_service.methods(driver),
        health=grpcio_server.health_servicer(),
        limits=grpcio_server.Limits(concurrent_rpcs=4, streams_per_connection=4),
    )
    socket = tmp_path / "dra.sock"
    server.add_address(f"unix:{socket}")
    server.start()
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        yield Served(channel, driver)
    server.stop(grace=0)


@pytest.mark.parametrize(
    ("pb", "grpc_mod", "has_share_id"),
    [
        pytest.param(dra_v1_pb2, dra_v1_pb2_grpc, True, id="v1"),
        pytest.param(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, False, id="v1beta1"),
    ],
)
def test_grpc_adapter_passes_claims_and_answers(
    served: Served, pb: ModuleType, grpc_mod: ModuleType, has_share_id: bool
) -> None:
    stub: Any = grpc_mod.DRAPluginStub(served.channel)
    claims = [
        pb.Claim(uid="u1", namespace="ns", name="good"),
        pb.Claim(uid="u2", namespace="ns", name="broken"),
        pb.Claim(uid="u1", namespace="ns", name="good"),  # the kubelet's repeat: once
        pb.Claim(uid="u3", namespace="ns", name=""),
    ]
    reply = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims), timeout=10)

    assert served.driver.prepared == [
        [ClaimRef(ClaimUID("u1"), "ns", "good"), ClaimRef(ClaimUID("u2"), "ns", "broken")]
    ]
    assert set(reply.claims) == {"u1", "u2", "u3"}
    (device,) = reply.claims["u1"].devices
    assert reply.claims["u1"].error == ""
    assert (device.device_name, device.pool_name, list(device.request_names)) == (
        "dev-u1",
        NODE,
        ["req"],
    )
    assert list(device.cdi_device_ids) == ["example.com/dev=claim-u1"]
    assert (getattr(device, "share_id", "") == "share-u1") is has_share_id
    assert reply.claims["u2"].error == "claim ns/broken: broken"
    assert not reply.claims["u2"].devices
    assert "required" in reply.claims["u3"].error

    gone = stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=claims[:2]), timeout=10
    )
    assert {uid: c.error for uid, c in gone.claims.items()} == {"u1": "", "u2": "busy"}


@dataclasses.dataclass(frozen=True)
class SemVer:
    major: int
    minor: int = 0
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@dataclasses.dataclass(frozen=True)
class Widget:
    """A device of some other driver: a name, attributes, capacities."""

    name: str
    attributes: Mapping[str, slices.AttributeValue]
    capacity: Mapping[str, int]
    partition: None = None  # consumes no shared counters


def widgets(*names: str) -> list[Widget]:
    return [
        Widget(
            n,
            {"model": "w1", "fast": True, "slots": 4, "firmware": SemVer(2, 1)},
            {"memory": 2 * 1024**3},
        )
        for n in names
    ]


def renderer(devices: Sequence[Widget]) -> publisher.Renderer:
    def render(node_uid: str) -> list[dict[str, Any]]:
        return slices.build_resource_slices(
            devices=devices,
            driver_name=DRIVER,
            node_name=NODE,
            pool_generation=0,
            node_owner=(NODE, node_uid),
        )

    return render


def published_devices(store: FakeSliceStore) -> list[dict[str, Any]]:
    return [d for s in store.slices.values() for d in s["spec"]["devices"]]


def test_publisher_publishes_the_drivers_devices() -> None:
    store = FakeSliceStore(node_uid="uid-of-node-a")
    pub = publisher.Publisher(
        store=store,
        node=NODE,
        driver=DRIVER,
        render=renderer(widgets("w-0", "w-1")),
        alive=lambda other: False,
    )
    stop = threading.Event()
    threads = pub.start(stop)
    try:
        assert pub.wait_synced(WAIT_S)
        (published,) = store.slices.values()
        assert published["spec"]["driver"] == DRIVER
        assert published["spec"]["nodeName"] == NODE
        assert published["metadata"]["ownerReferences"][0]["uid"] == "uid-of-node-a"
        assert published_devices(store)[0] == {
            "name": "w-0",
            "attributes": {
                "model": {"string": "w1"},
                "fast": {"bool": True},
                "slots": {"int": 4},
                "firmware": {"version": "2.1.0"},
            },
            "capacity": {"memory": {"value": "2Gi"}},
        }

        pub.set_inventory(renderer(widgets("w-0", "w-1", "w-2")))
        wait_for(
            "the new inventory",
            lambda: [d["name"] for d in published_devices(store)] == ["w-0", "w-1", "w-2"],
        )
    finally:
        stop.set()
        for t in threads:
            t.join(WAIT_S)
