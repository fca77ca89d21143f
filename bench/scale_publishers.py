"""Many nodes' slice publishers in one process: the worker that ``bench/scale.py`` starts.

Usage (by ``bench/scale.py``, not by hand)::

    python bench/scale_publishers.py --kubeconfig K --layout static --node kwok-0 --node kwok-1 ...

Which code is the product's: each node gets what the kubelet plugin runs for its node
(``plugin.main.serve`` -> ``node_plugin.NodePlugin``): a ``publisher.Publisher`` (its reconcile
and watch threads, ``slice_plan``, the product's resync period) over ``slice_api.SliceApi``
over the product's ``kube.client`` connection, rendering ``published.node_slices`` of the
simulated profile's devices. The benchmark's own parts: this process hosting many of them
(the product runs one per node; here too each node has its own connection pool),
``CountingStore`` (counts each API call the publishers make), and
the line protocol below. With a binding layout (``dynamic-mig-bound``) each node also runs the
product's binder (``plugin.mig_binding.MigBinder``: its pod watch, claim GETs, MIG devices made
on the node's simulated GPUs in a temporary state directory, status applies), over a
``CountingClient``; the benchmark's part there is ``MadeIsPrepared``: a claim counts as prepared
once its MIG device is made, as on a node whose kubelet prepares the moment the pod binds.

Protocol, one JSON object per line: the worker prints ``{"ready": n}`` once its publishers are
built; on ``go`` it starts them all and prints ``{"synced": [unix time per node]}`` once every
one has published (or ``{"error": ...}``); on ``counts`` it prints ``{"counts": {call: n}}``;
on ``restart`` it stops its publishers and builds new ones, as a restart of every node's plugin
would (``{"ready": n}`` again; ``go`` starts them); end of input stops the publishers and ends
the process.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scale_layouts  # noqa: E402
from dra_gpu import DRIVER_NAME  # noqa: E402
from dra_gpu.kube.client import KubeClient, connect  # noqa: E402
from dra_gpu.kube.objects import ResourceSlice  # noqa: E402
from dra_gpu.kubeletplugin import publisher, slice_api, slice_plan  # noqa: E402
from dra_gpu.mig.dynamic import SIMULATED_STATE_NAME, DynamicMig  # noqa: E402
from dra_gpu.mig.instances import SimulatedInstances  # noqa: E402
from dra_gpu.plugin.mig_binding import MigBinder  # noqa: E402

JSON = dict[str, Any]
SYNC_TIMEOUT_S = 600.0
PROGRESS_S = 30.0
log = logging.getLogger("scale_publishers")
# A thousand threads per worker: their stacks need not be the default 8 MiB each.
THREAD_STACK = 512 * 1024


class CountingStore:
    """``publisher.SliceStore`` that counts every call (``node GET`` …) before making it."""

    def __init__(
        self,
        inner: slice_api.SliceApi,
        counts: collections.Counter[str],
        lock: threading.Lock,  # guards ``counts``, which all of a worker's stores share
    ) -> None:
        self._inner = inner
        self._counts = counts
        self._lock = lock

    def _count(self, call: str) -> None:
        with self._lock:
            self._counts[call] += 1

    def node_uid(self) -> str:
        self._count("GET nodes")
        return self._inner.node_uid()

    def list_slices(self) -> list[ResourceSlice]:
        self._count("LIST resourceslices")
        return self._inner.list_slices()

    def create_slice(self, body: JSON) -> str:
        self._count("POST resourceslices")
        return self._inner.create_slice(body)

    def update_slice(self, body: JSON) -> str:
        self._count("PUT resourceslices")
        return self._inner.update_slice(body)

    def delete_slice(self, name: str, *, uid: str) -> None:
        self._count("DELETE resourceslices")
        self._inner.delete_slice(name, uid=uid)

    def watch_slices(self, stop: threading.Event) -> Iterator[str]:
        self._count("WATCH resourceslices")
        return self._inner.watch_slices(stop)


class CountingClient(KubeClient):
    """The node's connection for its binder, counting each call (``GET resourceclaims`` …)."""

    def __init__(
        self, inner: KubeClient, counts: collections.Counter[str], lock: threading.Lock
    ) -> None:  # no super().__init__: every call goes to ``inner``
        self._inner, self._counts, self._lock = inner, counts, lock

    def _count(self, method: str, path: str) -> None:
        resource = "pods" if path.startswith("/api/v1/pods") else "resourceclaims"
        if path.endswith("/status"):
            resource += "/status"
        verb = "LIST" if method == "GET" and resource == "pods" else method
        with self._lock:
            self._counts[f"{verb} {resource}"] += 1

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self._count(method, path)
        return self._inner.request(method, path, **kwargs)

    def watch(self, path: str, **kwargs: Any) -> Iterator[JSON]:
        with self._lock:
            self._counts["WATCH pods"] += 1
        return self._inner.watch(path, **kwargs)


