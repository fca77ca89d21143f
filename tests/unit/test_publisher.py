"""The ResourceSlice publisher against an in-memory API (threads, no processes).

Cases: first publish (owner reference, one pool, generation 1); a second pass writes nothing;
a deleted slice comes back through the watch; a new inventory raises the generation and drops
surplus slices; the watch events of its own writes do not make it list again (a foreign event
does); an API outage is survived and the pool repaired afterwards; a missing Node delays
publishing without ending it; backoff grows and is capped; a fleet of publishers failed at
once spreads its retries.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_slice_store import FakeSliceStore

from dra_gpu.kubeletplugin import publisher, slice_plan
from e2e import waiting

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
WAIT_S = 20.0  # only bounds a broken test; passing runs take milliseconds
wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S, every=0.01)


def render_devices(*names: str, per_slice: int = 128) -> publisher.Renderer:
    def render(node_uid: str) -> list[dict[str, Any]]:
        chunks = [names[i : i + per_slice] for i in range(0, len(names), per_slice)] or [()]
        return [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
                    ]
                },
                "spec": {
                    "driver": DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 0, "resourceSliceCount": len(chunks)},
                    "devices": [{"name": n} for n in chunk],
                },
            }
            for chunk in chunks
        ]

    return render


def make(
    store: FakeSliceStore,
    render: publisher.Renderer,
    instance: slice_plan.Instance | None = None,
) -> publisher.Publisher:
    return publisher.Publisher(
        store=store,
        node=NODE,
        driver=DRIVER,
        render=render,
        resync_s=3600,
        max_backoff_s=0.05,
        instance=instance,
        alive=lambda other: True,
    )


def pool(store: FakeSliceStore) -> list[tuple[int, list[str]]]:
    return sorted(
        (s["spec"]["pool"]["generation"], [d["name"] for d in s["spec"]["devices"]])
        for s in store.slices.values()
    )


@pytest.fixture
def running() -> Iterator[Callable[[FakeSliceStore, publisher.Renderer], publisher.Publisher]]:
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(
        store: FakeSliceStore,
        render: publisher.Renderer,
        instance: slice_plan.Instance | None = None,
    ) -> publisher.Publisher:
        pub = make(store, render, instance)
        threads.extend(pub.start(stop))
        return pub

    yield start
    stop.set()
    for t in threads:
        t.join(WAIT_S)


def test_first_publish_owns_slices_by_the_node() -> None:
    store = FakeSliceStore(node_uid="uid-n")
    make(store, render_devices("gpu-0", "gpu-1")).reconcile_once()
    (only,) = store.slices.values()
    assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert only["metadata"]["ownerReferences"][0]["uid"] == "uid-n"


def test_second_pass_writes_nothing() -> None:
    store = FakeSliceStore()
    pub = make(store, render_devices("gpu-0"))
    pub.reconcile_once()
    writes = store.writes
    assert pub.reconcile_once().is_empty
    assert store.writes == writes


def test_deleted_slice_comes_back(running: Any) -> None:
    store = FakeSliceStore()
    pub = running(store, render_devices("gpu-0", "gpu-1"))
    wait_for("the first sync", lambda: pub.synced)
    (name,) = store.slices
    store.delete_by_someone_else(name)
    wait_for("the slice back", lambda: len(store.slices) == 1)
    assert pool(store) == [(2, ["gpu-0", "gpu-1"])]


def test_own_writes_echoed_by_the_watch_cost_no_list(running: Any) -> None:
    # Each of the five slices of a dynamic-MIG node used to cost one more list of the whole
    # pool when its own watch event came back.
    store = FakeSliceStore(hold_echoes=True)
    pub = running(store, render_devices(*[f"gpu-{i}" for i in range(5)], per_slice=1))
    wait_for("five slices", lambda: pub.synced and store.writes == 5 and store.watching)
    lists = store.lists
    assert store.release_echoes() == 5
    wait_for("the echoes taken", lambda: store.consumed == 5)
    # Not a latency bound: the publisher coalesces wake-ups for 50 ms, so a list caused by the
    # echoes would come well within this; correct code never lists here, however slow the run.
    with pytest.raises(waiting.WaitTimeout):
        waiting.wait_for("a list", lambda: store.lists > lists, timeout=0.5, every=0.01)
    store.delete_by_someone_else(next(iter(store.slices)))
    wait_for("the slice back", lambda: len(store.slices) == 5)
    assert store.lists == lists + 1


def test_new_inventory_raises_generation_and_drops_surplus(running: Any) -> None:
    store = FakeSliceStore()
    pub = running(store, render_devices(*[f"gpu-{i}" for i in range(200)]))
    wait_for("two slices", lambda: pub.synced and len(store.slices) == 2)
    pub.set_inventory(render_devices("gpu-0", "gpu-1"))
    wait_for("the surplus slice gone", lambda: len(store.slices) == 1)
    assert pool(store) == [(2, ["gpu-0", "gpu-1"])]


def test_api_outage_is_survived_and_pool_repaired(running: Any) -> None:
    store = FakeSliceStore()
    pub = running(store, render_devices("gpu-0"))
    wait_for("the first sync", lambda: pub.synced)
    store.down = True
    store.slices.clear()  # e.g. the kubelet wiped them while we could not see it
    wait_for("the outage noticed", lambda: pub.api_outage)
    store.down = False
    wait_for("the pool repaired", lambda: len(store.slices) == 1)
    assert pool(store) == [(2, ["gpu-0"])]
    assert pub.synced


def test_missing_node_delays_publishing(running: Any) -> None:
    store = FakeSliceStore()
    store.node_missing = True
    pub = running(store, render_devices("gpu-0"))
    wait_for("three Node lookups", lambda: store.node_lookups >= 3)
    assert not pub.synced and not store.slices
    store.node_missing = False
    wait_for("the sync once the Node exists", lambda: pub.synced)
    assert pool(store) == [(1, ["gpu-0"])]


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 0.2), (2, 0.4), (3, 0.8), (10, 30.0), (100, 30.0)],
    ids=["first", "second", "third", "capped", "huge"],
)
def test_backoff_ceiling_doubles_up_to_its_cap(failures: int, expected: float) -> None:
    assert publisher.backoff_delay(failures, 1.0) == pytest.approx(expected)
    assert publisher.backoff_delay(failures, 0.0) == pytest.approx(0.2)


class CountingStop(threading.Event):
    """A stop event that records each pause asked of it, returns at once, and is set after
    ``pauses`` of them: the reconcile loop's waits without the waiting."""

    def __init__(self, pauses: int) -> None:
        super().__init__()
        self.pauses: list[float] = []
        self._limit = pauses

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            self.pauses.append(timeout)
        if len(self.pauses) >= self._limit:
            self.set()
        return self.is_set()


