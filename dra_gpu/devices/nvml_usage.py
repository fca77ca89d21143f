"""Usage samples of real GPUs through NVML: per device utilization, memory, temperature, power,
uncorrected ECC count, and the compute processes with their memory and SM share.

Design:

* Every NVML call goes through the backend's bounded caller (:class:`nvml.NvmlBackend`, its own
  worker), as discovery does: a wedged GPU turns into an ``error`` on its sample, not a hung
  telemetry loop. After ``max_timeouts`` hung calls in one pass the remaining devices are
  reported without being touched.
* NVML is initialised at the first sample and kept initialised until :meth:`close` (NVML
  counts ``nvmlInit``; discovery's own init/shutdown pairs nest inside), so a pass costs only
  the per-device reads. A failed init is tried again at the next pass.
* A value the device does not support (utilization and power of MIG devices, temperature
  under some hypervisors) is None. Per-process SM shares come from
  ``nvmlDeviceGetProcessUtilization`` since the previous pass's newest sample; under MPS only
  the MPS server gets samples (its clients read 0), which is why the series leave per-pod
  utilization out for MPS claims.
* Processes are mapped to pods through ``<proc_root>/<pid>/cgroup`` (:mod:`cgroups`): the
  plugin sees the host's PIDs only when it runs in the host's PID namespace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_gpu.devices import cgroups
from dra_gpu.devices.bounded import CallTimeoutError
from dra_gpu.devices.model import Device
from dra_gpu.devices.nvml import CallObserver, GpuReadError, NvmlBackend
from dra_gpu.devices.usage import DeviceUsage, ProcessUsage

log = logging.getLogger(__name__)

_OPTIONAL = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
)


class NvmlUsageSampler:
    """``UsageSampler`` over NVML (or anything shaped like pynvml)."""

    def __init__(
        self,
        *,
        nvml: Any = None,
        driver_root: Path = Path("/"),
        proc_root: Path = Path("/proc"),
        call_timeout_s: float = 10.0,
        max_timeouts: int = 2,
        observe: CallObserver | None = None,
        pod_of: Callable[[int], str | None] | None = None,
    ) -> None:
        self._backend = NvmlBackend(
            nvml=nvml, driver_root=driver_root, call_timeout_s=call_timeout_s, observe=observe
        )
        self._max_timeouts = max_timeouts
        self._pod_of = pod_of or (lambda pid: cgroups.pod_uid_of_pid(pid, proc_root=proc_root))
        self._initialised = False
        self._last_seen: dict[str, int] = {}  # device UUID -> newest process sample (µs)

    def _ensure_init(self) -> str:
        """ "" once NVML is initialised, else why not."""
        if self._initialised:
            return ""
        try:
            self._backend.load_library()
            self._backend.call("nvmlInit")
        except Exception as err:  # NvmlLibraryError, GpuReadError, CallTimeoutError
            return f"NVML could not be initialised: {err}"
        self._initialised = True
        return ""

    def sample(self, devices: Sequence[Device]) -> Mapping[str, DeviceUsage]:
        failure = self._ensure_init()
        if failure:
            return {d.name: DeviceUsage(error=failure) for d in devices}
        out: dict[str, DeviceUsage] = {}
        timeouts = 0
        for device in devices:
            if device.uuid is None:
                continue  # a dynamic MIG placement not created: nothing to read
            if timeouts >= self._max_timeouts:
                out[device.name] = DeviceUsage(error="skipped: NVML stopped answering")
                continue
            try:
                out[device.name] = self._read(device.uuid, mig=device.mig is not None)
            except CallTimeoutError as err:
                timeouts += 1
                out[device.name] = DeviceUsage(error=str(err))
            except GpuReadError as err:
                out[device.name] = DeviceUsage(error=str(err))
            except Exception as err:  # an NVML answer we did not expect: this device only
                log.exception("telemetry of %s", device.name)
                out[device.name] = DeviceUsage(error=f"unexpected {err!r}")
        return out

    def _optional(self, fn_name: str, *args: Any) -> Any:
        """The call's answer, or None when the device does not support it."""
        try:
            return self._backend.call(fn_name, *args)
        except GpuReadError as err:
            if self._backend.is_error(err, *_OPTIONAL):
                return None
            raise

    def _read(self, uuid: str, *, mig: bool) -> DeviceUsage:
        nvml = self._backend.nvml
        h = self._backend.call("nvmlDeviceGetHandleByUUID", uuid)
        memory = self._backend.call("nvmlDeviceGetMemoryInfo", h)
        rates = None if mig else self._optional("nvmlDeviceGetUtilizationRates", h)
        temperature = None if mig else self._optional("nvmlDeviceGetTemperature", h, 0)
        power_mw = None if mig else self._optional("nvmlDeviceGetPowerUsage", h)
        ecc = (
            None
            if mig
            else self._optional(
                "nvmlDeviceGetTotalEccErrors",
                h,
                getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                getattr(nvml, "NVML_VOLATILE_ECC", 0),
            )
        )
        running = self._optional("nvmlDeviceGetComputeRunningProcesses", h) or ()
        shares = None if mig else self._process_shares(uuid, h)
        processes = tuple(
            ProcessUsage(
                pid=int(p.pid),
                pod_uid=self._pod_of(int(p.pid)),
                memory_bytes=_memory(p.usedGpuMemory),
                sm_ratio=None if shares is None else shares.get(int(p.pid), 0.0),
            )
            for p in running
        )
        return DeviceUsage(
            utilization_ratio=None if rates is None else int(rates.gpu) / 100,
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if power_mw is None else int(power_mw) / 1000,
            ecc_uncorrected=None if ecc is None else int(ecc),
            processes=processes,
        )

    def _process_shares(self, uuid: str, h: Any) -> dict[int, float] | None:
        """pid -> mean SM share of its samples since the last pass (a process without samples
        used none); None when the device cannot tell."""
        since = self._last_seen.get(uuid, 0)
        try:
            samples = self._backend.call("nvmlDeviceGetProcessUtilization", h, since)
        except GpuReadError as err:
            if self._backend.is_error(err, "NVML_ERROR_NOT_FOUND"):
                return {}  # no process used the SMs since ``since``
            if self._backend.is_error(err, *_OPTIONAL):
                return None
            raise
        sums: dict[int, list[float]] = {}
        newest = since
        for s in samples or ():
            newest = max(newest, int(s.timeStamp))
            sums.setdefault(int(s.pid), []).append(int(s.smUtil) / 100)
        self._last_seen[uuid] = newest
        return {pid: sum(v) / len(v) for pid, v in sums.items()}

    def close(self) -> None:
        if not self._initialised:
            return
        self._initialised = False
        try:
            self._backend.call("nvmlShutdown")
        except (GpuReadError, CallTimeoutError) as err:
            log.warning("nvmlShutdown failed: %s", err)


def _memory(value: Any) -> int | None:
    """A process's memory; NVML answers an all-ones value when it cannot tell (no permission)."""
    if value is None:
        return None
    used = int(value)
    return None if used >= 0xFFFFFFFFFFFF else used
