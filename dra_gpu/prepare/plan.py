"""Prepare's pure step: from a ResourceClaim (API JSON) to what must be prepared on this node.

:func:`plan_claim` performs every check the kubelet leaves to the driver and resolves the
opaque configuration, without side effects, so that a claim that cannot be prepared fails
before anything is written. Each failure is a :class:`PlanError` whose message names the claim
and the problem; it becomes that claim's error for the kubelet.

Checks: the claim's UID is the one the kubelet asked for (a deleted and re-created claim has the
same name but a new UID); it is allocated; it has results for this driver, all from this node's
pool; every allocated device exists here.

Configuration: the DeviceClass configs from ``status.allocation.devices.config`` (``source:
FromClass``), then the claim's own from ``spec.devices.config`` (``FromClaim``; the allocation's
copies of them come without their ``requests`` from the Kubernetes 1.37.2 scheduler), numbered
as listed there. Configs of other drivers are skipped. Every config of this driver is parsed
strictly, whether or not it applies to a device here, exactly as the admission webhook does
(same parser), so the two never disagree. A claim's config that names a request the claim does
not have is an error. For each device, class configs first, then the claim's, each in listed
order, :func:`dra_gpu.config.scope.winner` picks the config (the webhook uses the same
function): the last that applies and fits the device type;
a claim-wide one of the other type is passed over, one of the other type that names the
device's request is an error. No config: the type's default. The winner is normalized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from dra_gpu.config import (
    ConfigError,
    DeviceConfig,
    default_gpu_config,
    default_mig_device_config,
    normalized,
    parse_opaque_config,
)
from dra_gpu.config.quantity import QuantityError, to_bytes
from dra_gpu.config.scope import MismatchError, Scoped, main_request, unknown_requests, winner
from dra_gpu.devices.model import Device
from dra_gpu.errors import UserError
from dra_gpu.kube.objects import (
    AllocationResult,
    DeviceClaimConfiguration,
    DeviceRequestAllocationResult,
    ResourceClaim,
)

# ClaimRef is the kit's; named here too because prepare's callers have always found it here.
from dra_gpu.kubeletplugin.driver import ClaimRef as ClaimRef
from dra_gpu.kubeletplugin.ids import DeviceName
from dra_gpu.prepare.cdi import ClaimDevice


class PlanError(UserError):
    """The claim cannot be prepared here; the message is shown to the user as is."""


@dataclass(frozen=True)
class PlannedDevice:
    # Top-level request names (a subrequest ``req/sub`` counts as ``req``): containers refer to
    # those. Two requests get one device only when it may be shared; it is prepared once.
    requests: tuple[str, ...]
    pool: str
    share_id: str | None
    admin_access: bool
    cdi: ClaimDevice
    # A shared device (consumable capacity): what the allocation consumed of each capacity,
    # summed over the claim's requests on the device; empty for a device of one claim.
    consumed: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimPlan:
    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]


@dataclass(frozen=True)
class _Config(Scoped):
    source: str = ""


def _consumed(ref: ClaimRef, result: DeviceRequestAllocationResult) -> dict[str, int]:
    """The result's ``consumedCapacity`` as whole amounts; raises PlanError."""
    raw = result.get("consumedCapacity")
    if raw is None:
        return {}
    where = f"claim {ref}: device {result.get('device')}"
    if not isinstance(raw, Mapping):
        raise PlanError(f"{where}: consumedCapacity is not a map of quantities")
    try:
        return {str(name): to_bytes(str(value)) for name, value in raw.items()}
    except QuantityError as exc:
        raise PlanError(f"{where}: consumedCapacity: {exc}") from None


