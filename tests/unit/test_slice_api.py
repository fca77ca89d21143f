"""The node's ResourceSlices over the API: listed from the API server's watch cache, and
published right even when that list is a moment old (a fake API server with a lagging cache)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from test_publisher import DRIVER, NODE, render_devices

from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient
from dra_gpu.kubeletplugin import publisher, slice_api


class LaggingApi(KubeClient):
    """Slices as etcd has them (``stored``) and as the watch cache has them (``cache``, brought
    up to date by ``catch_up``); creates, updates and deletes checked as the API server does."""

    def __init__(self) -> None:  # not connected to anything
        self.stored: dict[str, dict[str, Any]] = {}
        self.cache: dict[str, dict[str, Any]] = {}
        self.lists: list[dict[str, str]] = []
        self._version = 0

    def catch_up(self) -> None:
        self.cache = copy.deepcopy(self.stored)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if path == f"/api/v1/nodes/{NODE}":
            return {"metadata": {"name": NODE, "uid": "node-uid"}}
        name = path.rsplit("/", 1)[1] if path != slice_api.SLICES_PATH else ""
        if method == "GET":
            self.lists.append(dict(query or {}))
            cached = (query or {}).get("resourceVersion") == "0"
            return {"items": copy.deepcopy(list((self.cache if cached else self.stored).values()))}
        if method == "DELETE":
            self.stored.pop(name, None)
            return {}
        assert body is not None
        obj = copy.deepcopy(dict(body))
        name = obj["metadata"]["name"]
        if method == "POST" and name in self.stored:
            raise errors.AlreadyExists("exists", status=409, request=path, reason="AlreadyExists")
        if method == "PUT" and (
            self.stored[name]["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]
        ):
            raise errors.Conflict("modified", status=409, request=path)
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.stored[name] = obj
        return copy.deepcopy(obj)


def test_the_nodes_slices_are_listed_from_the_watch_cache() -> None:
    api = LaggingApi()
    slice_api.SliceApi(api, node=NODE, driver=DRIVER).list_slices()
    assert api.lists == [
        {"fieldSelector": f"spec.nodeName={NODE},spec.driver={DRIVER}", "resourceVersion": "0"}
    ]


def test_a_list_a_moment_old_writes_nothing_wrong() -> None:
    api = LaggingApi()
    pub = publisher.Publisher(
        store=slice_api.SliceApi(api, node=NODE, driver=DRIVER),
        node=NODE,
        driver=DRIVER,
        render=render_devices("gpu-0", "gpu-1", per_slice=1),
        alive=lambda other: True,
    )
    pub.reconcile_once()  # publishes the two slices
    published = copy.deepcopy(api.stored)
    assert sorted(published) and len(published) == 2
    # The cache has not seen them yet: the next pass plans them again, and the API server
    # refuses the create of a slice that exists; the publisher looks again (its run loop).
    with pytest.raises(errors.AlreadyExists):
        pub.reconcile_once()
    assert api.stored == published
    api.catch_up()
    assert pub.reconcile_once().is_empty
    assert api.stored == published
