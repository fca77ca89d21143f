"""Which claims (and which pods of shared claims) have left their GPUs idle, and for how long
(pure: the telemetry loop feeds it a :class:`UsageView` and the time).

* A claim is busy while any of its devices is at or above the utilization threshold; when one
  of its devices is also held by another claim (admin access), its own pods' processes
  count instead of the device's utilization.
* A pod of a claim shared by several pods is busy while its own processes' SM share is at or
  above the threshold; under MPS (no per-process share) while it has a process on the GPU.
* A claim or pod idle for ``idle_after_s`` is reported once (:meth:`IdleTracker.observe`
  returns it); work clears it, and a later idle period is reported again. A device whose
  sample failed makes its claim unknown: its idle time starts over, so a wedged NVML never
  reads as idle.
"""

from __future__ import annotations

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


def _busy_ratio(value: float | None, threshold: float) -> bool:
    return value is not None and value >= threshold


def activity(
    view: UsageView, *, threshold: float, pods: Mapping[str, Mapping[str, PodRef]]
) -> dict[Subject, Activity]:
    """What each prepared claim (and each pod of a shared claim) did in this pass; subjects
    whose devices could not be read are left out."""
    by_claim: dict[str, list[DeviceRow]] = {}
    holders: dict[str, Holder] = {}
    shared_device: set[str] = set()
    claims_of: dict[str, set[str]] = {}
    for row in view.devices:
        if row.claim is not None:
            by_claim.setdefault(row.claim.claim_uid, []).append(row)
            holders[row.claim.claim_uid] = row.claim
    pod_rows: dict[tuple[str, str], list[PodRow]] = {}
    for pod_row in view.pods:
        if pod_row.claim is not None:
            pod_rows.setdefault((pod_row.claim.claim_uid, pod_row.pod_uid), []).append(pod_row)
            claims_of.setdefault(pod_row.device.name, set()).add(pod_row.claim.claim_uid)
    shared_device = {name for name, claims in claims_of.items() if len(claims) > 1}
    out: dict[Subject, Activity] = {}
    for claim_uid, rows in by_claim.items():
        if any(r.usage.error for r in rows):
            continue
        holder = holders[claim_uid]
        mine = [r for (c, _p), rs in pod_rows.items() if c == claim_uid for r in rs]
        processes = sum(r.processes for r in mine)
        busy = any(
            _busy_ratio(r.usage.utilization_ratio, threshold)
            for r in rows
            if r.device.name not in shared_device
        ) or any(
            _pod_busy([r], threshold, mps=holder.mps)
            for r in mine
            if r.device.name in shared_device
        )
        names = tuple(sorted(r.device.name for r in rows))
        out[Subject(claim_uid)] = Activity(busy, processes, names, holder)
        known = pods.get(claim_uid, {})
        if len(known) < 2:
            continue
        for pod_uid, ref in sorted(known.items()):
            own = pod_rows.get((claim_uid, pod_uid), [])
            out[Subject(claim_uid, pod_uid)] = Activity(
                busy=_pod_busy(own, threshold, mps=holder.mps),
                processes=sum(r.processes for r in own),
                devices=names,
                claim=holder,
                pod=ref,
            )
    return out


def _pod_busy(rows: Sequence[PodRow], threshold: float, *, mps: bool) -> bool:
    if mps:
        return any(r.processes for r in rows)
    return _busy_ratio(sum(r.utilization_ratio or 0.0 for r in rows), threshold)


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
