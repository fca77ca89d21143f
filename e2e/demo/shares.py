"""The demo's consumable-shares example: two pods sharing one GPU by memory.

``demo-h200-shared``'s plugin runs with ``--consumable-shares memory`` (docs/concepts/sharing.md):
its
H200s are published with ``allowMultipleAllocations`` and a memory policy, so the scheduler puts
several claims on one GPU as long as their memory fits, gives each allocation result a
``shareID`` and records what it consumed. The example is the ``shared-by-memory`` scenario
(claims asking 40Gi and 20Gi) pinned to that node; its rows show the one GPU both pods got,
each share's ID and its consumed memory (``view.device_lines``). Elsewhere (the node suite, a
cluster without that mode) the same scenario gets two whole GPUs.
"""

from __future__ import annotations

from e2e.demo import pinned
from e2e.demo.env import SHARES_NODE
from e2e.suite.kube import Kube

NAMESPACE = "demo-shared-by-memory"
SCENARIO = "shared-by-memory"


def apply(kube: Kube) -> list[tuple[str, str]]:
    """Create the example; (namespace, pod name) of each pod to observe."""
    kube.create_namespace(NAMESPACE)
    pods = []
    for doc in pinned.manifests(SCENARIO, SHARES_NODE):
        kube.create(NAMESPACE, doc)
        if doc["kind"] == "Pod":
            pods.append((NAMESPACE, str(doc["metadata"]["name"])))
    return pods
