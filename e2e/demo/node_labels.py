"""The demo's node labels: GPU Feature Discovery's labels on every demo node, and a pod that picks
its node by them.

Every demo plugin runs with ``--node-labels true`` (the chart's default, docs/user/node-pools.md),
so each node carries ``nvidia.com/gpu.product``, ``gpu.count``, ``gpu.memory``, ... of what it
publishes. :func:`section` prints what ``kubectl get nodes -L nvidia.com/gpu.product,
nvidia.com/gpu.count,nvidia.com/gpu.memory`` prints, beside the same three values read from the
node's ResourceSlices, and says whether they are equal. :func:`apply` creates a pod that selects
``nvidia.com/gpu.product=NVIDIA-H200`` by node affinity and a whole GPU by claim: it lands on an
H200 node (``demo-h200`` or ``demo-h200-shared``), never on the A100 or H100 node, whose GPUs would
fit its claim as well. The demo applies it after the time-slicing example has given back its GPU of
``demo-h200``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.config.quantity import to_bytes
from e2e.cluster import SIMULATED_TOLERATION
from e2e.suite.kube import Kube, wait_for

NAMESPACE = "demo-gpu-by-node-label"
POD = "h200-by-label"
PRODUCT = "NVIDIA-H200"
LABELS = ("nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory")
FLAGS = ("--node-labels", "true")


@dataclass(frozen=True)
class NodeRow:
    node: str
    labels: tuple[str, str, str]  # product, count, memory as labelled ("" when missing)
    slices: tuple[str, str, str]  # the same, from the node's ResourceSlices

    @property
    def equal(self) -> bool:
        """Product and count equal; memory too where the slices tell it (a node whose GPUs are
        all MIG-enabled publishes only MIG devices, which hold part of a GPU's memory)."""
        known = 3 if self.slices[2] else 2
        return self.labels[:known] == self.slices[:known]

    def verdict(self) -> str:
        if not self.equal:
            return "DIFFERS: " + " ".join(self.slices)
        return "equal" if self.slices[2] else "equal (memory: MIG devices only)"


def from_slices(slices: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    """(product with spaces as -, physical GPUs, one GPU's memory in MiB) of a node's devices:
    its product of most GPUs, as the labels count them."""
    gpus: dict[str, tuple[str, int]] = {}
    for s in slices:
        for device in s["spec"].get("devices") or []:
            attrs = device.get("attributes") or {}
            uuid = (attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string")
            if not uuid:
                continue
            product = attrs["productName"]["string"].replace(" ", "-")
            memory = device.get("capacity", {}).get("memory", {}).get("value")
            if "parentUUID" not in attrs and memory:
                gpus[uuid] = (product, to_bytes(memory) >> 20)
            else:
                gpus.setdefault(uuid, (product, 0))
    if not gpus:
        return ("", "", "")
    products = [p for p, _ in gpus.values()]
    top = max(set(products), key=products.count)
    memories = [m for p, m in gpus.values() if p == top and m]
    return (top, str(products.count(top)), str(memories[0]) if memories else "")


def rows(kube: Kube, nodes: Sequence[str]) -> list[NodeRow]:
    slices = [s for s in kube.slices() if s["spec"].get("driver") == DRIVER_NAME]
    out = []
    for name in nodes:
        node = kube.as_dict(kube.core.read_node(name))
        labels = node["metadata"].get("labels") or {}
        mine = [s for s in slices if s["spec"].get("nodeName") == name]
        labelled = (labels.get(LABELS[0], ""), labels.get(LABELS[1], ""), labels.get(LABELS[2], ""))
        out.append(NodeRow(name, labelled, from_slices(mine)))
    return out


def wait_labelled(kube: Kube, nodes: Sequence[str], *, timeout: float = 60.0) -> list[NodeRow]:
    """The rows once every node carries the labels of its slices (the plugins write them on
    their own thread, soon after they publish)."""

    def labelled() -> list[NodeRow] | None:
        table = rows(kube, nodes)
        return table if all(r.equal for r in table) else None

    return wait_for("every demo node's GFD labels equal to its slices", labelled, timeout=timeout)


def section(table: Sequence[NodeRow]) -> str:
    """The rows of ``kubectl get nodes -L ...`` with the slices' values beside them."""
    head = ("NAME", "GPU.PRODUCT", "GPU.COUNT", "GPU.MEMORY", "FROM SLICES")
    cells = [(r.node, *r.labels, r.verdict()) for r in table]
    widths = [max(len(str(c[i])) for c in [head, *cells]) for i in range(len(head))]
    lines = [
        "Node labels (GPU Feature Discovery's names, written by the plugins;"
        " docs/user/node-pools.md):",
        "  kubectl get nodes -L " + ",".join(LABELS),
    ]
    for c in [head, *cells]:
        lines.append(
            "  " + "  ".join(str(v).ljust(w) for v, w in zip(c, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


def manifests() -> list[dict[str, Any]]:
    """A claim template for any GPU, and a pod choosing its node by ``nvidia.com/gpu.product``."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "any-gpu"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]
                }
            }
        },
    }
    by_label = {"key": LABELS[0], "operator": "In", "values": [PRODUCT]}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [by_label]}]
                    }
                }
            },
            "tolerations": [dict(SIMULATED_TOLERATION)],
            "containers": [
                {
                    "name": "ctr",
                    "image": "localhost/dra-gpu/busybox:1.35",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c"],
                    "args": [
                        'echo "== env"; env | sort\n'
                        'echo "== devices"; find /dev -name "nvidia*" | sort\n'
                        'echo "== end"\n'
                        'trap "exit 0" TERM; sleep 100000 & wait\n'
                    ],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "any-gpu"}],
        },
    }
    return [template, pod]


def apply(kube: Kube) -> tuple[str, str]:
    """Create the example; (namespace, pod name) to observe."""
    kube.create_namespace(NAMESPACE)
    for doc in manifests():
        kube.create(NAMESPACE, doc)
    return NAMESPACE, POD
