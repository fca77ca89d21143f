"""The demo's dynamic-MIG example: a claim for a ``3g.40gb`` MIG device on ``demo-h100-dyn``.

That node's H100s have MIG on and no MIG devices; its plugin runs with ``--mig-mode=dynamic``,
so the scheduler allocates one of the published placements and the MIG device is created for
the claim: the table's row shows the created device's UUID (``MIG-…``) as the container would
get it. The example is not one of ``e2e/scenarios/`` (the node suite runs those on nodes without
dynamic MIG), and its pod is pinned to the dynamic node: a real node like the others, whose
container's report is read from its log, or, where real nodes cannot start, a simulated one.

Where the API server serves device binding conditions (the demo's Kubernetes does), the
allocated device carries ``gpu.nvidia.com/mig-created`` and the plugin creates the MIG device
before the pod is bound (docs/concepts/dynamic-mig.md): the row also shows the condition from
the claim's ``status.devices`` (True, and when), when the pod was bound (its ``PodScheduled``
condition) and the pod's events, so that one reads the condition was true first.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_gpu.mig.dynamic import SIMULATED_STATE_NAME
from dra_gpu.plugin.published import MIG_CREATED
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
CREATED = f"{DRIVER}/{MIG_CREATED}"
# The pod's events that tell its binding: the scheduler waited for the binding conditions, then
# bound it.
BINDING_EVENTS = ("BindingConditionsPending", "Scheduled")


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


def _utc(text: str) -> datetime.datetime:
    """An API time (``2026-12-06T20:01:02Z``, or ``+00:00`` as the Python client writes it)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(datetime.UTC)


def _rfc3339(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("eventTime") or event.get("firstTimestamp") or event.get("lastTimestamp") or ""
    )


def binding_lines(
    claim: Mapping[str, Any], pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]
) -> list[str]:
    """What the row says of the binding (pure): the ``mig-created`` condition of the claim's
    device status (status and time), when the pod was bound (``PodScheduled`` True), the pod's
    events of its binding, and which came first (times in whole seconds, as the API keeps
    them). Where the allocation carries no binding condition, that it was made at prepare."""
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    ours = [r for r in results.get("results") or [] if r.get("driver") == DRIVER]
    waited = [r for r in ours if CREATED in (r.get("bindingConditions") or [])]
    if not waited:
        return [
            "no binding condition in the allocation: this API server does not serve them, "
            "the MIG device was created at prepare"
        ]
    device = str(waited[0]["device"])
    entries = (claim.get("status") or {}).get("devices") or []
    found = [
        c
        for e in entries
        if e.get("driver") == DRIVER and e.get("device") == device
        for c in e.get("conditions") or []
        if c.get("type") == CREATED
    ]
    scheduled = [
        c
        for c in (pod.get("status") or {}).get("conditions") or []
        if c.get("type") == "PodScheduled" and c.get("status") == "True"
    ]
    told = sorted(
        ((_utc(t), str(e.get("reason"))) for e in events if (t := _event_time(e))),
        key=lambda pair: pair[0],
    )
    lines = [f"binding condition of {device} (claim status.devices):"]
    if not found:
        lines.append(f"  {CREATED}: none in the claim's status")
    else:
        made = found[0]
        lines.append(
            f"  {CREATED} {made.get('status')} at {_rfc3339(_utc(str(made['lastTransitionTime'])))}"
            f" ({made.get('reason')})"
        )
    if not scheduled:
        lines.append("pod not bound (no PodScheduled True)")
    else:
        bound = _utc(str(scheduled[0]["lastTransitionTime"]))
        lines.append(f"pod bound at {_rfc3339(bound)} (PodScheduled True)")
    lines.append(
        "pod events: "
        + (
            ", ".join(f"{reason} {_rfc3339(t)}" for t, reason in told if reason in BINDING_EVENTS)
            or "none of " + ", ".join(BINDING_EVENTS)
        )
    )
    if found and scheduled:
        made_at = _utc(str(found[0]["lastTransitionTime"]))
        true = found[0].get("status") == "True"
        first = true and made_at <= _utc(str(scheduled[0]["lastTransitionTime"]))
        lines.append(
            "mig-created was True before the pod was bound"
            if first
            else "mig-created was NOT True before the pod was bound"
        )
    return lines


def binding_of(kube: Kube) -> list[str]:
    """:func:`binding_lines` of the example's pod and its claim, read from the API server; the
    scheduler's events are written a moment after the binding: waited for, a while."""
    pod = kube.pod(NAMESPACE, POD)
    names = [
        str(s.get("resourceClaimName") or "")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    ]
    claim = kube.claim(NAMESPACE, names[0]) if names and names[0] else None
    if claim is None:
        return ["binding: the pod's claim not found"]

    def bound_event() -> list[dict[str, Any]] | None:
        events = kube.events(NAMESPACE, POD)
        return events if any(e.get("reason") == "Scheduled" for e in events) else None

    try:
        events = wait_for("the pod's Scheduled event", bound_event, timeout=STATUS_WAIT_S)
    except WaitTimeout:  # the lines say which events there were
        events = kube.events(NAMESPACE, POD)
    return binding_lines(claim, pod, events)


def with_created(rows: Sequence[Row], state: DemoState, kube: Kube) -> list[Row]:
    """``rows`` with the MIG devices the dynamic node's plugin created added to what was seen,
    the UUID the claim's device status names (written by the plugin shortly after the prepare:
    waited for), and the binding (:func:`binding_of`)."""
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
    binding = binding_of(kube)
    return [replace(r, saw="\n".join([r.saw, *created, *status, *binding])) for r in rows]
