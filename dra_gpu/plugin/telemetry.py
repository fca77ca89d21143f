"""The telemetry loop of the kubelet plugin: every ``--telemetry-interval`` one pass samples the
published devices, joins the samples with the claims prepared here and their pods, tracks idle
claims and posts their ``GpuIdle`` Events. Started with the metrics endpoint only.

One thread (``telemetry``); the NVML calls of a pass run on the sampler's bounded worker
(``nvml_usage``). A pass's result is one immutable :class:`Snapshot` that replaces the previous
one by assignment; the collector reads whichever is current at scrape time, so a scrape never
waits for NVML and never takes a lock. Idle state is touched by the loop's thread only.
Events are posted from the loop's thread (best effort: a failure is logged by
``kubeletplugin.events.post``), at most one per idle period and subject.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dra_gpu.devices.model import Device
from dra_gpu.devices.usage import UsageSampler
from dra_gpu.plugin import idle_claims, usage_series
from dra_gpu.plugin.claim_pods import ClaimPods
from dra_gpu.prepare.checkpoint import ClaimRecord

log = logging.getLogger(__name__)

REASON_IDLE = "GpuIdle"
DEFAULT_INTERVAL_S = 10.0
DEFAULT_IDLE_AFTER_S = 1800.0
DEFAULT_IDLE_THRESHOLD = 0.01

# (involvedObject, message) -> posts one Warning Event (kubeletplugin.events).
PostEvent = Callable[[Mapping[str, str], str], None]


@dataclass(frozen=True)
class IdleSettings:
    after_s: float
    threshold: float = DEFAULT_IDLE_THRESHOLD


@dataclass(frozen=True)
class IdleNow:
    subject: idle_claims.Subject
    activity: idle_claims.Activity
    seconds: float  # 0 while busy


@dataclass(frozen=True)
class Snapshot:
    view: usage_series.UsageView
    idle: tuple[IdleNow, ...] = ()
    passes: int = 0
    last_pass_s: float = 0.0  # CPU seconds of the last pass, the loop's own cost
    errors: Mapping[str, str] = field(default_factory=dict)  # device -> why it has no sample


class Telemetry:
    def __init__(
        self,
        *,
        node: str,
        sampler: UsageSampler,
        devices: Callable[[], Sequence[Device]],
        claims: Callable[[], Mapping[str, ClaimRecord]],
        pods: ClaimPods,
        interval_s: float = DEFAULT_INTERVAL_S,
        idle: IdleSettings | None = None,
        post: PostEvent | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.interval_s = interval_s
        self._sampler, self._devices, self._claims = sampler, devices, claims
        self._pods, self._idle, self._post, self._clock = pods, idle, post, clock
        self._tracker = idle_claims.IdleTracker(idle_after_s=idle.after_s) if idle else None
        self.snapshot = Snapshot(usage_series.UsageView(node=node))
        self._last_claims: Mapping[str, ClaimRecord] = {}
        self._thread: threading.Thread | None = None

    def run_once(self) -> Snapshot:
        """One pass; the new snapshot is also :attr:`snapshot`."""
        started = time.process_time()
        devices = [d for d in self._devices() if d.uuid is not None]
        usage = self._sampler.sample(devices)
        try:
            claims = self._last_claims = self._claims()
        except Exception as err:
            # The checkpoint's lock not taken in time, or the file moved aside: the last
            # claims read stand, so labels and idle periods do not drop out for a pass.
            log.warning("telemetry: cannot read the checkpoint: %s", err)
            claims = self._last_claims
        held = usage_series.holders(claims, pool=self.node)
        by_uid = {h.claim_uid: h for hs in held.values() for h in hs}
        view = usage_series.build_view(
            node=self.node, devices=devices, usage=usage, held=held, pods=self._pods.pods()
        )
        if view.unknown_pods or set(by_uid) - set(self._pods.pods()):
            self._pods.update(by_uid, view.unknown_pods)
            view = usage_series.build_view(
                node=self.node, devices=devices, usage=usage, held=held, pods=self._pods.pods()
            )
        else:
            self._pods.update(by_uid, {})
        idle = self._track(view)
        errors = {name: u.error for name, u in usage.items() if u.error}
        self.snapshot = Snapshot(
            view,
            idle,
            passes=self.snapshot.passes + 1,
            last_pass_s=time.process_time() - started,
            errors=errors,
        )
        return self.snapshot

    def _track(self, view: usage_series.UsageView) -> tuple[IdleNow, ...]:
        if self._tracker is None or self._idle is None:
            return ()
        now = self._clock()
        seen = idle_claims.activity(view, threshold=self._idle.threshold, pods=self._pods.pods())
        # A claim idle as a whole gets one Event on it and each of its pods; its pods' own
        # idle periods are announced only while another pod keeps the claim busy.
        idle_claims_now = {s.claim_uid for s, a in seen.items() if not s.pod_uid and not a.busy}
        for crossed in self._tracker.observe(now, seen):
            if crossed.subject.pod_uid and crossed.subject.claim_uid in idle_claims_now:
                continue
            self._announce(crossed)
        idle_for = self._tracker.idle_seconds(now)
        return tuple(
            IdleNow(subject, act, idle_for.get(subject, 0.0))
            for subject, act in sorted(seen.items())
        )

    def _announce(self, idle: idle_claims.Idle) -> None:
        text = idle_claims.message(idle, node=self.node)
        log.warning("%s: %s", REASON_IDLE, text)
        if self._post is None:
            return
        involved = self._pods.involved(idle.subject.claim_uid)
        if idle.subject.pod_uid:
            involved = tuple(o for o in involved if o.get("uid") == idle.subject.pod_uid)
        for target in involved:
            self._post(target, text)

    def close_sampler(self) -> None:
        """Let go of the sampler (NVML) when passes are run by hand, not by :meth:`run`."""
        self._sampler.close()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except Exception:  # one bad pass must not end telemetry
                log.exception("telemetry pass failed")
            if stop.wait(self.interval_s):
                break
        self.close_sampler()

    def start(self, stop: threading.Event) -> threading.Thread:
        self._thread = threading.Thread(
            target=self.run, args=(stop,), name="telemetry", daemon=True
        )
        self._thread.start()
        return self._thread
