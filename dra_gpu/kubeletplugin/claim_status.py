"""ResourceClaim device status (KEP-4817), the protocol part: a driver's entries of a prepared
claim's ``status.devices`` written off the kubelet's answer, by one thread.

The driver says what its entries are (``entries_of``: the claim's entries while it is prepared,
None once it is not); this module owns when and how they reach the API server. It is one of the
kit's steps after a call (``driver.Step``): a prepared claim is written :data:`SETTLE_S` after its
prepare answered, so that a burst of answers is not slowed by the writes, repeated prepares of a
claim within that time give one write, and a claim unprepared by then is not written at all
(Kubernetes clears a claim's status when it is deallocated). The queue is bounded (a full one
drops the claim, logged); a write that fails for a reason that may pass (no answer, 429, 5xx, a
conflicting write) is tried again after 0.5 s, doubling up to 30 s; one that cannot succeed (the
claim gone or replaced by another of the same name, Forbidden, Invalid) is dropped with one log
line.

The write is a server-side apply of the ``status`` subresource with the driver's own field
manager: it carries only the driver's entries, which the server merges into ``status.devices``
by their key (driver, pool, device, shareID), so other drivers' entries and every other field
stay as they are, with no read before it and no conflict with a concurrent writer. It names the
claim's UID, so a claim replaced by another of the same name is refused (the UID cannot
change), never written. A repeat of what this writer last applied for the claim (the kubelet's
repeated prepare) sends nothing.

An API server whose ``DRAResourceClaimDeviceStatus`` gate is off drops the field silently: the
first write that comes back without our entries switches the writer off, with one log line.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

from dra_gpu.kube import errors
from dra_gpu.kube.client import APPLY_PATCH
from dra_gpu.kube.objects import AllocatedDeviceStatus, ResourceClaim, claim_path
from dra_gpu.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_gpu.kubeletplugin.ids import ClaimUID

log = logging.getLogger(__name__)

FIRST_BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 30.0
# Long enough for the answers of a burst of prepares to go out before their writes start, and
# for a pod that fails at once to be unprepared unwritten; short next to a pod's start (seconds).
SETTLE_S: Final = 0.25
# A write due while DRA calls are in flight waits for them to end, at most this long: in a burst
# of pods the writes took a sixth of the plugin's GIL time (py-spy --gil through bench/prepare.py's
# 64-at-once rounds), time the burst's answers then waited for. Bounded, so a node that is never
# idle still gets its status, seconds late at most.
YIELD_S: Final = 2.0
QUEUE_SIZE: Final = 1024
API_VERSION: Final = "resource.k8s.io/v1"

# Results, the label values of the metric (bounded).
WRITTEN: Final = "written"
UNCHANGED: Final = "unchanged"
RETRY: Final = "retry"
DROPPED: Final = "dropped"
UNSUPPORTED: Final = "unsupported"
RESULTS: Final = (WRITTEN, UNCHANGED, RETRY, DROPPED, UNSUPPORTED)

EntriesOf = Callable[[ClaimUID], Sequence[AllocatedDeviceStatus] | None]


def key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What the server merges ``status.devices`` entries by."""
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID", "")),
    )


def same_entries(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Equal but for the conditions' transition times (a repeat must not rewrite them)."""

    def shown(entry: Mapping[str, Any]) -> Any:
        conditions = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"}
            for c in entry.get("conditions") or []
        ]
        return {**entry, "conditions": conditions}

    return [shown(e) for e in a] == [shown(e) for e in b]


def apply_body(ref: ClaimRef, ours: Sequence[AllocatedDeviceStatus]) -> dict[str, Any]:
    """The apply patch: the claim named by UID, and only our entries of ``status.devices``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": str(ref.uid)},
        "status": {"devices": list(ours)},
    }


def backoff(attempt: int, *, first_s: float = FIRST_BACKOFF_S) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): ``first_s`` doubling, at most 30 s."""
    return float(min(first_s * 2 ** (attempt - 1), MAX_BACKOFF_S))


def permanent(err: errors.ApiError) -> bool:
    """Whether a failed write cannot succeed by trying again (the claim is gone, or the server
    refuses the request itself)."""
    if isinstance(err, errors.NotFound | errors.Gone):
        return True
    if isinstance(err, errors.ApiUnavailable | errors.Conflict):
        return False
    return err.status in (400, 403, 422)


