"""Leader election on a ``coordination.k8s.io/v1`` Lease: the decisions, without I/O.

The protocol is the one client-go's leaderelection package follows, so ``kubectl get lease``
reads it the usual way and the rules are well understood:

- The Lease names its holder, a duration, acquire/renew times and a transition count.
- A candidate takes the lease when there is none, when it is released (empty holder), or when
  it has expired. Expiry is judged on the *local monotonic clock*: a lease counts as expired
  when this process has not seen the record change for ``leaseDurationSeconds``. Times written
  by another machine are never compared with ours, so clock skew cannot make two leaders.
- Every write carries the resourceVersion that was read; of two candidates racing for a free
  lease the second gets a conflict and stays a follower.
- A leader that has not renewed for ``renew_deadline`` (shorter than the duration) considers
  itself no longer leading, before any follower can consider the lease expired.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True)
class Timing:
    """Seconds; the defaults follow client-go's (15 s duration, 10 s deadline, 2 s retry)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    renew_period: float = 5.0  # how often the leader renews
    retry_period: float = 2.0  # how often a follower looks

    def __post_init__(self) -> None:
        if not 0 < self.renew_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need 0 < renew_period < renew_deadline < lease_duration")


DEFAULT_TIMING = Timing()


@dataclass(frozen=True)
class LeaseRecord:
    """The ``spec`` of a Lease."""

    holder: str  # "" when released
    duration_s: int
    acquire_time: dt.datetime | None = None
    renew_time: dt.datetime | None = None
    transitions: int = 0


@dataclass(frozen=True)
class Observation:
    """The last Lease seen, and when (local monotonic seconds) it last changed."""

    record: LeaseRecord | None  # None: no Lease object exists
    version: str | None  # its resourceVersion
    changed_at: float


class Decision(enum.Enum):
    CREATE = "create"  # no Lease: create it holding it
    ACQUIRE = "acquire"  # free or expired: take it over
    RENEW = "renew"  # ours: renew it
    FOLLOW = "follow"  # someone else holds a live lease


def observe(
    previous: Observation | None,
    record: LeaseRecord | None,
    version: str | None,
    *,
    now: float,
) -> Observation:
    """Fold a fresh read into the observation; the clock restarts only when the record changed."""
    if previous is not None and previous.record == record:
        return dataclasses.replace(previous, version=version)
    return Observation(record, version, now)


def decide(observation: Observation, *, identity: str, now: float) -> Decision:
    record = observation.record
    if record is None:
        return Decision.CREATE
    if record.holder == identity:
        return Decision.RENEW
    if not record.holder or now - observation.changed_at >= record.duration_s:
        return Decision.ACQUIRE
    return Decision.FOLLOW


def next_record(
    decision: Decision,
    current: LeaseRecord | None,
    *,
    identity: str,
    wall_now: dt.datetime,
    timing: Timing,
) -> LeaseRecord:
    """The record to write for a CREATE, ACQUIRE or RENEW decision."""
    duration = round(timing.lease_duration)
    if decision is Decision.RENEW and current is not None:
        return dataclasses.replace(current, renew_time=wall_now, duration_s=duration)
    if decision is Decision.FOLLOW:
        raise ValueError("a follower writes nothing")
    transitions = current.transitions + 1 if current is not None else 0
    return LeaseRecord(identity, duration, wall_now, wall_now, transitions)


def released(current: LeaseRecord, *, wall_now: dt.datetime) -> LeaseRecord:
    """What a leader writes when it stops, so a follower takes over on its next look."""
    return dataclasses.replace(current, holder="", duration_s=1, renew_time=wall_now)


def _format(t: dt.datetime | None) -> str | None:
    return t.astimezone(dt.UTC).strftime(_MICRO_TIME) if t is not None else None


def _parse(text: object) -> dt.datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def to_spec(record: LeaseRecord) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "holderIdentity": record.holder,
        "leaseDurationSeconds": record.duration_s,
        "leaseTransitions": record.transitions,
    }
    for key, value in (("acquireTime", record.acquire_time), ("renewTime", record.renew_time)):
        if value is not None:
            spec[key] = _format(value)
    return spec


def from_spec(spec: Mapping[str, Any]) -> LeaseRecord:
    """Tolerant: a Lease edited by hand with odd values reads as free or short, never crashes."""
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration_s=duration if isinstance(duration, int) and duration > 0 else 1,
        acquire_time=_parse(spec.get("acquireTime")),
        renew_time=_parse(spec.get("renewTime")),
        transitions=transitions if isinstance(transitions, int) else 0,
    )
