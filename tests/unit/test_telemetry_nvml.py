"""The NVML usage sampler against a stand-in for pynvml: what the H200 answers (two CUDA
processes time-slicing one GPU, each in its own pod), a device that does not support a value,
a MIG device, and a call that hangs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from dra_gpu.devices import naming, simulated
from dra_gpu.devices.model import Device
from dra_gpu.devices.nvml_usage import NvmlUsageSampler
from dra_gpu.devices.usage import ProcessUsage

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
POD_A = "0d6a8e43-1f2b-4c3d-9e8f-1a2b3c4d5e6f"
POD_B = "7b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"
MIB = 1 << 20


class Nvml:
    NVMLError = pynvml.NVMLError

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}
        self.hang: set[str] = set()
        self.release = threading.Event()
        self.inits = 0
        self.since: list[int] = []
        self.processes = [
            SimpleNamespace(pid=10, usedGpuMemory=776 * MIB),
            SimpleNamespace(pid=20, usedGpuMemory=1544 * MIB),
        ]
        self.samples = [
            SimpleNamespace(pid=10, timeStamp=100, smUtil=40),
            SimpleNamespace(pid=20, timeStamp=100, smUtil=60),
            SimpleNamespace(pid=10, timeStamp=200, smUtil=20),
            SimpleNamespace(pid=20, timeStamp=200, smUtil=80),
        ]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML_"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _enter(self, fn: str) -> None:
        if fn in self.hang:
            self.release.wait(timeout=30)
        if fn in self.fail:
            raise pynvml.NVMLError(self.fail[fn])

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self._enter("nvmlDeviceGetHandleByUUID")
        return uuid

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=2949 * MIB, total=143155 * MIB)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=100, memory=30)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature")
        return 41

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        self._enter("nvmlDeviceGetPowerUsage")
        return 146_000

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors")
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        return self.processes

    def nvmlDeviceGetProcessUtilization(self, h: str, since: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization")
        self.since.append(since)
        found = [s for s in self.samples if s.timeStamp > since]
        if not found:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return found


@pytest.fixture
def nvml() -> Iterator[Nvml]:
    fake = Nvml()
    yield fake
    fake.release.set()  # no worker outlives the test


def h200() -> Device:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["h200x8"], node_name="n"
    )
    return naming.build_devices(backend.discover().gpus)[0]


def sampler(nvml: Nvml, **kw: Any) -> NvmlUsageSampler:
    pods = {10: POD_A, 20: POD_B}
    return NvmlUsageSampler(nvml=nvml, pod_of=pods.get, **kw)


def test_two_time_sliced_processes_get_their_memory_pod_and_sm_share(nvml: Nvml) -> None:
    gpu = h200()
    s = sampler(nvml)
    got = s.sample([gpu])[gpu.name]
    assert got.error == ""
    assert got.utilization_ratio == 1.0 and got.temperature_celsius == 41
    assert got.power_watts == 146 and got.memory_total_bytes == 143155 * MIB
    assert got.processes == (
        ProcessUsage(10, POD_A, 776 * MIB, pytest.approx(0.3)),  # type: ignore[arg-type]
        ProcessUsage(20, POD_B, 1544 * MIB, pytest.approx(0.7)),  # type: ignore[arg-type]
    )
    # The next pass asks only for samples newer than those already seen; none: both used 0.
    again = s.sample([gpu])[gpu.name]
    assert nvml.since == [0, 200]
    assert [p.sm_ratio for p in again.processes] == [0.0, 0.0]
    assert nvml.inits == 1  # initialised once, kept
    s.close()
    assert nvml.inits == 0


def test_values_a_device_does_not_support_are_unknown_not_zero(nvml: Nvml) -> None:
    nvml.fail["nvmlDeviceGetPowerUsage"] = NOT_SUPPORTED
    nvml.fail["nvmlDeviceGetProcessUtilization"] = NOT_SUPPORTED
    gpu = h200()
    got = sampler(nvml).sample([gpu])[gpu.name]
    assert got.error == "" and got.power_watts is None
    assert [p.sm_ratio for p in got.processes] == [None, None]


def test_a_mig_device_reports_memory_and_processes_only(nvml: Nvml) -> None:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["a100x4-mig"], node_name="n"
    )
    mig = next(d for d in naming.build_devices(backend.discover().gpus) if d.mig is not None)
    got = sampler(nvml).sample([mig])[mig.name]
    assert got.utilization_ratio is None and got.temperature_celsius is None
    assert got.memory_used_bytes == 2949 * MIB and len(got.processes) == 2


def test_a_hung_call_is_an_error_on_its_device_and_later_devices_are_skipped(
    nvml: Nvml,
) -> None:
    nvml.hang.add("nvmlDeviceGetMemoryInfo")
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["h200x8"], node_name="n"
    )
    gpus = naming.build_devices(backend.discover().gpus)[:3]
    got = sampler(nvml, call_timeout_s=0.2, max_timeouts=1).sample(gpus)
    assert "did not return" in got["gpu-0"].error
    assert got["gpu-1"].error == got["gpu-2"].error == "skipped: NVML stopped answering"


def test_nvml_that_cannot_start_is_reported_on_every_device_and_tried_again(
    nvml: Nvml,
) -> None:
    nvml.fail["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    gpu = h200()
    s = sampler(nvml)
    assert "could not be initialised" in s.sample([gpu])[gpu.name].error
    del nvml.fail["nvmlInit"]
    assert s.sample([gpu])[gpu.name].error == ""
