"""DRA calls made as the kubelet makes them, over the plugin's unix socket (benchmarks, demos).

``call`` is one NodePrepareResources or NodeUnprepareResources for one claim, raising on a
per-claim error. ``prepare_cycles`` times unprepare + prepare cycles of one claim on a real node
(both full calls: the plugin reads the claim, plans, writes the CDI spec and the checkpoint); it
ends prepared, as the kubelet left it. Containers that already run keep their devices (a
container's devices are fixed at its start).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc


@dataclass
class Latencies:
    prepare_ms: list[float] = field(default_factory=list)
    unprepare_ms: list[float] = field(default_factory=list)


def call(stub: Any, method: str, claim: Any) -> None:
    """``method`` ("prepare" or "unprepare") of one claim; a per-claim error raises."""
    if method == "prepare":
        request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim])
        response = stub.NodePrepareResources(request, timeout=60)
    else:
        unprepare = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim])
        response = stub.NodeUnprepareResources(unprepare, timeout=60)
    error = response.claims[claim.uid].error
    if error:
        raise RuntimeError(f"{method} {claim.name}: {error}")


def prepare_cycles(socket: Path, *, uid: str, namespace: str, name: str, cycles: int) -> Latencies:
    claim = dra_v1_pb2.Claim(uid=uid, namespace=namespace, name=name)
    found = Latencies()
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for _ in range(cycles):
            started = time.perf_counter()
            call(stub, "unprepare", claim)
            found.unprepare_ms.append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            call(stub, "prepare", claim)
            found.prepare_ms.append((time.perf_counter() - started) * 1e3)
    return found
