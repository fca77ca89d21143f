"""A scenario's manifests with its pods pinned to one demo node, for the demo's own examples.

The pods tolerate a simulated node's taint, so the node may be real or simulated.
"""

from __future__ import annotations

from typing import Any

from e2e.cluster import SIMULATED_TOLERATION
from e2e.suite.kube import load_manifests
from e2e.suite.runner import SCENARIOS_DIR


def manifests(scenario: str, node: str) -> list[dict[str, Any]]:
    """The documents of ``e2e/scenarios/<scenario>/``, each pod pinned to ``node``."""
    pinned = {"nodeSelector": {"kubernetes.io/hostname": node}}
    tolerate = {"tolerations": [dict(SIMULATED_TOLERATION)]}
    return [
        {**doc, "spec": {**doc["spec"], **pinned, **tolerate}} if doc["kind"] == "Pod" else doc
        for doc in load_manifests(SCENARIOS_DIR / scenario)
    ]
