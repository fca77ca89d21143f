"""What this driver says in a prepared claim's ``status.devices`` (KEP-4817): its entries, pure.

An entry: ``driver``, ``pool``, ``device`` (and ``shareID`` for a shared allocation), a ``Ready``
condition, and ``data`` with what tools such as dcgm-exporter and users look for: ``type``,
``uuid``, ``productName``, ``driverVersion``, ``pciBusID``, and for a MIG device its ``profile``
and ``parentUUID``. A MIG device created at prepare (dynamic MIG) is published without a
``uuid`` in the slices, since it does not exist until then: its entry here carries the UUID it
got. When and how the entries are written is the kit's (``kubeletplugin.claim_status``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from dra_gpu.devices import model
from dra_gpu.devices.model import Device
from dra_gpu.kube.objects import AllocatedDeviceStatus
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointError,
    ClaimRecord,
    DeviceRecord,
)

CONDITION_READY: Final = "Ready"
REASON_PREPARED: Final = "Prepared"


def device_data(record: DeviceRecord, published: Device | None) -> dict[str, str]:
    """``data`` of one entry: the prepared device's facts (the record: the UUID it got) and its
    GPU's (the published device; None when re-discovery no longer lists it)."""
    data: dict[str, str] = {}
    if record.type is not None:
        data["type"] = record.type
    if record.uuid:  # never an empty one: a device not yet created has none to say
        data["uuid"] = record.uuid
    if record.product_name is not None:
        data["productName"] = record.product_name
    if published is not None:
        driver = published.attributes.get(model.ATTR_DRIVER_VERSION)
        if driver is not None:
            data["driverVersion"] = str(driver)
        data["pciBusID"] = published.gpu.pci_bus_id
        if published.type == "mig":
            data["parentUUID"] = published.gpu.uuid
    if record.mig_profile is not None:
        data["profile"] = record.mig_profile
    return data


def entries(
    *, driver: str, record: ClaimRecord, inventory: Mapping[str, Device], now: str
) -> list[AllocatedDeviceStatus]:
    """This driver's entries for a prepared claim; ``now``: the conditions' transition time."""
    out: list[AllocatedDeviceStatus] = []
    for d in record.devices:
        entry: AllocatedDeviceStatus = {
            "driver": driver,
            "pool": d.pool,
            "device": d.device,
            "conditions": [
                {
                    "type": CONDITION_READY,
                    "status": "True",
                    "reason": REASON_PREPARED,
                    "message": "prepared for the claim's containers",
                    "lastTransitionTime": now,
                }
            ],
            "data": device_data(d, inventory.get(d.device)),
        }
        if d.share_id is not None:
            entry["shareID"] = d.share_id
        out.append(entry)
    return out


def _timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Peekable(Protocol):
    def peek(self) -> Checkpoint: ...


def entries_of(
    store: _Peekable, *, driver: str, inventory: Callable[[], Mapping[str, Device]]
) -> Callable[[ClaimUID], list[AllocatedDeviceStatus] | None]:
    """The claim status writer's ``entries_of``: a claim's entries while the checkpoint in
    memory has it completed; None once unprepared (or when the checkpoint cannot be read:
    nothing to say)."""

    def of(uid: ClaimUID) -> list[AllocatedDeviceStatus] | None:
        try:
            record = store.peek().claims.get(uid)
        except (CheckpointError, OSError):
            return None
        if record is None or record.state != PREPARE_COMPLETED:
            return None
        return entries(driver=driver, record=record, inventory=inventory(), now=_timestamp())

    return of
