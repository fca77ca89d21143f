"""``publisher.SliceStore`` over the API server: this node's ResourceSlices of one driver.

Thin I/O over ``kube.client.KubeClient``; list and watch use the field selector
``spec.nodeName=<node>,spec.driver=<driver>``, so the plugin never sees other nodes' slices.
Failures are ``kube.errors`` types, which the publisher sorts into retry and look-again.

The list is served from the API server's watch cache (``resourceVersion=0``, as the kubelet's
own slice controller reads through an informer). A consistent list (no ``resourceVersion``)
makes the server wait for its cache to reach etcd's revision and, when it has not within 3 s,
list from etcd, which cannot apply the field selector: every node's slices are read for one
node's. At 1,000 nodes starting together that took etcd to 16 GiB in two minutes
(docs/development/scale.md). A list from the cache may be a moment old; what is written from it
is safe all the same: an update carries the resourceVersion it read (409 if it is stale), a
create of a slice that exists is refused (409), a delete carries the UID, and the publisher
looks again after any of them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import quote

from dra_gpu.kube.client import KubeClient, list_query
from dra_gpu.kube.objects import Node, ResourceSlice

JSON = dict[str, Any]
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class SliceApi:
    """``publisher.SliceStore`` for one node and driver."""

    def __init__(self, client: KubeClient, *, node: str, driver: str) -> None:
        self._client = client
        self._node = node
        self._selector = {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}

    def node_uid(self) -> str:
        # The API boundary: the server's JSON is taken to be a Node, unchecked.
        node = cast(Node, self._client.request("GET", f"/api/v1/nodes/{quote(self._node)}"))
        return str(node["metadata"]["uid"])

    def list_slices(self) -> list[ResourceSlice]:
        # From the watch cache (see above).
        listed = self._client.request("GET", SLICES_PATH, query=list_query(self._selector))
        # The API boundary: the listed items are taken to be ResourceSlices, unchecked.
        return cast("list[ResourceSlice]", list(listed.get("items") or []))

    def create_slice(self, body: JSON) -> str:
        return _version(self._client.request("POST", SLICES_PATH, body=body))

    def update_slice(self, body: JSON) -> str:
        name = body["metadata"]["name"]
        return _version(self._client.request("PUT", f"{SLICES_PATH}/{quote(name)}", body=body))

    def delete_slice(self, name: str, *, uid: str) -> None:
        # The UID precondition keeps us from deleting a slice that a peer just recreated.
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        self._client.request("DELETE", f"{SLICES_PATH}/{quote(name)}", body=options)

    def watch_slices(self, stop: threading.Event) -> Iterator[str]:
        for event in self._client.watch(SLICES_PATH, query=self._selector, stop=stop):
            yield _version(event.get("object") or {})


def _version(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
