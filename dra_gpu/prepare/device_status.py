"""ResourceClaim device status (KEP-4817): the devices this driver prepared, in the claim's
``status.devices``, written off the prepare's path.

What an entry says: ``driver``, ``pool``, ``device`` (and ``shareID`` for a shared allocation),
a ``Ready`` condition, and ``data`` with what tools such as dcgm-exporter and users look for:
``type``, ``uuid``, ``productName``, ``driverVersion``, ``pciBusID``, and for a MIG device its
``profile`` and ``parentUUID``. A MIG device created at prepare (dynamic MIG) is published
without a ``uuid`` in the slices, since it does not exist until then: its entry here carries
the UUID it got.

How it is written: after a successful prepare, :class:`StatusReporting` hands the claim to
:class:`DeviceStatusWriter`, whose one thread does the API round trips, so the kubelet's answer
never waits for them. The queue is bounded (a full one drops the claim, logged); a write that
fails for a reason that may pass (no answer, 429, 5xx, a conflicting write) is tried again
after 0.5 s, doubling up to 30 s; one that cannot succeed (the claim gone or replaced by
another of the same name, Forbidden, Invalid) is dropped with one log line.

The write is a server-side apply of the ``status`` subresource with this driver's own field
manager: it carries only our entries, which the server merges into ``status.devices`` by their
key (driver, pool, device, shareID), so other drivers' entries and every other field stay as
they are, with no read before it and no conflict with a concurrent writer. It names the
claim's UID, so a claim replaced by another of the same name is refused (the UID cannot
change), never written. A repeat of what this writer last applied for the claim (the kubelet's
repeated prepare) sends nothing.

An API server whose ``DRAResourceClaimDeviceStatus`` gate is off drops the field silently: the
first write that comes back without our entries switches the writer off, with one log line.
"""

from __future__ import annotations

import datetime
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast
from urllib.parse import quote

from dra_gpu.devices import model
from dra_gpu.devices.model import Device
from dra_gpu.kube import errors
from dra_gpu.kube.client import APPLY_PATCH
from dra_gpu.kube.objects import AllocatedDeviceStatus, ResourceClaim
from dra_gpu.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointError,
    ClaimRecord,
    DeviceRecord,
)

log = logging.getLogger(__name__)

CONDITION_READY: Final = "Ready"
REASON_PREPARED: Final = "Prepared"
FIRST_BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 30.0
QUEUE_SIZE: Final = 1024
CLAIMS_PATH: Final = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
API_VERSION: Final = "resource.k8s.io/v1"

# Results, the label values of the metric (bounded).
WRITTEN: Final = "written"
UNCHANGED: Final = "unchanged"
RETRY: Final = "retry"
DROPPED: Final = "dropped"
UNSUPPORTED: Final = "unsupported"
RESULTS: Final = (WRITTEN, UNCHANGED, RETRY, DROPPED, UNSUPPORTED)


# --- pure --------------------------------------------------------------------------------------


def device_data(record: DeviceRecord, published: Device | None) -> dict[str, str]:
    """``data`` of one entry: the prepared device's facts (the record: the UUID it got) and its
    GPU's (the published device; None when re-discovery no longer lists it)."""
    data: dict[str, str] = {}
    if record.type is not None:
        data["type"] = record.type
    if record.uuid is not None:
        data["uuid"] = record.uuid
    if record.product_name is not None:
        data["productName"] = record.product_name
    if published is not None:
        driver = published.attributes.get(model.ATTR_DRIVER_VERSION)
        if driver is not None:
            data["driverVersion"] = str(driver)
        data["pciBusID"] = published.gpu.pci_bus_id
        if published.type == "mig":
            data["parentUUID"] = published.gpu.uuid
    if record.mig_profile is not None:
        data["profile"] = record.mig_profile
    return data


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID", "")),
    )


def entries(
    *, driver: str, record: ClaimRecord, inventory: Mapping[str, Device], now: str
) -> list[AllocatedDeviceStatus]:
    """This driver's entries for a prepared claim; ``now``: the conditions' transition time."""
    out: list[AllocatedDeviceStatus] = []
    for d in record.devices:
        entry: AllocatedDeviceStatus = {
            "driver": driver,
            "pool": d.pool,
            "device": d.device,
            "conditions": [
                {
                    "type": CONDITION_READY,
                    "status": "True",
                    "reason": REASON_PREPARED,
                    "message": "prepared for the claim's containers",
                    "lastTransitionTime": now,
                }
            ],
            "data": device_data(d, inventory.get(d.device)),
        }
        if d.share_id is not None:
            entry["shareID"] = d.share_id
        out.append(entry)
    return out


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


def _timestamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- I/O ---------------------------------------------------------------------------------------


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


