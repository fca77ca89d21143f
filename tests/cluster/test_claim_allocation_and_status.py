"""What Kubernetes 1.37 asks of the driver, against the real API server and scheduler; the test
acts as the kubelet on a simulated ``h200x8`` node (no kubelet there).

Cases:
- the scenario ``two-gpus-one-numa-node`` (its manifests as users read them): with three GPUs
  of NUMA node 0 taken, the scheduler allocates the pair from node 1 (published
  ``resource.kubernetes.io/numaNode``: GPUs 0-3 on node 0, 4-7 on node 1), so does a second
  pair, and a third, with one GPU left (on node 0), stays Pending with the scheduler's reason.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu import DRIVER_NAME
from e2e import mig_manifests, procs, waiting
from e2e.cluster import SIMULATED_TOLERATION, Cluster
from e2e.cluster.device_classes import builtin_device_classes
from e2e.driver import PluginDirs, plugin_argv
from e2e.suite.kube import load_manifests
from e2e.suite.runner import SCENARIOS_DIR, with_node_selector

WAIT_S = 90.0  # bounds a broken test only
wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S)
NUMA = "resource.kubernetes.io/numaNode"


class Node:
    """A registered Node with a simulated ``h200x8`` plugin and no kubelet."""

    def __init__(self, cluster: Cluster, name: str, root: Path) -> None:
        self.cluster, self.name, self.root = cluster, name, root
        self.dirs = PluginDirs.under(root)
        self.proc: Any = None

    @property
    def log(self) -> Path:
        return self.root / "plugin.log"

    @property
    def socket(self) -> Path:
        return self.dirs.data / "dra.sock"

    def start(self) -> None:
        argv = plugin_argv(
            node_name=self.name,
            kubeconfig=self.cluster.kubeconfig,
            profile="h200x8",
            dirs=self.dirs,
        )
        self.proc = procs.spawn(argv, log_path=self.log, env={"PATH": "/usr/bin:/bin"})
        wait_for(
            "the plugin's DRA socket", lambda: self.proc.poll() is not None or self.socket.exists()
        )
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            self.proc = None

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.cluster.kubectl(*args, "-n", self.name, "-o", "json"))
        return out

    def create(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl("create", "-n", self.name, "-f", "-", input=json.dumps(doc))

    def slice_devices(self) -> dict[str, dict[str, Any]]:
        listed = json.loads(self.cluster.kubectl("get", "resourceslices", "-o", "json"))
        return {
            d["name"]: d
            for s in listed["items"]
            if s["spec"].get("nodeName") == self.name
            for d in s["spec"].get("devices") or []
        }

    def call(self, method: str, claim: dict[str, Any]) -> str:
        from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc

        ref = dra_v1_pb2.Claim(
            uid=claim["metadata"]["uid"],
            namespace=claim["metadata"]["namespace"],
            name=claim["metadata"]["name"],
        )
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            if method == "prepare":
                request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref])
                return str(stub.NodePrepareResources(request, timeout=30).claims[ref.uid].error)
            unprepare = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref])
            return str(stub.NodeUnprepareResources(unprepare, timeout=30).claims[ref.uid].error)


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[Node]:
    name = f"k137-{uuid.uuid4().hex[:6]}"
    cluster.register_node(name)
    cluster.create_namespace(name)
    root = Path(tempfile.mkdtemp(prefix="k1-"))  # short: unix socket paths <= 107 bytes
    n = Node(cluster, name, root)
    n.start()
    try:
        with builtin_device_classes(cluster):
            wait_for("the node's 8 GPUs published", lambda: len(n.slice_devices()) == 8)
            yield n
    finally:
        n.stop()
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        cluster.unregister_node(name)
        shutil.rmtree(root, ignore_errors=True)


def allocated_claim(node: Node, pod: str) -> dict[str, Any] | None:
    """The pod's (one) claim once the pod is scheduled and the claim allocated."""
    body = node.kubectl_json("get", "pod", pod)
    (source,) = body["spec"]["resourceClaims"]
    statuses = body.get("status", {}).get("resourceClaimStatuses") or [{}]
    name = source.get("resourceClaimName") or statuses[0].get("resourceClaimName")
    if not body["spec"].get("nodeName") or not name:
        return None
    claim = node.kubectl_json("get", "resourceclaim", name)
    return claim if claim.get("status", {}).get("allocation") else None


def devices_of(claim: dict[str, Any]) -> list[str]:
    return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])


def scenario_pod(node: Node, scenario: str, pod_name: str, *, with_template: bool) -> None:
    """The scenario's manifests in the node's namespace, the pod renamed and pinned to the
    node."""
    for doc in load_manifests(SCENARIOS_DIR / scenario):
        if doc["kind"] == "Pod":
            doc = with_node_selector(doc, {"kubernetes.io/hostname": node.name})
            doc["metadata"]["name"] = pod_name
            # The node has no kubelet: only pods meant for such a node tolerate its taint.
            doc["spec"]["tolerations"] = [dict(SIMULATED_TOLERATION)]
            node.create(doc)
        elif with_template:
            node.create(doc)


