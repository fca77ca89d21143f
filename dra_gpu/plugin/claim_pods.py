"""The pods each prepared claim is reserved for, for the telemetry labels and the idle Events:
a small cache over GETs of the claim, made by the telemetry loop, never by a scrape.

A claim is read once when the telemetry first sees it prepared, again when a process on its
device runs in a pod its ``reservedFor`` did not name (a pod that joined a shared claim after
its prepare) but at most every ``refresh_s`` and once per such pod (a pod a fresh read did not
name either, such as the plugin's own pod running an MPS server, is not asked about again),
and every ``stale_s`` in any case (a pod that joined without a process yet). Claims no longer
prepared are forgotten. A failed GET keeps what was known; it is logged once per claim until a
GET succeeds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_gpu.kube import errors
from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin.events import involved_objects
from dra_gpu.plugin.usage_series import Holder, PodRef

log = logging.getLogger(__name__)

Fetch = Callable[[str, str], ResourceClaim | None]  # (namespace, name) -> claim or None


@dataclass(frozen=True)
class _Known:
    pods: Mapping[str, PodRef]
    involved: tuple[Mapping[str, str], ...]  # the claim and its pods, as Event objects
    fetched_at: float


class ClaimPods:
    def __init__(
        self,
        fetch: Fetch,
        *,
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = 30.0,
        stale_s: float = 300.0,
    ) -> None:
        self._fetch, self._clock = fetch, clock
        self._refresh_s, self._stale_s = refresh_s, stale_s
        self._known: dict[str, _Known] = {}
        self._failing: set[str] = set()
        # Pod UIDs a fresh read of the claim did not name (an MPS server runs in the plugin's
        # own pod): asked about once, not every ``refresh_s``.
        self._not_members: dict[str, set[str]] = {}

    def update(
        self, held: Mapping[str, Holder], unknown_pods: Mapping[str, frozenset[str]]
    ) -> None:
        """Read the claims that need it; ``held``: claim UID -> claim prepared here."""
        now = self._clock()
        for uid in set(self._known) - set(held):
            del self._known[uid]
            self._not_members.pop(uid, None)
        for uid, holder in held.items():
            known = self._known.get(uid)
            asked = unknown_pods.get(uid, frozenset())
            if known is not None and now - known.fetched_at < self._stale_s:
                missing = asked - set(known.pods) - self._not_members.get(uid, set())
                if not missing or now - known.fetched_at < self._refresh_s:
                    continue
            self._read(uid, holder, now)
            read = self._known[uid]
            if uid not in self._failing:
                self._not_members[uid] = set(asked - set(read.pods))

    def _read(self, uid: str, holder: Holder, now: float) -> None:
        try:
            claim = self._fetch(holder.namespace, holder.name)
        except errors.ApiError as err:
            if uid not in self._failing:
                log.warning(
                    "cannot read claim %s/%s for telemetry: %s", holder.namespace, holder.name, err
                )
                self._failing.add(uid)
            old = self._known.get(uid)
            fallback = _Known({}, (), now) if old is None else _Known(old.pods, old.involved, now)
            self._known[uid] = fallback
            return
        self._failing.discard(uid)
        read: Mapping[str, Any] | None = claim
        if read is None or (read.get("metadata") or {}).get("uid") != uid:
            # Gone, or another claim of that name by now: only the prepared one is named.
            read = {"metadata": {"namespace": holder.namespace, "name": holder.name, "uid": uid}}
        involved = tuple(involved_objects(read))
        pods = {o["uid"]: PodRef(o["namespace"], o["name"]) for o in involved if o["kind"] == "Pod"}
        self._known[uid] = _Known(pods, involved, now)

    def pods(self) -> dict[str, Mapping[str, PodRef]]:
        """Claim UID -> pod UID -> pod, for the claims read so far."""
        return {uid: k.pods for uid, k in self._known.items()}

    def involved(self, claim_uid: str) -> tuple[Mapping[str, str], ...]:
        """The claim and its pods as Event ``involvedObject``s (empty before a read)."""
        known = self._known.get(claim_uid)
        return known.involved if known is not None else ()
