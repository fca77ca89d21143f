"""Kubernetes Events where a user looks: on the pod and the claim when prepare fails.

``kubectl describe pod`` shows the kubelet's generic ``FailedPrepareDynamicResources``; the Event
posted here says, on the pod and on its ResourceClaim, what this plugin found wrong (the message
names the config field or the device). Thin I/O around a pure builder (:func:`warning_event`,
shared with the Node events of :mod:`claims`).

Posting is best effort and off the kubelet's call path: one background thread posts, failures
are logged. The kubelet retries a failing prepare every few seconds; the same failure of the
same claim is posted again only after ``REPEAT_S``.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import quote

from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient

log = logging.getLogger(__name__)

COMPONENT = "gpu.nvidia.com-kubelet-plugin"  # the source of our events
REASON_PREPARE_FAILED = "PrepareFailed"
REPEAT_S = 60.0
MAX_REMEMBERED = 1024


def warning_event(
    involved: Mapping[str, str], *, namespace: str, reason: str, message: str, host: str
) -> dict[str, Any]:
    """A Warning Event about ``involved`` (kind, name, uid, and apiVersion/namespace if any)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message[:1024],
        "type": "Warning",
        "source": {"component": COMPONENT, "host": host},
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


class Claimed(Protocol):
    @property
    def uid(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...


class Handler(Protocol):
    def prepare(self, refs: Sequence[Any]) -> Mapping[Any, Any]: ...

    def unprepare(self, refs: Sequence[Any]) -> Mapping[Any, str]: ...


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
    """The prepare handler, plus an Event on the claim and its pods for each failed claim."""

    def __init__(self, handler: Handler, client: KubeClient, *, node_name: str) -> None:
        self._handler, self._client, self._node = handler, client, node_name
        self._posted: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="events")

    def prepare(self, refs: Sequence[Any]) -> Mapping[Any, Any]:
        results = self._handler.prepare(refs)
        for ref in refs:
            error = getattr(results.get(ref.uid), "error", "")
            if error and self._first_time(ref.uid, error):
                self._pool.submit(self._post_failure, ref, error)
        return results

    def unprepare(self, refs: Sequence[Any]) -> Mapping[Any, str]:
        return self._handler.unprepare(refs)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

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

    def _post_failure(self, ref: Claimed, error: str) -> None:
        path = (
            f"/apis/resource.k8s.io/v1/namespaces/{quote(ref.namespace)}/resourceclaims/"
            f"{quote(ref.name)}"
        )
        try:
            claim = self._client.request("GET", path)
        except errors.ApiError:
            claim = None
        if claim is None or (claim.get("metadata") or {}).get("uid") != ref.uid:
            # Gone, or another claim by now: name the one the kubelet asked about.
            claim = {"metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}}
        message = f"prepare on node {self._node} failed: {error}"
        for involved in involved_objects(claim):
            post(
                self._client,
                warning_event(
                    involved,
                    namespace=ref.namespace,
                    reason=REASON_PREPARE_FAILED,
                    message=message,
                    host=self._node,
                ),
            )
