"""The Kubernetes objects the driver reads: ``TypedDict``s of their API JSON (resource.k8s.io/v1).

Only the fields some module reads (or writes back) are declared; the API server sends more, and
those are simply not named here. ``total=False`` everywhere, since a reader must cope with an
absent field; ``Required[...]`` marks what the API server always sets on a stored object (names,
the pool of a slice, the keys of an allocation result), so code may index it directly.

These are types only, for mypy: nothing is checked at run time. Where JSON enters (the API
client's answers, ``json.loads``, a YAML file, a test's literal) the value is ``cast`` to one of
these once, at that boundary. Standard library only, so the pure core may import it.
"""

from __future__ import annotations

import builtins
from typing import Any, Required, TypedDict
from urllib.parse import quote


def claim_path(namespace: str, name: str) -> str:
    """The API path of a ResourceClaim (its GET; its status subresource below it)."""
    return f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"


def node_path(name: str) -> str:
    """The API path of a Node (its GET, and the merge patch of its labels)."""
    return f"/api/v1/nodes/{quote(name, safe='')}"


# --- shared --------------------------------------------------------------------------------


class OwnerReference(TypedDict, total=False):
    apiVersion: Required[str]
    kind: Required[str]
    name: Required[str]
    uid: Required[str]
    controller: bool


class ObjectMeta(TypedDict, total=False):
    name: str  # absent only on an object not yet created (generateName)
    namespace: str
    uid: str
    generateName: str
    generation: int
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]


class CELDeviceSelector(TypedDict):
    expression: str


class DeviceSelector(TypedDict, total=False):
    cel: CELDeviceSelector


class DeviceToleration(TypedDict, total=False):
    key: str
    operator: str  # "Exists" or "Equal" (the default)
    value: str
    effect: str
    tolerationSeconds: int


class OpaqueDeviceConfiguration(TypedDict, total=False):
    driver: Required[str]
    parameters: Required[object]  # the driver's own JSON document (a config kind)


# --- ResourceClaim -------------------------------------------------------------------------


class ExactDeviceRequest(TypedDict, total=False):
    deviceClassName: str
    selectors: list[DeviceSelector]
    allocationMode: str  # "ExactCount" (the default) or "All"
    count: int
    adminAccess: bool
    tolerations: list[DeviceToleration]
    capacity: dict[str, Any]  # {"requests": {name: quantity}} (consumable capacity)


class DeviceSubRequest(ExactDeviceRequest, total=False):
    name: Required[str]


class DeviceRequest(ExactDeviceRequest, total=False):
    """v1: ``exactly`` or ``firstAvailable``; the inherited fields are v1beta1's inline shape."""

    name: Required[str]
    exactly: ExactDeviceRequest
    firstAvailable: list[DeviceSubRequest]


class DeviceConstraint(TypedDict, total=False):
    requests: list[str]
    matchAttribute: str
    distinctAttribute: str


class DeviceClaimConfiguration(TypedDict, total=False):
    requests: list[str]  # empty or absent: every request of the claim
    opaque: OpaqueDeviceConfiguration


class DeviceClaim(TypedDict, total=False):
    requests: list[DeviceRequest]
    constraints: list[DeviceConstraint]
    config: list[DeviceClaimConfiguration]


class ResourceClaimSpec(TypedDict, total=False):
    devices: DeviceClaim


class DeviceRequestAllocationResult(TypedDict, total=False):
    request: Required[str]  # "req" or "req/sub"
    driver: Required[str]
    pool: Required[str]
    device: Required[str]
    adminAccess: bool
    shareID: str
    consumedCapacity: dict[str, str]  # capacity name -> quantity (shared devices only)
    tolerations: list[DeviceToleration]
    bindingConditions: list[str]  # copied from the slice (KEP-5007)
    bindingFailureConditions: list[str]


