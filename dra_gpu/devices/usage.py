"""What a GPU is doing now: one sample per device, with the processes on it. Plain values.

Samplers (``nvml_usage`` on real GPUs, ``simulated_usage`` on simulated nodes; the platform
picks one) return a :class:`DeviceUsage` per published device, keyed by device name. A value
NVML cannot give for a device (utilization of a MIG device, power under some hypervisors) is
None, never 0: a 0 would read as an idle GPU. A process carries the UID of the pod it runs in
when its cgroup names one (:mod:`dra_gpu.devices.cgroups`), else None (a process outside
Kubernetes, or one whose ``/proc`` entry is not visible here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_gpu.devices.model import Device


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    pod_uid: str | None
    memory_bytes: int | None
    # This process's share of the SMs over the last interval (0..1); None when the device
    # cannot tell (a MIG device). Under MPS the MPS server holds it all and its clients read 0.
    sm_ratio: float | None = None


@dataclass(frozen=True)
class DeviceUsage:
    utilization_ratio: float | None = None  # SM utilization, 0..1
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors since the driver loaded
    processes: tuple[ProcessUsage, ...] = ()
    error: str = ""  # why the sample is missing or partial; "" when complete


class UsageSampler(Protocol):
    def sample(self, devices: Sequence[Device]) -> Mapping[str, DeviceUsage]:
        """One sample per device name; a device that cannot be read has ``error`` set."""
        ...

    def close(self) -> None: ...
