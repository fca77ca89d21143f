"""``dra-gpu explain`` against the real scheduler.

Three simulated nodes (h200x8, h100x8, a100x4-mig) publish the ResourceSlices the plugin builds
for them (same builder; no plugin process is needed for allocation). For each of twenty claim
shapes, in turn: the claim is created, explain judges it against the cluster as it is (earlier
claims keep their devices, so later shapes meet a fuller cluster), then a pod using it is
created and the real scheduler decides. Whatever explain says fits must be allocated, on a node
explain named; whatever it says cannot fit must stay Pending (Unschedulable, or a
scheduler error for a CEL run-time error). Also: explain
on the ``unsatisfiable`` scenario's claim template names the count as the reason.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from dra_gpu import DRIVER_NAME, cli
from dra_gpu.controller import classes
from dra_gpu.explain import analysis, source
from dra_gpu.kube.client import KubeClient, connect
from dra_gpu.kube.objects import ResourceClaim
from e2e import waiting
from e2e.cluster import SIMULATED_TOLERATION, Cluster
from e2e.sim_slices import node_slices

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
WAIT_S = 60.0  # bounds a broken test only
PROFILES = ("h200x8", "h100x8", "a100x4-mig")
A = f"device.attributes['{DRIVER_NAME}']"
C = f"device.capacity['{DRIVER_NAME}']"


def exactly(name: str, count: int = 1, cls: str = "gpu.nvidia.com", *sel: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if sel:
        spec["selectors"] = [{"cel": {"expression": e}} for e in sel]
    return {"name": name, "exactly": spec}


# (id, requests, constraints), in the order they are created.
SHAPES: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]] = [
    ("one-gpu", [exactly("g")], []),
    (
        "h200-by-product",
        [exactly("g", 2, "gpu.nvidia.com", f"{A}.productName == 'NVIDIA H200'")],
        [],
    ),
    (
        "h100-by-product",
        [exactly("g", 1, "gpu.nvidia.com", f"{A}.productName.startsWith('NVIDIA H100')")],
        [],
    ),
    ("b200-absent", [exactly("g", 1, "gpu.nvidia.com", f"{A}.productName == 'NVIDIA B200'")], []),
    ("sixteen", [exactly("g", 16)], []),
    (
        "memory-100gi",
        [exactly("g", 1, "gpu.nvidia.com", f"{C}.memory.compareTo(quantity('100Gi')) >= 0")],
        [],
    ),
    (
        "memory-200gi",
        [exactly("g", 1, "gpu.nvidia.com", f"{C}.memory.compareTo(quantity('200Gi')) >= 0")],
        [],
    ),
    (
        "typo-cel-error",
        [exactly("g", 1, "gpu.nvidia.com", f"{A}.productname == 'NVIDIA H200'")],
        [],
    ),
    ("mig-any", [exactly("m", 1, "mig.nvidia.com")], []),
    ("mig-3g20gb-two", [exactly("m", 2, "mig.nvidia.com", f"{A}.profile == '3g.20gb'")], []),
    ("mig-7g-absent", [exactly("m", 1, "mig.nvidia.com", f"{A}.profile == '7g.40gb'")], []),
    (
        "two-requests-same-product",
        [exactly("a", 2), exactly("b", 2)],
        [{"matchAttribute": f"{DRIVER_NAME}/productName"}],
    ),
    (
        "h200-and-h100-same-product",
        [
            exactly("a", 1, "gpu.nvidia.com", f"{A}.productName == 'NVIDIA H200'"),
            exactly("b", 1, "gpu.nvidia.com", f"{A}.productName.startsWith('NVIDIA H100')"),
        ],
        [{"matchAttribute": f"{DRIVER_NAME}/productName"}],
    ),
    (
        "distinct-product-two",
        [exactly("g", 2)],
        [{"distinctAttribute": f"{DRIVER_NAME}/productName"}],
    ),
    (
        "driver-newer",
        [exactly("g", 1, "gpu.nvidia.com", f"{A}.driverVersion.isGreaterThan(semver('500.0.0'))")],
        [],
    ),
    (
        "driver-too-new",
        [exactly("g", 1, "gpu.nvidia.com", f"{A}.driverVersion.isGreaterThan(semver('999.0.0'))")],
        [],
    ),
    (
        "first-available",
        [
            {
                "name": "g",
                "firstAvailable": [
                    {"name": "many", "deviceClassName": "gpu.nvidia.com", "count": 16},
                    {"name": "one", "deviceClassName": "gpu.nvidia.com", "count": 1},
                ],
            }
        ],
        [],
    ),
    (
        "other-domain-error",
        [exactly("g", 1, "gpu.nvidia.com", "device.attributes['other.example.com'].x == 1")],
        [],
    ),
    (
        "pci-domain",
        [
            exactly(
                "g",
                1,
                "gpu.nvidia.com",
                "device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:')",
            )
        ],
        [],
    ),
    (
        "h100-remaining-eight",
        [exactly("g", 8, "gpu.nvidia.com", f"{A}.productName.startsWith('NVIDIA H100')")],
        [],
    ),
    (
        "a100-full-gpu",
        [exactly("g", 1, "gpu.nvidia.com", f"{A}.productName == 'NVIDIA A100-SXM4-40GB'")],
        [],
    ),
]


def untainted(kube: KubeClient, node: str) -> bool:
    """No taint but the simulated node's own, which the pods here tolerate."""
    taints = kube.request("GET", f"/api/v1/nodes/{node}")["spec"].get("taints") or []
    return all(t["key"] == SIMULATED_TOLERATION["key"] for t in taints)


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[KubeClient]:
    suffix = uuid.uuid4().hex[:5]
    kube = connect(cluster.kubeconfig)
    for profile in PROFILES:
        node = f"ex-{profile}-{suffix}"
        uid = str(cluster.register_node(node)["metadata"]["uid"])
        doc = {
            "apiVersion": "v1",
            "kind": "List",
            "items": node_slices(node, profile, owner_uid=uid),
        }
        cluster.kubectl("create", "-f", "-", input=json.dumps(doc))
        # A new Node carries the not-ready taint until the node controller sees it Ready.
        waiting.wait_for(
            f"node {node} without the not-ready taint",
            functools.partial(untainted, kube, node),
            timeout=WAIT_S,
        )
    for desired in classes.builtin_classes(extended_resource_name=None):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(desired.body()))
    try:
        yield kube
    finally:
        clean_up(cluster, kube, [f"ex-{profile}-{suffix}" for profile in PROFILES])
        kube.close()