class DeviceAllocationConfiguration(DeviceClaimConfiguration, total=False):
    source: Required[str]  # "FromClass" or "FromClaim"


class DeviceAllocationResult(TypedDict, total=False):
    results: list[DeviceRequestAllocationResult]
    config: list[DeviceAllocationConfiguration]


class AllocationResult(TypedDict, total=False):
    devices: DeviceAllocationResult
    nodeSelector: dict[str, Any]
    allocationTimestamp: str


class ResourceClaimConsumerReference(TypedDict, total=False):
    apiGroup: str
    resource: Required[str]
    name: Required[str]
    uid: Required[str]


class Condition(TypedDict, total=False):
    type: Required[str]
    status: Required[str]  # "True", "False" or "Unknown"
    reason: Required[str]  # CamelCase
    message: str
    lastTransitionTime: Required[str]  # RFC 3339
    observedGeneration: int


class AllocatedDeviceStatus(TypedDict, total=False):
    """One entry of ``status.devices`` (KEP-4817): written by the driver that prepared it."""

    driver: Required[str]
    pool: Required[str]
    device: Required[str]
    shareID: str
    conditions: list[Condition]
    data: dict[str, Any]  # any JSON object, at most 10 KiB


class ResourceClaimStatus(TypedDict, total=False):
    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumerReference]
    devices: list[AllocatedDeviceStatus]


class ResourceClaim(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Required[ObjectMeta]
    spec: ResourceClaimSpec  # absent only on a claim written by hand (a file, a template)
    status: ResourceClaimStatus


# --- ResourceSlice -------------------------------------------------------------------------


class ResourcePool(TypedDict, total=False):
    name: Required[str]
    generation: Required[int]
    resourceSliceCount: Required[int]


class DeviceAttribute(TypedDict, total=False):
    """Exactly one of the four is set (the field names shadow built-ins, hence ``builtins.``)."""

    int: builtins.int
    bool: builtins.bool
    string: str
    version: str


class DeviceCapacity(TypedDict, total=False):
    value: Required[str]  # a quantity


class Counter(TypedDict):
    value: str  # a quantity


class CounterSet(TypedDict):
    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(TypedDict):
    counterSet: str
    counters: dict[str, Counter]


class DeviceTaint(TypedDict, total=False):
    key: Required[str]
    value: str
    effect: Required[str]  # "NoSchedule", "NoExecute" or "None"
    timeAdded: str


class SliceDevice(TypedDict, total=False):
    """One entry of ``spec.devices`` (``Device`` in the API)."""

    name: Required[str]
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]
    consumesCounters: list[DeviceCounterConsumption]
    taints: list[DeviceTaint]


class ResourceSliceSpec(TypedDict, total=False):
    driver: Required[str]
    pool: Required[ResourcePool]
    nodeName: str  # exactly one of nodeName, nodeSelector, allNodes
    nodeSelector: dict[str, Any]
    allNodes: bool
    devices: list[SliceDevice]
    sharedCounters: list[CounterSet]


class ResourceSlice(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Required[ObjectMeta]
    spec: Required[ResourceSliceSpec]


# --- DeviceClass, Node ---------------------------------------------------------------------


class DeviceClassConfiguration(TypedDict, total=False):
    opaque: OpaqueDeviceConfiguration


class DeviceClassSpec(TypedDict, total=False):
    selectors: list[DeviceSelector]
    config: list[DeviceClassConfiguration]
    extendedResourceName: str


class DeviceClass(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: Required[ObjectMeta]
    spec: DeviceClassSpec


class NodeSystemInfo(TypedDict, total=False):
    kubeletVersion: str


class NodeStatus(TypedDict, total=False):
    nodeInfo: NodeSystemInfo


class Node(TypedDict, total=False):
    """What is read of a Node: its UID (a ResourceSlice's owner) and its kubelet's version."""

    apiVersion: str
    kind: str
    metadata: Required[ObjectMeta]
    status: NodeStatus
