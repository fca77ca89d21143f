"""Prepare latency on a real node: the harness acts as the kubelet on the plugin's DRA socket.

Each cycle unprepares then prepares one claim (both full calls: the plugin reads the claim, plans,
writes the CDI spec and the checkpoint); it ends prepared, as the kubelet left it. Containers
that already run keep their devices (a container's devices are fixed at its start).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc


@dataclass
class Latencies:
    prepare_ms: list[float] = field(default_factory=list)
    unprepare_ms: list[float] = field(default_factory=list)


def _check(response: object, uid: str) -> None:
    error = response.claims[uid].error  # type: ignore[attr-defined]
    if error:
        raise RuntimeError(f"claim {uid}: {error}")


def prepare_cycles(socket: Path, *, uid: str, namespace: str, name: str, cycles: int) -> Latencies:
    claim = dra_v1_pb2.Claim(uid=uid, namespace=namespace, name=name)
    found = Latencies()
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for _ in range(cycles):
            started = time.perf_counter()
            request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim])
            _check(stub.NodeUnprepareResources(request, timeout=60), uid)
            found.unprepare_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            prepare = dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim])
            _check(stub.NodePrepareResources(prepare, timeout=60), uid)
            found.prepare_ms.append((time.perf_counter() - started) * 1e3)
    return found
