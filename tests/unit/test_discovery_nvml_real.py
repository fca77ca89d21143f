"""The NVML backend on a real GPU, compared with the simulated ``h200x8`` profile.

Runs only where NVML answers (skipped with the reason elsewhere). Read only: it never changes a
GPU setting. Cases: every GPU is read without errors; each published device has exactly the
attribute names and value types the simulated H200 has (so tests and demos on simulated nodes
exercise what real nodes publish); full GPUs match the real facts NVML gives directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import real_nvml

from dra_gpu.devices import naming, simulated
from dra_gpu.devices.model import Device, Version
from dra_gpu.devices.nvml import NvmlBackend
from dra_gpu.plugin import inventory

pytestmark = pytest.mark.nvml


@pytest.fixture(scope="module")
def pynvml_ready() -> Iterator[Any]:
    yield from real_nvml.initialized()


def shape(d: Device) -> dict[str, type]:
    return {k: type(v) for k, v in d.attributes.items()}


def sim_devices(profile: str) -> list[Device]:
    backend = simulated.SimulatedBackend(profile=simulated.BUILTIN_PROFILES[profile], node_name="n")
    return naming.build_devices(backend.discover().gpus)


# published only where known (see naming.py), so a real node may lack them
OPTIONAL = {"addressingMode", "resource.kubernetes.io/pcieRoot"}


def test_nvml_devices_have_the_simulated_attribute_shape(pynvml_ready: Any) -> None:
    discovery = NvmlBackend().discover()
    assert discovery.errors == ()
    real = naming.build_devices(discovery.gpus)
    assert real, "NVML reported no GPU"
    sim_gpu = sim_devices("h200x8")[0]
    sim_mig = next(d for d in sim_devices("a100x4-mig") if d.type == "mig")
    for d in real:
        expected = sim_gpu if d.type == "gpu" else sim_mig
        got = {k: v for k, v in shape(d).items() if k not in OPTIONAL}
        assert got == {k: v for k, v in shape(expected).items() if k not in OPTIONAL}, d.name
        assert set(d.capacity) == set(expected.capacity), d.name


def test_full_gpus_match_nvml(pynvml_ready: Any) -> None:
    nvml = pynvml_ready
    for gpu in NvmlBackend().discover().gpus:
        h = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        assert gpu.memory_bytes == nvml.nvmlDeviceGetMemoryInfo(h).total
        assert gpu.uuid == nvml.nvmlDeviceGetUUID(h)
        assert gpu.cuda_compute_capability == tuple(nvml.nvmlDeviceGetCudaComputeCapability(h))
        assert gpu.minor == nvml.nvmlDeviceGetMinorNumber(h)
        if not gpu.mig_enabled:
            (dev,) = naming.build_devices([gpu])
            major, minor = gpu.cuda_compute_capability
            assert dev.attributes["cudaComputeCapability"] == Version(major, minor, 0)
            assert dev.capacity["memory"] == gpu.memory_bytes


def test_rediscovery_of_unchanged_gpus_is_no_change(pynvml_ready: Any) -> None:
    # The plugin re-discovers every minute and republishes on any difference: nothing volatile
    # (temperatures, memory in use, clocks) may reach the devices.
    backend = NvmlBackend()
    first = naming.build_devices(backend.discover().gpus)
    heard: list[int] = []
    watcher = inventory.Watcher(
        poll=inventory.backend_poll(backend),
        listener=lambda devices: heard.append(len(devices)),
        current=first,
        interval_s=60.0,
        confirm=2,
        what="NVML inventory",
    )
    assert [watcher.check() for _ in range(3)] == [False, False, False]
    assert heard == []