class DeviceStatusWriter:
    """One thread writing ``status.devices`` of prepared claims; :meth:`submit` never blocks.

    ``record_of(uid)``: the claim's checkpoint record (None once unprepared, which cancels the
    write); ``inventory()``: the published devices by name; ``observe(result)``: one call per
    attempt's result (:data:`RESULTS`), for the metric; ``forbidden_hint``: the permission the
    server checks (it depends on the version), named when it refuses.
    """

    def __init__(
        self,
        client: Client,
        *,
        driver: str,
        record_of: Callable[[ClaimUID], ClaimRecord | None],
        inventory: Callable[[], Mapping[str, Device]],
        observe: Callable[[str], None] | None = None,
        forbidden_hint: str = "",
        first_backoff_s: float = FIRST_BACKOFF_S,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._client, self._driver = client, driver
        self._record_of, self._inventory = record_of, inventory
        self._observe = observe or (lambda _result: None)
        self._hint = forbidden_hint
        # Owns our entries in the server's managed fields; one per driver, since a claim's
        # devices of one driver are prepared by the plugin of one node.
        self._field_manager = f"{driver}/kubelet-plugin"
        self._first_backoff_s = first_backoff_s
        self._size = queue_size
        self._submitted: queue.Queue[ClaimRef | None] = queue.Queue(maxsize=queue_size)
        self._seq = itertools.count()
        # Set by the worker thread only (read by submit: a stale read costs one queued item).
        self._off = False
        # Claim UID -> the entries last applied; the worker thread's only.
        self._applied: dict[ClaimUID, list[AllocatedDeviceStatus]] = {}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="device-status", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; pending writes are dropped (the next prepare answer submits again)."""
        if self._thread is None:
            return
        try:
            self._submitted.put(None, timeout=timeout_s)
        except queue.Full:
            log.warning("device status: queue full at stop; pending writes dropped")
        self._thread.join(timeout=timeout_s)
        self._thread = None

    def submit(self, ref: ClaimRef) -> None:
        if self._off:
            return
        try:
            self._submitted.put_nowait(ref)
        except queue.Full:
            log.warning("device status of %s not written: %d writes pending", ref, self._size)
            self._observe(DROPPED)

    # --- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        due: list[_Due] = []  # retries, soonest first; this thread's only
        while True:
            wait = max(0.0, due[0].at - time.monotonic()) if due else None
            try:
                ref = self._submitted.get(timeout=wait)
            except queue.Empty:
                ref = None
                item = heapq.heappop(due)
            else:
                if ref is None:
                    return
                item = _Due(time.monotonic(), next(self._seq), ref)
            if self._off:
                continue
            again = self._attempt(item)
            if again is not None:
                if len(due) >= self._size:
                    log.warning("device status of %s not written: too many retries", item.ref)
                    self._observe(DROPPED)
                else:
                    heapq.heappush(due, again)

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
            return _Due(time.monotonic() + delay, next(self._seq), ref, attempt)
        except Exception:  # a bug: one line with the traceback, the thread keeps serving
            log.exception("device status of %s (%s) not written", ref, ref.uid)
            self._observe(DROPPED)
            return None
        self._observe(result)
        return None

    def _write(self, ref: ClaimRef) -> str:
        record = self._record_of(ref.uid)
        if record is None:
            self._applied.pop(ref.uid, None)
            raise Dropped("unprepared meanwhile")
        ours = entries(
            driver=self._driver, record=record, inventory=self._inventory(), now=_timestamp()
        )
        if same_entries(self._applied.get(ref.uid) or [], ours):
            return UNCHANGED
        path = CLAIMS_PATH.format(namespace=quote(ref.namespace), name=quote(ref.name))
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
        self._forget_unprepared()
        kept = {_key(e) for e in (stored.get("status") or {}).get("devices") or []}
        if not {_key(e) for e in ours} <= kept:
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

    def _forget_unprepared(self) -> None:
        for uid in [u for u in self._applied if self._record_of(u) is None]:
            del self._applied[uid]


class _Peekable(Protocol):
    def peek(self) -> Checkpoint: ...


def completed_records(store: _Peekable) -> Callable[[ClaimUID], ClaimRecord | None]:
    """``record_of`` over the checkpoint's copy in memory: a claim's record while it is
    prepared; None once unprepared (or when the checkpoint cannot be read: nothing to say)."""

    def record_of(uid: ClaimUID) -> ClaimRecord | None:
        try:
            record = store.peek().claims.get(uid)
        except (CheckpointError, OSError):
            return None
        return record if record is not None and record.state == PREPARE_COMPLETED else None

    return record_of


class Handler(Protocol):
    def prepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, PrepareResult]: ...

    def unprepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, str]: ...


class Submits(Protocol):
    def submit(self, ref: ClaimRef) -> None: ...


class StatusReporting:
    """The prepare handler, plus the device status of each claim it prepared, written later."""

    def __init__(self, handler: Handler, writer: Submits) -> None:
        self._handler, self._writer = handler, writer

    def prepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, PrepareResult]:
        results = self._handler.prepare(refs)
        for ref in refs:
            result = results.get(ref.uid)
            if result is not None and not result.error and result.devices:
                self._writer.submit(ref)
        return results

    def unprepare(self, refs: Sequence[ClaimRef]) -> Mapping[ClaimUID, str]:
        return self._handler.unprepare(refs)
