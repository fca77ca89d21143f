"""Which claims (and which pods of shared claims) have left their GPUs idle, and for how long
(pure: the telemetry loop feeds it a :class:`UsageView` and the time).

* A claim is busy while any of its devices is at or above the utilization threshold (a device
  without utilization, MIG: while it has a process). On a device several claims hold
  (consumable shares, admin access) only the claim's own pods' processes count there, never the
  device's utilization, which is the other holders' work too.
* Processes -- a pod's, or a claim's on a device it does not hold alone -- are busy while their
  SM share is at or above the threshold; where there is no per-process share (under MPS the
  server holds all the samples; MIG) while there is a process.
* An admin-access claim (monitoring) is never a subject: it holds a GPU without computing.
* A claim or pod idle for ``idle_after_s`` is reported once (:meth:`IdleTracker.observe`
  returns it); work clears it, and a later idle period is reported again. A device whose
  sample failed makes its claim unknown: its idle time starts over, so a wedged NVML never
  reads as idle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_gpu.plugin.usage_series import DeviceRow, Holder, PodRef, PodRow, UsageView


@dataclass(frozen=True, order=True)
class Subject:
    """A claim (``pod_uid`` "") or one pod of a shared claim."""

    claim_uid: str
    pod_uid: str = ""


@dataclass(frozen=True)
class Activity:
    busy: bool
    processes: int
    devices: tuple[str, ...]
    claim: Holder
    pod: PodRef | None = None


@dataclass(frozen=True)
class Idle:
    """A subject that has just been idle for ``seconds``: the Event to post."""

    subject: Subject
    activity: Activity
    seconds: float


def activity(
    view: UsageView, *, threshold: float, pods: Mapping[str, Mapping[str, PodRef]]
) -> dict[Subject, Activity]:
    """What each prepared claim (and each pod of a shared claim) did in this pass; subjects
    whose devices could not be read are left out."""
    by_claim: dict[str, list[DeviceRow]] = {}
    holders: dict[str, Holder] = {}
    for row in view.devices:
        if row.claim is not None:
            by_claim.setdefault(row.claim.claim_uid, []).append(row)
            holders[row.claim.claim_uid] = row.claim
    # Every claim holding the device, whether its pods run processes or not: with several,
    # the device's utilization says nothing about any one of them.
    holding = Counter(r.device.name for r in view.devices if r.claim is not None)
    pod_rows: dict[tuple[str, str], list[PodRow]] = {}
    for pod_row in view.pods:
        if pod_row.claim is not None:
            pod_rows.setdefault((pod_row.claim.claim_uid, pod_row.pod_uid), []).append(pod_row)
    out: dict[Subject, Activity] = {}
    for claim_uid, rows in by_claim.items():
        if any(r.usage.error for r in rows):
            continue
        holder = holders[claim_uid]
        if holder.admin_access:
            continue  # a monitoring claim runs no compute by design: it is never "idle"
        mine = [r for (c, _p), rs in pod_rows.items() if c == claim_uid for r in rs]
        busy = any(
            _device_busy(r, threshold)
            if holding[r.device.name] == 1
            else _pod_busy([p for p in mine if p.device.name == r.device.name], threshold)
            for r in rows
        )
        names = tuple(sorted(r.device.name for r in rows))
        out[Subject(claim_uid)] = Activity(busy, sum(r.processes for r in mine), names, holder)
        known = pods.get(claim_uid, {})
        if len(known) < 2:
            continue
        for pod_uid, ref in sorted(known.items()):
            own = pod_rows.get((claim_uid, pod_uid), [])
            out[Subject(claim_uid, pod_uid)] = Activity(
                busy=_pod_busy(own, threshold),
                processes=sum(r.processes for r in own),
                devices=names,
                claim=holder,
                pod=ref,
            )
    return out


def _device_busy(row: DeviceRow, threshold: float) -> bool:
    """A device its claim holds alone: its utilization; a process when it has none (MIG)."""
    if row.usage.utilization_ratio is None:
        return bool(row.usage.processes)
    return row.usage.utilization_ratio >= threshold


def _pod_busy(rows: Sequence[PodRow], threshold: float) -> bool:
    """Processes of one pod or claim: their SM share; a process when the share is not known
    (MPS, where the server holds all the samples, or a MIG device)."""
    shares = [r.utilization_ratio for r in rows if r.utilization_ratio is not None]
    if shares:
        return sum(shares) >= threshold
    return any(r.processes for r in rows)


class IdleTracker:
    """Idle periods of subjects over successive passes (the caller brings the clock)."""

    def __init__(self, *, idle_after_s: float) -> None:
        self.idle_after_s = idle_after_s
        self._since: dict[Subject, float] = {}
        self._reported: set[Subject] = set()

    def observe(self, now: float, seen: Mapping[Subject, Activity]) -> list[Idle]:
        """Record one pass; returns the subjects that have just reached ``idle_after_s``."""
        for gone in set(self._since) - {s for s, a in seen.items() if not a.busy}:
            del self._since[gone]
            self._reported.discard(gone)
        crossed: list[Idle] = []
        for subject, act in sorted(seen.items()):
            if act.busy:
                continue
            since = self._since.setdefault(subject, now)
            if now - since >= self.idle_after_s and subject not in self._reported:
                self._reported.add(subject)
                crossed.append(Idle(subject, act, now - since))
        return crossed

    def idle_seconds(self, now: float) -> dict[Subject, float]:
        """Every subject idle now, with how long it has been."""
        return {s: now - since for s, since in self._since.items()}


def duration_text(seconds: float) -> str:
    """``1800`` -> ``30m``, ``90`` -> ``1m30s``, ``7200`` -> ``2h``."""
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
        f"{secs}s" if secs else "",
    ]
    return "".join(parts) or "0s"


def message(idle: Idle, *, node: str) -> str:
    """The Event's text: ``GPU gpu-3 idle for 30m, 0 processes``."""
    act = idle.activity
    gpus = ", ".join(act.devices)
    noun = "GPU" if len(act.devices) == 1 else "GPUs"
    processes = f"{act.processes} process" + ("" if act.processes == 1 else "es")
    whose = f" in pod {act.pod.name}" if act.pod is not None else ""
    return (
        f"{noun} {gpus} idle{whose} for {duration_text(idle.seconds)}, {processes} "
        f"(claim {act.claim.namespace}/{act.claim.name}, node {node}); nothing was stopped"
    )
