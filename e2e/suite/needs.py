"""What a scenario needs from the cluster, checked before it runs: a version that lacks it
refuses the scenario with the reason (the version, the feature gate), instead of a failure that
only says a pod stayed Pending.

A need is a function of the cluster (:class:`~e2e.suite.kube.Kube`) that returns None when the
cluster has what it takes, or the reason it has not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client

from e2e.suite.kube import RESOURCE, Kube

Need = Callable[[Kube], str | None]
GPU_CLASS = "gpu.nvidia.com"


class Refused(Exception):
    """The cluster lacks a feature the scenario needs; the message says which and why."""


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
