"""The DRAPlugin gRPC adapter, served on a unix socket over the real prepare state.

Cases:
- v1 and v1beta1 prepare return per device request names, pool, device and CDI IDs; the share
  ID only in v1; a failing claim gets its error while the others succeed;
- a claim without namespace or name gets an error entry, the call still succeeds;
- unprepare answers every claim, known or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_claims import NODE, FakeFetcher, claim, device_state, inventory, result

from dra_gpu.kubeletplugin import dra_service, grpcio_server
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

INVENTORY = inventory()


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    fetcher = FakeFetcher(
        claim("u1", [result("gpu-0", share_id="s1")]),
        claim("u2", [result("gpu-1-mig-1g5gb-19-2", "mig")]),
    )
    state = device_state(tmp_path, devices=INVENTORY, claims=fetcher)
    state.start()
    server = grpcio_server.GrpcioServer(
        dra_service.methods(state),
        health=grpcio_server.health_servicer(),
        limits=grpcio_server.Limits(concurrent_rpcs=4, streams_per_connection=4),
    )
    socket = tmp_path / "dra.sock"
    server.add_address(f"unix:{socket}")
    server.start()
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        yield ch
    server.stop(grace=0)
    state.close()


def claims(pb: Any, *uids: str) -> list[Any]:
    return [pb.Claim(uid=u, namespace="default", name=f"claim-{u}") for u in uids]


@pytest.mark.parametrize(
    ("pb", "grpc_mod", "has_share_id"),
    [
        pytest.param(dra_v1_pb2, dra_v1_pb2_grpc, True, id="v1"),
        pytest.param(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc, False, id="v1beta1"),
    ],
)
def test_prepare_and_unprepare(
    channel: grpc.Channel, pb: Any, grpc_mod: Any, has_share_id: bool
) -> None:
    stub = grpc_mod.DRAPluginStub(channel)
    request = pb.NodePrepareResourcesRequest(claims=claims(pb, "u1", "u2", "missing"))
    response = stub.NodePrepareResources(request, timeout=10)
    assert set(response.claims) == {"u1", "u2", "missing"}
    u1 = response.claims["u1"]
    assert u1.error == ""
    [device] = u1.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["gpu"],
        NODE,
        "gpu-0",
    )
    assert list(device.cdi_device_ids) == ["k8s.gpu.nvidia.com/claim=u1-gpu-0"]
    if has_share_id:
        assert device.HasField("share_id") and device.share_id == "s1"
        assert not response.claims["u2"].devices[0].HasField("share_id")
    else:
        assert "share_id" not in pb.Device.DESCRIPTOR.fields_by_name
    assert response.claims["u2"].devices[0].request_names == ["mig"]
    assert "claim default/claim-missing not found" in response.claims["missing"].error
    assert response.claims["missing"].devices == []

    unprepared = stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=claims(pb, "u1", "u2", "missing")), timeout=10
    )
    assert {uid: r.error for uid, r in unprepared.claims.items()} == {
        "u1": "",
        "u2": "",
        "missing": "",
    }


def test_claim_without_name_gets_an_error_entry(channel: grpc.Channel) -> None:
    stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
    request = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(uid="u9", namespace="default"), *claims(dra_v1_pb2, "u1")]
    )
    response = stub.NodePrepareResources(request, timeout=10)
    assert "uid, namespace and name are all required" in response.claims["u9"].error
    assert response.claims["u1"].error == ""


def test_empty_call_succeeds(channel: grpc.Channel) -> None:
    stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
    assert (
        stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=10).claims == {}
    )
