"""The kubelet plugin's gRPC servers side by side: builtin (``rpcserver``) against grpcio.

Usage: ``.venv/bin/python bench/grpc_server.py [--cycles N] [--rounds R] [--concurrent C]``

Each round starts, for each server in turn (the order alternates between rounds), a bare server
process: this script with ``--serve KIND``, serving the plugin's DRAPlugin v1 method table
(``dra_service.methods``, the real protobuf adapter) over a trivial driver that answers every
claim with one device at once. The benchmark, acting as the kubelet with a grpcio client over
one channel, makes 200 warm-up cycles, then N prepare + unprepare cycles one after another, then
R x C calls C at a time on the same channel, and reads from /proc:

- server CPU per cycle (user + system, all threads) and the client's wall time per cycle;
- server CPU per call at concurrency C;
- the server's RSS after the run.

Medians over the rounds. No API server, no checkpoint: what differs is only the gRPC server.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dra_gpu.kubeletplugin.driver import ClaimRef, PreparedDevice, PrepareResult  # noqa: E402
from dra_gpu.kubeletplugin.ids import CDIDeviceID, ClaimUID, DeviceName  # noqa: E402

SERVERS = ("builtin", "grpcio")
WARMUP = 200


class TrivialDriver:
    def prepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, PrepareResult]:
        device = PreparedDevice(
            request_names=("gpu",),
            pool_name="node",
            device_name=DeviceName("gpu-0"),
            cdi_device_ids=(CDIDeviceID("k8s.gpu.nvidia.com/claim=x-gpu-0"),),
        )
        return {ref.uid: PrepareResult(devices=(device,)) for ref in refs}

    def unprepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, str]:
        return {ref.uid: "" for ref in refs}


def serve(kind: str, socket: Path) -> None:
    """The server process: imports only what the plugin imports for ``kind``."""
    from dra_gpu.kubeletplugin import dra_service, rpcserver
    from dra_gpu.kubeletplugin.rpc_methods import RpcServer

    methods = dra_service.methods(TrivialDriver())
    server: RpcServer
    if kind == "grpcio":
        from dra_gpu.kubeletplugin import grpcio_server

        server = grpcio_server.GrpcioServer(methods, max_workers=16)
    else:
        server = rpcserver.Server(methods, max_workers=16)
    socket.unlink(missing_ok=True)
    server.add_address(f"unix:{socket}")
    server.start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1)


def measure(kind: str, socket: Path, cycles: int, rounds: int, concurrent: int) -> dict[str, float]:
    import grpc

    from bench.plugin_startup import rss_mib
    from bench.reference import cpu_seconds
    from dra_gpu.pb import dra_v1_pb2

    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--socket", str(socket)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        claims = [dra_v1_pb2.Claim(namespace="default", uid="u1", name="c")]
        prepare_request = dra_v1_pb2.NodePrepareResourcesRequest(claims=claims)
        unprepare_request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims)
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            service = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
            prepare: Any = channel.unary_unary(
                service + "NodePrepareResources",
                request_serializer=dra_v1_pb2.NodePrepareResourcesRequest.SerializeToString,
                response_deserializer=dra_v1_pb2.NodePrepareResourcesResponse.FromString,
            )
            unprepare: Any = channel.unary_unary(
                service + "NodeUnprepareResources",
                request_serializer=dra_v1_pb2.NodeUnprepareResourcesRequest.SerializeToString,
                response_deserializer=dra_v1_pb2.NodeUnprepareResourcesResponse.FromString,
            )
            for _ in range(WARMUP):
                prepare(prepare_request)
                unprepare(unprepare_request)
            cpu0, wall0 = cpu_seconds(proc.pid), time.perf_counter()
            for _ in range(cycles):
                prepare(prepare_request)
                unprepare(unprepare_request)
            wall1, cpu1 = time.perf_counter(), cpu_seconds(proc.pid)
            for _ in range(rounds):
                pending = [prepare.future(prepare_request) for _ in range(concurrent)]
                for p in pending:
                    p.result()
            cpu2 = cpu_seconds(proc.pid)
        return {
            "cpu_ms": (cpu1 - cpu0) * 1e3 / cycles,
            "wall_ms": (wall1 - wall0) * 1e3 / cycles,
            "cpu_concurrent_ms": (cpu2 - cpu1) * 1e3 / (rounds * concurrent),
            "rss_mib": rss_mib(proc.pid),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=64, help="calls at once (one channel)")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--socket", type=Path, default=Path(f"/tmp/grpc-bench-{os.getpid()}.sock"))
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.socket)
        return 0
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in SERVERS}
    for round_ in range(args.rounds):
        order = SERVERS if round_ % 2 == 0 else SERVERS[::-1]
        for kind in order:
            figures = measure(kind, args.socket, args.cycles, 20, args.concurrent)
            results[kind].append(figures)
            print(kind, {k: round(v, 3) for k, v in figures.items()}, flush=True)
    print()
    print("| server | CPU ms per prepare+unprepare | wall ms per cycle | "
          f"CPU ms per call, {args.concurrent} at once | RSS MiB |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for kind, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(
            f"| {kind} | {med['cpu_ms']:.3f} | {med['wall_ms']:.3f} | "
            f"{med['cpu_concurrent_ms']:.3f} | {med['rss_mib']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