def _check_identity(ref: ClaimRef, claim: ResourceClaim) -> AllocationResult:
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise PlanError(
            f"claim {ref} has UID {uid}, the kubelet asked for {ref.uid} "
            "(was the claim deleted and re-created?)"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PlanError(f"claim {ref} is not allocated")
    return allocation.copy()


def _our_results(
    ref: ClaimRef, allocation: AllocationResult, *, driver: str, pool: str
) -> list[DeviceRequestAllocationResult]:
    results = [r for r in (allocation.get("devices") or {}).get("results") or ()]
    ours = [r for r in results if r.get("driver") == driver]
    if not ours:
        drivers = sorted({str(r.get("driver")) for r in results}) or ["none"]
        raise PlanError(
            f"claim {ref} has no devices of driver {driver} (allocated: {', '.join(drivers)})"
        )
    for result in ours:
        if result.get("pool") != pool:
            raise PlanError(
                f"claim {ref}: device {result.get('device')} is allocated from pool "
                f"{result.get('pool')!r}, not from this node's pool {pool!r} "
                "(allocation for another node)"
            )
    return ours


def _config_entries(
    claim: ResourceClaim, allocation: AllocationResult
) -> list[tuple[int, str, DeviceClaimConfiguration]]:
    """(index, source, entry) of every config: the class configs from the allocation, the
    claim's own from its spec, where it has one. The scheduler copies the claim's configs into
    the allocation, but the 1.37.2 scheduler writes them without their ``requests``: read there, a
    MigDeviceConfig the user named a full GPU's request for looked claim-wide and was passed
    over for the default. A claim's spec cannot change, so it is the same config, as written."""
    allocated = (allocation.get("devices") or {}).get("config") or ()
    devices = (claim.get("spec") or {}).get("devices")
    entries: list[tuple[int, str, DeviceClaimConfiguration]] = []
    for index, entry in enumerate(allocated):
        source = str(entry.get("source", ""))
        if devices is None or source != "FromClaim":
            entries.append((index, source, entry))
    if devices is not None:
        entries += [(i, "FromClaim", e) for i, e in enumerate(devices.get("config") or ())]
    return entries


def _our_configs(
    ref: ClaimRef, claim: ResourceClaim, allocation: AllocationResult, *, driver: str
) -> list[_Config]:
    configs = []
    for index, source, entry in _config_entries(claim, allocation):
        opaque = entry.get("opaque")
        if not opaque or opaque.get("driver") != driver:
            continue
        where = f"config[{index}] ({source or 'unknown source'})"
        try:
            parsed = parse_opaque_config(opaque.get("parameters"))
        except ConfigError as exc:
            raise PlanError(f"claim {ref}: {where}: {exc}") from exc
        configs.append(
            _Config(
                where=where,
                source=source,
                requests=tuple(entry.get("requests") or ()),
                config=parsed,
            )
        )
    # Class configs first, then the claim's; sorted() is stable, so listed order holds within.
    return sorted(configs, key=lambda c: 0 if c.source == "FromClass" else 1)


def _check_named_requests(ref: ClaimRef, claim: ResourceClaim, configs: Sequence[_Config]) -> None:
    """A claim's config names only requests of the claim (``req`` or ``req/sub``)."""
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    if not requests:
        return  # a claim written by hand (a file): nothing to check against
    known = {
        str(r.get("name")): [str(s.get("name")) for s in r.get("firstAvailable") or ()]
        for r in requests
    }
    for config in configs:
        if config.source == "FromClass":
            continue  # the scheduler names the class's requests itself
        if unknown := unknown_requests(config.requests, known):
            raise PlanError(
                f"claim {ref}: {config.where}: names request "
                f"{', '.join(repr(u) for u in unknown)}, which the claim does not have "
                f"(its requests: {', '.join(sorted(known))})"
            )


def resolve_config(
    ref: ClaimRef, configs: Sequence[_Config], *, request: str, device: Device
) -> DeviceConfig:
    """The normalized config for one device; raises PlanError."""
    try:
        found = winner(configs, request=request, device_type=device.type, device=device.name)
    except MismatchError as exc:
        raise PlanError(f"claim {ref}: {exc}") from exc
    if found is not None:
        return normalized(found.config)
    return normalized(default_gpu_config() if device.type == "gpu" else default_mig_device_config())


def _claim_device(
    ref: ClaimRef, device: Device, config: DeviceConfig, *, admin_access: bool
) -> ClaimDevice:
    if device.uuid is None and device.partition is None:
        raise PlanError(f"claim {ref}: MIG device {device.name} does not exist on the GPU yet")
    mig = device.mig
    return ClaimDevice(
        name=DeviceName(device.name),
        type=device.type,
        uuid=device.uuid or "",  # dynamic MIG: prepare creates the device and fills it in
        minor=device.gpu.minor,
        product_name=device.gpu.product_name,
        config=config,
        mig_profile=mig.profile if mig else device.partition.profile if device.partition else None,
        gi_id=mig.gi_id if mig else None,
        ci_id=mig.ci_id if mig else None,
        admin_access=admin_access,
    )


def plan_claim(
    ref: ClaimRef,
    claim: ResourceClaim,
    *,
    driver: str,
    pool: str,
    inventory: Mapping[str, Device],
) -> ClaimPlan:
    """What to prepare for ``claim`` on this node; raises PlanError naming the problem."""
    allocation = _check_identity(ref, claim)
    results = _our_results(ref, allocation, driver=driver, pool=pool)
    configs = _our_configs(ref, claim, allocation, driver=driver)
    _check_named_requests(ref, claim, configs)
    by_device: dict[str, PlannedDevice] = {}
    for result in results:
        name = str(result.get("device"))
        device = inventory.get(name)
        if device is None:
            raise PlanError(f"claim {ref}: allocated device {name} does not exist on this node")
        request = str(result.get("request", ""))
        config = resolve_config(ref, configs, request=request, device=device)
        previous = by_device.get(name)
        if previous is not None:
            if previous.cdi.config != config:
                raise PlanError(
                    f"claim {ref}: device {name} is allocated for several requests "
                    "with different configs"
                )
            requests = (*previous.requests, main_request(request))
            # Two shares of one device in one claim are prepared as one share of their sum:
            # the claim's containers see the device once (one CDI device), under one limit.
            consumed = {
                k: previous.consumed.get(k, 0) + v for k, v in _consumed(ref, result).items()
            }
            by_device[name] = replace(
                previous,
                requests=tuple(dict.fromkeys(requests)),
                consumed={**previous.consumed, **consumed},
            )
            continue
        share_id = result.get("shareID")
        admin_access = bool(result.get("adminAccess"))
        by_device[name] = PlannedDevice(
            requests=(main_request(request),),
            pool=pool,
            share_id=str(share_id) if share_id else None,
            admin_access=admin_access,
            cdi=_claim_device(ref, device, config, admin_access=admin_access),
            consumed=_consumed(ref, result),
        )
    return ClaimPlan(ref=ref, devices=tuple(by_device.values()))
