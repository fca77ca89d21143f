"""ResourceSlice building (pure).

Cases: one slice for a small node; chunks of 128 with a shared pool count; an empty node still
publishes one empty slice; deterministic DNS-safe names; owner reference to the Node; attribute
encoding by type (bool before int, version apart from string); capacities as canonical
quantities.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from dra_gpu.devices import naming, simulated
from dra_gpu.devices.model import Device, Version
from dra_gpu.kubeletplugin import slices

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def h200_devices(n: int) -> list[Device]:
    base = naming.build_devices(
        simulated.SimulatedBackend(profile=simulated.BUILTIN_PROFILES["h200x8"], node_name="n")
        .discover()
        .gpus
    )[0]
    return [replace(base, name=f"gpu-{i}") for i in range(n)]


def build(devices: list[Device], **kw: object) -> list[dict[str, object]]:
    args: dict[str, object] = {
        "devices": devices,
        "driver_name": "gpu.nvidia.com",
        "node_name": "node-a",
        "pool_generation": 3,
        "node_owner": None,
    }
    args.update(kw)
    return slices.build_resource_slices(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "sizes"),
    [(0, [0]), (8, [8]), (128, [128]), (129, [128, 1]), (300, [128, 128, 44])],
)
def test_chunking(n: int, sizes: list[int]) -> None:
    objs = build(h200_devices(n))
    assert [len(o["spec"]["devices"]) for o in objs] == sizes  # type: ignore[index]
    for i, o in enumerate(objs):
        assert o["apiVersion"] == "resource.k8s.io/v1" and o["kind"] == "ResourceSlice"
        assert o["spec"]["pool"] == {  # type: ignore[index]
            "name": "node-a",
            "generation": 3,
            "resourceSliceCount": len(sizes),
        }
        assert o["spec"]["nodeName"] == "node-a"  # type: ignore[index]
        assert o["metadata"] == {"name": f"node-a-gpu.nvidia.com-{i}"}
    names = [d["name"] for o in objs for d in o["spec"]["devices"]]  # type: ignore[index]
    assert names == [f"gpu-{i}" for i in range(n)]


def test_owner_reference_to_node() -> None:
    (obj,) = build(h200_devices(1), node_owner=("node-a", "uid-1"))
    assert obj["metadata"]["ownerReferences"] == [  # type: ignore[index]
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}
    ]


@pytest.mark.parametrize(
    ("node", "driver"),
    [
        ("node-a", "gpu.nvidia.com"),
        ("Node_With_Caps", "gpu.nvidia.com"),
        ("n" * 250, "gpu.nvidia.com"),
        ("ip-10-0-0-1.ec2.internal", "x..y"),
    ],
    ids=["plain", "caps", "long", "dots"],
)
def test_slice_names_are_dns_subdomains_and_distinct(node: str, driver: str) -> None:
    names = [slices.slice_name(node_name=node, driver_name=driver, index=i) for i in range(3)]
    for name in names:
        assert DNS_SUBDOMAIN.match(name) and len(name) <= 253, name
    assert len(set(names)) == 3


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (True, {"bool": True}),
        (7, {"int": 7}),
        (Version(580, 159, 4), {"version": "580.159.4"}),
        ("Hopper", {"string": "Hopper"}),
    ],
)
def test_attribute_encoding(value: bool | int | str | Version, encoded: dict[str, object]) -> None:
    assert slices.encode_attribute(value) == encoded


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (16, "16"),
        (1024, "1Ki"),
        (150754820096, "143771Mi"),
        (16384 * 2**20, "16Gi"),
        (1000, "1000"),
    ],
)
def test_quantities(value: int, text: str) -> None:
    assert slices.format_quantity(value) == text


def test_device_encoding_of_h200() -> None:
    (obj,) = build(h200_devices(1))
    (dev,) = obj["spec"]["devices"]  # type: ignore[index]
    assert dev["capacity"] == {"memory": {"value": "143771Mi"}}
    assert dev["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert dev["attributes"]["type"] == {"string": "gpu"}


def test_devices_per_slice_may_only_be_lowered() -> None:
    objs = build(h200_devices(65), devices_per_slice=64)
    assert [len(o["spec"]["devices"]) for o in objs] == [64, 1]  # type: ignore[index]
    with pytest.raises(ValueError):
        build(h200_devices(1), devices_per_slice=129)
