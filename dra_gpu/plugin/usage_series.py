"""Samples + who holds each device -> the rows of the telemetry series (pure).

Input: the published devices, one :class:`DeviceUsage` per device name, the claims prepared on
this node (from the checkpoint: :func:`holders`) and the pods each claim is reserved for (a
cache fed from the API server). Output: a :class:`UsageView`, one :class:`DeviceRow` per
(device, claim holding it) -- one with no claim for a free device -- and one :class:`PodRow` per
(device, pod) with processes on it, which the collector turns into Prometheus series and the
idle tracker into activity.

Rules:

* A device held by several claims (consumable shares, admin access next to a user's claim) has
  a row for each claim, with the same sample: every holder is named, none stands for the others.
  Claims not admin access come first.
* A process is attributed by the pod UID of its cgroup to the claim whose ``reservedFor`` names
  that pod. A pod no claim of the device names keeps its UID with empty namespace and name; it
  is counted for the device's claim when there is one, for none when several hold the device
  (which share it belongs to is not known, and guessing would make an idle share read busy).
  Processes outside any pod (no pod UID) are one row with an empty UID and no claim: someone
  uses the GPU outside Kubernetes.
* Under a strategy whose clients go through a daemon (MPS; ``dra_gpu.config.strategies``) the
  SM samples all go to the daemon's server, so a pod of such a claim has no utilization (None),
  only memory and the compute share its claim configured; its device's utilization is the
  whole GPU's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from dra_gpu.config import strategies
from dra_gpu.devices.model import Device
from dra_gpu.devices.usage import DeviceUsage, ProcessUsage
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, ClaimRecord

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class Holder:
    """A claim prepared on this node that holds a device."""

    claim_uid: str
    namespace: str
    name: str
    admin_access: bool = False
    # The claim's strategy serves its clients through a daemon (MPS): NVML gives the SM samples
    # to the daemon, so its pods have no utilization of their own.
    through_daemon: bool = False
    # The share of the SMs each client may use, where the strategy caps it (MPS's
    # defaultActiveThreadPercentage); None when it has no such cap or the claim set none.
    compute_share: float | None = None


@dataclass(frozen=True)
class DeviceRow:
    device: Device
    usage: DeviceUsage
    claim: Holder | None

    @property
    def labels(self) -> dict[str, str]:
        mig = self.device.mig
        return {
            "device": self.device.name,
            "uuid": self.device.uuid or "",
            "product": self.device.gpu.product_name,
            "mig_profile": mig.profile if mig is not None else "",
            "claim_namespace": self.claim.namespace if self.claim else "",
            "claim_name": self.claim.name if self.claim else "",
        }


@dataclass(frozen=True)
class PodRow:
    device: Device
    claim: Holder | None
    pod_uid: str
    pod: PodRef | None
    processes: int
    memory_bytes: int | None
    utilization_ratio: float | None
    compute_share: float | None = None  # the SM share each client of the claim may use (MPS)

    @property
    def labels(self) -> dict[str, str]:
        return {
            "device": self.device.name,
            "uuid": self.device.uuid or "",
            "claim_namespace": self.claim.namespace if self.claim else "",
            "claim_name": self.claim.name if self.claim else "",
            "pod_namespace": self.pod.namespace if self.pod else "",
            "pod_name": self.pod.name if self.pod else "",
            "pod_uid": self.pod_uid,
        }


@dataclass(frozen=True)
class UsageView:
    node: str
    devices: tuple[DeviceRow, ...] = ()
    pods: tuple[PodRow, ...] = ()
    # Pod UIDs with processes on a claim's device that the claim's reservedFor did not name.
    unknown_pods: Mapping[str, frozenset[str]] = field(default_factory=dict)


def holders(claims: Mapping[str, ClaimRecord], *, pool: str) -> dict[str, list[Holder]]:
    """Device name -> the claims holding it, from the checkpoint's claims by UID (prepared
    ones only; devices of other pools left out)."""
    out: dict[str, list[Holder]] = {}
    for uid, record in claims.items():
        if record.state != PREPARE_COMPLETED:
            continue
        for d in record.devices:
            if d.pool != pool:
                continue
            sharing = (d.config or {}).get("sharing") or {}
            strategy = strategies.recorded(sharing)
            out.setdefault(d.device, []).append(
                Holder(
                    claim_uid=uid,
                    namespace=record.namespace,
                    name=record.name,
                    admin_access=d.admin_access,
                    through_daemon=strategy is not None and strategy.through_daemon,
                    compute_share=strategy.compute_share(sharing) if strategy else None,
                )
            )
    return out


def _ordered(held: Sequence[Holder]) -> list[Holder]:
    return sorted(held, key=lambda h: (h.admin_access, h.namespace, h.name, h.claim_uid))


def build_view(
    *,
    node: str,
    devices: Sequence[Device],
    usage: Mapping[str, DeviceUsage],
    held: Mapping[str, Sequence[Holder]],
    pods: Mapping[str, Mapping[str, PodRef]],
) -> UsageView:
    """The rows for one pass; ``pods``: claim UID -> pod UID -> pod (the claims' reservedFor)."""
    device_rows: list[DeviceRow] = []
    pod_rows: list[PodRow] = []
    unknown: dict[str, set[str]] = {}
    for device in sorted(devices, key=lambda d: d.name):
        sample = usage.get(device.name)
        if sample is None:
            continue
        claims = _ordered(held.get(device.name, ()))
        named: list[Holder | None] = [*claims] or [None]  # a free device: one unlabelled row
        device_rows.extend(DeviceRow(device, sample, c) for c in named)
        only = claims[0] if len(claims) == 1 else None
        by_pod: dict[str, list[ProcessUsage]] = {}
        for process in sample.processes:
            by_pod.setdefault(process.pod_uid or "", []).append(process)
        for pod_uid, processes in sorted(by_pod.items()):
            claim = next((c for c in claims if pod_uid in pods.get(c.claim_uid, {})), None)
            if claim is None and pod_uid:
                # The pod may have joined one of these claims after its prepare: each is
                # read again (ClaimPods bounds how often).
                for c in claims:
                    unknown.setdefault(c.claim_uid, set()).add(pod_uid)
            owner = claim or only
            pod = pods.get(claim.claim_uid, {}).get(pod_uid) if claim else None
            pod_rows.append(
                PodRow(
                    device=device,
                    claim=owner if pod_uid else None,
                    pod_uid=pod_uid,
                    pod=pod,
                    processes=len(processes),
                    memory_bytes=_known_sum([p.memory_bytes for p in processes]),
                    utilization_ratio=(
                        None
                        if owner is not None and owner.through_daemon
                        else _known_sum([p.sm_ratio for p in processes])
                    ),
                    compute_share=owner.compute_share if owner is not None and pod_uid else None,
                )
            )
    return UsageView(
        node=node,
        devices=tuple(device_rows),
        pods=tuple(pod_rows),
        unknown_pods={uid: frozenset(p) for uid, p in unknown.items()},
    )


def _known_sum(values: Sequence[N | None]) -> N | None:
    """The sum, or None when no value is known (unknown is not zero)."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    total = known[0]
    for v in known[1:]:
        total += v
    return total
