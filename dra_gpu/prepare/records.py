"""Conversions between a claim's plan, its checkpoint record and the answer to the kubelet.

Pure functions. The checkpoint record of a prepared claim holds everything needed to answer a
repeated prepare (no API call) and to rebuild its CDI spec after a reboot (no discovery). The
way back, :func:`record_from_spec`, saves what a spec holds when the checkpoint lost the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from dra_gpu.config import parse_opaque_config
from dra_gpu.kubeletplugin.driver import PreparedDevice
from dra_gpu.kubeletplugin.ids import CDIDeviceID, ClaimUID, DeviceName
from dra_gpu.prepare import cdi
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, ClaimRecord, ClaimState, DeviceRecord
from dra_gpu.prepare.plan import ClaimPlan, PlannedDevice


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
        consumed=dict(planned.consumed) or None,
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
                admin_access=d.admin_access,
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
        if planned.share_id and (held.share_id or other.from_spec):
            # Both allocations say the device is shared; a record rebuilt from a spec does not
            # know its share ID, so there the new allocation's word decides.
            continue
        return (
            f"device {held.device} is already prepared for claim "
            f"{other.namespace}/{other.name} ({other_uid}) and is not shared"
        )
    return None


def record_from_spec(uid: ClaimUID, spec: Mapping[str, Any], *, pool: str) -> ClaimRecord:
    """The record of a prepared claim as far as its CDI spec tells; raises ValueError.

    The spec names the claim's devices (``<uid>-<device>``), and its environment the claim
    (``<ns>/<name>``) and each device's UUID, type, product, MIG profile and admin access (a
    device held with admin access is never exclusive). It does not hold the request names,
    share IDs or config: the record is marked ``from_spec``, its other devices are shared in the
    conflict check only with allocations that carry a share ID, and a repeated
    prepare plans the claim again instead of answering from it. Specs are only written for
    devices of this node, so ``pool`` is this node's.
    """
    if spec.get("kind") != cdi.KIND:
        raise ValueError(f"kind is {spec.get('kind')!r}, not {cdi.KIND!r}")
    entries = spec.get("devices")
    if not isinstance(entries, list) or not entries:
        raise ValueError("it names no devices")
    claim_ref = ""
    devices = []
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.startswith(f"{uid}-"):
            raise ValueError(f"device {name!r} is not a device of claim {uid}")
        device = DeviceName(name.removeprefix(f"{uid}-"))
        edits = entry.get("containerEdits")
        env_list = edits.get("env") if isinstance(edits, dict) else None
        env = dict(e.split("=", 1) for e in env_list or () if isinstance(e, str) and "=" in e)
        key = cdi.env_prefix(device)
        claim_ref = env.get(f"{key}_CLAIM", claim_ref)
        kind: Literal["gpu", "mig"] | None = None
        if env.get(f"{key}_TYPE") in ("gpu", "mig"):
            kind = "mig" if env[f"{key}_TYPE"] == "mig" else "gpu"
        devices.append(
            DeviceRecord(
                pool=pool,
                device=device,
                cdi_device_ids=(cdi.device_id(uid, device),),
                type=kind,
                uuid=env.get(f"{key}_UUID"),
                product_name=env.get(f"{key}_PRODUCT"),
                mig_profile=env.get(f"{key}_MIG_PROFILE"),
                admin_access=env.get(f"{key}_ADMIN_ACCESS") == "true",
            )
        )
    namespace, _, name = claim_ref.partition("/")
    return ClaimRecord(
        state=PREPARE_COMPLETED,
        namespace=namespace,
        name=name,
        devices=tuple(devices),
        from_spec=True,
    )
