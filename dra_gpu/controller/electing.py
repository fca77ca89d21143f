"""The leader-election loop: reads and writes the Lease, following :mod:`leases`' decisions.

:class:`Elector` does one round per :meth:`Elector.step` (read, decide, maybe write) and tells
how long to wait before the next; :meth:`Elector.run` loops that on a thread. The Lease is
reached through a :class:`LeaseStore` (:class:`KubeLeaseStore` in production, an in-memory one
in unit tests) and time through a :class:`Clock`, so tests drive two electors against one
store with a fake clock and no sleeping.

:attr:`Elector.is_leader` is safe to read from any thread; it turns false by itself once the
renew deadline passes without a successful renewal (an API server outage), so the reconciler
stops acting even while this thread is stuck in a request.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from dra_gpu.controller import leases
from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient

log = logging.getLogger(__name__)


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now(self) -> dt.datetime: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class LeaseConflict(Exception):
    """Someone else wrote the Lease since we read it (or created it first)."""


class LeaseStore(Protocol):
    def get(self) -> tuple[leases.LeaseRecord, str] | None:
        """The record and its resourceVersion, or None when there is no Lease."""

    def create(self, record: leases.LeaseRecord) -> str:
        """Create the Lease; its resourceVersion. Raises :class:`LeaseConflict` if it exists."""

    def update(self, record: leases.LeaseRecord, version: str) -> str:
        """Replace the Lease if still at ``version``; else :class:`LeaseConflict`."""


class KubeLeaseStore:
    """A ``coordination.k8s.io/v1`` Lease in the API server."""

    def __init__(self, client: KubeClient, *, namespace: str, name: str) -> None:
        self._client = client
        self._namespace = namespace
        self._name = name
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def _body(self, record: leases.LeaseRecord, version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self._name, "namespace": self._namespace}
        if version is not None:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": leases.to_spec(record),
        }

    def get(self) -> tuple[leases.LeaseRecord, str] | None:
        try:
            obj = self._client.request("GET", f"{self._collection}/{self._name}", timeout_s=5.0)
        except errors.NotFound:
            return None
        version = str(obj.get("metadata", {}).get("resourceVersion", ""))
        return leases.from_spec(obj.get("spec") or {}), version

    def create(self, record: leases.LeaseRecord) -> str:
        try:
            obj = self._client.request(
                "POST", self._collection, body=self._body(record, None), timeout_s=5.0
            )
        except errors.Conflict as exc:
            raise LeaseConflict(str(exc)) from exc
        return str(obj["metadata"]["resourceVersion"])

    def update(self, record: leases.LeaseRecord, version: str) -> str:
        path = f"{self._collection}/{self._name}"
        try:
            obj = self._client.request("PUT", path, body=self._body(record, version), timeout_s=5.0)
        except errors.Conflict as exc:
            raise LeaseConflict(str(exc)) from exc
        return str(obj["metadata"]["resourceVersion"])


class Elector:
    """One candidate; every replica runs one with its own identity."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        identity: str,
        clock: Clock,
        timing: leases.Timing = leases.DEFAULT_TIMING,
    ) -> None:
        self._store = store
        self._identity = identity
        self._clock = clock
        self._timing = timing
        self._lock = threading.Lock()
        self._observation: leases.Observation | None = None
        self._renewed_at: float | None = None  # monotonic time of our last successful write

    @property
    def is_leader(self) -> bool:
        with self._lock:
            renewed = self._renewed_at
        return renewed is not None and (
            self._clock.monotonic() - renewed < self._timing.renew_deadline
        )

    def step(self) -> float:
        """One round; seconds until the next. Never raises for API errors (they are logged)."""
        now = self._clock.monotonic()
        try:
            got = self._store.get()
        except Exception as exc:
            log.warning("reading lease failed: %s", exc)
            return self._timing.retry_period
        record, version = got if got is not None else (None, None)
        with self._lock:
            observation = leases.observe(self._observation, record, version, now=now)
            self._observation = observation
        decision = leases.decide(observation, identity=self._identity, now=now)
        if decision is leases.Decision.FOLLOW:
            self._lose(f"lease held by {record.holder if record else '?'}")
            return self._timing.retry_period
        return self._write(decision, observation, now)

    def _write(
        self, decision: leases.Decision, observation: leases.Observation, now: float
    ) -> float:
        record = leases.next_record(
            decision,
            observation.record,
            identity=self._identity,
            wall_now=self._clock.now(),
            timing=self._timing,
        )
        try:
            if decision is leases.Decision.CREATE:
                version = self._store.create(record)
            else:
                version = self._store.update(record, observation.version or "")
        except LeaseConflict:
            self._lose("lost a race for the lease")
            return self._timing.retry_period
        except Exception as exc:
            log.warning("writing lease failed (%s): %s", decision.value, exc)
            return self._timing.retry_period
        was_leading = self.is_leader
        with self._lock:
            self._renewed_at = now
            self._observation = leases.Observation(record, version, now)
        if not was_leading:
            log.info("%s is now the leader (%s)", self._identity, decision.value)
        return self._timing.renew_period

    def _lose(self, why: str) -> None:
        with self._lock:
            was = self._renewed_at is not None
            self._renewed_at = None
        if was:
            log.warning("%s stopped leading: %s", self._identity, why)

    def release(self) -> None:
        """Give the lease up if we hold it, so another replica takes over without waiting."""
        with self._lock:
            observation, held = self._observation, self._renewed_at is not None
            self._renewed_at = None
        if not held or observation is None or observation.record is None:
            return
        record = leases.released(observation.record, wall_now=self._clock.now())
        try:
            self._store.update(record, observation.version or "")
            log.info("%s released the lease", self._identity)
        except Exception as exc:
            log.warning("releasing lease failed: %s", exc)

    def run(self, stop: threading.Event, on_change: Callable[[bool], None]) -> None:
        """Loop until ``stop``, then release; ``on_change(leading)`` whenever leadership flips.

        Leadership is polled between steps too, so losing it by deadline is reported promptly.
        """
        leading = False
        next_step = 0.0
        while not stop.is_set():
            if self._clock.monotonic() >= next_step:
                next_step = self._clock.monotonic() + self.step()
            if self.is_leader != leading:
                leading = not leading
                if not leading and self._renewed_at is not None:  # lapsed, not lost (logged)
                    log.warning(
                        "%s stopped leading: no renewal within the renew deadline", self._identity
                    )
                on_change(leading)
            stop.wait(min(max(next_step - self._clock.monotonic(), 0.0), 0.5))
        self.release()
        if leading:
            on_change(False)