def clean_up(cluster: Cluster, kube: KubeClient, nodes: list[str]) -> None:
    """Leave the shared cluster as found: this module's pods left Pending would take the devices
    of nodes that later tests register (the scheduler retries them as nodes appear), and its
    nodes would take later tests' pods."""
    for kind, path in (
        ("pods", f"/api/v1/namespaces/{NS}/pods"),
        ("resourceclaims", f"{source.RESOURCE}/namespaces/{NS}/resourceclaims"),
    ):
        for item in kube.request("GET", path).get("items", []):
            name = item["metadata"]["name"]
            if name.startswith("ex-"):
                query = {"gracePeriodSeconds": "0"} if kind == "pods" else None
                kube.request("DELETE", f"{path}/{name}", query=query)
    for node in nodes:
        cluster.unregister_node(node)


def pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "tolerations": [dict(SIMULATED_TOLERATION)],  # the nodes are simulated
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        },
    }


def scheduler_outcome(kube: KubeClient, name: str) -> tuple[bool, str]:
    """(scheduled, node) once the scheduler has decided."""
    path = f"/api/v1/namespaces/{NS}/pods/{name}"

    def decided() -> tuple[bool, str] | None:
        p = kube.request("GET", path)
        if (p.get("spec") or {}).get("nodeName"):
            return True, p["spec"]["nodeName"]
        for c in (p.get("status") or {}).get("conditions") or ():
            # Unschedulable, or SchedulerError for a CEL run-time error: the pod stays Pending.
            if c["type"] == "PodScheduled" and c.get("status") == "False":
                return False, str(c.get("message", ""))
        return None

    return waiting.wait_for(f"the scheduler's decision on pod {name}", decided, timeout=WAIT_S)


@pytest.mark.timeout(900)
def test_explain_agrees_with_the_scheduler(client: KubeClient) -> None:
    disagreements = []
    verdicts = []
    for shape, requests, constraints in SHAPES:
        name = f"ex-{shape}"
        body: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": requests, "constraints": constraints}},
        }
        # The API boundary: the created claim's JSON, taken to be a ResourceClaim.
        claim = cast(
            ResourceClaim,
            client.request("POST", f"{source.RESOURCE}/namespaces/{NS}/resourceclaims", body=body),
        )
        device_classes, slice_objs, claims = source.cluster_state(client)
        report = analysis.explain_claim(
            claim, classes=device_classes, slices=slice_objs, claims=claims
        )
        client.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod(name, name))
        scheduled, where = scheduler_outcome(client, name)
        verdicts.append((shape, report.satisfiable, scheduled))
        if scheduled != report.satisfiable or (scheduled and where not in report.fits):
            disagreements.append(
                f"{shape}: explain fits={report.fits} suggestions={report.suggestions}; "
                f"scheduler {'placed it on ' if scheduled else 'says: '}{where}"
            )
    assert not disagreements, "\n".join(disagreements)
    # Both verdicts occur often enough for the agreement to mean something.
    assert sum(v[2] for v in verdicts) >= 8 and sum(not v[2] for v in verdicts) >= 6, verdicts


def test_explain_names_why_unsatisfiable_stays_pending(
    client: KubeClient, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    template = ROOT / "e2e" / "scenarios" / "unsatisfiable" / "01-claim-template.yaml"
    argv = ["explain", "-f", str(template), "--kubeconfig", str(cluster.kubeconfig), "-o", "json"]
    assert cli.main(argv) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert report["satisfiable"] is False
    assert any("count 16 is more than any node offers" in s for s in report["suggestions"]), report
    assert cli.main(argv[:-2]) == 1  # the table names it too
    assert "count 16 is more than any node offers" in capsys.readouterr().out


def test_explain_reads_a_pod_and_a_claim_by_name(
    client: KubeClient, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig), "-n", NS, "-o", "json"]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "ex-by-name"},
        "spec": {"devices": {"requests": [exactly("g", 1, "gpu.nvidia.com", f"{A}.x == 1")]}},
    }
    client.request("POST", f"{source.RESOURCE}/namespaces/{NS}/resourceclaims", body=body)
    client.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod("ex-by-name", "ex-by-name"))
    for target in ("pod/ex-by-name", "claim/ex-by-name"):
        assert cli.main(["explain", target, *kubeconfig]) == 1
        (report,) = json.loads(capsys.readouterr().out)
        assert report["claim"] == f"{NS}/ex-by-name"
        (request,) = report["requests"]
        assert any("no such member" in (r.get("celError") or "") for r in request["ruledOut"])
    assert cli.main(["explain", "pod/no-such-pod", *kubeconfig]) == 2
    assert "no-such-pod" in capsys.readouterr().err
