"""Simulated backend and the published device model, per built-in profile.

Cases: device names per profile; attribute names and value types exactly as NVIDIA's driver
publishes them; capacities; MIG placements valid and non-overlapping; UUIDs stable per node and
different across nodes; an invalid layout skips that GPU with a reason; profile files (YAML and
JSON) load, and bad ones fail with every problem named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.devices import migprofiles, model, naming, partitions, profiles, simulated
from dra_gpu.devices.model import Device, MigDeviceInfo, Version
from dra_gpu.devices.simulated import ProfileError, SimGpu, SimMig, SimProfile

H200_MEMORY = 150754820096  # NVML memory.total of the real H200 (fixture)


def devices_of(profile: str, node: str = "node-a") -> list[Device]:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES[profile], node_name=node
    )
    d = backend.discover()
    assert d.errors == ()
    return naming.build_devices(d.gpus)


EXPECTED_NAMES = {
    "h200x8": [f"gpu-{i}" for i in range(8)],
    "h100x8": [f"gpu-{i}" for i in range(8)],
    "a100x4-mig": [
        "gpu-0",
        "gpu-1-mig-2g10gb-14-0",
        "gpu-1-mig-1g5gb-19-2",
        "gpu-1-mig-1g5gb-19-3",
        "gpu-1-mig-3g20gb-9-4",
        "gpu-2-mig-4g20gb-5-0",
        "gpu-2-mig-2g10gb-14-4",
        "gpu-2-mig-1g5gbme-20-6",
        "gpu-3-mig-3g20gb-9-0",
        "gpu-3-mig-3g20gb-9-4",
    ],
}


@pytest.mark.parametrize("profile", sorted(EXPECTED_NAMES))
def test_device_names(profile: str) -> None:
    assert [d.name for d in devices_of(profile)] == EXPECTED_NAMES[profile]


COMMON_ATTRS = {
    "type": str,
    "uuid": str,
    "productName": str,
    "brand": str,
    "architecture": str,
    "cudaComputeCapability": Version,
    "driverVersion": Version,
    "cudaDriverVersion": Version,
    "resource.kubernetes.io/pciBusID": str,
    "resource.kubernetes.io/pcieRoot": str,
    "resource.kubernetes.io/numaNode": int,
}
# A simulated GPU publishes what the real H200 does, addressingMode "None" included.
GPU_ATTRS = {**COMMON_ATTRS, "addressingMode": str}
MIG_ATTRS = {**COMMON_ATTRS, "parentUUID": str, "profile": str}


@pytest.mark.parametrize("profile", sorted(EXPECTED_NAMES))
def test_attribute_names_and_types(profile: str) -> None:
    for d in devices_of(profile):
        expected = GPU_ATTRS if d.type == "gpu" else MIG_ATTRS
        assert {k: type(v) for k, v in d.attributes.items()} == expected, d.name
        assert set(d.attributes) <= model.ATTRIBUTE_NAMES
        assert set(d.capacity) <= model.CAPACITY_NAMES
        assert d.attributes["type"] == d.type


@pytest.mark.parametrize(
    ("profile", "product", "memory", "cc"),
    [
        ("h200x8", "NVIDIA H200", H200_MEMORY, Version(9, 0, 0)),
        ("h100x8", "NVIDIA H100 80GB HBM3", 81559 * 2**20, Version(9, 0, 0)),
    ],
)
def test_full_gpu_facts(profile: str, product: str, memory: int, cc: Version) -> None:
    for d in devices_of(profile):
        assert d.attributes["productName"] == product
        assert d.attributes["brand"] == "Nvidia"
        assert d.attributes["architecture"] == "Hopper"
        assert d.attributes["cudaComputeCapability"] == cc
        assert d.attributes["driverVersion"] == Version(580, 159, 4)
        assert d.attributes["addressingMode"] == "None"
        assert d.capacity == {"memory": memory}


NUMA = "resource.kubernetes.io/numaNode"


@pytest.mark.parametrize("profile", sorted(simulated.BUILTIN_PROFILES))
def test_every_device_carries_what_dcgm_exporter_reads(profile: str) -> None:
    """dcgm-exporter labels metrics from the slices' type and uuid (MIG: parentUUID, profile);
    only a dynamic MIG partition lacks uuid (its claim's status.devices carries it)."""
    backend: Any = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES[profile], node_name="n"
    )
    for dynamic in (False, True):
        source = partitions.DynamicMigBackend(backend) if dynamic else backend
        for d in naming.build_devices(source.discover().gpus):
            wanted = {"type"} | ({"parentUUID", "profile"} if d.type == "mig" else set())
            if d.partition is None:
                wanted.add("uuid")
            assert wanted <= set(d.attributes), (profile, d.name)


