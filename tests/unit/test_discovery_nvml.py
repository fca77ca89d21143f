"""NvmlBackend against a fake pynvml.

Cases: the fixture H200 read as NVML reports it; an NVML error on one call of one GPU skips that
GPU with a log line naming the call, the others are published; a hung call becomes a bounded
error naming the call; after repeated hangs the remaining GPUs are reported untouched; init
failure is a backend error, not an exception; MIG devices read with profile and placement; a
partial compute instance is skipped; MIG/addressing NOT_SUPPORTED are "no", not failures;
PCIe root from sysfs; the NUMA node from NVML, else from sysfs, and left out when neither knows
(the H200 VM: NVML NOT_SUPPORTED, sysfs -1), never published as 0 or -1.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
from nvml_fakes import FakeGpu, FakeMig, FakeNvml

from dra_gpu import metrics
from dra_gpu.devices import migprofiles, naming
from dra_gpu.devices.model import Version
from dra_gpu.devices.nvml import NvmlBackend


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    f = FakeNvml([FakeGpu(index=0, minor=0)])
    yield f
    f.release.set()  # let any deliberately hung worker thread finish


def three_gpus(fake: FakeNvml) -> None:
    fake.gpus = [
        FakeGpu(index=i, minor=i, uuid=f"GPU-{i}", bus_id=f"00000000:{0x18 + i:02X}:00.0".encode())
        for i in range(3)
    ]


def test_reads_the_fixture_h200(fake: FakeNvml, tmp_path: Path) -> None:
    d = NvmlBackend(nvml=fake, sysfs_root=tmp_path).discover()
    assert d.errors == ()
    (gpu,) = d.gpus
    assert (gpu.product_name, gpu.brand, gpu.architecture) == ("NVIDIA H200", "Nvidia", "Hopper")
    assert gpu.memory_bytes == 150754820096
    assert gpu.pci_bus_id == "0000:00:06.0"
    assert gpu.pcie_root is None  # no sysfs entry in tmp_path
    assert gpu.addressing_mode == "None"  # NVML says NONE (nvidia-smi -q: "Addressing Mode: None")
    assert (gpu.mig_capable, gpu.mig_enabled) == (True, False)
    assert gpu.mig_table == "H200-141GB"
    (dev,) = naming.build_devices(d.gpus)
    # Exactly what NVIDIA's driver publishes for this GPU (shared/docs/reference-drivers.md);
    # pcieRoot is left out only because tmp_path has no sysfs.
    assert dict(dev.attributes) == {
        "type": "gpu",
        "uuid": "GPU-dca98826-84b3-01c9-07e5-0760ceb4833e",
        "productName": "NVIDIA H200",
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": Version(9, 0, 0),
        "driverVersion": Version(580, 159, 4),
        "cudaDriverVersion": Version(13, 0, 0),
        "addressingMode": "None",
        "resource.kubernetes.io/pciBusID": "0000:00:06.0",
    }
    assert dict(dev.capacity) == {"memory": 150754820096}
    assert fake.calls[0] == "nvmlInit" and fake.calls[-1] == "nvmlShutdown"


@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMinorNumber",
    ],
)
def test_error_on_one_call_skips_only_that_gpu(
    fake: FakeNvml, call: str, caplog: pytest.LogCaptureFixture
) -> None:
    three_gpus(fake)
    fake.fail[(call, 1)] = pynvml.NVML_ERROR_GPU_IS_LOST
    with caplog.at_level(logging.WARNING, logger="dra_gpu.devices.nvml"):
        d = NvmlBackend(nvml=fake).discover()
    assert [g.index for g in d.gpus] == [0, 2]
    (err,) = d.errors
    assert err.index == 1 and call in err.message and "GPU is lost" in err.message
    assert f"skipping GPU index 1: {call}: GPU is lost" in caplog.text


def test_hung_call_is_bounded_and_named(fake: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    three_gpus(fake)
    fake.hang.add(("nvmlDeviceGetName", 1))
    with caplog.at_level(logging.WARNING, logger="dra_gpu.devices.nvml"):
        d = NvmlBackend(nvml=fake, call_timeout_s=0.2).discover()
    assert [g.index for g in d.gpus] == [0, 2]
    (err,) = d.errors
    assert "nvmlDeviceGetName did not return within 0.2s" in err.message
    assert "skipping GPU index 1: nvmlDeviceGetName did not return" in caplog.text


def test_repeated_hangs_stop_touching_nvml(fake: FakeNvml) -> None:
    three_gpus(fake)
    fake.hang |= {("nvmlDeviceGetName", 0), ("nvmlDeviceGetName", 1)}
    d = NvmlBackend(nvml=fake, call_timeout_s=0.1, max_timeouts=2).discover()
    assert d.gpus == ()
    assert [e.index for e in d.errors] == [0, 1, 2]
    assert "NVML stopped answering" in d.errors[2].message
    assert fake.calls.count("nvmlDeviceGetHandleByIndex") == 2  # GPU 2 never touched


@pytest.mark.parametrize(
    ("call", "code", "expected"),
    [
        ("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML could not be initialised"),
        ("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, "NVML system query failed"),
    ],
    ids=["init", "count"],
)
def test_backend_failure_is_reported_not_raised(
    fake: FakeNvml, call: str, code: int, expected: str
) -> None:
    fake.fail[(call, None)] = code
    d = NvmlBackend(nvml=fake).discover()
    assert d.gpus == ()
    (err,) = d.errors
    assert err.index is None and expected in err.message


def test_not_supported_mig_and_addressing_mean_no(fake: FakeNvml) -> None:
    fake.gpus = [FakeGpu(index=0, minor=0, mig_mode=None, addressing_mode=None)]
    (gpu,) = NvmlBackend(nvml=fake).discover().gpus
    assert (gpu.mig_capable, gpu.mig_enabled, gpu.addressing_mode) == (False, False, None)
    (dev,) = naming.build_devices([gpu])
    assert "addressingMode" not in dev.attributes


def test_addressing_mode_ats_is_published(fake: FakeNvml) -> None:
    fake.gpus = [FakeGpu(index=0, minor=0, addressing_mode=pynvml.NVML_DEVICE_ADDRESSING_MODE_ATS)]
    (dev,) = naming.build_devices(NvmlBackend(nvml=fake).discover().gpus)
    assert dev.attributes["addressingMode"] == "ATS"


def a100_with_migs() -> FakeGpu:
    t = migprofiles.A100_40GB
    return FakeGpu(
        index=0,
        minor=3,
        name="NVIDIA A100-SXM4-40GB",
        arch=7,
        cc=(8, 0),
        mig_mode=(1, 1),
        mig_table=t,
        migs=[
            FakeMig("MIG-a", gi_id=1, profile=t.by_name("3g.20gb"), start=4),
            FakeMig("MIG-b", gi_id=2, profile=t.by_name("1g.5gb+me"), start=0),
        ],
    )


def test_mig_devices_with_profile_and_placement(fake: FakeNvml) -> None:
    fake.gpus = [a100_with_migs()]
    d = NvmlBackend(nvml=fake).discover()
    assert d.errors == ()
    devices = naming.build_devices(d.gpus)
    assert [x.name for x in devices] == ["gpu-3-mig-1g5gbme-20-0", "gpu-3-mig-3g20gb-9-4"]
    mig = devices[1].mig
    assert mig is not None
    assert (mig.uuid, mig.gi_id, mig.placement_start, mig.placement_size) == ("MIG-a", 1, 4, 4)
    assert devices[1].capacity["memory"] == 19968 * 2**20
    assert devices[1].capacity["multiprocessors"] == 42
    assert devices[0].capacity["ofaEngines"] == 1


def test_partial_compute_instance_is_skipped_with_reason(fake: FakeNvml) -> None:
    gpu = a100_with_migs()
    gpu.migs[0].ci_slices = 1
    fake.gpus = [gpu]
    d = NvmlBackend(nvml=fake).discover()
    assert [m.uuid for m in d.gpus[0].mig_devices] == ["MIG-b"]
    (err,) = d.errors
    assert "MIG-a" in err.message and "whole-GI" in err.message


def test_pcie_root_from_sysfs(fake: FakeNvml, tmp_path: Path) -> None:
    real = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:00:06.0"
    real.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:00:06.0").symlink_to(real)
    (gpu,) = NvmlBackend(nvml=fake, sysfs_root=tmp_path).discover().gpus
    assert gpu.pcie_root == "pci0000:00"


def sysfs_numa(tmp_path: Path, bus_id: str, text: str) -> None:
    device = tmp_path / "bus" / "pci" / "devices" / bus_id
    device.mkdir(parents=True)
    (device / "numa_node").write_text(text)


def numa_attribute(fake: FakeNvml, tmp_path: Path) -> object:
    d = NvmlBackend(nvml=fake, sysfs_root=tmp_path).discover()
    assert d.errors == ()
    (dev,) = naming.build_devices(d.gpus)
    return dev.attributes.get("resource.kubernetes.io/numaNode")


def test_numa_node_from_nvml(fake: FakeNvml, tmp_path: Path) -> None:
    fake.gpus[0].numa_node = 1
    sysfs_numa(tmp_path, "0000:00:06.0", "0\n")  # NVML's answer wins
    assert numa_attribute(fake, tmp_path) == 1


def test_numa_node_from_sysfs_when_nvml_cannot_tell(fake: FakeNvml, tmp_path: Path) -> None:
    sysfs_numa(tmp_path, "0000:00:06.0", "1\n")
    assert numa_attribute(fake, tmp_path) == 1


@pytest.mark.parametrize("sysfs", ["-1\n", None], ids=["sysfs-says-minus-one", "no-sysfs-entry"])
def test_unknown_numa_node_is_left_out(fake: FakeNvml, tmp_path: Path, sysfs: str | None) -> None:
    # The H200 VM: NVML answers NOT_SUPPORTED and sysfs reads -1.
    if sysfs is not None:
        sysfs_numa(tmp_path, "0000:00:06.0", sysfs)
    assert numa_attribute(fake, tmp_path) is None


def test_a_negative_nvml_answer_is_not_published(fake: FakeNvml, tmp_path: Path) -> None:
    fake.gpus[0].numa_node = -1
    assert numa_attribute(fake, tmp_path) is None


def test_numa_node_on_mig_devices_is_the_parents(fake: FakeNvml, tmp_path: Path) -> None:
    gpu = fake.gpus[0]
    gpu.mig_mode, gpu.numa_node = (1, 1), 1
    gpu.migs = [FakeMig("MIG-a", 1, migprofiles.H200_141GB.by_name("3g.71gb"), 0)]
    (dev,) = naming.build_devices(NvmlBackend(nvml=fake, sysfs_root=tmp_path).discover().gpus)
    assert (dev.type, dev.attributes["resource.kubernetes.io/numaNode"]) == ("mig", 1)


def test_every_call_is_reported_with_its_outcome(fake: FakeNvml) -> None:
    three_gpus(fake)
    fake.fail[("nvmlDeviceGetUUID", 1)] = pynvml.NVML_ERROR_GPU_IS_LOST
    fake.hang.add(("nvmlDeviceGetName", 2))
    m = metrics.PluginMetrics()
    NvmlBackend(nvml=fake, call_timeout_s=0.2, observe=m.nvml_call).discover()

    def value(name: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, labels)

    failures = "dra_gpu_plugin_nvml_call_failures_total"
    assert value(failures, function="nvmlDeviceGetUUID", reason="error") == 1
    assert value(failures, function="nvmlDeviceGetName", reason="timeout") == 1
    observed = value("dra_gpu_plugin_nvml_call_duration_seconds_count", function="nvmlInit")
    assert observed == fake.calls.count("nvmlInit") == 1
