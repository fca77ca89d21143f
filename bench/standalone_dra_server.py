"""Only the DRA services of the plugin on a unix socket: no registration, no ResourceSlices.

``bench/prepare.py --server standalone`` runs it to measure prepare without the plugin's
node-wide call lock. The prepare core and the server's limits are the plugin's own
(``plugin.prepare_core``, ``kit.DRA_LIMITS``), so what is measured is what the plugin
does per claim.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from dra_gpu import DRIVER_NAME
from dra_gpu.kube.client import connect
from dra_gpu.kubeletplugin import dra_service, events, grpcio_server, kit
from dra_gpu.plugin import inventory, platforms, prepare_core
from dra_gpu.prepare.sharing.applied import Switches


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/standalone_dra_server.py", description=__doc__)
    p.add_argument("--socket", type=Path, required=True, help="unix socket to serve on")
    p.add_argument("--node-name", required=True)
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--simulate", required=True, help="simulated profile name or file")
    p.add_argument("--cdi-root", type=Path, required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--driver-name", default=DRIVER_NAME)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    platform = platforms.SimulatedPlatform(profile=args.simulate, node_name=args.node_name)
    devices = {d.name: d for d in inventory.discover(inventory.backend_for(platform))}
    state = prepare_core.make_state(
        driver_name=args.driver_name,
        node_name=args.node_name,
        cdi_root=args.cdi_root,
        state_dir=args.state_dir,
        platform=platform,
        inventory=lambda: devices,
        client=(client := connect(args.kubeconfig)),
        poster=events.EventPoster(client),
        call_lock=contextlib.nullcontext,
        sharing=Switches(),
    )
    state.start()
    server = grpcio_server.GrpcioServer(
        dra_service.methods(state),
        health=grpcio_server.health_servicer(),
        limits=kit.DRA_LIMITS,
    )
    args.socket.unlink(missing_ok=True)
    server.add_address(f"unix:{args.socket}")
    server.start()
    print(f"serving on {args.socket}", file=sys.stderr, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=5)
    state.close()
    args.socket.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