@pytest.mark.parametrize("profile", ["h200x8", "h100x8"])
def test_eight_gpu_boxes_have_four_gpus_per_numa_node(profile: str) -> None:
    assert [d.attributes[NUMA] for d in devices_of(profile)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a100_numa_nodes_follow_the_root_complex() -> None:
    nodes = {d.name: d.attributes[NUMA] for d in devices_of("a100x4-mig")}
    assert nodes["gpu-0"] == nodes["gpu-1-mig-3g20gb-9-4"] == 0
    assert nodes["gpu-2-mig-4g20gb-5-0"] == nodes["gpu-3-mig-3g20gb-9-0"] == 1


def test_profile_file_numa_node_given_or_left_out(tmp_path: Path) -> None:
    path = tmp_path / "numa.yaml"
    path.write_text("gpus: [{product: H100-80GB, count: 2, numaNode: 1}, {product: H100-80GB}]")
    profile = profiles.resolve_profile(str(path))
    gpus = simulated.SimulatedBackend(profile=profile, node_name="n").discover().gpus
    assert [d.attributes.get(NUMA) for d in naming.build_devices(gpus)] == [1, 1, None]


def test_a100_mig_capacities_match_the_profile_table() -> None:
    by_name = {d.name: d for d in devices_of("a100x4-mig")}
    assert by_name["gpu-0"].capacity == {"memory": 40960 * 2**20}
    me = by_name["gpu-2-mig-1g5gbme-20-6"]
    assert me.attributes["profile"] == "1g.5gb+me"
    assert me.capacity == {
        "multiprocessors": 14,
        "copyEngines": 1,
        "decoders": 1,
        "encoders": 0,
        "jpegEngines": 1,
        "ofaEngines": 1,
        "memory": 4864 * 2**20,
    }
    assert by_name["gpu-1-mig-3g20gb-9-4"].capacity["memory"] == 19968 * 2**20


def test_a100_mig_placements_are_valid_and_disjoint() -> None:
    table = migprofiles.A100_40GB
    migs_by_gpu: dict[str, list[MigDeviceInfo]] = {}
    for d in devices_of("a100x4-mig"):
        if d.mig is not None:
            assert d.attributes["parentUUID"] == d.gpu.uuid
            migs_by_gpu.setdefault(d.gpu.uuid, []).append(d.mig)
    assert len(migs_by_gpu) == 3
    for migs in migs_by_gpu.values():
        for m in migs:
            assert m.placement_start in table.by_name(m.profile).placement_starts
            assert m.placement_size == table.by_name(m.profile).memory_slices
        used = [
            s for m in migs for s in range(m.placement_start, m.placement_start + m.placement_size)
        ]
        assert len(used) == len(set(used)), "memory slices overlap"
        assert (
            migprofiles.layout_errors(table, [(m.profile, m.placement_start) for m in migs]) == []
        )


def test_uuids_stable_per_node_and_distinct_across_nodes() -> None:
    a1 = [d.uuid for d in devices_of("a100x4-mig", "node-a")]
    a2 = [d.uuid for d in devices_of("a100x4-mig", "node-a")]
    b = [d.uuid for d in devices_of("a100x4-mig", "node-b")]
    assert a1 == a2
    assert not set(a1) & set(b)
    assert len(set(a1)) == len(a1)


def test_invalid_layout_skips_that_gpu_with_reason() -> None:
    bad = SimProfile(
        name="bad",
        gpus=(
            SimGpu("A100-SXM4-40GB", "0000:01:00.0", None),
            SimGpu(
                "A100-SXM4-40GB",
                "0000:02:00.0",
                None,
                mig_enabled=True,
                mig_devices=(SimMig("3g.20gb", 0), SimMig("2g.10gb", 2)),
            ),
        ),
    )
    d = simulated.SimulatedBackend(profile=bad, node_name="n").discover()
    assert [g.minor for g in d.gpus] == [0]
    (err,) = d.errors
    assert err.index == 1 and "memory slice 2 already used by 3g.20gb@0" in err.message


YAML_PROFILE = """
driverVersion: "570.86.15"
cudaDriverVersion: "12.8"
gpus:
  - product: H100-80GB
    count: 2
  - product: A100-SXM4-40GB
    pciBusID: "0000:81:00.0"
    pcieRoot: pci0000:80
    mig:
      enabled: true
      devices:
        - {profile: 7g.40gb, placement: 0}
"""


def test_yaml_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(YAML_PROFILE)
    profile = profiles.resolve_profile(str(path))
    d = simulated.SimulatedBackend(profile=profile, node_name="n").discover()
    devices = naming.build_devices(d.gpus)
    assert [x.name for x in devices] == ["gpu-0", "gpu-1", "gpu-2-mig-7g40gb-0-0"]
    assert devices[0].attributes["driverVersion"] == Version(570, 86, 15)
    assert devices[2].attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:80"
    assert (
        devices[0].attributes["resource.kubernetes.io/pciBusID"]
        != devices[1].attributes["resource.kubernetes.io/pciBusID"]
    )


def test_json_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"gpus": [{"product": "H200-141GB"}]}))
    profile = profiles.resolve_profile(str(path))
    assert profile.name == "one" and len(profile.gpus) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("gpus: [{product: H100-80GB, migg: {}}]", "gpus.0.migg: Extra inputs are not permitted"),
        ("gpus: [{product: B200}]", "unknown product 'B200'"),
        ("gpus: []", "gpus: List should have at least 1 item"),
        (
            "gpus: [{product: H100-80GB, mig: {enabled: true, devices: [{profile: 3g.40gb, "
            "placement: 2}]}}]",
            "3g.40gb@2: placement start must be one of [0, 4]",
        ),
        (
            "gpus: [{product: H100-80GB, mig: {devices: [{profile: 1g.10gb, placement: 0}]}}]",
            "MIG devices listed but MIG is not enabled",
        ),
        ("gpus: [{product: H100-80GB, count: 2, pciBusID: '0000:01:00.0'}]", "count 1"),
        ("driverVersion: banana\ngpus: [{product: H100-80GB}]", "not a numeric version"),
        ("gpus: [{", "not valid YAML"),
        ("gpus: [{product: H100-80GB, numaNode: -1}]", "greater than or equal to 0"),
    ],
    ids=[
        "typo",
        "product",
        "empty",
        "placement",
        "mig-off",
        "bus-id-count",
        "version",
        "syntax",
        "numa-negative",
    ],
)
def test_bad_profile_file_names_the_problem(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ProfileError) as e:
        profiles.resolve_profile(str(path))
    assert message in str(e.value)


def test_unknown_profile_lists_builtins() -> None:
    with pytest.raises(ProfileError, match=r"built-in: a100x4-mig, h100x8, h100x8-mig, h200x8"):
        profiles.resolve_profile("h300x8")


def test_docs_list_every_builtin_profile_and_product() -> None:
    doc = (
        Path(__file__).resolve().parents[2] / "docs" / "user" / "simulated-profiles.md"
    ).read_text()
    for name in [*simulated.BUILTIN_PROFILES, *simulated.PRODUCTS]:
        assert f"`{name}`" in doc, name
    for table in migprofiles.TABLES.values():
        for p in table.profiles:
            assert f"`{p.name}` ({p.gi_profile_id})" in doc, (table.key, p.name)
