"""Conversions between a claim's plan, its checkpoint record and the answer to the kubelet.

Pure functions. The checkpoint record of a prepared claim holds everything needed to answer a
repeated prepare (no API call) and to rebuild its CDI spec after a reboot (no discovery).
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_gpu.config import parse_opaque_config
from dra_gpu.plugin import cdi
from dra_gpu.plugin.checkpoint import ClaimRecord, ClaimState, DeviceRecord
from dra_gpu.plugin.ids import CDIDeviceID, ClaimUID, DeviceName
from dra_gpu.plugin.plan import ClaimPlan, PlannedDevice


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet gets it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: DeviceName
    cdi_device_ids: tuple[CDIDeviceID, ...]
    share_id: str | None = None


class RecordIncomplete(ValueError):
    """A record (from an older plugin) lacks the facts to rebuild its CDI spec."""


def device_record(uid: ClaimUID, planned: PlannedDevice) -> DeviceRecord:
    device = planned.cdi
    return DeviceRecord(
        request_names=planned.requests,
        pool=planned.pool,
        device=device.name,
        cdi_device_ids=(cdi.device_id(uid, device.name),),
        share_id=planned.share_id,
        admin_access=planned.admin_access,
        type=device.type,
        uuid=device.uuid,
        minor=device.minor,
        product_name=device.product_name,
        mig_profile=device.mig_profile,
        gi_id=device.gi_id,
        ci_id=device.ci_id,
        config=device.config.model_dump(mode="json", exclude_none=True),
    )


def claim_record(plan: ClaimPlan, *, state: ClaimState) -> ClaimRecord:
    return ClaimRecord(
        state=state,
        namespace=plan.ref.namespace,
        name=plan.ref.name,
        devices=tuple(device_record(plan.ref.uid, d) for d in plan.devices),
    )


def prepared_devices(record: ClaimRecord) -> tuple[PreparedDevice, ...]:
    return tuple(
        PreparedDevice(
            request_names=d.request_names,
            pool_name=d.pool,
            device_name=DeviceName(d.device),
            cdi_device_ids=tuple(CDIDeviceID(i) for i in d.cdi_device_ids),
            share_id=d.share_id,
        )
        for d in record.devices
    )


def claim_devices(record: ClaimRecord) -> list[cdi.ClaimDevice]:
    """The CDI inputs stored in a record; raises RecordIncomplete or ConfigError."""
    out = []
    for d in record.devices:
        if d.type is None or d.uuid is None or d.minor is None or d.config is None:
            raise RecordIncomplete(
                f"the record of device {d.device} lacks the facts to rebuild its CDI spec "
                "(written by an older plugin)"
            )
        out.append(
            cdi.ClaimDevice(
                name=DeviceName(d.device),
                type=d.type,
                uuid=d.uuid,
                minor=d.minor,
                product_name=d.product_name or "",
                config=parse_opaque_config(d.config),
                mig_profile=d.mig_profile,
                gi_id=d.gi_id,
                ci_id=d.ci_id,
            )
        )
    return out


def conflicts(planned: PlannedDevice, *, other_uid: str, other: ClaimRecord) -> str | None:
    """Why ``planned`` may not be prepared while ``other`` holds it; None if it may."""
    for held in other.devices:
        if held.device != planned.cdi.name:
            continue
        if planned.admin_access or held.admin_access:
            continue  # admin access is never exclusive
        if planned.share_id and held.share_id:
            continue  # both allocations say the device is shared
        return (
            f"device {held.device} is already prepared for claim "
            f"{other.namespace}/{other.name} ({other_uid}) and is not shared"
        )
    return None
