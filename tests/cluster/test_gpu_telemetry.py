"""GPU telemetry of a real plugin process after real prepares: the series carry the claim and
pod labels, an idle claim gets its ``GpuIdle`` Events while a busy one does not, and
``dra-gpu top`` prints both claims.

A simulated node (``h200x8``) runs the kubelet plugin with ``--metrics-address``,
``--telemetry-interval 1`` and ``--idle-after 3s``; the real scheduler allocates two claims,
each for one pod; the test, acting as the kubelet, prepares both, and as the "workload" writes
the simulated usage file: one process of the busy claim's pod at 90 %.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu.controller import classes
from dra_gpu.kube.client import KubeClient, connect
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc
from e2e import procs, waiting
from e2e.cluster import Cluster
from e2e.driver import PluginDirs, plugin_argv
from e2e.probes import Series, scrape

NS = "default"
WAIT_S = 60.0  # bounds a broken test only


@pytest.fixture(scope="module")
def plugin(cluster: Cluster) -> Iterator[tuple[str, Path, int, KubeClient]]:
    node = f"tl-{uuid.uuid4().hex[:6]}"
    cluster.register_node(node)
    root = Path(tempfile.mkdtemp(prefix="tl-"))
    (port,) = procs.free_ports(1)
    argv = plugin_argv(
        node_name=node,
        kubeconfig=cluster.kubeconfig,
        profile="h200x8",
        dirs=PluginDirs.under(root),
        extra=(
            *("--metrics-address", f"127.0.0.1:{port}"),
            *("--telemetry-interval", "1", "--idle-after", "3s"),
        ),
    )
    proc = procs.spawn(argv, log_path=root / "plugin.log", env={"PATH": "/usr/bin:/bin"})
    kube = connect(cluster.kubeconfig)
    try:
        for desired in classes.builtin_classes(extended_resource_name=None):
            cluster.kubectl("apply", "-f", "-", input=json.dumps(desired.body()))
        dra = PluginDirs.under(root).data / "dra.sock"
        waiting.wait_for("the plugin's DRA socket", dra.is_socket, timeout=WAIT_S)
        yield node, root, port, kube
    finally:
        procs.stop(proc)
        kube.close()
        shutil.rmtree(root, ignore_errors=True)


def allocated_claim(kube: KubeClient, node: str, name: str) -> dict[str, Any]:
    """A claim for one GPU and a pod on ``node`` that uses it, once the scheduler allocated it."""
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    kube.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [request]}},
        },
    )
    container = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"claims": [{"name": "gpu"}]},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod)
    path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}"

    def reserved() -> dict[str, Any] | None:
        claim = kube.request("GET", path)
        status = claim.get("status") or {}
        return claim if status.get("allocation") and status.get("reservedFor") else None

    return waiting.wait_for(f"claim {name} allocated", reserved, timeout=WAIT_S)


def prepare(socket: Path, uid: str, name: str) -> str:
    """Prepare one claim as the kubelet does; its error ("" when prepared)."""
    ref = dra_v1_pb2.Claim(uid=uid, namespace=NS, name=name)
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=30
        )
    return str(response.claims[uid].error)


def labelled(s: Series, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(ls), v)
        for (n, ls), v in s.items()
        if n == name and labels.items() <= dict(ls).items()
    ]


def gpu_idle_events(kube: KubeClient, kind: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    items = (
        kube.request(
            "GET", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": selector}
        ).get("items")
        or []
    )
    return [e for e in items if e["reason"] == "GpuIdle"]


def test_series_carry_claims_and_pods_and_the_idle_claim_gets_its_events(
    plugin: tuple[str, Path, int, KubeClient],
) -> None:
    node, root, port, kube = plugin
    busy = allocated_claim(kube, node, f"{node}-busy")
    idle = allocated_claim(kube, node, f"{node}-idle")
    socket = PluginDirs.under(root).data / "dra.sock"
    for claim in (busy, idle):
        assert prepare(socket, claim["metadata"]["uid"], claim["metadata"]["name"]) == ""
    device_of = {
        c["metadata"]["name"]: c["status"]["allocation"]["devices"]["results"][0]["device"]
        for c in (busy, idle)
    }
    busy_pod = kube.request("GET", f"/api/v1/namespaces/{NS}/pods/{node}-busy")
    usage = {
        "devices": {
            device_of[f"{node}-busy"]: {
                "utilization": 0.9,
                "processes": [
                    {"pid": 4242, "podUID": busy_pod["metadata"]["uid"], "memoryBytes": 3 << 30}
                ],
            }
        }
    }
    (PluginDirs.under(root).state / "simulated-usage.json").write_text(json.dumps(usage))

    def labelled_series() -> Series | None:
        s = scrape(port)
        pods = labelled(s, "dra_gpu_pod_memory_used_bytes", pod_name=f"{node}-busy")
        return s if pods else None

    s = waiting.wait_for("pod series with the pod's name", labelled_series, timeout=WAIT_S)
    ((labels, value),) = labelled(s, "dra_gpu_device_utilization_ratio", claim_name=f"{node}-busy")
    assert value == 0.9 and labels["device"] == device_of[f"{node}-busy"]
    assert labels["node"] == node and labels["claim_namespace"] == NS
    assert labels["product"] == "NVIDIA H200"
    ((labels, value),) = labelled(s, "dra_gpu_pod_memory_used_bytes", pod_name=f"{node}-busy")
    assert value == 3 << 30 and labels["pod_uid"] == busy_pod["metadata"]["uid"]
    ((_, value),) = labelled(s, "dra_gpu_device_utilization_ratio", claim_name=f"{node}-idle")
    assert value == 0
    free = labelled(s, "dra_gpu_device_memory_total_bytes", claim_name="")
    assert len(free) == 6  # the node's other GPUs, unclaimed

    def idle_events() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        on_claim = gpu_idle_events(kube, "ResourceClaim", f"{node}-idle")
        on_pod = gpu_idle_events(kube, "Pod", f"{node}-idle")
        return (on_claim, on_pod) if on_claim and on_pod else None

    on_claim, on_pod = waiting.wait_for("GpuIdle events", idle_events, timeout=WAIT_S)
    assert on_claim[0]["type"] == on_pod[0]["type"] == "Warning"
    assert on_pod[0]["message"] == on_claim[0]["message"]
    assert on_claim[0]["message"].startswith(f"GPU {device_of[f'{node}-idle']} idle for ")
    assert "0 processes" in on_claim[0]["message"]
    assert gpu_idle_events(kube, "ResourceClaim", f"{node}-busy") == []
    assert gpu_idle_events(kube, "Pod", f"{node}-busy") == []
    s = scrape(port)
    ((_, idle_s),) = labelled(s, "dra_gpu_claim_idle_seconds", claim_name=f"{node}-idle")
    ((_, busy_s),) = labelled(s, "dra_gpu_claim_idle_seconds", claim_name=f"{node}-busy")
    assert idle_s >= 3 and busy_s == 0
    assert len(gpu_idle_events(kube, "ResourceClaim", f"{node}-idle")) == 1  # once

    top = subprocess.run(
        [
            *(sys.executable, "-m", "dra_gpu", "top", "-n", NS, "--node", node),
            *("--metrics-url", f"http://127.0.0.1:{port}/metrics"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = top.stdout.splitlines()
    assert lines[0].split() == [
        "NODE",
        "DEVICE",
        "PRODUCT",
        "CLAIM",
        "PODS",
        "UTIL",
        "MEMORY",
        "IDLE",
    ]
    busy_line = next(line for line in lines if f"{NS}/{node}-busy" in line)
    assert f"{node}-busy" in busy_line.split() and "90%" in busy_line.split()  # its pod
    idle_line = next(line for line in lines if f"{NS}/{node}-idle" in line)
    assert "0%" in idle_line and idle_line.split()[-1] != "-"
    assert len(lines) == 3  # the two claims; free GPUs only with -A
