"""``dra-gpu explain`` on consumable devices: remaining capacity per device.

Cases: a node of one shared H200 (143,771Mi) with claims holding all but 40Gi of it; a claim
asking 48Gi does not fit and the suggestion says the most any GPU has left is 40Gi; asking
40Gi fits on the same GPU; a request asking more than a device has at all fails the capacity
filter; without shares, an allocated device is taken as before.
"""

from __future__ import annotations

from typing import Any, cast

from fake_claims import inventory

from dra_gpu import DRIVER_NAME
from dra_gpu.controller import classes
from dra_gpu.devices import shares
from dra_gpu.explain import analysis
from dra_gpu.kube.objects import DeviceClassSpec, ResourceClaim, ResourceSlice
from dra_gpu.plugin import published

CLASSES = {
    c.name: cast(DeviceClassSpec, c.spec)
    for c in classes.builtin_classes(extended_resource_name=None)
}
GPU = inventory("h200x8", node="node-a")["gpu-0"]  # 143771Mi


def slices(mode: shares.ShareMode | None) -> list[ResourceSlice]:
    objs = published.node_slices(
        [GPU], driver_name=DRIVER_NAME, node_name="node-a", node_uid=None, shares=mode
    )
    return cast("list[ResourceSlice]", objs)


def holding(name: str, memory: str | None) -> ResourceClaim:
    result: dict[str, Any] = {
        "driver": DRIVER_NAME,
        "pool": "node-a",
        "device": "gpu-0",
        "request": "gpu",
    }
    if memory is not None:
        result |= {"shareID": f"s-{name}", "consumedCapacity": {"memory": memory}}
    body = {
        "metadata": {"namespace": "ns", "name": name, "uid": name},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    return cast(ResourceClaim, body)


def explain(memory: str, *, mode: shares.ShareMode | None, held: list[ResourceClaim]) -> Any:
    exactly = {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": memory}}}
    claim = {
        "metadata": {"namespace": "ns", "name": "new", "uid": "new"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    return analysis.explain_claim(
        cast(ResourceClaim, claim), classes=CLASSES, slices=slices(mode), claims=held
    )


MEMORY = shares.ShareMode("memory")
HELD = [holding("a", "61771Mi"), holding("b", "41040Mi")]  # 143771Mi - 40Gi together


def test_asking_more_than_any_gpu_has_left_names_the_most_left() -> None:
    report = explain("48Gi", mode=MEMORY, held=HELD)
    assert report.fits == []
    assert report.suggestions == [
        "request gpu: asks 48Gi memory, the most any matching device has left is 40Gi (gpu-0 on "
        "node-a, shared with other claims); wait for a share to be released or ask for at most "
        "40Gi"
    ]


def test_asking_what_is_left_fits_on_the_shared_gpu() -> None:
    report = explain("40Gi", mode=MEMORY, held=HELD)
    assert report.fits == ["node-a"]
    (counts,) = report.requests[0].nodes
    assert counts.free == [(DRIVER_NAME, "node-a", "gpu-0")]


def test_asking_more_than_a_device_has_at_all_fails_the_capacity_filter() -> None:
    report = explain("200Gi", mode=MEMORY, held=[])
    assert report.fits == []
    assert [f.stage for f in report.requests[0].failures] == ["capacity request"]
    assert report.suggestions == [
        "request gpu: no device that passes its selectors has the capacity it asks for "
        "(memory: 200Gi) even when no other claim uses it"
    ]


def test_without_shares_an_allocated_gpu_is_taken() -> None:
    report = explain("8Gi", mode=None, held=[holding("a", None)])
    assert report.fits == []
    assert any("wait for those claims" in s and "ns/a" in s for s in report.suggestions)
