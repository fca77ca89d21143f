"""gRPC adapter: the kubelet's DRAPlugin services (v1 and v1beta1) over a prepare handler.

Only translates messages: claims in, per-claim results out. Every claim of a request gets an
entry in the response; a claim's failure is its ``error`` (the kubelet then ignores its
devices), never a gRPC error for the whole call. ``share_id`` exists only in v1.

Wiring (what ``dra-gpu kubelet-plugin`` does): :func:`make_state` builds the handler from the
plugin's settings, a ``kube.client.KubeClient`` and an inventory callable; :func:`registrar`
returns the function that restores state (``DeviceState.start``) and adds both services to the
DRA server before it starts serving.

``python -m dra_gpu.plugin.dra_service --socket PATH ...`` runs only the DRA services on a unix
socket (no registration, no ResourceSlices): the crash tests and the prepare benchmark use it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from dra_gpu import DRIVER_NAME
from dra_gpu.devices.model import Device
from dra_gpu.kube.client import KubeClient, connect
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from dra_gpu.plugin import claims, faults
from dra_gpu.plugin.ids import ClaimUID
from dra_gpu.plugin.plan import ClaimRef
from dra_gpu.plugin.state import CallLock, DeviceState, PrepareResult, StateSettings

if TYPE_CHECKING:
    from dra_gpu.mig.dynamic import DynamicMig

log = logging.getLogger(__name__)


class PrepareHandler(Protocol):
    def prepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, PrepareResult]: ...

    def unprepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, str]: ...


def _refs(claims_in: Any) -> tuple[list[ClaimRef], dict[str, str]]:
    """Claims from a request, deduplicated; plus errors for claims missing required fields."""
    refs: dict[str, ClaimRef] = {}
    invalid: dict[str, str] = {}
    for claim in claims_in:
        if not (claim.uid and claim.namespace and claim.name):
            invalid[claim.uid] = (
                f"claim {claim.namespace}/{claim.name} ({claim.uid}): "
                "uid, namespace and name are all required"
            )
            continue
        refs.setdefault(
            claim.uid, ClaimRef(uid=ClaimUID(claim.uid), namespace=claim.namespace, name=claim.name)
        )
    return list(refs.values()), invalid


def _servicer(handler: PrepareHandler, pb: ModuleType, base: type, *, share_id: bool) -> Any:
    class Servicer(base):  # type: ignore[misc]
        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            refs, invalid = _refs(request.claims)
            response = pb.NodePrepareResourcesResponse()
            for uid, message in invalid.items():
                response.claims[uid].error = message
            for uid, result in handler.prepare(refs).items():
                entry = response.claims[uid]
                if result.error:
                    entry.error = result.error
                    continue
                for device in result.devices:
                    out = entry.devices.add(
                        request_names=device.request_names,
                        pool_name=device.pool_name,
                        device_name=device.device_name,
                        cdi_device_ids=device.cdi_device_ids,
                    )
                    if share_id and device.share_id:
                        out.share_id = device.share_id
            return response

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            refs, invalid = _refs(request.claims)
            response = pb.NodeUnprepareResourcesResponse()
            for uid, message in invalid.items():
                response.claims[uid].error = message
            for uid, error in handler.unprepare(refs).items():
                response.claims[uid].error = error
            return response

    return Servicer()


def register_dra_services(server: grpc.Server, handler: PrepareHandler) -> None:
    """Add DRAPlugin v1 and v1beta1, both served by ``handler``."""
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
        _servicer(handler, dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginServicer, share_id=True), server
    )
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
        _servicer(handler, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginServicer, share_id=False),
        server,
    )


def make_state(
    *,
    driver_name: str,
    node_name: str,
    cdi_root: Path,
    state_dir: Path,
    simulated: bool,
    driver_root: Path,
    inventory: Callable[[], Mapping[str, Device]],
    client: KubeClient,
    env: Mapping[str, str] = os.environ,
    host_driver_root: PurePosixPath | None = None,
    call_lock: CallLock = contextlib.nullcontext,
    mig: DynamicMig | None = None,
) -> DeviceState:
    """The prepare handler as the plugin process runs it (faults from ``DRA_GPU_FAULT``)."""
    return DeviceState(
        settings=StateSettings(
            driver_name=driver_name,
            node_name=node_name,
            cdi_root=cdi_root,
            state_dir=state_dir,
            simulated=simulated,
            driver_root=driver_root,
            host_driver_root=host_driver_root,
        ),
        inventory=inventory,
        claims=claims.KubeClaimFetcher(client),
        fault=faults.from_env(env),
        report=claims.NodeEventReporter(client, node_name=node_name),
        call_lock=call_lock,
        mig=mig,
    )


def registrar(
    state: DeviceState, handler: PrepareHandler | None = None
) -> Callable[[grpc.Server], None]:
    """Restores ``state`` and registers the services (answered by ``handler``, by default the
    state itself); call before the server starts."""

    def register(server: grpc.Server) -> None:
        state.start()
        register_dra_services(server, handler or state)

    return register


# --- standalone DRA server (tests, benchmark) -------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dra_gpu.plugin.dra_service", description=__doc__)
    p.add_argument("--socket", type=Path, required=True, help="unix socket to serve on")
    p.add_argument("--node-name", required=True)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--simulate", required=True, help="simulated profile name or file")
    p.add_argument("--cdi-root", type=Path, required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--driver-name", default=DRIVER_NAME)
    p.add_argument("--workers", type=int, default=16)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from dra_gpu.plugin import inventory

    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    backend = inventory.backend_for(simulate=args.simulate, node_name=args.node_name)
    devices = {d.name: d for d in inventory.discover(backend)}
    state = make_state(
        driver_name=args.driver_name,
        node_name=args.node_name,
        cdi_root=args.cdi_root,
        state_dir=args.state_dir,
        simulated=True,
        driver_root=Path("/"),
        inventory=lambda: devices,
        client=connect(args.kubeconfig),
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers))
    registrar(state)(server)
    args.socket.unlink(missing_ok=True)
    server.add_insecure_port(f"unix://{args.socket}")
    server.start()
    print(f"serving on {args.socket}", file=sys.stderr, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5).wait()
    state.close()
    args.socket.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
