"""Dynamic MIG before the pod binds (KEP-5007): what to do for one claim, and what to report
(pure; the thread that reads claims and writes their status is ``plugin.mig_binding``).

Where the API server serves binding conditions, every dynamic MIG device of a node's slices
carries ``<driver>/mig-created`` as its binding condition and ``<driver>/mig-failed`` as its
failure condition (``plugin.published``). The scheduler allocates such a device, writes the
allocation (with the conditions copied into the result) and waits in PreBind until every
condition of the allocated devices is True in the claim's ``status.devices`` (or a failure
condition is, or its binding timeout passes: then it deallocates the claim and schedules the pod
again). The node's plugin, seeing the allocation, creates the MIG devices and reports:

* all made: ``mig-created`` True on each device's entry; the pod binds, and prepare finds the
  devices made (``DynamicMig.ensure`` returns what the ledger names);
* one failed: whatever was made for the claim is destroyed, then ``mig-failed`` True (with the
  error) on the failed device's entry, ``mig-created`` False on the others;
* so that the scheduler does not allocate the refused placement again at once, the device is
  tainted ``<driver>/mig-failed`` (NoSchedule) for :data:`REFUSED_TAINT_S` (:func:`refused_taint`);
* the claim no longer allocated those devices (deallocated, deleted, replaced by another claim
  of the same name) while the node holds MIG devices made for it: they are destroyed.

:func:`step` decides which, from the claim as read, the ledger's devices for it and whether it
is prepared (then prepare and unprepare own its devices, as without binding conditions).
After :class:`Wait`, :class:`Prepared` and :class:`Forget` of an allocated claim nothing is
left to do until the scheduler acts
(binds the pod, or deallocates the claim and clears the pod's nomination), which the binder
learns from the pod (``plugin.mig_binding``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from dra_gpu.kube.objects import AllocatedDeviceStatus, Condition, ResourceClaim

CREATED_REASON: Final = "MigDeviceCreated"
FAILED_REASON: Final = "MigDeviceCreationFailed"
NOT_CREATED_REASON: Final = "MigDeviceNotCreated"
MAX_MESSAGE: Final = 1024  # a condition's message is at most 32 KiB; ours stay short
# How long a placement the GPU refused stays tainted: the scheduler's default binding timeout,
# long enough for the claim to be allocated elsewhere, short enough for a passing refusal.
REFUSED_TAINT_S: Final = 600.0


@dataclass(frozen=True)
class Wanted:
    """A claim allocated devices of this node that wait for ``ready``: which, and where each
    stands in the claim's ``status.devices``."""

    uid: str
    namespace: str
    name: str
    devices: tuple[str, ...]
    reported: frozenset[str]  # ``ready`` True already
    failed: frozenset[str]  # ``failed`` True already (the scheduler will deallocate)


def _condition_true(entry: AllocatedDeviceStatus, condition: str) -> bool:
    return any(
        c.get("type") == condition and c.get("status") == "True"
        for c in entry.get("conditions") or []
    )


