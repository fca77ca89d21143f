"""An in-memory ``publisher.SliceStore`` that behaves like the API server where it matters."""

from __future__ import annotations

import copy
import itertools
import queue
import threading
from collections.abc import Iterator
from typing import Any, cast

from dra_gpu.kube import errors
from dra_gpu.kube.objects import ResourceSlice

JSON = dict[str, Any]


class FakeSliceStore:
    """``hold_echoes``: the watch events of creates and updates wait for ``release_echoes()``,
    as when the API server answers a write before its watchers hear of it."""

    def __init__(self, *, node_uid: str = "node-uid-1", hold_echoes: bool = False) -> None:
        self.slices: dict[str, JSON] = {}
        self.down = False  # True: every call fails as if the API server were stopped
        self.node_missing = False
        self.node_lookups = 0
        self.lists = 0
        self.writes = 0
        self._node_uid = node_uid
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self._lock = threading.Lock()
        self._watchers: list[queue.SimpleQueue[str]] = []
        self._hold_echoes = hold_echoes
        self._held: list[str] = []
        self.consumed = 0  # watch events taken by the watcher (it asked for the next one)

    def _check(self) -> None:
        if self.down:
            raise errors.ApiUnavailable("connection refused")

    def _notify(self, resource_version: str) -> None:
        for q in self._watchers:
            q.put(resource_version)

    def _echo(self, resource_version: str) -> None:
        if self._hold_echoes:
            self._held.append(resource_version)
        else:
            self._notify(resource_version)

    def release_echoes(self) -> int:
        """Deliver the held watch events of writes; returns how many."""
        held, self._held = self._held, []
        for version in held:
            self._notify(version)
        return len(held)

    @property
    def watching(self) -> bool:
        return bool(self._watchers)

    def node_uid(self) -> str:
        self._check()
        self.node_lookups += 1
        if self.node_missing:
            raise errors.NotFound("nodes not found", status=404)
        return self._node_uid

    def list_slices(self) -> list[ResourceSlice]:
        self._check()
        with self._lock:
            self.lists += 1
            # The fake server's stored bodies, typed as what the API server would list.
            return cast("list[ResourceSlice]", copy.deepcopy(list(self.slices.values())))

    def create_slice(self, body: JSON) -> str:
        self._check()
        with self._lock:
            name = body["metadata"]["name"]
            if name in self.slices:
                raise errors.Conflict("already exists", status=409)
            stored = copy.deepcopy(body)
            stored["metadata"].update(
                uid=f"uid-{next(self._uid)}", resourceVersion=str(next(self._rv))
            )
            self.slices[name] = stored
            self.writes += 1
            version = str(stored["metadata"]["resourceVersion"])
        self._echo(version)
        return version

    def update_slice(self, body: JSON) -> str:
        self._check()
        with self._lock:
            name = body["metadata"]["name"]
            have = self.slices.get(name)
            if have is None:
                raise errors.NotFound("not found", status=404)
            if have["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
                raise errors.Conflict("stale resourceVersion", status=409)
            stored = copy.deepcopy(body)
            stored["metadata"].update(
                uid=have["metadata"]["uid"], resourceVersion=str(next(self._rv))
            )
            self.slices[name] = stored
            self.writes += 1
            version = str(stored["metadata"]["resourceVersion"])
        self._echo(version)
        return version

    def delete_slice(self, name: str, *, uid: str) -> None:
        self._check()
        with self._lock:
            have = self.slices.get(name)
            if have is None:
                raise errors.NotFound("not found", status=404)
            if have["metadata"]["uid"] != uid:
                raise errors.Conflict("precondition failed", status=409)
            del self.slices[name]
            self.writes += 1
        self._notify(str(next(self._rv)))

    def delete_by_someone_else(self, name: str) -> None:
        with self._lock:
            del self.slices[name]
        self._notify(str(next(self._rv)))

    def watch_slices(self, stop: threading.Event) -> Iterator[str]:
        self._check()
        events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._watchers.append(events)
        try:
            while not stop.is_set():
                if self.down:
                    return  # the stream ends when the API server goes away
                try:
                    event = events.get(timeout=0.05)
                except queue.Empty:
                    continue
                yield event
                self.consumed += 1
        finally:
            self._watchers.remove(events)
