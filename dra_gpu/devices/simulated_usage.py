"""Usage of simulated GPUs, from a file the simulated node's workload writes (format in
docs/user/simulated-profiles.md#usage-of-simulated-gpus).

The file (``simulated-usage.json`` in the plugin's state directory) maps device names to what
they are doing; a device it does not list is idle (no process, 0 % utilization). It is read
again only when it changed. A file that cannot be parsed makes every sample carry the reason
as its ``error`` (and is logged once), so a typo shows rather than simulating idle GPUs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_gpu.devices.model import Device
from dra_gpu.devices.usage import DeviceUsage, ProcessUsage

log = logging.getLogger(__name__)

FILE_NAME = "simulated-usage.json"
IDLE_TEMPERATURE_C = 32.0
IDLE_POWER_W = 75.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SimProcess(_Strict):
    pid: int = Field(ge=1)
    pod_uid: str | None = Field(default=None, alias="podUID")
    memory_bytes: int = Field(default=0, ge=0, alias="memoryBytes")
    utilization: float | None = Field(default=None, ge=0, le=1)


class SimDeviceUsage(_Strict):
    utilization: float = Field(default=0.0, ge=0, le=1)
    memory_used_bytes: int | None = Field(default=None, ge=0, alias="memoryUsedBytes")
    temperature_celsius: float = Field(default=IDLE_TEMPERATURE_C, alias="temperatureCelsius")
    power_watts: float = Field(default=IDLE_POWER_W, ge=0, alias="powerWatts")
    ecc_uncorrected: int = Field(default=0, ge=0, alias="eccUncorrected")
    processes: list[SimProcess] = Field(default_factory=list)


class UsageFile(_Strict):
    devices: dict[str, SimDeviceUsage] = Field(default_factory=dict)


def parse(text: str) -> UsageFile:
    """The file's content; raises ValueError naming the problem."""
    try:
        return UsageFile.model_validate(json.loads(text) if text.strip() else {})
    except ValidationError as err:
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or '<top>'}: {e['msg']}" for e in err.errors()
        ]
        raise ValueError("; ".join(problems)) from None


def usage_of(device: Device, entry: SimDeviceUsage | None) -> DeviceUsage:
    """What ``device`` reports given its entry in the file (None: not listed, idle)."""
    entry = entry or SimDeviceUsage()
    total = device.mig.memory_bytes if device.mig is not None else device.gpu.memory_bytes
    processes = tuple(
        ProcessUsage(
            pid=p.pid,
            pod_uid=p.pod_uid,
            memory_bytes=p.memory_bytes,
            sm_ratio=p.utilization if p.utilization is not None else 0.0,
        )
        for p in entry.processes
    )
    used = entry.memory_used_bytes
    if used is None:
        used = sum(p.memory_bytes or 0 for p in processes)
    mig = device.mig is not None
    return DeviceUsage(
        utilization_ratio=None if mig else entry.utilization,
        memory_used_bytes=min(used, total),
        memory_total_bytes=total,
        temperature_celsius=None if mig else entry.temperature_celsius,
        power_watts=None if mig else entry.power_watts,
        ecc_uncorrected=None if mig else entry.ecc_uncorrected,
        processes=processes,
    )


class SimulatedUsageSampler:
    """``UsageSampler`` of a simulated node: the usage file, re-read when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._content: UsageFile | str = UsageFile()  # str: why the file cannot be used

    def _refresh(self) -> UsageFile | str:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._content = None, UsageFile()
            return self._content
        except OSError as err:
            return f"cannot read {self.path}: {err}"
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return self._content
        self._stamp = stamp
        try:
            self._content = parse(self.path.read_text())
        except (OSError, ValueError) as err:
            self._content = f"{self.path}: {err}"
            log.warning("simulated usage not used: %s", self._content)
        return self._content

    def sample(self, devices: Sequence[Device]) -> Mapping[str, DeviceUsage]:
        content = self._refresh()
        if isinstance(content, str):
            return {d.name: DeviceUsage(error=content) for d in devices}
        return {d.name: usage_of(d, content.devices.get(d.name)) for d in devices}

    def close(self) -> None:
        pass