def wanted(
    claim: ResourceClaim, *, driver: str, pool: str, ready: str, failed: str
) -> Wanted | None:
    """The claim's devices of ``driver`` in ``pool`` whose allocation waits for ``ready``;
    None when it has none (not allocated, allocated elsewhere, or without the condition)."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    devices = tuple(
        sorted(
            {
                str(r["device"])
                for r in results
                if r.get("driver") == driver
                and r.get("pool") == pool
                and ready in (r.get("bindingConditions") or [])
            }
        )
    )
    if not devices:
        return None
    entries = {
        str(e.get("device")): e
        for e in status.get("devices") or []
        if e.get("driver") == driver and e.get("pool") == pool
    }
    meta = claim["metadata"]
    return Wanted(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        devices=devices,
        reported=frozenset(
            d for d in devices if d in entries and _condition_true(entries[d], ready)
        ),
        failed=frozenset(
            d for d in devices if d in entries and _condition_true(entries[d], failed)
        ),
    )


@dataclass(frozen=True)
class Forget:
    """Nothing of the claim is held here and nothing of this node waits for it (not allocated
    yet, allocated elsewhere or without the condition, or gone)."""

    # Allocated (elsewhere, or without the condition): only a deallocation changes that.
    allocated: bool = False


@dataclass(frozen=True)
class Prepared:
    """The claim is prepared here: prepare and unprepare own its devices, nothing to do."""


@dataclass(frozen=True)
class Wait:
    """Made and reported, or failed and reported: look again later (deallocation, prepare)."""


@dataclass(frozen=True)
class Release:
    """Destroy what was made for the claim ``uid``: its allocation no longer names it."""

    uid: str
    why: str


@dataclass(frozen=True)
class Make:
    """Create ``wanted.devices`` (those not made yet) and report the outcome."""

    wanted: Wanted


Step = Forget | Prepared | Wait | Release | Make


def step(
    claim: ResourceClaim | None,
    *,
    uid: str | None,
    held: Collection[str],
    prepared: bool,
    driver: str,
    pool: str,
    ready: str,
    failed: str,
) -> Step:
    """What to do now for one claim.

    ``claim``: as read (None: not found); ``uid``: the UID the ledger knows it by (None: no MIG
    device was made for it here); ``held``: the devices the ledger holds for that UID;
    ``prepared``: the claim is prepared here (prepare and unprepare own its devices).
    """
    if prepared:
        return Prepared()
    want = (
        None
        if claim is None
        else wanted(claim, driver=driver, pool=pool, ready=ready, failed=failed)
    )
    same = want is not None and (uid is None or want.uid == uid)
    if held and uid is not None:
        if claim is None:
            return Release(uid, "the claim is gone")
        if not same:
            return Release(uid, "the claim is no longer allocated these devices")
        assert want is not None
        if set(held) - set(want.devices):
            return Release(uid, "the claim is allocated other devices now")
    if want is None or not same:
        allocated = claim is not None and bool((claim.get("status") or {}).get("allocation"))
        return Forget(allocated=allocated)
    if want.failed:
        return Wait()  # the scheduler deallocates it; nothing of it is held
    if set(want.devices) <= set(held) and set(want.devices) <= want.reported:
        return Wait()
    return Make(want)


def _condition(kind: str, status: bool, reason: str, message: str, now: str) -> Condition:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "lastTransitionTime": now,
    }


def entries(
    want: Wanted,
    *,
    driver: str,
    pool: str,
    ready: str,
    failed: str,
    made: Mapping[str, str],
    failure: tuple[str, str] | None,
    now: str,
) -> list[AllocatedDeviceStatus]:
    """The claim's ``status.devices`` entries for its devices here: ``made`` device -> the MIG
    device's UUID; ``failure`` (device, error) when one could not be made (then nothing is)."""
    out: list[AllocatedDeviceStatus] = []
    for device in want.devices:
        if failure is not None and failure[0] == device:
            conditions = [
                _condition(ready, False, FAILED_REASON, failure[1], now),
                _condition(failed, True, FAILED_REASON, failure[1], now),
            ]
        elif failure is not None:
            why = f"not created: {failure[0]} of the same claim could not be"
            conditions = [_condition(ready, False, NOT_CREATED_REASON, why, now)]
        else:
            message = f"MIG device {made.get(device, '')} created for this allocation"
            conditions = [_condition(ready, True, CREATED_REASON, message, now)]
        out.append({"driver": driver, "pool": pool, "device": device, "conditions": conditions})
    return out


def refused_taint(driver: str, *, since: str) -> dict[str, str]:
    """The taint of a dynamic MIG device whose creation the GPU refused (``since``: RFC 3339)."""
    return {
        "key": f"{driver}/mig-failed",
        "value": "placement-refused",
        "effect": "NoSchedule",
        "timeAdded": since,
    }


def claim_names(pod: Mapping[str, object]) -> list[str]:
    """The ResourceClaims a pod uses, by name: those it names, and those made from its
    templates (``status.resourceClaimStatuses``, once the claim controller made them)."""
    spec = pod.get("spec")
    status = pod.get("status")
    names: list[str] = []
    for entry in _dicts(spec, "resourceClaims"):
        if isinstance(entry.get("resourceClaimName"), str):
            names.append(str(entry["resourceClaimName"]))
    for entry in _dicts(status, "resourceClaimStatuses"):
        if isinstance(entry.get("resourceClaimName"), str):
            names.append(str(entry["resourceClaimName"]))
    return sorted(set(names))


def _dicts(parent: object, key: str) -> Sequence[Mapping[str, object]]:
    if not isinstance(parent, Mapping):
        return []
    items = parent.get(key)
    if not isinstance(items, list):
        return []
    return [i for i in items if isinstance(i, Mapping)]
