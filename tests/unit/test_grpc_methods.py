"""The generated services answer on exactly the gRPC method names the kubelet calls.

Real gRPC servers listen on unix sockets, laid out like a deployed plugin: the registration
service on its own socket, and both DRAPlugin versions plus both health versions on the DRA
socket. Clients call them by raw method name (written out here, not taken from generated code),
so a wrong proto package or service name fails these tests.

Cases:
- every kubelet method name reaches its servicer and the answer round-trips;
- the health stream (both versions) delivers every message in order;
- a method name outside the protocol is UNIMPLEMENTED (the names above are not catch-alls).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu.pb import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

DRIVER = "gpu.example.com"
CALL_TIMEOUT_S = 10  # only so that a broken server fails the test instead of hanging it


def prepare_response(request: Any, pb: Any) -> Any:
    # Echoes each claim into its device so the caller can tell the servicer really ran.
    resp = pb.NodePrepareResourcesResponse()
    for claim in request.claims:
        device = pb.Device(
            request_names=["gpu"],
            pool_name=claim.namespace,
            device_name=claim.name,
            cdi_device_ids=[f"k8s.{DRIVER}/claim={claim.uid}"],
        )
        resp.claims[claim.uid].devices.append(device)
    return resp


def unprepare_response(request: Any, pb: Any) -> Any:
    resp = pb.NodeUnprepareResourcesResponse()
    for claim in request.claims:
        resp.claims[claim.uid].error = "" if claim.name else f"claim {claim.uid} has no name"
    return resp


class DraV1(dra_v1_pb2_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        resp: dra_v1_pb2.NodePrepareResourcesResponse = prepare_response(request, dra_v1_pb2)
        for result in resp.claims.values():
            result.devices[0].share_id = "share-0"
        return resp

    def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        result: dra_v1_pb2.NodeUnprepareResourcesResponse = unprepare_response(request, dra_v1_pb2)
        return result


class DraV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def NodePrepareResources(
        self, request: dra_v1beta1_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        result: dra_v1beta1_pb2.NodePrepareResourcesResponse = prepare_response(
            request, dra_v1beta1_pb2
        )
        return result

    def NodeUnprepareResources(
        self, request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        result: dra_v1beta1_pb2.NodeUnprepareResourcesResponse = unprepare_response(
            request, dra_v1beta1_pb2
        )
        return result


class Registration(pluginregistration_v1_pb2_grpc.RegistrationServicer):
    def __init__(self, *, endpoint: str) -> None:
        self.endpoint = endpoint
        self.statuses: list[pluginregistration_v1_pb2.RegistrationStatus] = []

    def GetInfo(
        self, request: pluginregistration_v1_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_v1_pb2.PluginInfo:
        return pluginregistration_v1_pb2.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=self.endpoint,
            supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
        )

    def NotifyRegistrationStatus(
        self, request: pluginregistration_v1_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_v1_pb2.RegistrationStatusResponse:
        self.statuses.append(request)
        return pluginregistration_v1_pb2.RegistrationStatusResponse()


def health_updates(pb: Any) -> list[Any]:
    """Two complete device lists: gpu-0 healthy, then gpu-0 unhealthy."""
    return [
        pb.NodeWatchResourcesResponse(
            devices=[
                pb.DeviceHealth(
                    device=pb.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
                    health=health,
                    last_updated_time=1_767_225_600 + i,
                    health_check_timeout_seconds=30,
                    message=message,
                )
            ]
        )
        for i, (health, message) in enumerate(
            [(pb.HEALTHY, ""), (pb.UNHEALTHY, "XID 79: GPU has fallen off the bus")]
        )
    ]


class HealthV1alpha1(health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def NodeWatchResources(
        self, request: health_v1alpha1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        yield from health_updates(health_v1alpha1_pb2)


class HealthV1(health_v1_pb2_grpc.DRAResourceHealthServicer):
    def NodeWatchResources(
        self, request: health_v1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[health_v1_pb2.NodeWatchResourcesResponse]:
        yield from health_updates(health_v1_pb2)


@dataclass(frozen=True)
class Sockets:
    registration: str
    dra: str
    registrar: Registration


def serve(path: str, register: Callable[[grpc.Server], None]) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    register(server)
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise RuntimeError(f"cannot listen on unix socket {path}")
    server.start()
    return server


@pytest.fixture(scope="module")
def sockets() -> Iterator[Sockets]:
    # Short base dir: unix socket paths are limited to 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="dra-pb-", dir="/tmp"))
    dra_path = str(tmp / "dra.sock")
    reg_path = str(tmp / f"{DRIVER}-reg.sock")
    registrar = Registration(endpoint=dra_path)

    def register_dra(server: grpc.Server) -> None:
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1(), server)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1beta1(), server)
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1alpha1(), server)
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(), server)

    def register_registration(server: grpc.Server) -> None:
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(registrar, server)

    servers: list[grpc.Server] = []
    try:
        # Same order as a real plugin: the DRA socket exists before the kubelet can see the
        # registration socket.
        servers.append(serve(dra_path, register_dra))
        servers.append(serve(reg_path, register_registration))
        yield Sockets(registration=reg_path, dra=dra_path, registrar=registrar)
    finally:
        for server in servers:
            server.stop(grace=None).wait()
        shutil.rmtree(tmp, ignore_errors=True)


def claims(pb: Any) -> list[Any]:
    return [
        pb.Claim(namespace="ns-a", uid="uid-1", name="claim-1"),
        pb.Claim(namespace="ns-b", uid="uid-2", name=""),
    ]


def expected_prepare(pb: Any, *, share_id: bool) -> Any:
    resp = pb.NodePrepareResourcesResponse()
    for claim in claims(pb):
        device = pb.Device(
            request_names=["gpu"],
            pool_name=claim.namespace,
            device_name=claim.name,
            cdi_device_ids=[f"k8s.{DRIVER}/claim={claim.uid}"],
        )
        if share_id:
            device.share_id = "share-0"
        resp.claims[claim.uid].devices.append(device)
    return resp


def expected_unprepare(pb: Any) -> Any:
    resp = pb.NodeUnprepareResourcesResponse()
    resp.claims["uid-1"].error = ""
    resp.claims["uid-2"].error = "claim uid-2 has no name"
    return resp


@dataclass(frozen=True)
class UnaryCase:
    method: str
    request: Any
    expected: Any


UNARY_CASES = [
    UnaryCase(
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        dra_v1_pb2.NodePrepareResourcesRequest(claims=claims(dra_v1_pb2)),
        expected_prepare(dra_v1_pb2, share_id=True),
    ),
    UnaryCase(
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims(dra_v1_pb2)),
        expected_unprepare(dra_v1_pb2),
    ),
    UnaryCase(
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=claims(dra_v1beta1_pb2)),
        expected_prepare(dra_v1beta1_pb2, share_id=False),
    ),
    UnaryCase(
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        dra_v1beta1_pb2.NodeUnprepareResourcesRequest(claims=claims(dra_v1beta1_pb2)),
        expected_unprepare(dra_v1beta1_pb2),
    ),
]


@pytest.mark.parametrize("case", UNARY_CASES, ids=[c.method for c in UNARY_CASES])
def test_unary_method_by_raw_name(sockets: Sockets, case: UnaryCase) -> None:
    with grpc.insecure_channel(f"unix://{sockets.dra}") as channel:
        call = channel.unary_unary(
            case.method,
            request_serializer=type(case.request).SerializeToString,
            response_deserializer=type(case.expected).FromString,
        )
        assert call(case.request, timeout=CALL_TIMEOUT_S) == case.expected


def test_get_info_by_raw_name_points_kubelet_at_dra_socket(sockets: Sockets) -> None:
    with grpc.insecure_channel(f"unix://{sockets.registration}") as channel:
        get_info = channel.unary_unary(
            "/pluginregistration.Registration/GetInfo",
            request_serializer=pluginregistration_v1_pb2.InfoRequest.SerializeToString,
            response_deserializer=pluginregistration_v1_pb2.PluginInfo.FromString,
        )
        info = get_info(pluginregistration_v1_pb2.InfoRequest(), timeout=CALL_TIMEOUT_S)
    assert info == pluginregistration_v1_pb2.PluginInfo(
        type="DRAPlugin",
        name=DRIVER,
        endpoint=sockets.dra,
        supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )


def test_registration_status_by_raw_name_reaches_plugin(sockets: Sockets) -> None:
    status = pluginregistration_v1_pb2.RegistrationStatus(
        plugin_registered=False, error="version not supported"
    )
    with grpc.insecure_channel(f"unix://{sockets.registration}") as channel:
        notify = channel.unary_unary(
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            request_serializer=pluginregistration_v1_pb2.RegistrationStatus.SerializeToString,
            response_deserializer=pluginregistration_v1_pb2.RegistrationStatusResponse.FromString,
        )
        notify(status, timeout=CALL_TIMEOUT_S)
    assert sockets.registrar.statuses[-1] == status


@pytest.mark.parametrize(
    ("method", "pb"),
    [
        ("/v1alpha1.DRAResourceHealth/NodeWatchResources", health_v1alpha1_pb2),
        ("/v1.DRAResourceHealth/NodeWatchResources", health_v1_pb2),
    ],
    ids=["v1alpha1", "v1"],
)
def test_health_stream_by_raw_name(sockets: Sockets, method: str, pb: Any) -> None:
    with grpc.insecure_channel(f"unix://{sockets.dra}") as channel:
        watch = channel.unary_stream(
            method,
            request_serializer=pb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=pb.NodeWatchResourcesResponse.FromString,
        )
        received = list(watch(pb.NodeWatchResourcesRequest(), timeout=CALL_TIMEOUT_S))
    assert received == health_updates(pb)


@pytest.mark.parametrize(
    "method",
    [
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeWatchResources",
        "/v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1alpha1.DRAPlugin/NodePrepareResources",
    ],
)
def test_unknown_method_is_unimplemented(sockets: Sockets, method: str) -> None:
    with grpc.insecure_channel(f"unix://{sockets.dra}") as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            call(b"", timeout=CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
