"""Keeps this node's GPU labels (``devices.node_labels``) on its Node, and takes them off.

:class:`NodeLabeler` is told the published devices at start and after every re-discovery
(``current_devices.Inventory`` calls :meth:`NodeLabeler.set_devices` on the re-discovery
thread, so a driver reload, a lost GPU or a MIG change reaches the labels with the slices);
it computes the labels there (pure) and wakes its own thread, ``node-labels``, which reads
the Node and sends a JSON merge patch of the keys that differ. No API call runs on a caller's
thread. A failed patch is retried every :data:`RETRY_S`; every :data:`RESYNC_S` the labels are
compared again (someone removed one by hand). When the node has no GPUs left, the labels this
driver writes are removed. The plugin's stop leaves them (a restart or an upgrade must not
make them flap); ``dra-gpu remove-node-labels`` (the chart's pre-delete hook) removes them.

The API server admits the patch only for the plugin's own Node and only keys under
``nvidia.com/`` (the chart's ``own-node-labels`` ValidatingAdmissionPolicy).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

from dra_gpu.devices import node_labels
from dra_gpu.devices.model import Device
from dra_gpu.kube import errors
from dra_gpu.kube.client import MERGE_PATCH, KubeClient
from dra_gpu.kube.objects import node_path

log = logging.getLogger(__name__)

RETRY_S = 30.0
RESYNC_S = 600.0
STOP_POLL_S = 1.0


def apply(client: KubeClient, node: str, wanted: Mapping[str, str]) -> dict[str, str | None]:
    """Make ``node``'s labels of this driver ``wanted`` (one GET, at most one PATCH); returns
    the patch sent (empty: nothing to change). An ``errors.ApiError`` when either call fails."""
    current = _labels(client.request("GET", node_path(node)))
    change = node_labels.patch(current, wanted)
    if change:
        body: dict[str, Any] = {"metadata": {"labels": change}}
        client.request("PATCH", node_path(node), body=body, content_type=MERGE_PATCH)
    return change


def _labels(node: Mapping[str, Any]) -> dict[str, str]:
    labels = cast(Mapping[str, Any], node.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in cast(Mapping[str, Any], labels).items()}


class NodeLabeler:
    """The labels wanted now, and the thread that puts them on the Node."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self._client = client
        self._node = node
        self._lock = threading.Lock()
        self._wanted: dict[str, str] = {}
        self._wake = threading.Event()

    def set_devices(self, devices: Sequence[Device]) -> None:
        """The published devices now (start-up, re-discovery's thread): no I/O here."""
        wanted = node_labels.node_labels(devices)
        with self._lock:
            if wanted == self._wanted:
                return
            self._wanted = wanted
        self._wake.set()

    def start(self, stop: threading.Event) -> None:
        """Apply the labels now, then on every change, retry and resync, until ``stop``."""
        threading.Thread(target=self._run, args=(stop,), name="node-labels", daemon=True).start()

    def _run(self, stop: threading.Event) -> None:
        failing = False
        while not stop.is_set():
            self._wake.clear()
            with self._lock:
                wanted = dict(self._wanted)
            try:
                change = apply(self._client, self._node, wanted)
            except errors.ApiError as err:
                if not failing:
                    log.warning(
                        "cannot label node %s (retried every %.0fs): %s", self._node, RETRY_S, err
                    )
                failing = True
                self._pause(stop, RETRY_S)
                continue
            if failing or change:
                log.info("node %s labels: %s", self._node, _said(change))
            failing = False
            self._pause(stop, RESYNC_S)

    def _pause(self, stop: threading.Event, seconds: float) -> None:
        """Until a change wakes the thread, ``stop`` is set, or ``seconds`` have passed (the
        stop event is looked at every second)."""
        waited = 0.0
        while waited < seconds and not stop.is_set():
            if self._wake.wait(min(STOP_POLL_S, seconds - waited)):
                return
            waited += STOP_POLL_S


def _said(change: Mapping[str, str | None]) -> str:
    if not change:
        return "as wanted"
    return ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(change.items()))


def remove(client: KubeClient, node: str) -> dict[str, str | None]:
    """Take this driver's labels off ``node`` (the patch sent; empty when there were none)."""
    return apply(client, node, {})


def labelled_nodes(client: KubeClient) -> list[str]:
    """The nodes that carry this driver's labels (its marker label)."""
    listed = client.request("GET", "/api/v1/nodes", query={"labelSelector": node_labels.MARKER})
    items = cast(list[Mapping[str, Any]], listed.get("items") or [])
    return sorted(str(cast(Mapping[str, Any], i.get("metadata") or {}).get("name")) for i in items)
