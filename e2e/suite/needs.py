"""What a scenario needs from the cluster, checked before it runs: a version that lacks it
refuses the scenario with the reason (the version, the feature gate), instead of a failure that
only says a pod stayed Pending.

A need is a function of the cluster (:class:`~e2e.suite.kube.Kube`) that returns None when the
cluster has what it takes, or the reason it has not.

A refusal is accepted only where it is known (:data:`KNOWN_GATES`, :func:`known_refusal`): the
reason names a feature gate of the table and the version is older than the first one that serves
that feature with its default gates. Any other refusal (an unknown reason, or a version that
should serve the feature) is a scenario that did not run, and counts against the run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from e2e.suite.kube import RESOURCE, Kube

Need = Callable[[Kube], str | None]
GPU_CLASS = "gpu.nvidia.com"


class Refused(Exception):
    """The cluster lacks a feature the scenario needs; the message says which and why."""


@dataclass(frozen=True)
class Gate:
    """A feature a scenario needs that Kubernetes serves, with its default feature gates, only
    from ``served_from`` (major, minor) on."""

    name: str
    served_from: tuple[int, int]
    what: str


# The features a scenario may be refused for, and the first minor that serves each with its
# default gates (seen in `make matrix`'s runs, docs/development/versions.md). A refusal naming
# any other reason, or one on a version at or after ``served_from``, is a scenario that did not run.
KNOWN_GATES: Mapping[str, Gate] = {
    g.name: g
    for g in (
        Gate("DRAExtendedResource", (1, 36), "DeviceClass spec.extendedResourceName"),
        Gate("DRAConsumableCapacity", (1, 36), "a request's capacity.requests"),
        # The dynamic-MIG node's tests (e2e/matrix.py NODE_TESTS): the plugin refuses
        # --mig-mode=dynamic naming this gate.
        Gate("DRAPartitionableDevices", (1, 36), "ResourceSlice sharedCounters (dynamic MIG)"),
    )
}
# Not a refusal: dynamic MIG runs either way; where a version serves device binding conditions
# with its default gates, the MIG device is made before the pod binds, elsewhere at prepare
# (the dynamic-MIG node's ``dynamic-mig-binding`` row checks which).
BINDING_CONDITIONS = Gate(
    "DRADeviceBindingConditions", (1, 36), "device binding conditions (MIG made before binding)"
)
_GATE_IN_REASON = re.compile(r"feature gate (\w+)")
_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.\d+)?")


def _minor(version: str) -> tuple[int, int] | None:
    found = _VERSION.match(version.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def known_refusal(version: str, reason: str) -> Gate | None:
    """The gate of :data:`KNOWN_GATES` that excuses ``reason`` on ``version`` (the cluster's
    Kubernetes version, e.g. ``v1.34.4``), or None: the refusal names no known gate, or the
    version serves that feature."""
    found = _GATE_IN_REASON.search(reason)
    gate = KNOWN_GATES.get(found.group(1)) if found else None
    minor = _minor(version)
    if gate is None or minor is None or minor >= gate.served_from:
        return None
    return gate


def serves(version: str, gate: Gate) -> bool:
    """Whether ``version`` (e.g. ``v1.36.3``) serves ``gate``'s feature with its default gates."""
    minor = _minor(version)
    if minor is None:
        raise ValueError(f"{version!r} is not a Kubernetes version")
    return minor >= gate.served_from


def server_version(kube: Kube) -> str:
    return str(client.VersionApi(kube.api).get_code().git_version)


def extended_resource_mapping(kube: Kube) -> str | None:
    """The ``gpu.nvidia.com`` DeviceClass keeps ``extendedResourceName`` (DRAExtendedResource):
    an API server with the gate off drops the field, and a plain ``nvidia.com/gpu`` limit then
    stays Pending for want of a device plugin."""
    group, version = RESOURCE
    found: Any = kube.custom.get_cluster_custom_object(group, version, "deviceclasses", GPU_CLASS)
    if (found.get("spec") or {}).get("extendedResourceName"):
        return None
    return (
        f"Kubernetes {server_version(kube)} drops DeviceClass spec.extendedResourceName "
        "(feature gate DRAExtendedResource is off there): a nvidia.com/gpu limit is not "
        "served through DRA on this version"
    )


def consumable_capacity(kube: Kube) -> str | None:
    """A claim's ``capacity.requests`` is kept (DRAConsumableCapacity): an API server with the
    gate off drops the field, and a claim asking memory of a GPU would ask for nothing. Asked
    with a server-side dry run, which stores nothing."""
    group, version = RESOURCE
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": GPU_CLASS, "capacity": {"requests": {"memory": "1Gi"}}},
    }
    claim = {
        "apiVersion": f"{group}/{version}",
        "kind": "ResourceClaim",
        "metadata": {"generateName": "needs-consumable-"},
        "spec": {"devices": {"requests": [request]}},
    }
    stored: Any = kube.custom.create_namespaced_custom_object(
        group, version, "default", "resourceclaims", claim, dry_run="All"
    )
    (kept,) = stored["spec"]["devices"]["requests"]
    if (kept.get("exactly") or {}).get("capacity"):
        return None
    return (
        f"Kubernetes {server_version(kube)} drops a request's capacity.requests (feature gate "
        "DRAConsumableCapacity is off there): a claim cannot ask memory of a GPU on this version"
    )


def refuse_unmet(kube: Kube, needs: Sequence[Need]) -> None:
    """Raise :class:`Refused` with the first unmet need's reason."""
    for need in needs:
        reason = need(kube)
        if reason is not None:
            raise Refused(reason)