def test_a_fleet_failed_at_once_spreads_its_retries() -> None:
    # The API server fails every node's publisher at once (an overload): were their pauses
    # deterministic, all retries of the fleet would arrive together, wave after wave.
    eighth: list[float] = []
    for node in range(50):
        store = FakeSliceStore()
        store.down = True
        pub = publisher.Publisher(
            store=store,
            node=NODE,
            driver=DRIVER,
            render=render_devices("gpu-0"),
            alive=lambda other: True,
            draw=random.Random(node).random,
        )
        stop = CountingStop(pauses=8)
        pub.run(stop)
        assert len(stop.pauses) == 8 and max(stop.pauses) <= publisher.MAX_BACKOFF_S
        eighth.append(stop.pauses[-1])
    assert max(eighth) - min(eighth) > 10.0
    assert len({round(p, 3) for p in eighth}) == len(eighth)


def test_two_instances_with_different_inventories_do_not_fight(running: Any) -> None:
    # A rolling update from a version that publishes other devices: the newer instance's slices
    # stay, the older one stands by instead of writing them back at every watch event.
    store = FakeSliceStore()
    old = running(store, render_devices("gpu-0"), slice_plan.Instance(1, "pod-old"))
    wait_for("the old instance's pool", lambda: old.synced)
    new = running(store, render_devices("gpu-0", "gpu-1"), slice_plan.Instance(2, "pod-new"))
    wait_for(
        "the new instance's pool", lambda: new.synced and pool(store) == [(2, ["gpu-0", "gpu-1"])]
    )
    writes = store.writes
    old.set_inventory(render_devices("gpu-0", "gpu-9"))  # wakes the old instance up
    new.set_inventory(render_devices("gpu-0", "gpu-1"))
    threading.Event().wait(0.5)
    assert store.writes == writes
    assert pool(store) == [(2, ["gpu-0", "gpu-1"])]