class MadeIsPrepared:
    """``mig_binding.ClaimLocks`` of a node without a kubelet: a claim is prepared once its MIG
    device is made (in the ledger)."""

    def __init__(self, mig: DynamicMig) -> None:
        self._mig = mig

    def holding(self, uid: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def completed(self) -> set[str]:
        return {e.claim for e in self._mig.ledger.load()}


def _say(obj: JSON) -> None:
    print(json.dumps(obj), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--layout", required=True)
    parser.add_argument("--node", action="append", default=[])
    parser.add_argument("--sync-timeout-s", type=float, default=SYNC_TIMEOUT_S)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    threading.stack_size(THREAD_STACK)
    (layout,) = scale_layouts.parse_layouts(args.layout)
    fleet = Fleet(args.kubeconfig, layout, args.node)
    _say({"ready": len(fleet.publishers)})
    for line in sys.stdin:
        command = line.strip()
        if command == "go":
            synced = fleet.go(args.sync_timeout_s)
            if all(synced):
                _say({"synced": synced})
            else:
                missing = synced.count(0.0)
                _say({"error": f"{missing} nodes not published in {args.sync_timeout_s:.0f} s"})
        elif command == "counts":
            _say({"counts": fleet.counts()})
        elif command == "restart":
            fleet.close()
            fleet = Fleet(args.kubeconfig, layout, args.node)
            _say({"ready": len(fleet.publishers)})
    fleet.close()
    return 0


class Fleet:
    """One set of the nodes' publishers: what a start of every node's plugin builds.

    A restart is a new fleet: new publishers (no state carried over), a new instance started
    now, new connections (each node's plugin connects anew), and calls counted from zero; the
    old fleet's threads see their stop event and end (their last calls count in the old
    counter, not the new one)."""

    def __init__(self, kubeconfig: Path, layout: scale_layouts.Layout, nodes: list[str]) -> None:
        self._counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()  # one for all stores' counts
        self._stop = threading.Event()
        started = time.time_ns()
        self.publishers: list[publisher.Publisher] = []
        self.binders: list[MigBinder] = []
        self._clients = []
        self._state = Path(tempfile.mkdtemp(prefix="scale-binders-")) if layout.binds else None
        for node in nodes:
            # A connection pool per node, as each node's plugin has its own: one pool shared by
            # hundreds of publishers keeps too few connections open and pays a TLS handshake on
            # most requests (the API server's CPU, which the figures are about).
            client = connect(kubeconfig)
            self._clients.append(client)
            api = slice_api.SliceApi(client, node=node, driver=DRIVER_NAME)
            store = CountingStore(api, self._counts, self._lock)
            self.publishers.append(
                publisher.Publisher(
                    store=store,
                    node=node,
                    driver=DRIVER_NAME,
                    render=functools.partial(layout.render, node),
                    instance=slice_plan.Instance(started_ns=started, name=f"scale-{node}"),
                    alive=lambda _other: False,  # no other instance runs on a simulated node
                )
            )
            if self._state is not None:
                self.binders.append(self._binder(layout, node, client, self.publishers[-1]))

    def _binder(
        self,
        layout: scale_layouts.Layout,
        node: str,
        client: KubeClient,
        pub: publisher.Publisher,
    ) -> MigBinder:
        assert self._state is not None
        state_dir = self._state / node
        instances = SimulatedInstances(state_dir / SIMULATED_STATE_NAME, node_name=node)
        mig = DynamicMig(state_dir=state_dir, instances=instances, keep_ahead=True)
        devices = {d.name: d for d in scale_layouts.devices_of(layout, node)}
        return MigBinder(
            CountingClient(client, self._counts, self._lock),
            driver=DRIVER_NAME,
            node=node,
            mig=mig,
            inventory=lambda: devices,
            claims=MadeIsPrepared(mig),
            slices_published=pub.wait_synced,  # as the plugin wires it (plugin.lifecycle)
        )

    def go(self, timeout_s: float) -> list[float]:
        """Start every publisher; the time each one was first in sync (0.0: not in time)."""
        for pub in self.publishers:
            pub.start(self._stop)
        for binder in self.binders:
            binder.start(self._stop)
        synced: list[float] = [0.0] * len(self.publishers)
        begin = time.monotonic()
        deadline, progress = begin + timeout_s, begin + PROGRESS_S
        while not all(synced) and time.monotonic() < deadline:
            for i, pub in enumerate(self.publishers):
                if not synced[i] and pub.synced:
                    synced[i] = time.time()
            if time.monotonic() >= progress:  # how far a slow start got, in the worker's log
                done = len(synced) - synced.count(0.0)
                log.warning("%d of %d published after %.0f s", done, len(synced), progress - begin)
                progress += PROGRESS_S
            time.sleep(0.02)
        return synced

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        self._stop.set()
        for client in self._clients:
            client.close()
        if self._state is not None:
            shutil.rmtree(self._state, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
