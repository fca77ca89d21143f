"""The demo's dynamic-MIG example: a claim for a ``3g.40gb`` MIG device on ``demo-h100-dyn``.

That node's H100s have MIG on and no MIG devices; its plugin runs with ``--mig-mode=dynamic``,
so the scheduler allocates one of the published placements and prepare creates the MIG device:
the table's row shows the created device's UUID (``MIG-…``) as the container would get it. The
example is not one of ``e2e/scenarios/`` (the node suite runs those on nodes without dynamic
MIG), and its pod is pinned to the dynamic node: a real node like the others, whose container's
report is read from its log, or, where real nodes cannot start, a simulated one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_gpu.mig.dynamic import SIMULATED_STATE_NAME
from e2e import mig_manifests
from e2e.demo.env import DYNAMIC_MIG_NODE, DemoState
from e2e.demo.view import Row
from e2e.suite.kube import Kube, wait_for
from e2e.waiting import WaitTimeout

NAMESPACE = "demo-mig-dynamic"
POD = "mig-3g-created"
PROFILE = "3g.40gb"
DRIVER = "gpu.nvidia.com"
STATUS_WAIT_S = 30.0


def manifests(node: str) -> list[dict[str, Any]]:
    return [mig_manifests.claim_template(POD, PROFILE), mig_manifests.pod(POD, node, template=POD)]


def apply(kube: Kube) -> tuple[str, str]:
    """Create the example; (namespace, pod name) to observe."""
    kube.create_namespace(NAMESPACE)
    for doc in manifests(DYNAMIC_MIG_NODE):
        kube.create(NAMESPACE, doc)
    return NAMESPACE, POD


def status_uuids(kube: Kube) -> list[str]:
    """The ``uuid`` of each of the driver's entries in the example's claims' device status."""
    return [
        str((entry.get("data") or {}).get("uuid") or "")
        for c in kube.all_claims()
        if (c.get("metadata") or {}).get("namespace") == NAMESPACE
        for entry in (c.get("status") or {}).get("devices") or []
        if entry.get("driver") == DRIVER
    ]


def with_created(rows: Sequence[Row], state: DemoState, kube: Kube) -> list[Row]:
    """``rows`` with the MIG devices the dynamic node's plugin created added to what was seen,
    and the UUID the claim's device status names (written by the plugin shortly after the
    prepare: waited for)."""
    node = next(n for n in state.nodes if n.name == DYNAMIC_MIG_NODE)
    path = Path(node.state_dir) / SIMULATED_STATE_NAME
    made: dict[str, list[dict[str, Any]]] = json.loads(path.read_text()) if path.exists() else {}
    created = [
        f"created {i['uuid']} ({i['profile']} at memory slice {i['start']})"
        for items in made.values()
        for i in items
    ]
    try:
        said = wait_for(
            "the UUID in the claim's device status",
            lambda: [u for u in status_uuids(kube) if u] or None,
            timeout=STATUS_WAIT_S,
        )
    except WaitTimeout:  # said in the row, not raised: the rest of the demo still runs
        said = []
    status = [f"claim status.devices: uuid {u}" for u in said] or [
        f"claim status.devices: no uuid within {STATUS_WAIT_S:.0f} s"
    ]
    return [replace(r, saw="\n".join([r.saw, *created, *status])) for r in rows]