def unschedulable(node: Node, pod: str) -> str | None:
    conditions = node.kubectl_json("get", "pod", pod).get("status", {}).get("conditions") or []
    for c in conditions:
        if (c["type"], c["status"], c.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return str(c.get("message", ""))
    return None


def claim_and_pod(node: Node, name: str, count: int) -> None:
    """A claim for ``count`` GPUs, without constraints, and a pod on the node that uses it."""
    exactly = {"deviceClassName": "gpu.nvidia.com", "count": count}
    node.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
        }
    )
    pod = mig_manifests.pod(name, node.name, claim=name)
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": name}]
    node.create(pod)


def test_two_gpus_on_one_numa_node(node: Node) -> None:
    numa = {name: d["attributes"][NUMA]["int"] for name, d in node.slice_devices().items()}
    assert sorted(numa.values()) == [0, 0, 0, 0, 1, 1, 1, 1]

    # Three GPUs taken first: the allocator goes through the devices in order, so without the
    # constraint the pair would be the fourth GPU of node 0 and the first of node 1.
    claim_and_pod(node, "three", 3)
    three = wait_for("three allocated", functools.partial(allocated_claim, node, "three"))
    free = {n: [d for d in numa if numa[d] == n and d not in devices_of(three)] for n in (0, 1)}
    assert sorted(len(f) for f in free.values()) == [1, 4], free

    scenario_pod(node, "two-gpus-one-numa-node", "pair-a", with_template=True)
    pair_a = wait_for("pair-a allocated", functools.partial(allocated_claim, node, "pair-a"))
    got = devices_of(pair_a)
    assert len(got) == 2 and len({numa[d] for d in got}) == 1, (got, numa)

    scenario_pod(node, "two-gpus-one-numa-node", "pair-b", with_template=False)
    pair_b = wait_for("pair-b allocated", functools.partial(allocated_claim, node, "pair-b"))
    got_b = devices_of(pair_b)
    assert len(got_b) == 2 and {numa[d] for d in got + got_b} == {1}, (got, got_b, numa)

    # One GPU is left, on node 0: a pair no longer fits, and the scheduler says so.
    scenario_pod(node, "two-gpus-one-numa-node", "pair-c", with_template=False)
    reason = wait_for("pair-c unschedulable", functools.partial(unschedulable, node, "pair-c"))
    assert "cannot allocate all claims" in reason, reason
    print(f"three: {devices_of(three)}; pairs: {got} {got_b}; NUMA {numa}; pair-c: {reason}")


def our_entries(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e for e in (claim.get("status") or {}).get("devices") or [] if e["driver"] == DRIVER_NAME
    ]


def test_prepared_claim_shows_its_device_status(node: Node) -> None:
    claim_and_pod(node, "status", 1)
    claim = wait_for("status allocated", functools.partial(allocated_claim, node, "status"))
    (device,) = devices_of(claim)
    assert our_entries(claim) == []
    assert node.call("prepare", claim) == ""

    def written() -> list[dict[str, Any]] | None:
        return our_entries(node.kubectl_json("get", "resourceclaim", "status")) or None

    (entry,) = wait_for("status.devices written after prepare", written)
    attributes = node.slice_devices()[device]["attributes"]
    assert (entry["pool"], entry["device"]) == (node.name, device)
    assert entry["data"] == {
        "type": "gpu",
        "uuid": attributes["uuid"]["string"],
        "productName": "NVIDIA H200",
        "driverVersion": attributes["driverVersion"]["version"],
        "pciBusID": attributes["resource.kubernetes.io/pciBusID"]["string"],
    }
    assert [(c["type"], c["status"]) for c in entry["conditions"]] == [("Ready", "True")]
    print(f"status.devices of claim 'status': {json.dumps(entry)}")

    # The claim's CDI spec mounts its request's device metadata file, which names the GPU.
    (spec_path,) = node.dirs.cdi_root.glob(f"*{claim['metadata']['uid']}*.json")
    (cdi_device,) = json.loads(spec_path.read_text())["devices"]
    (mount,) = [
        m
        for m in cdi_device["containerEdits"]["mounts"]
        if "dra-device-attributes" in m["containerPath"]
    ]
    assert mount["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/status/gpus/"
        "gpu.nvidia.com-metadata.json"
    )
    assert "ro" in mount["options"]
    metadata = json.loads(Path(mount["hostPath"]).read_text())
    ((listed,),) = [r["devices"] for r in metadata["requests"]]
    assert listed["name"] == device
    for name in ("uuid", "productName", "resource.kubernetes.io/pciBusID"):
        assert listed["attributes"][name] == attributes[name], name

    # Unprepare leaves the entry (and removes the metadata file); deallocating the claim (its
    # pod gone) removes the entry.
    assert node.call("unprepare", claim) == ""
    assert not Path(mount["hostPath"]).exists()
    assert our_entries(node.kubectl_json("get", "resourceclaim", "status")) == [entry]
    node.cluster.kubectl("delete", "-n", node.name, "pod", "status", "--grace-period=0", "--force")

    def deallocated() -> dict[str, Any] | None:
        got = node.kubectl_json("get", "resourceclaim", "status")
        return None if (got.get("status") or {}).get("allocation") else got

    assert our_entries(wait_for("the claim deallocated", deallocated)) == []