class Client(Protocol):
    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = ...,
        timeout_s: float = ...,
    ) -> dict[str, Any]: ...


class Dropped(Exception):
    """The write cannot succeed; the message says why (logged once, not retried)."""


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    ref: ClaimRef
    attempt: int = 0


class ClaimStatusWriter:
    """One thread writing the driver's ``status.devices`` entries of prepared claims; a kit
    step (:class:`~dra_gpu.kubeletplugin.driver.Step`) whose methods never block.

    ``entries_of(uid)``: the driver's entries for the claim while it is prepared (None once it
    is not, which cancels the write); ``observe(result)``: one call per attempt's result
    (:data:`RESULTS`), for the metric; ``forbidden_hint``: the permission the server checks (it
    depends on the version), named when it refuses.

    The call threads hand claims over in a dict under a plain lock and wake the writer only when
    it has nothing due: a wake-up per claim (a queue's) cost a thread switch and a GIL hand-over
    per prepare and per unprepare, a tenth of the calls' GIL time (py-spy --gil through
    bench/reference.py's cycles).
    """

    def __init__(
        self,
        client: Client,
        *,
        driver: str,
        entries_of: EntriesOf,
        observe: Callable[[str], None] | None = None,
        forbidden_hint: str = "",
        first_backoff_s: float = FIRST_BACKOFF_S,
        settle_s: float = SETTLE_S,
        yield_s: float = YIELD_S,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._client, self._entries_of = client, entries_of
        self._observe = observe or (lambda _result: None)
        self._hint = forbidden_hint
        # Owns our entries in the server's managed fields; one per driver, since a claim's
        # devices of one driver are prepared by the plugin of one node.
        self._field_manager = f"{driver}/kubelet-plugin"
        self._first_backoff_s, self._settle_s, self._yield_s = first_backoff_s, settle_s, yield_s
        self._size = queue_size
        # Guarded by _lock, shared with the call threads: claims prepared and when their write
        # is due (a repeat keeps the first); claims unprepared since the writer last looked;
        # whether to stop; DRA calls in flight, and whether the writer waits for them to end.
        self._lock = threading.Lock()
        self._due: dict[ClaimUID, tuple[float, ClaimRef]] = {}
        self._gone: set[ClaimUID] = set()
        self._stopping = False
        self._in_flight = 0
        self._waits_for_idle = False
        self._wake = threading.Event()  # set when the writer may sleep past something new
        # Set by the worker thread only (read by the call threads: a stale read costs one claim).
        self._off = False
        # The worker thread's only: claim UID -> the entries last applied.
        self._applied: dict[ClaimUID, Sequence[AllocatedDeviceStatus]] = {}
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; pending writes are dropped (the next prepare answer submits again)."""
        if self._thread is None:
            return
        with self._lock:
            self._stopping = True
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        self._thread = None

    # --- the kit's step --------------------------------------------------------------------------

    def started(self, operation: str) -> None:
        with self._lock:
            self._in_flight += 1

    def _ended(self) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)  # a step called out of turn: not below 0
            wake = self._in_flight == 0 and self._waits_for_idle
        if wake:
            self._wake.set()

    def prepared(
        self, refs: Sequence[ClaimRef], results: Mapping[ClaimUID, PrepareResult], seconds: float
    ) -> None:
        self._ended()
        for ref in refs:
            result = results.get(ref.uid)
            if result is not None and not result.error and result.devices:
                self.submit(ref)

    def unprepared(
        self, refs: Sequence[ClaimRef], errors: Mapping[ClaimUID, str], seconds: float
    ) -> None:
        self._ended()
        if self._off:
            return
        with self._lock:
            for ref in refs:
                if not errors.get(ref.uid):
                    self._due.pop(ref.uid, None)  # never written, if it was not yet
                    self._gone.add(ref.uid)  # a later prepare writes again

    def submit(self, ref: ClaimRef) -> None:
        if self._off:
            return
        with self._lock:
            if ref.uid in self._due:
                return  # repeats within the settle time: one write
            if len(self._due) >= self._size:
                full = True
            else:
                full = False
                first = not self._due
                self._due[ref.uid] = (time.monotonic() + self._settle_s, ref)
        if full:
            log.warning("device status of %s not written: %d writes pending", ref, self._size)
            self._observe(DROPPED)
        elif first:  # the writer sleeps without a deadline only when nothing was due
            self._wake.set()

    # --- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        retries: list[_Due] = []  # soonest first; this thread's only
        while True:
            now = time.monotonic()
            with self._lock:
                if self._stopping:
                    return
                # While calls are in flight a due write waits for them, up to yield_s.
                late = self._yield_s if self._in_flight else 0.0
                ready = [ref for at, ref in self._due.values() if at + late <= now]
                for ref in ready:
                    del self._due[ref.uid]
                gone, self._gone = self._gone, set()
                soonest = min((at + late for at, _ in self._due.values()), default=None)
                # The last call to end wakes the writer only when it waits for that.
                self._waits_for_idle = late > 0 and bool(self._due)
                self._wake.clear()  # under the lock: a submit after this sets it again
            if gone:
                for uid in gone:
                    self._applied.pop(uid, None)
                retries = [r for r in retries if r.ref.uid not in gone]
                heapq.heapify(retries)
            while retries and retries[0].at <= now:
                ready.append(heapq.heappop(retries).ref)
            for ref in ready:
                if self._off:
                    break
                again = self._attempt(_Due(now, next(self._seq), ref))
                if again is not None:
                    if len(retries) >= self._size:
                        log.warning("device status of %s not written: too many retries", ref)
                        self._observe(DROPPED)
                    else:
                        again.seq = next(self._seq)
                        heapq.heappush(retries, again)
            if ready:
                continue  # time has passed: look again before sleeping
            deadlines = [t for t in (soonest, retries[0].at if retries else None) if t is not None]
            wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            self._wake.wait(wait)

    def _attempt(self, item: _Due) -> _Due | None:
        """One write; the item to retry, or None when done (written, unchanged or dropped)."""
        ref = item.ref
        try:
            result = self._write(ref)
        except Dropped as why:
            log.warning("device status of %s (%s) not written: %s", ref, ref.uid, why)
            self._observe(DROPPED)
            return None
        except errors.ApiError as err:
            if permanent(err):
                # From 1.36 a missing permission for the entries is an invalid field (422).
                refused = err.status == 403 or "permission" in err.message
                hint = f" (needs {self._hint})" if self._hint and refused else ""
                log.warning("device status of %s (%s) not written: %s%s", ref, ref.uid, err, hint)
                self._observe(DROPPED)
                return None
            attempt = item.attempt + 1
            delay = backoff(attempt, first_s=self._first_backoff_s)
            log.info("device status of %s: %s; again in %.1f s", ref, err, delay)
            self._observe(RETRY)
            return _Due(time.monotonic() + delay, 0, ref, attempt)
        except Exception:  # a bug: one line with the traceback, the thread keeps serving
            log.exception("device status of %s (%s) not written", ref, ref.uid)
            self._observe(DROPPED)
            return None
        self._observe(result)
        return None

    def _write(self, ref: ClaimRef) -> str:
        ours = self._entries_of(ref.uid)
        if ours is None:
            self._applied.pop(ref.uid, None)
            raise Dropped("unprepared meanwhile")
        if same_entries(self._applied.get(ref.uid) or [], ours):
            return UNCHANGED
        path = claim_path(ref.namespace, ref.name)
        try:
            stored = cast(
                ResourceClaim,
                self._client.request(
                    "PATCH",
                    f"{path}/status",
                    query={"fieldManager": self._field_manager, "force": "true"},
                    body=apply_body(ref, ours),
                    content_type=APPLY_PATCH,
                ),
            )
        except errors.ApiError as err:
            if err.status == 422 and "metadata.uid" in err.message:
                raise Dropped(f"the claim {ref} is now another one ({err.message})") from err
            raise
        kept = {key(e) for e in (stored.get("status") or {}).get("devices") or []}
        if not {key(e) for e in ours} <= kept:
            self._off = True
            log.warning(
                "ResourceClaim device status not available: the API server dropped "
                "status.devices of %s (feature gate DRAResourceClaimDeviceStatus is off there); "
                "claims get no device status from this driver",
                ref,
            )
            return UNSUPPORTED
        self._applied[ref.uid] = ours
        return WRITTEN
