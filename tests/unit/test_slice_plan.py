"""Reconcile planning of a node's ResourceSlice pool (pure).

Cases: first publish; nothing to do; a slice deleted by someone, a partly failed create or
update (completed at the pool's generation, the right slices left alone) and a missing slice
beside a changed one (a new generation); a pool wiped after we published; content changed;
fewer slices; stale slices of another pool; a hand edit; server-side
canonicalization is not a change; tolerant parsing.
"""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest

from dra_gpu.kube.objects import ResourceSlice
from dra_gpu.kubeletplugin import slice_plan

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
OWNER = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1", "controller": True}


def body(*devices: str, memory: str = "141Gi") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "ignored-", "ownerReferences": [OWNER]},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": "placeholder", "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": d, "capacity": {"memory": {"value": memory}}} for d in devices],
        },
    }


def plan(desired: list[dict[str, Any]], existing: list[dict[str, Any]], last: int = 0) -> Any:
    return slice_plan.plan(
        desired=desired,
        existing=cast("list[ResourceSlice]", existing),  # test bodies, as the API would list
        node=NODE,
        driver=DRIVER,
        last_generation=last,
        alive=lambda other: True,
    )


def as_stored(created: dict[str, Any], n: int) -> dict[str, Any]:
    """What the API server returns for a slice we created."""
    stored = copy.deepcopy(created)
    stored["metadata"].update(uid=f"uid-{n}", resourceVersion=str(100 + n))
    return stored


def published(desired: list[dict[str, Any]], last: int = 0) -> list[dict[str, Any]]:
    first = plan(desired, [], last)
    return [as_stored(b, i) for i, b in enumerate(first.creates)]


def test_first_publish_creates_all_slices_at_generation_1() -> None:
    result = plan([body("gpu-0"), body("gpu-1")], [])
    assert result.generation == 1
    assert [b["metadata"]["name"] for b in result.creates] == [
        "node-a-gpu.nvidia.com-0",
        "node-a-gpu.nvidia.com-1",
    ]
    for b in result.creates:
        assert b["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        assert "generateName" not in b["metadata"]
    assert not result.updates and not result.deletes


def test_up_to_date_pool_needs_nothing() -> None:
    desired = [body("gpu-0"), body("gpu-1")]
    result = plan(desired, published(desired, last=2), last=3)
    assert result.is_empty
    assert result.generation == 3


def test_slice_deleted_by_someone_comes_back_at_the_pools_generation() -> None:
    desired = [body("gpu-0"), body("gpu-1")]
    existing = published(desired)
    result = plan(desired, existing[1:], last=1)
    assert result.generation == 1
    assert [b["metadata"]["name"] for b in result.creates] == ["node-a-gpu.nvidia.com-0"]
    assert result.creates[0]["spec"]["pool"]["generation"] == 1
    assert not result.updates and not result.deletes  # the slice that was right is left alone


def test_partly_failed_first_publish_creates_only_what_is_missing() -> None:
    # The creates of the first pass timed out after the first: the next pass completes the
    # pool instead of raising the generation and rewriting the slice that was right.
    desired = [body("gpu-0"), body("gpu-1"), body("gpu-2")]
    existing = published(desired)[:1]
    result = plan(desired, existing, last=0)
    assert result.generation == 1
    assert [b["metadata"]["name"] for b in result.creates] == [
        "node-a-gpu.nvidia.com-1",
        "node-a-gpu.nvidia.com-2",
    ]
    assert not result.updates


def test_partly_failed_update_updates_only_the_slice_left_behind() -> None:
    old = published([body("gpu-0"), body("gpu-1")])
    new = [body("gpu-0", memory="140Gi"), body("gpu-1", memory="140Gi")]
    first = plan(new, old, last=1)
    assert first.generation == 2 and len(first.updates) == 2
    done = as_stored(first.updates[0], 0)  # the second update failed
    result = plan(new, [done, old[1]], last=1)
    assert result.generation == 2
    (update,) = result.updates
    assert update["metadata"]["name"] == "node-a-gpu.nvidia.com-1"
    assert update["metadata"]["resourceVersion"] == "101"
    assert update["spec"]["devices"][0]["capacity"]["memory"]["value"] == "140Gi"
    assert not result.creates


def test_missing_slice_beside_a_changed_one_raises_the_generation() -> None:
    # The slice still at the pool's generation holds old content: completing the pool at that
    # generation would mix old and new, so everything goes one generation up.
    existing = published([body("gpu-0"), body("gpu-1")])
    desired = [body("gpu-0", memory="140Gi"), body("gpu-1", memory="140Gi")]
    result = plan(desired, existing[:1], last=1)
    assert result.generation == 2
    assert len(result.creates) == 1 and len(result.updates) == 1
    assert {b["spec"]["pool"]["generation"] for b in result.creates + result.updates} == {2}


def test_wiped_pool_is_recreated_above_the_last_published_generation() -> None:
    result = plan([body("gpu-0")], [], last=5)
    assert result.generation == 6
    assert len(result.creates) == 1


def test_changed_content_updates_in_place_with_next_generation() -> None:
    existing = published([body("gpu-0", "gpu-1")])
    result = plan([body("gpu-0", "gpu-1", "gpu-2")], existing, last=1)
    assert result.generation == 2
    assert not result.creates and not result.deletes
    (update,) = result.updates
    assert [d["name"] for d in update["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    assert update["metadata"]["resourceVersion"] == "100"


def test_fewer_slices_deletes_the_surplus() -> None:
    existing = published([body("gpu-0"), body("gpu-1")])
    result = plan([body("gpu-0", "gpu-1")], existing, last=1)
    assert result.generation == 2
    assert [e.name for e in result.deletes] == ["node-a-gpu.nvidia.com-1"]
    assert [e.uid for e in result.deletes] == ["uid-1"]
    (update,) = result.updates
    assert update["spec"]["pool"]["resourceSliceCount"] == 1


def test_stale_slice_of_another_pool_is_deleted_without_a_new_generation() -> None:
    desired = [body("gpu-0")]
    stale = as_stored(body("old"), 7)
    stale["metadata"]["name"] = "leftover"
    stale["spec"]["pool"] = {"name": "old-node", "generation": 40, "resourceSliceCount": 1}
    result = plan(desired, [*published(desired), stale], last=1)
    assert result.generation == 1
    assert not result.creates and not result.updates
    assert [e.name for e in result.deletes] == ["leftover"]


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda s: s["spec"]["devices"].pop(), id="device-removed"),
        pytest.param(lambda s: s["spec"]["pool"].update(resourceSliceCount=3), id="pool-count"),
        pytest.param(lambda s: s["metadata"]["annotations"].clear(), id="hash-removed"),
        pytest.param(lambda s: s["spec"].update(nodeName="other"), id="node-name"),
    ],
)
def test_hand_edit_is_repaired(edit: Any) -> None:
    desired = [body("gpu-0", "gpu-1")]
    existing = published(desired)
    edit(existing[0])
    result = plan(desired, existing, last=1)
    assert len(result.updates) == 1
    assert result.generation == 2


