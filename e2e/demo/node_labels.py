"""The demo's node-label example: a pod that picks its node by GPU Feature Discovery's labels.

Every demo plugin runs with ``--node-labels true`` (the chart's default, docs/user/node-pools.md),
so each node carries ``nvidia.com/gpu.product``, ``gpu.count``, ``gpu.memory``, ... of what it
publishes; ``e2e.suite.node_labels`` reads them beside the node's ResourceSlices and prints the
table the demo shows. :func:`apply` creates a pod that selects
``nvidia.com/gpu.product=NVIDIA-H200`` by node affinity and a whole GPU by claim: it lands on an
H200 node (``demo-h200`` or ``demo-h200-shared``), never on the A100 or H100 node, whose GPUs would
fit its claim as well. The demo applies it after the time-slicing example has given back its GPU of
``demo-h200``.
"""

from __future__ import annotations

from typing import Any

from dra_gpu import DRIVER_NAME
from e2e.cluster import SIMULATED_TOLERATION
from e2e.suite.kube import Kube
from e2e.suite.node_labels import LABELS

NAMESPACE = "demo-gpu-by-node-label"
POD = "h200-by-label"
PRODUCT = "NVIDIA-H200"


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
