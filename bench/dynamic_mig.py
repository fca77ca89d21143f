"""Dynamic MIG figures: prepare latency with MIG device creation, and the scheduler's time to
allocate a MIG claim on partitionable GPUs against static MIG devices.

Usage: ``.venv/bin/python bench/dynamic_mig.py prepare [--samples N]``
       ``.venv/bin/python bench/dynamic_mig.py scheduler [--samples N]``

``prepare`` (no cluster): the plugin's prepare transaction in process (``DeviceState``, a claim
served from memory instead of the API server, temp directories), N prepare + unprepare cycles
of one claim on a simulated node: a dynamic-MIG ``1g.10gb`` partition of ``h100x8-mig``
(prepare creates the MIG device: ledger entry, simulated GI+CI, both written durably; unprepare
destroys it) against an existing static MIG device of ``a100x4-mig``. p50 and p99 in ms.

``scheduler``: a local control plane (``e2e.cluster.Cluster``) with two registered nodes and
their slices written as the plugin publishes them: ``dyn`` = 8 H100 in dynamic MIG (a counter
slice + 200 partitions in 4 slices), ``static`` = 8 H100 with 7 ``1g.10gb`` MIG devices each (56
devices). Per sample, one pod with one claim for a ``1g.10gb`` device is created, pinned to one
node (alternating); the time from the pod's creation until the claim's allocation is visible
(polled every 10 ms) is recorded; the pod and claim are deleted before the next sample. p50 and
p99 per node.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import dra_gpu  # noqa: E402
from dra_gpu.devices import (  # noqa: E402
    naming,
    partitions,
    simulated,
)
from dra_gpu.devices.model import Device  # noqa: E402
from dra_gpu.kube.objects import ResourceClaim  # noqa: E402
from dra_gpu.kubeletplugin import slices  # noqa: E402

NODE = "bench-node"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def show(label: str, values: list[float]) -> None:
    print(
        f"{label}: p50 {statistics.median(values):.2f} ms, p99 {percentile(values, 0.99):.2f} ms "
        f"({len(values)} samples)"
    )


def devices_of(profile: simulated.SimProfile, *, dynamic: bool, node: str) -> list[Device]:
    backend: Any = simulated.SimulatedBackend(profile=profile, node_name=node)
    if dynamic:
        backend = partitions.DynamicMigBackend(backend)
    return naming.build_devices(backend.discover().gpus)


class _Claims:
    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body = body

    def get_claim(self, *, namespace: str, name: str) -> ResourceClaim | None:
        return cast(ResourceClaim, self.body)  # the benchmark's stand-in for the API's JSON


def _claim(uid: str, device: str) -> dict[str, Any]:
    result = {"request": "mig", "driver": dra_gpu.DRIVER_NAME, "pool": NODE, "device": device}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "bench", "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result], "config": []}}},
    }


def prepare_cycles(samples: int, *, dynamic: bool) -> tuple[list[float], list[float]]:
    from dra_gpu.kubeletplugin.ids import ClaimUID
    from dra_gpu.mig.dynamic import DynamicMig
    from dra_gpu.mig.instances import SimulatedInstances
    from dra_gpu.prepare import node_facts
    from dra_gpu.prepare.plan import ClaimRef
    from dra_gpu.prepare.state import DeviceState, StateSettings

    name = "h100x8-mig" if dynamic else "a100x4-mig"
    device = "gpu-0-mig-1g10gb-19-0" if dynamic else "gpu-1-mig-1g5gb-19-2"
    inventory = {
        d.name: d for d in devices_of(simulated.BUILTIN_PROFILES[name], dynamic=dynamic, node=NODE)
    }
    root = Path(tempfile.mkdtemp(prefix="dmig-bench-"))
    mig = None
    if dynamic:
        sim = SimulatedInstances(root / "state" / "simulated-mig.json", node_name=NODE)
        mig = DynamicMig(state_dir=root / "state", instances=sim)
    uid = str(uuid.uuid4())
    state = DeviceState(
        settings=StateSettings(
            driver_name=dra_gpu.DRIVER_NAME,
            node_name=NODE,
            cdi_root=root / "cdi",
            state_dir=root / "state",
        ),
        node_facts=node_facts.simulated,
        inventory=lambda: inventory,
        claims=_Claims(_claim(uid, device)),
        boot_id=lambda: "bench",
        mig=mig,
    )
    ref = ClaimRef(uid=ClaimUID(uid), namespace="default", name="bench")
    prep: list[float] = []
    unprep: list[float] = []
    try:
        for _ in range(samples):
            start = time.perf_counter()
            error = state.prepare([ref])[ref.uid].error
            prep.append((time.perf_counter() - start) * 1e3)
            assert not error, error
            start = time.perf_counter()
            assert state.unprepare([ref]) == {ref.uid: ""}
            unprep.append((time.perf_counter() - start) * 1e3)
    finally:
        state.close()
        shutil.rmtree(root, ignore_errors=True)
    return prep, unprep


def bench_prepare(samples: int) -> None:
    for dynamic in (True, False):
        label = (
            "dynamic MIG (device created / destroyed)" if dynamic else "static MIG (device exists)"
        )
        prep, unprep = prepare_cycles(samples, dynamic=dynamic)
        show(f"prepare, {label}", prep)
        show(f"unprepare, {label}", unprep)


STATIC_H100X8 = simulated.SimProfile(
    name="h100x8-1g",
    gpus=tuple(
        simulated.SimGpu(
            "H100-80GB",
            *simulated.default_pci(i),
            mig_enabled=True,
            mig_devices=tuple(simulated.SimMig("1g.10gb", s) for s in range(7)),
        )
        for i in range(8)
    ),
)


def bench_scheduler(samples: int) -> None:
    from e2e.cluster import Cluster

    nodes = {
        "dyn": devices_of(simulated.BUILTIN_PROFILES["h100x8-mig"], dynamic=True, node="dyn"),
        "static": devices_of(STATIC_H100X8, dynamic=False, node="static"),
    }
    with Cluster(log=lambda _line: None) as cluster:
        _device_classes(cluster)
        for node, devices in nodes.items():
            uid = str(cluster.register_node(node)["metadata"]["uid"])
            objs = slices.build_resource_slices(
                devices=devices,
                driver_name=dra_gpu.DRIVER_NAME,
                node_name=node,
                pool_generation=1,
                node_owner=(node, uid),
            )
            doc = {"apiVersion": "v1", "kind": "List", "items": objs}
            cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
            print(f"{node}: {len(devices)} devices in {len(objs)} slices")
        cluster.create_namespace("bench")
        api = cluster.api_client()
        try:
            found: dict[str, list[float]] = {n: [] for n in nodes}
            for i in range(samples * len(nodes)):
                node = list(nodes)[i % len(nodes)]
                found[node].append(_allocate_once(cluster, api, node, i))
        finally:
            api.close()
    for node, values in found.items():
        show(f"pod created -> 1g claim allocated, node {node}", values)


def _device_classes(cluster: Any) -> None:
    from kubernetes import client

    from dra_gpu.controller import classes

    resource = client.ResourceV1Api(cluster.api_client())
    for desired in classes.builtin_classes(extended_resource_name=None):
        resource.create_device_class(desired.body(), _request_timeout=30)  # type: ignore[arg-type]


def _allocate_once(cluster: Any, api: Any, node: str, i: int) -> float:
    from kubernetes import client

    from e2e import mig_manifests

    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    claim = mig_manifests.claim(f"c{i}", "1g.10gb")
    pod = mig_manifests.pod(f"p{i}", node, claim=f"c{i}")
    resource.create_namespaced_resource_claim("bench", claim, _request_timeout=30)  # type: ignore[arg-type]
    start = time.perf_counter()
    core.create_namespaced_pod("bench", pod, _request_timeout=30)  # type: ignore[arg-type]

    def allocated() -> bool:
        got = resource.read_namespaced_resource_claim(f"c{i}", "bench", _request_timeout=10)
        return got.status is not None and got.status.allocation is not None

    _poll(allocated, every=0.01)
    took = (time.perf_counter() - start) * 1e3
    core.delete_namespaced_pod(f"p{i}", "bench", grace_period_seconds=0, _request_timeout=30)
    resource.delete_namespaced_resource_claim(f"c{i}", "bench", _request_timeout=30)

    def gone() -> bool:
        items = resource.list_namespaced_resource_claim("bench").items
        names = [c.metadata.name for c in items if c.metadata is not None]
        return f"c{i}" not in names

    _poll(gone, every=0.1)
    return took


def _poll(check: Callable[[], bool], *, every: float, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{check.__name__} not true after {timeout} s")
        time.sleep(every)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("prepare", "scheduler"))
    parser.add_argument("--samples", type=int, default=0, help="default: 200 prepare, 10 scheduler")
    args = parser.parse_args()
    if args.what == "prepare":
        bench_prepare(args.samples or 200)
    else:
        bench_scheduler(args.samples or 10)


if __name__ == "__main__":
    main()
