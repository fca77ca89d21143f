"""Devices -> resource.k8s.io/v1 ResourceSlice objects (pure; no API client here).

One pool per node, named after the node, published as ``ceil(n / 128)`` slices (at least one:
an empty slice tells the scheduler the node has no devices rather than "not published yet").
Every slice of a pool carries the same ``generation`` and ``resourceSliceCount``; a consumer
uses only the highest generation, so the publisher bumps it whenever the device set changes.

Slice names are deterministic (``<node>-<driver>-<i>``, made a valid DNS subdomain) so that a
restarted plugin updates its own slices instead of leaking new ones.

A device is anything with a name, attributes and capacities (:class:`SliceDevice`: a driver
passes its own device values). Attribute encoding: ``bool`` is tested before ``int`` (``bool``
is an ``int`` in Python), and a version (:class:`VersionValue`, printed as
``major.minor.patch``) is distinct from ``str``. Capacities are Kubernetes quantities in their
canonical binary form (``150754820096`` -> ``143771Mi``), which is what the API server returns
anyway, so a published slice compares equal to the one read back.

Partitionable devices: devices that consume counters list them under ``consumesCounters``; the
counter sets they name are published in slices of their own in the same pool (``pool_layout``:
how Kubernetes 1.35+ wants it), and a slice holding such devices carries at most 64 of them.

Binding conditions (KEP-5007, :class:`BindingConditions`, by device name): the conditions the
driver reports in an allocated claim's ``status.devices`` before the scheduler binds the pod
(``bindingConditions``, all True) or to send the claim back to be allocated again
(``bindingFailureConditions``, any True).

Consumable devices (KEP-5075, :class:`ConsumableDevice`) carry ``allowMultipleAllocations`` and
a ``requestPolicy`` on the capacities their ``request_policies`` name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
# Also the limit when any device consumes counters (1.35+).
MAX_DEVICES_PER_SLICE_WITH_COUNTERS = MAX_DEVICES_PER_SLICE_WITH_TAINTS
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_NAME_LENGTH = 253


class VersionValue(Protocol):
    """A semantic version attribute; ``str()`` gives ``major.minor.patch``."""

    @property
    def major(self) -> int: ...

    @property
    def minor(self) -> int: ...

    @property
    def patch(self) -> int: ...


AttributeValue = bool | int | str | VersionValue


class CounterUse(Protocol):
    """A partitionable device's share of its counter set (KEP-4815)."""

    @property
    def counter_set(self) -> str: ...

    @property
    def consumes(self) -> Mapping[str, int]: ...

    @property
    def set_counters(self) -> Mapping[str, int]:
        """What the whole counter set holds (published once per set)."""
        ...


class SliceDevice(Protocol):
    """What a slice publishes of a device."""

    @property
    def partition(self) -> CounterUse | None:
        """None for a device that consumes no shared counters."""
        ...

    @property
    def name(self) -> str: ...

    @property
    def attributes(self) -> Mapping[str, AttributeValue]: ...

    @property
    def capacity(self) -> Mapping[str, int]: ...


class RequestPolicy(Protocol):
    """How a claim consumes one capacity of a device that allows multiple allocations
    (KEP-5075): the default and the range (``step`` None: any amount in the range)."""

    @property
    def default(self) -> int: ...

    @property
    def min(self) -> int: ...

    @property
    def max(self) -> int: ...

    @property
    def step(self) -> int | None: ...


@runtime_checkable
class ConsumableDevice(SliceDevice, Protocol):
    """A device several claims are allocated at once (``allowMultipleAllocations``)."""

    @property
    def request_policies(self) -> Mapping[str, RequestPolicy]: ...


_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
_DASHES = re.compile(r"-{2,}")
_DOTS = re.compile(r"\.{2,}")


def format_quantity(value: int) -> str:
    """Canonical binary-SI quantity for a non-negative integer, as Kubernetes prints it."""
    if value < 0:
        raise ValueError(f"negative quantity {value}")
    exp = 0
    while value and value % 1024 == 0 and exp < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        exp += 1
    return f"{value}{_BINARY_SUFFIXES[exp]}"


def encode_attribute(value: AttributeValue) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, str):
        return {"string": value}
    return {"version": str(value)}


@dataclass(frozen=True)
class BindingConditions:
    """A device's binding conditions (at most 4 of each, valid condition types)."""

    ready: tuple[str, ...]  # all True: the scheduler binds the pod
    failed: tuple[str, ...]  # any True: the claim is deallocated and allocated again


MAX_BINDING_CONDITIONS = 4


def device_to_api(
    device: SliceDevice,
    taints: Sequence[Mapping[str, Any]] = (),
    binding: BindingConditions | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": device.name,
        "attributes": {k: encode_attribute(v) for k, v in device.attributes.items()},
        "capacity": {k: {"value": format_quantity(v)} for k, v in device.capacity.items()},
    }
    if isinstance(device, ConsumableDevice):
        out["allowMultipleAllocations"] = True
        for name, policy in device.request_policies.items():
            out["capacity"][name]["requestPolicy"] = _policy(policy)
    if device.partition is not None:
        out["consumesCounters"] = [
            {
                "counterSet": device.partition.counter_set,
                "counters": _counters(device.partition.consumes),
            }
        ]
    if taints:
        out["taints"] = [dict(t) for t in taints]
    if binding is not None:
        out["bindingConditions"] = list(binding.ready)
        out["bindingFailureConditions"] = list(binding.failed)
    return out


