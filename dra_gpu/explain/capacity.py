"""Consumable capacity as the scheduler counts it (KEP-5075), for explain (pure).

A request's ``capacity.requests`` filter every device: a device whose capacity is smaller never
matches. A device with ``allowMultipleAllocations`` is shared: each claim consumes, of every
capacity, what it asks rounded up to the capacity's ``requestPolicy`` (its minimum, its step),
or the policy's default when it asks nothing, or the whole capacity when there is no policy;
an amount past the policy's maximum does not fit at all. The device is left to a claim while
what the other claims consumed (their ``consumedCapacity``) plus its own fits the capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dra_gpu.config.quantity import QuantityError, to_bytes
from dra_gpu.kube.objects import ResourceClaim

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


def _amount(value: object) -> int | None:
    try:
        return to_bytes(str(value))
    except QuantityError:
        return None


def _short(name: str, driver: str) -> str:
    domain, _, short = name.rpartition("/")
    return short if domain in ("", driver) else name


def values(capacity: Mapping[str, Mapping[str, Any]], driver: str) -> dict[str, int]:
    """A published device's capacities, name (driver-relative) -> amount."""
    out = {}
    for name, entry in capacity.items():
        amount = _amount((entry or {}).get("value"))
        if amount is not None:
            out[_short(name, driver)] = amount
    return out


def asked(requests: Mapping[str, Any], driver: str) -> dict[str, int]:
    """A request's ``capacity.requests``, name (driver-relative) -> amount."""
    out = {}
    for name, value in requests.items():
        amount = _amount(value)
        if amount is not None:
            out[_short(name, driver)] = amount
    return out


def _rounded(amount: int, policy: Mapping[str, Any], total: int) -> int | None:
    """``amount`` as the policy lets it be consumed; None when it cannot be."""
    valid = policy.get("validRange")
    if isinstance(valid, Mapping):
        low = _amount(valid.get("min")) or 0
        high = _amount(valid.get("max")) if valid.get("max") is not None else total
        step = _amount(valid.get("step")) if valid.get("step") is not None else None
        amount = max(amount, low)
        if step:
            amount = low + -(-(amount - low) // step) * step
        return amount if high is None or amount <= high else None
    options = sorted(a for v in policy.get("validValues") or () if (a := _amount(v)) is not None)
    if options:
        return next((o for o in options if o >= amount), None)
    return amount


def consumption(
    capacity: Mapping[str, Mapping[str, Any]], requests: Mapping[str, int], driver: str
) -> dict[str, int] | None:
    """What one allocation of a shared device consumes; None when the request breaks a policy
    or asks for a capacity the device does not have."""
    out = {}
    for name, entry in capacity.items():
        short = _short(name, driver)
        total = _amount((entry or {}).get("value"))
        if total is None:
            continue
        policy = (entry or {}).get("requestPolicy")
        if short in requests:
            amount = requests[short]
            if isinstance(policy, Mapping):
                rounded = _rounded(amount, policy, total)
                if rounded is None:
                    return None
                amount = rounded
        elif isinstance(policy, Mapping) and policy.get("default") is not None:
            amount = _amount(policy["default"]) or 0
        else:
            amount = total
        out[short] = amount
    if set(requests) - set(out):
        return None
    return out


def consumed(
    claims: Iterable[ResourceClaim], *, except_uid: str | None
) -> dict[DeviceKey, dict[str, int]]:
    """Per shared device, what the allocated claims consumed together."""
    out: dict[DeviceKey, dict[str, int]] = {}
    for c in claims:
        meta = c.get("metadata") or {}
        if except_uid is not None and meta.get("uid") == except_uid:
            continue
        alloc = ((c.get("status") or {}).get("allocation") or {}).get("devices") or {}
        for r in alloc.get("results") or ():
            used = r.get("consumedCapacity")
            if not used:
                continue
            key = (r["driver"], r["pool"], r["device"])
            total = out.setdefault(key, {})
            for name, value in used.items():
                amount = _amount(value)
                if amount is not None:
                    short = _short(name, r["driver"])
                    total[short] = total.get(short, 0) + amount
    return out


def left(totals: Mapping[str, int], used: Mapping[str, int]) -> dict[str, int]:
    return {name: total - used.get(name, 0) for name, total in totals.items()}


def shortfall(want: Mapping[str, int], free: Mapping[str, int]) -> str | None:
    """The first capacity ``want`` asks more of than ``free`` has, or None."""
    for name, amount in sorted(want.items()):
        if amount > free.get(name, 0):
            return name
    return None
