"""Kubernetes Events where a user looks: on the pod and the claim when prepare fails, on the
Node for what the plugin finds wrong with the node.

``kubectl describe pod`` shows the kubelet's generic ``FailedPrepareDynamicResources``; the Event
posted by :class:`FailureEvents` (a kit step after each call) says, on the pod and on its
ResourceClaim, what the driver found wrong (the message names the config field or the device).
Thin I/O around a pure builder (:func:`warning_event`).

Posting is best effort and off every caller's path: :class:`EventPoster`'s one thread posts
(and reads the claim a failure Event names), its queue is bounded (a full one drops, logged),
failures are logged. So a caller that holds a lock while it reports (the checkpoint's salvage
under its file lock) makes no API call under it. The kubelet retries a failing prepare every few
seconds; the same failure of the same claim is posted again only after ``REPEAT_S``.
"""

from __future__ import annotations

import datetime
import functools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.objects import claim_path
from dra_gpu.kubeletplugin.driver import ClaimRef, PrepareResult
from dra_gpu.kubeletplugin.ids import ClaimUID

log = logging.getLogger(__name__)

REASON_PREPARE_FAILED: Final = "PrepareFailed"
REPEAT_S: Final = 60.0
MAX_REMEMBERED: Final = 1024
QUEUE_SIZE: Final = 256


def component(driver: str) -> str:
    """The source the plugin's Events name (``kubectl get events`` shows it)."""
    return f"{driver}-kubelet-plugin"


def warning_event(
    involved: Mapping[str, str],
    *,
    namespace: str,
    reason: str,
    message: str,
    host: str,
    source: str,
    event_type: str = "Warning",
) -> dict[str, Any]:
    """A Warning Event about ``involved`` (kind, name, uid, and apiVersion/namespace if any);
    ``event_type`` "Normal" for one that reports things back to normal."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": source, "host": host},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def post(client: KubeClient, event: Mapping[str, Any]) -> None:
    """Create ``event``; a failure is logged, never raised."""
    namespace = event["metadata"]["namespace"]
    try:
        client.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=event)
    except errors.ApiError as exc:
        log.error("could not post event %s: %s", event["reason"], exc)


class EventPoster:
    """One thread that posts Events; :meth:`submit` queues a posting and never blocks."""

    def __init__(self, client: KubeClient, *, queue_size: int = QUEUE_SIZE) -> None:
        self.client = client
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        try:
            self._queue.put_nowait(work)
        except queue.Full:
            log.warning("an Event was not posted: %d postings pending", self._queue.maxsize)

    def post(self, event: Mapping[str, Any]) -> None:
        """Post ``event`` from the poster's thread."""
        self.submit(lambda: post(self.client, event))

    def close(self, timeout_s: float = 5.0) -> None:
        """Post what is queued (within ``timeout_s``), then stop."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            log.warning("Events queue full at stop; pending Events dropped")
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while (work := self._queue.get()) is not None:
            try:
                work()
            except Exception:  # a bug: one line with the traceback, the thread keeps posting
                log.exception("an Event was not posted")


def involved_objects(claim: Mapping[str, Any]) -> list[dict[str, str]]:
    """The claim and the pods it is reserved for, as Event ``involvedObject``s."""
    meta = claim.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    out = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": namespace,
            "name": str(meta.get("name", "")),
            "uid": str(meta.get("uid", "")),
        }
    ]
    for user in (claim.get("status") or {}).get("reservedFor") or ():
        if user.get("resource") == "pods" and not user.get("apiGroup"):
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": namespace,
                    "name": str(user.get("name", "")),
                    "uid": str(user.get("uid", "")),
                }
            )
    return out


class FailureEvents:
    """A kit step: an Event on the claim and its pods for each claim whose prepare failed."""

    def __init__(self, poster: EventPoster, *, node_name: str, source: str) -> None:
        self._poster, self._node, self._source = poster, node_name, source
        self._posted: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def started(self, operation: str) -> None:
        return None

    def prepared(
        self, refs: Sequence[ClaimRef], results: Mapping[ClaimUID, PrepareResult], seconds: float
    ) -> None:
        for ref in refs:
            result = results.get(ref.uid)
            if result is not None and result.error and self._first_time(ref.uid, result.error):
                self._poster.submit(functools.partial(self._post_failure, ref, result.error))

    def unprepared(
        self, refs: Sequence[ClaimRef], errors: Mapping[ClaimUID, str], seconds: float
    ) -> None:
        return None

    def _first_time(self, uid: str, error: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if len(self._posted) > MAX_REMEMBERED:
                self._posted.clear()
            last = self._posted.get((uid, error))
            if last is not None and now - last < REPEAT_S:
                return False
            self._posted[(uid, error)] = now
            return True

    def _post_failure(self, ref: ClaimRef, error: str) -> None:
        client = self._poster.client
        path = claim_path(ref.namespace, ref.name)
        try:
            claim = client.request("GET", path)
        except errors.ApiError:
            claim = None
        if claim is None or (claim.get("metadata") or {}).get("uid") != ref.uid:
            # Gone, or another claim by now: name the one the kubelet asked about.
            claim = {"metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}}
        message = f"prepare on node {self._node} failed: {error}"
        for involved in involved_objects(claim):
            post(
                client,
                warning_event(
                    involved,
                    namespace=ref.namespace,
                    reason=REASON_PREPARE_FAILED,
                    message=message,
                    host=self._node,
                    source=self._source,
                ),
            )