def _policy(policy: RequestPolicy) -> dict[str, Any]:
    valid: dict[str, Any] = {
        "min": format_quantity(policy.min),
        "max": format_quantity(policy.max),
    }
    if policy.step is not None:
        valid["step"] = format_quantity(policy.step)
    return {"default": format_quantity(policy.default), "validRange": valid}


def _counters(values: Mapping[str, int]) -> dict[str, Any]:
    return {name: {"value": format_quantity(n)} for name, n in values.items()}


def counter_sets(devices: Sequence[SliceDevice]) -> list[dict[str, Any]]:
    """The counter sets ``devices`` consume, in the order they are first named."""
    found: dict[str, Mapping[str, int]] = {}
    for d in devices:
        if d.partition is not None:
            found.setdefault(d.partition.counter_set, d.partition.set_counters)
    return [{"name": name, "counters": _counters(values)} for name, values in found.items()]


def pool_layout(
    devices: Sequence[SliceDevice],
    devices_per_slice: int,
    taints: Mapping[str, Sequence[Mapping[str, Any]]],
    binding: Mapping[str, BindingConditions] | None = None,
) -> list[dict[str, Any]]:
    """The spec parts of a pool's slices, in order: counter sets first, then devices.

    Kubernetes 1.35+ (the API this driver serves is 1.37): a slice holds ``sharedCounters`` or
    ``devices``, never both; at most 8 counter sets per slice; devices may name counter sets of
    other slices of their pool. A version that keeps counters beside the devices branches here.
    """
    sets = counter_sets(devices)
    parts: list[dict[str, Any]] = [
        {"sharedCounters": sets[i : i + MAX_COUNTER_SETS_PER_SLICE]}
        for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    if sets:
        devices_per_slice = min(devices_per_slice, MAX_DEVICES_PER_SLICE_WITH_COUNTERS)
    parts += [
        {
            "devices": [
                device_to_api(d, taints.get(d.name, ()), (binding or {}).get(d.name)) for d in chunk
            ]
        }
        for chunk in _chunks(devices, devices_per_slice)
    ]
    return parts


def slice_name(*, node_name: str, driver_name: str, index: int) -> str:
    """``<node>-<driver>-<index>`` as a DNS subdomain; long names keep a hash of the original."""
    raw = f"{node_name}-{driver_name}-{index}"
    name = _DASHES.sub("-", _NOT_DNS.sub("-", raw.lower()))
    name = _DOTS.sub(".", re.sub(r"\.-|-\.", "-", name)).strip(".-")
    if name != raw or len(name) > MAX_NAME_LENGTH:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
        keep = MAX_NAME_LENGTH - len(digest) - len(str(index)) - 2
        name = f"{name[:keep].strip('.-')}-{digest}-{index}"
    return name


def _chunks(devices: Sequence[SliceDevice], size: int) -> list[Sequence[SliceDevice]]:
    if not devices:
        return [()]
    return [devices[i : i + size] for i in range(0, len(devices), size)]


def build_resource_slices(
    *,
    devices: Sequence[SliceDevice],
    driver_name: str,
    node_name: str,
    pool_generation: int,
    node_owner: tuple[str, str] | None,
    devices_per_slice: int = MAX_DEVICES_PER_SLICE,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    binding: Mapping[str, BindingConditions] | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlices that publish ``devices`` for ``node_name`` (order preserved).

    ``node_owner`` is ``(node name, node uid)``: the slices are then garbage-collected with the
    Node. ``devices_per_slice`` may only lower the API limit. ``taints``: device name -> its
    taints (``device_taints``); while any device has one, a slice holds at most 64 devices, the
    API server's limit for slices with taints. ``binding``: device name -> its binding conditions.
    """
    for name, conditions in (binding or {}).items():
        if not 0 < len(conditions.ready) <= MAX_BINDING_CONDITIONS or not (
            0 < len(conditions.failed) <= MAX_BINDING_CONDITIONS
        ):
            raise ValueError(
                f"{name}: 1 to {MAX_BINDING_CONDITIONS} binding conditions of each kind"
            )
    if not 0 < devices_per_slice <= MAX_DEVICES_PER_SLICE:
        raise ValueError(f"devices_per_slice must be 1..{MAX_DEVICES_PER_SLICE}")
    taints = taints or {}
    if any(taints.values()):
        devices_per_slice = min(devices_per_slice, MAX_DEVICES_PER_SLICE_WITH_TAINTS)
    if pool_generation < 0:
        raise ValueError("pool_generation must be >= 0")
    parts = pool_layout(devices, devices_per_slice, taints, binding)
    slices: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        metadata: dict[str, Any] = {
            "name": slice_name(node_name=node_name, driver_name=driver_name, index=index)
        }
        if node_owner is not None:
            metadata["ownerReferences"] = [_node_owner_reference(*node_owner)]
        spec: dict[str, Any] = {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {
                "name": node_name,
                "generation": pool_generation,
                "resourceSliceCount": len(parts),
            },
            **part,
        }
        slices.append(
            {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}
        )
    return slices


def _node_owner_reference(name: str, uid: str) -> Mapping[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid, "controller": True}
