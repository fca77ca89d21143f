"""Consumable shares at prepare: what each share consumed, the capacity check, its limits (pure).

The scheduler writes each allocation result of a device that allows multiple allocations with a
``shareID`` and a ``consumedCapacity`` (``dra_gpu.devices.shares``). Prepare keeps both in the
claim's record, so two claims on one device are two records, each with its own amounts.

:func:`capacity_problem` is the conflict check for a shared device: the amounts the recorded
shares of the device consumed plus the new one's must fit what the device publishes (the
scheduler ensured it for the allocations it made; a stale allocation, or one made while the
node published other capacities, is refused here, naming the claims that hold the device).

:func:`enforced` gives each share its limits through the strategy that caps shares
(``dra_gpu.config.strategies.share_limiter``; today MPS): served by an MPS control daemon of its
own (one per claim, as for any MPS claim: ``sharing.mps``) whose pinned device memory limit is the
share's consumed memory and whose active thread percentage is its ``compute`` share, set before
its server starts, so they cap every client of the share (a client can only lower them). A
limit in the claim's own MPS config that is lower is kept; a time-slicing config on a share is
replaced (its interval would be set on the whole GPU, under the other shares too). A share that
consumed neither memory nor compute has nothing to enforce and is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from dra_gpu.config.strategies import share_limiter
from dra_gpu.devices.model import CAP_MEMORY
from dra_gpu.devices.shares import CAP_COMPUTE
from dra_gpu.kubeletplugin.slices import format_quantity
from dra_gpu.prepare.checkpoint import ClaimRecord
from dra_gpu.prepare.plan import ClaimPlan, PlannedDevice


def added(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in {*a, *b}}


def _shown(name: str, amount: int) -> str:
    if name == CAP_MEMORY:
        return format_quantity(amount)
    return str(amount)


def capacity_problem(
    planned: PlannedDevice,
    held: Iterable[tuple[str, ClaimRecord]],
    capacity: Mapping[str, int],
) -> str | None:
    """Why the share ``planned`` does not fit beside the recorded shares ``held`` ((claim UID,
    record) of the other claims) on a device of ``capacity``; None if it fits."""
    if planned.share_id is None or not planned.consumed:
        return None
    holders: list[str] = []
    used: dict[str, int] = {}
    for uid, record in held:
        for device in record.devices:
            if device.device == planned.cdi.name and device.share_id and device.consumed:
                used = added(used, device.consumed)
                holders.append(f"{record.namespace}/{record.name} ({uid})")
    for name, amount in sorted(planned.consumed.items()):
        total = capacity.get(name)
        if total is None or used.get(name, 0) + amount <= total:
            continue
        return (
            f"device {planned.cdi.name} has {_shown(name, total)} {name}: claims "
            f"{', '.join(holders)} hold {_shown(name, used.get(name, 0))}, this share asks "
            f"{_shown(name, amount)}"
        )
    return None


def enforced(plan: ClaimPlan) -> ClaimPlan:
    """``plan`` with each share's limits in its device's config (see the module doc)."""
    limiter = share_limiter()
    devices = []
    for planned in plan.devices:
        memory = planned.consumed.get(CAP_MEMORY, 0)
        compute = planned.consumed.get(CAP_COMPUTE, 0)
        if planned.share_id is not None and (memory > 0 or compute > 0):
            config = limiter.limited(planned.cdi.config, memory, compute)
            planned = replace(planned, cdi=replace(planned.cdi, config=config))
        devices.append(planned)
    return replace(plan, devices=tuple(devices))
