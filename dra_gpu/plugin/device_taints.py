"""GPU faults -> device taints in the ResourceSlices, and their recovery (pure; no I/O, no clock).

- A fault is kept per GPU (by UUID) and per taint key: ``xid-<n>`` for an XID, else the event
  kind (``ecc-double-bit``, …). Events the rules ignore leave no fault.
- Every device of a faulty GPU carries its taints: the GPU itself and each of its MIG devices.
  A taint reads ``<driver>/xid-79 = gpu-has-fallen-off-the-bus.20261201T112438Z`` (what, and
  when it first happened) with the rule's effect; ``timeAdded`` is that same first time.
- A GPU recovers when each of its faults has been quiet (no new event of that key) for the
  quiet period *and* its health probe succeeds; a GPU that is lost (not discovered, or the
  probe fails) keeps its taints however long it has been quiet.
- An administrator's clear drops every fault of the GPU at once.
- The kernel driver's outage (``driver_outage``: unloaded for an upgrade, a version mismatch) is
  one more fault, ``driver-unavailable`` (NoSchedule), on every device of the node at once; it is
  not a GPU's and goes with the driver's return, not with a quiet period or a clear.
- Faults live in memory; the published taints are their durable copy: at start the plugin
  ``restore``s them from its slices, so a restart neither lifts a taint nor re-stamps it, and
  the quiet period starts again.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dra_gpu.devices import health_rules
from dra_gpu.devices.health_events import HealthEvent
from dra_gpu.devices.model import Device
from dra_gpu.kube.objects import ResourceSlice

JSON = dict[str, Any]
MAX_TAINTS_PER_DEVICE = 16  # the API server's limit
MAX_LABEL_VALUE = 63
SEVERITY_EFFECTS = (health_rules.NO_SCHEDULE, health_rules.NO_EXECUTE)
DRIVER_UNAVAILABLE = "driver-unavailable"  # the taint key of the driver's outage
_NOT_SLUG = re.compile(r"[^a-z0-9]+")


@dataclasses.dataclass(frozen=True)
class Fault:
    key: str  # xid-79, ecc-double-bit, ...
    effect: str  # NoSchedule or NoExecute
    reason: str
    first: float  # unix seconds of the first event
    last: float  # unix seconds of the latest event


# GPU UUID -> taint key -> fault
Faults = Mapping[str, Mapping[str, Fault]]


def fault_key(event: HealthEvent) -> str:
    return f"xid-{event.code}" if event.kind == health_rules.XID else event.kind


def record(faults: Faults, event: HealthEvent, rule: health_rules.Rule) -> Faults:
    """``faults`` after ``event``; the same object when the event changes nothing."""
    if rule.effect == health_rules.IGNORE:
        return faults
    key = fault_key(event)
    gpu = dict(faults.get(event.gpu, {}))
    old = gpu.get(key)
    if old is None:
        gpu[key] = Fault(key, rule.effect, rule.reason, event.at, event.at)
    else:
        severe = max(old.effect, rule.effect, key=health_rules.SEVERITY.__getitem__)
        gpu[key] = dataclasses.replace(old, effect=severe, last=max(old.last, event.at))
    return {**faults, event.gpu: gpu}


def clear(faults: Faults, gpu: str) -> Faults:
    return {k: v for k, v in faults.items() if k != gpu}


def recovered(
    faults: Faults, *, now: float, quiet_s: float, healthy: Callable[[str], bool]
) -> list[str]:
    """GPUs whose faults have all been quiet for ``quiet_s`` and whose probe succeeds.

    ``healthy`` is asked only for GPUs that are quiet (a probe is an NVML call).
    """
    quiet = [
        gpu
        for gpu, by_key in faults.items()
        if all(now - f.last >= quiet_s for f in by_key.values())
    ]
    return [gpu for gpu in sorted(quiet) if healthy(gpu)]


def _utc(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(ts), tz=datetime.UTC)


def taint_value(fault: Fault) -> str:
    """``<reason slug>.<first time>``: a label value (<= 63, alphanumeric at both ends)."""
    when = _utc(fault.first).strftime("%Y%m%dT%H%M%SZ")
    slug = _NOT_SLUG.sub("-", fault.reason.lower()).strip("-")
    slug = slug[: MAX_LABEL_VALUE - len(when) - 1].rstrip("-")
    return f"{slug}.{when}" if slug else when


def taint(driver: str, fault: Fault) -> JSON:
    return {
        "key": f"{driver}/{fault.key}",
        "value": taint_value(fault),
        "effect": fault.effect,
        "timeAdded": _utc(fault.first).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _ordered(by_key: Mapping[str, Fault]) -> list[Fault]:
    """Most severe first, then oldest: what is kept when there are more than the API allows."""
    return sorted(
        by_key.values(), key=lambda f: (-health_rules.SEVERITY[f.effect], f.first, f.key)
    )[:MAX_TAINTS_PER_DEVICE]


def _of(device: Device, faults: Faults, outage: Fault | None) -> Mapping[str, Fault]:
    by_key = faults.get(device.gpu.uuid) or {}
    return {**by_key, outage.key: outage} if outage is not None else by_key


def device_taints(
    driver: str, devices: Iterable[Device], faults: Faults, outage: Fault | None = None
) -> dict[str, list[JSON]]:
    """Device name -> its taints, for the devices of faulty GPUs (MIG devices included), and
    for every device while the driver is out (``outage``)."""
    out: dict[str, list[JSON]] = {}
    for device in devices:
        by_key = _of(device, faults, outage)
        if by_key:
            out[device.name] = [taint(driver, f) for f in _ordered(by_key)]
    return out


def describe(fault: Fault) -> str:
    what = fault.key.replace("xid-", "XID ") if fault.key.startswith("xid-") else fault.key
    first = _utc(fault.first).strftime("%Y-%m-%dT%H:%M:%SZ")
    last = _utc(fault.last).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{what}: {fault.reason} ({fault.effect}; first {first}, last {last})"


def device_messages(
    devices: Iterable[Device], faults: Faults, outage: Fault | None = None
) -> dict[str, str]:
    """Device name -> why it is unhealthy, for the devices of faulty GPUs and for every device
    while the driver is out (health stream)."""
    out: dict[str, str] = {}
    for device in devices:
        by_key = _of(device, faults, outage)
        if by_key:
            out[device.name] = "; ".join(describe(f) for f in _ordered(by_key))[:1024]
    return out


def _parse_time(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return (
            datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
            .replace(tzinfo=datetime.UTC)
            .timestamp()
        )
    except ValueError:
        return None


def restore(
    published: Iterable[ResourceSlice], *, driver: str, devices: Sequence[Device], now: float
) -> Faults:
    """The faults behind the taints this driver published (before a restart) on devices that
    still exist. Their quiet period starts again at ``now``; taints of others (a
    DeviceTaintRule, another driver) are not ours and are left out, and so is the driver's
    outage: the monitor looks at the driver again within seconds."""
    prefix = f"{driver}/"
    gpu_of_device = {d.name: d.gpu.uuid for d in devices}
    faults: dict[str, dict[str, Fault]] = {}
    for item in published:
        spec = item.get("spec")
        for device in (spec.get("devices") if spec else None) or []:
            gpu = gpu_of_device.get(str(device.get("name")))
            for t in device.get("taints") or [] if gpu is not None else []:
                key, effect = str(t.get("key", "")), t.get("effect")
                if not key.startswith(prefix) or effect not in SEVERITY_EFFECTS:
                    continue
                name = key.removeprefix(prefix)
                if name == DRIVER_UNAVAILABLE:
                    continue
                slug = str(t.get("value", "")).rpartition(".")[0]
                first = _parse_time(t.get("timeAdded")) or now
                reason = slug.replace("-", " ") or name
                faults.setdefault(str(gpu), {})[name] = Fault(name, str(effect), reason, first, now)
    return faults


def gpu_of(devices: Sequence[Device], name: str) -> str | None:
    """The UUID of the GPU that device ``name`` is or belongs to; None if there is no such."""
    for device in devices:
        if device.name == name:
            return device.gpu.uuid
    return None