def test_canonicalized_quantity_is_not_a_change() -> None:
    desired = [body("gpu-0", memory="1024Mi")]
    existing = published(desired)
    existing[0]["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Gi"
    assert plan(desired, existing, last=1).is_empty


def test_empty_inventory_deletes_every_slice() -> None:
    existing = published([body("gpu-0"), body("gpu-1")])
    result = plan([], existing, last=1)
    assert len(result.deletes) == 2 and not result.creates


def test_parse_existing_tolerates_missing_fields() -> None:
    malformed = cast(ResourceSlice, {"metadata": {"name": "x"}, "spec": {"pool": {}}})
    parsed = slice_plan.parse_existing(malformed)
    assert (parsed.name, parsed.generation, parsed.pool) == ("x", 0, "")


OLD = slice_plan.Instance(started_ns=1_000, name="pod-old")
NEW = slice_plan.Instance(started_ns=2_000, name="pod-new")


def plan_as(instance: slice_plan.Instance, desired: list[dict[str, Any]], existing: Any) -> Any:
    return slice_plan.plan(
        desired=desired,
        existing=existing,
        node=NODE,
        driver=DRIVER,
        last_generation=0,
        instance=instance,
        alive=lambda other: True,
    )


def written_by(instance: slice_plan.Instance, *devices: str) -> list[ResourceSlice]:
    first = plan_as(instance, [body(*devices)], [])
    return cast("list[ResourceSlice]", [as_stored(b, i) for i, b in enumerate(first.creates)])


def test_newer_instance_takes_over_a_pool_an_older_one_wrote() -> None:
    p = plan_as(NEW, [body("gpu-0", "gpu-1")], written_by(OLD, "gpu-0"))
    assert p.standby_for is None
    (update,) = p.updates
    assert update["metadata"]["annotations"][f"{DRIVER}/publisher"] == "2000/pod-new"
    assert update["spec"]["pool"]["generation"] == 2


def test_older_instance_stands_by_while_a_newer_one_publishes() -> None:
    # A rolling update between versions that publish different content must not ping-pong.
    p = plan_as(OLD, [body("gpu-0")], written_by(NEW, "gpu-0", "gpu-1"))
    assert p.standby_for == NEW
    assert p.is_empty


def test_same_content_from_another_instance_needs_no_write() -> None:
    assert plan_as(NEW, [body("gpu-0")], written_by(OLD, "gpu-0")).is_empty


@pytest.mark.parametrize("text", ["", "pod", "x/pod", "/pod"])
def test_unreadable_publisher_annotation_is_no_instance(text: str) -> None:
    assert slice_plan.Instance.parse(text) is None


def test_a_newer_instance_that_is_gone_does_not_silence_the_pool() -> None:
    # E.g. it crashed, or the clock was set back after it wrote: its slices must not win.
    p = slice_plan.plan(
        desired=[body("gpu-0")],
        existing=written_by(NEW, "gpu-0", "gpu-1"),
        node=NODE,
        driver=DRIVER,
        last_generation=0,
        instance=OLD,
        alive=lambda other: False,
    )
    assert p.standby_for is None
    assert [d["name"] for d in p.updates[0]["spec"]["devices"]] == ["gpu-0"]
