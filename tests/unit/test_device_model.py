"""Pure pieces of the device model: semver conversion, names, MIG layout rules, PCI naming.

Cases: NVML version strings to semver (leading zeros, missing parts, junk refused); CUDA
version integers; MIG device names drop dots and ``+``; duplicate minors refused; MIG-enabled
GPUs publish only their MIG devices; layout rules (valid/invalid placements, overlaps, engine
limits, instance counts); bus ID normalisation.
"""

from __future__ import annotations

import pytest

from dra_gpu.devices import migprofiles, naming, pci
from dra_gpu.devices.model import GpuInfo, MigEngines, Version


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("580.159.04", "580.159.4"),
        ("9.0", "9.0.0"),
        ("13", "13.0.0"),
        ("550.54.15", "550.54.15"),
        (" 12.8 ", "12.8.0"),
    ],
)
def test_version_parse_gives_valid_semver(text: str, expected: str) -> None:
    assert str(Version.parse(text)) == expected


@pytest.mark.parametrize("text", ["", "580.159.04.1", "r580", "1.-2", "9.0-beta"])
def test_version_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        Version.parse(text)


@pytest.mark.parametrize(("value", "expected"), [(13000, "13.0.0"), (12080, "12.8.0")])
def test_cuda_int_version(value: int, expected: str) -> None:
    assert str(Version.from_cuda_int(value)) == expected


def test_versions_order_numerically() -> None:
    assert Version.parse("580.159.04") > Version.parse("580.95.05")


@pytest.mark.parametrize(
    ("profile", "gi", "start", "expected"),
    [
        ("1g.18gb", 19, 6, "gpu-0-mig-1g18gb-19-6"),
        ("1g.18gb+me", 20, 0, "gpu-0-mig-1g18gbme-20-0"),
        ("7g.141gb", 0, 0, "gpu-0-mig-7g141gb-0-0"),
    ],
)
def test_mig_device_names(profile: str, gi: int, start: int, expected: str) -> None:
    assert (
        naming.mig_device_name(parent_minor=0, profile=profile, gi_profile_id=gi, start=start)
        == expected
    )


def gpu(minor: int, *, mig_enabled: bool = False) -> GpuInfo:
    return GpuInfo(
        minor=minor,
        index=minor,
        uuid=f"GPU-{minor}",
        product_name="NVIDIA H200",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        driver_version="580.159.04",
        cuda_driver_version="13.0",
        memory_bytes=1,
        pci_bus_id=f"0000:{minor:02x}:00.0",
        pcie_root=None,
        addressing_mode=None,
        mig_enabled=mig_enabled,
    )


def test_devices_sorted_by_minor_and_mig_gpu_without_migs_publishes_nothing() -> None:
    devices = naming.build_devices([gpu(2), gpu(1, mig_enabled=True), gpu(0)])
    assert [d.name for d in devices] == ["gpu-0", "gpu-2"]
    assert "resource.kubernetes.io/pcieRoot" not in devices[0].attributes  # unknown: left out


def test_duplicate_minor_is_refused() -> None:
    with pytest.raises(ValueError, match="gpu-0"):
        naming.build_devices([gpu(0), gpu(0)])


A100 = migprofiles.A100_40GB


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ([("1g.5gb", i) for i in range(7)], None),
        ([("4g.20gb", 0), ("3g.20gb", 4)], None),
        ([("1g.10gb", 0), ("1g.10gb", 2), ("1g.10gb", 4), ("1g.10gb", 6)], None),
        ([("3g.20gb", 2)], "placement start must be one of [0, 4]"),
        ([("2g.10gb", 0), ("1g.5gb", 1)], "memory slice 1 already used by 2g.10gb@0"),
        ([("1g.5gb+me", 0), ("1g.5gb+me", 1)], "1g.5gb+me: 2 instances, at most 1"),
        ([("7g.40gb", 0), ("1g.5gb", 0)], "memory slice 0 already used"),
        ([("9g.90gb", 0)], "has no MIG profile '9g.90gb'"),
    ],
    ids=["seven-1g", "4g+3g", "four-1g10", "bad-start", "overlap", "two-me", "full+1", "unknown"],
)
def test_layout_rules(layout: list[tuple[str, int]], problem: str | None) -> None:
    errors = migprofiles.layout_errors(A100, layout)
    if problem is None:
        assert errors == []
    else:
        assert any(problem in e for e in errors), errors


def test_engine_limits_are_enforced() -> None:
    # a fictitious table where two decoders-hungry profiles fit in memory but not in decoders
    table = migprofiles.MigTable(
        key="T",
        memory_slices=8,
        compute_slices=7,
        profiles=(
            migprofiles.MigProfile("7g.8gb", 0, 7, 8, 1, (0,), 8, MigEngines(7, 1, 1, 0, 0, 0)),
            migprofiles.MigProfile(
                "1g.1gb", 19, 1, 1, 7, tuple(range(7)), 1, MigEngines(1, 0, 1, 0, 0, 0)
            ),
        ),
    )
    errors = migprofiles.layout_errors(table, [("1g.1gb", 0), ("1g.1gb", 1)])
    assert errors == ["layout needs 2 decoders, the GPU has 1"]


def test_fixture_h200_table() -> None:
    t = migprofiles.H200_141GB
    assert t.by_gi_profile_id(19).name == "1g.18gb"
    assert t.by_name("7g.141gb").memory_bytes == 143360 * 2**20
    assert migprofiles.table_key_for_product("NVIDIA H200") == "H200-141GB"
    assert migprofiles.table_key_for_product("NVIDIA A100-SXM4-80GB") is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"00000000:00:06.0", "0000:00:06.0"),
        ("00000001:AB:1F.7", "0001:ab:1f.7"),
        ("0000:3a:00.0", "0000:3a:00.0"),
    ],
)
def test_bus_id_normalisation(raw: str | bytes, expected: str) -> None:
    assert pci.normalize_bus_id(raw) == expected


def test_bus_id_junk_refused() -> None:
    with pytest.raises(ValueError):
        pci.normalize_bus_id("GPU-0")
