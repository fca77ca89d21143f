"""NVML backend: reads GPUs and existing MIG devices through pynvml. Read only.

Design:

* The pynvml module is a collaborator passed in (``nvml=``), so tests inject a fake that fails
  or hangs per call. Every NVML call goes through ``BoundedCaller``: a hung call becomes a
  ``CallTimeoutError`` naming the call instead of a hung driver.
* One failing GPU is logged and reported in ``Discovery.errors`` and skipped; the others are
  still published. After ``max_timeouts`` hung calls in one pass the remaining GPUs are reported
  without being touched, so a wedged driver costs at most ``max_timeouts * call_timeout_s``.
  Re-discovery passes while calls are still stuck fail at once (``BoundedCaller.max_stuck``), so
  a driver that stays wedged does not collect one abandoned thread per pass.
* The library is found under ``driver_root`` (:mod:`dra_gpu.devices.nvml_lib`) and handed to
  pynvml before the first ``nvmlInit``; until that succeeds every pass tries again and reports
  the paths it tried, so a driver that appears later is picked up.
* Each pass does ``nvmlInit``/``nvmlShutdown`` (NVML reference-counts them), so nothing stays
  open between passes and a driver upgrade under a running plugin is picked up.
* A MIG device whose compute instance is smaller than its GPU instance is reported and skipped:
  its name would collide with a sibling's (names are per GPU instance).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_gpu.devices import migprofiles, nvml_lib, pci
from dra_gpu.devices.bounded import BoundedCaller, CallTimeoutError
from dra_gpu.devices.model import (
    Discovery,
    DiscoveryError,
    DriverStatus,
    GpuInfo,
    MigDeviceInfo,
    MigEngines,
    Version,
)

log = logging.getLogger(__name__)

# NVML_BRAND_* -> the names NVIDIA's DRA driver publishes (so existing selectors keep matching).
BRAND_NAMES: Mapping[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}

# NVML_DEVICE_ARCH_*
ARCHITECTURE_NAMES: Mapping[int, str] = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    0xFFFFFFFF: "Unknown",
}

# NVML_DEVICE_ADDRESSING_MODE_*, named as NVIDIA's driver publishes them: NONE (0) is a mode
# like the others ("None", what the real H200 reports); only a GPU that cannot answer the query
# (NOT_SUPPORTED) goes without the attribute.
ADDRESSING_MODE_NAMES: Mapping[int, str] = {0: "None", 1: "HMM", 2: "ATS"}


class GpuReadError(Exception):
    """One NVML call failed; the message names the call and NVML's error, ``code`` its value."""

    def __init__(self, message: str, *, code: int | None) -> None:
        super().__init__(message)
        self.code = code


def _text(value: str | bytes) -> str:
    return (value.decode() if isinstance(value, bytes) else value).rstrip("\x00")


text = _text  # for dra_gpu.mig.nvml_instances


def profile_name(value: str | bytes) -> str:
    """NVML's GI profile name ("MIG 1g.18gb") as published ("1g.18gb")."""
    return _text(value).removeprefix("MIG ")


def _cuda_version_text(value: int) -> str:
    """``13000`` -> ``"13.0"``, the way NVML tools print it (``GpuInfo`` keeps raw text)."""
    version = Version.from_cuda_int(value)
    return f"{version.major}.{version.minor}"


# (NVML function, seconds, "ok" | "error" | "timeout") after each call: metrics, when served.
CallObserver = Callable[[str, float, str], None]


class NvmlBackend:
    """``GpuBackend`` over pynvml (or anything shaped like it)."""

    def __init__(
        self,
        *,
        nvml: Any = None,
        call_timeout_s: float = 10.0,
        max_timeouts: int = 2,
        sysfs_root: Path = Path("/sys"),
        driver_root: Path = Path("/"),
        open_library: nvml_lib.OpenLibrary = ctypes.CDLL,
        observe: CallObserver | None = None,
    ) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._caller = BoundedCaller(timeout_s=call_timeout_s, name="nvml")
        self._max_timeouts = max_timeouts
        self._sysfs_root = sysfs_root
        self._driver_root = driver_root
        self._open_library = open_library
        self._observe = observe
        self._timeouts = 0
        # one pass at a time: the per-pass timeout budget is per backend, not per thread
        self._pass_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------

    def _call(self, fn_name: str, *args: Any) -> Any:
        fn: Callable[..., Any] | None = getattr(self._nvml, fn_name, None)
        if fn is None:  # an older pynvml without this wrapper
            code = getattr(self._nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", None)
            raise GpuReadError(f"{fn_name}: not provided by this pynvml", code=code)
        start, outcome = time.perf_counter(), "error"
        try:
            result = self._caller.call(fn_name, lambda: fn(*args))
            outcome = "ok"
            return result
        except CallTimeoutError:
            self._timeouts += 1
            outcome = "timeout"
            raise
        except self._nvml.NVMLError as e:
            raise GpuReadError(f"{fn_name}: {e}", code=getattr(e, "value", None)) from e
        finally:
            if self._observe is not None:
                self._observe(fn_name, time.perf_counter() - start, outcome)

    def _is(self, err: GpuReadError, *codes: str) -> bool:
        return any(err.code == getattr(self._nvml, c, object()) for c in codes)

    # What dynamic MIG (dra_gpu.mig.nvml_instances) uses: the same bounded calls and lookups.
    def call(self, fn_name: str, *args: Any) -> Any:
        return self._call(fn_name, *args)

    def is_error(self, err: GpuReadError, *codes: str) -> bool:
        return self._is(err, *codes)

    @property
    def nvml(self) -> Any:
        return self._nvml

    def gi_profiles(self, h: Any) -> dict[int, Any]:
        return self._gi_profiles(h)

    def load_library(self) -> None:
        """For the telemetry sampler (``nvml_usage``); raises NvmlLibraryError."""
        self._load_library()

    def _load_library(self) -> None:
        """Hand pynvml the NVML under the driver root; raises NvmlLibraryError."""
        if not nvml_lib.needs_library(self._nvml):
            return
        handle, shown = nvml_lib.load(self._driver_root, open_library=self._open_library)
        if nvml_lib.install(self._nvml, handle):
            log.info("NVML loaded from %s", shown)

    # -- the driver --------------------------------------------------------------------------

    def driver_status(self) -> DriverStatus:
        """Whether NVML can be used, and the driver's versions: four bounded calls (init, two
        versions, shutdown), cheap enough for a look every few seconds. A library that cannot
        be loaded, an ``nvmlInit`` that fails or hangs (``Driver Not Loaded`` while the kernel
        modules are out; ``RM has detected an NVML/RM version mismatch`` when the library this
        process loaded is older than the kernel module now loaded) all read as not loaded."""
        with self._pass_lock:
            try:
                self._load_library()
            except nvml_lib.NvmlLibraryError as e:
                return DriverStatus(loaded=False, reason=str(e))
            try:
                self._call("nvmlInit")
            except (GpuReadError, CallTimeoutError) as e:
                return DriverStatus(loaded=False, reason=str(e))
            try:
                version = _text(self._call("nvmlSystemGetDriverVersion"))
                cuda = _cuda_version_text(int(self._call("nvmlSystemGetCudaDriverVersion")))
            except Exception as e:  # GpuReadError, CallTimeoutError or an unexpected answer
                return DriverStatus(loaded=False, reason=f"NVML system query failed: {e}")
            finally:
                try:
                    self._call("nvmlShutdown")
                except (GpuReadError, CallTimeoutError) as e:
                    log.warning("nvmlShutdown failed: %s", e)
            return DriverStatus(loaded=True, version=version, cuda_version=cuda)

    # -- discovery ------------------------------------------------------------------------

    def discover(self) -> Discovery:
        with self._pass_lock:
            self._timeouts = 0
            try:
                self._load_library()
            except nvml_lib.NvmlLibraryError as e:
                return _backend_failure(str(e))
            try:
                self._call("nvmlInit")
            except (GpuReadError, CallTimeoutError) as e:
                return _backend_failure(f"NVML could not be initialised: {e}")
            try:
                return self._discover_initialised()
            finally:
                try:
                    self._call("nvmlShutdown")
                except (GpuReadError, CallTimeoutError) as e:
                    log.warning("nvmlShutdown failed: %s", e)

    def _discover_initialised(self) -> Discovery:
        try:
            driver = _text(self._call("nvmlSystemGetDriverVersion"))
            cuda = _cuda_version_text(int(self._call("nvmlSystemGetCudaDriverVersion")))
            count = int(self._call("nvmlDeviceGetCount"))
        except Exception as e:  # GpuReadError, CallTimeoutError or an unexpected answer
            return _backend_failure(f"NVML system query failed: {e}")
        gpus: list[GpuInfo] = []
        errors: list[DiscoveryError] = []
        for index in range(count):
            if self._timeouts >= self._max_timeouts:
                msg = f"skipped: NVML stopped answering ({self._timeouts} calls timed out)"
                errors.append(DiscoveryError(index, msg))
                log.warning("skipping GPU index %d: %s", index, msg)
                continue
            try:
                gpu, mig_errors = self._read_gpu(index, driver=driver, cuda=cuda)
            except (GpuReadError, CallTimeoutError, ValueError) as e:
                errors.append(DiscoveryError(index, f"skipped: {e}"))
                log.warning("skipping GPU index %d: %s", index, e)
                continue
            except Exception as e:  # an NVML answer we did not expect: still one GPU only
                errors.append(DiscoveryError(index, f"skipped: unexpected {e!r}"))
                log.exception("skipping GPU index %d", index)
                continue
            gpus.append(gpu)
            errors.extend(mig_errors)
        return Discovery(gpus=tuple(gpus), errors=tuple(errors))

    def _read_gpu(
        self, index: int, *, driver: str, cuda: str
    ) -> tuple[GpuInfo, list[DiscoveryError]]:
        h = self._call("nvmlDeviceGetHandleByIndex", index)
        uuid = _text(self._call("nvmlDeviceGetUUID", h))
        name = _text(self._call("nvmlDeviceGetName", h))
        brand = int(self._call("nvmlDeviceGetBrand", h))
        arch = int(self._call("nvmlDeviceGetArchitecture", h))
        cc = self._call("nvmlDeviceGetCudaComputeCapability", h)
        bus_id = pci.normalize_bus_id(self._call("nvmlDeviceGetPciInfo", h).busId)
        mig_capable, mig_enabled = self._mig_mode(h)
        gpu = GpuInfo(
            minor=int(self._call("nvmlDeviceGetMinorNumber", h)),
            index=index,
            uuid=uuid,
            product_name=name,
            brand=BRAND_NAMES.get(brand, f"Unknown({brand})"),
            architecture=ARCHITECTURE_NAMES.get(arch, f"Unknown({arch})"),
            cuda_compute_capability=(int(cc[0]), int(cc[1])),
            driver_version=driver,
            cuda_driver_version=cuda,
            memory_bytes=int(self._call("nvmlDeviceGetMemoryInfo", h).total),
            pci_bus_id=bus_id,
            pcie_root=pci.pcie_root(bus_id, sysfs_root=self._sysfs_root),
            addressing_mode=self._addressing_mode(h),
            numa_node=self._numa_node(h, bus_id),
            mig_enabled=mig_enabled,
            mig_capable=mig_capable,
            mig_table=migprofiles.table_key_for_product(name),
        )
        if not mig_enabled:
            return gpu, []
        migs, errors = self._read_mig_devices(h, gpu)
        return replace(gpu, mig_devices=tuple(migs)), errors

    def _mig_mode(self, h: Any) -> tuple[bool, bool]:
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", h)
        except GpuReadError as e:
            if self._is(e, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return False, False
            raise
        return True, int(current) == int(getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _addressing_mode(self, h: Any) -> str | None:
        try:
            mode = self._call("nvmlDeviceGetAddressingMode", h)
        except GpuReadError as e:
            if self._is(e, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return None
            raise
        return ADDRESSING_MODE_NAMES.get(int(mode))

    def _numa_node(self, h: Any, bus_id: str) -> int | None:
        """NVML's answer, else sysfs's; None when neither knows (never a guessed 0 or -1)."""
        try:
            node = int(self._call("nvmlDeviceGetNumaNodeId", h))
        except GpuReadError as e:
            # Older drivers lack the call; VMs answer NOT_SUPPORTED (the H200 VM does).
            if not self._is(e, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                raise
        else:
            if node >= 0:
                return node
        return pci.numa_node(bus_id, sysfs_root=self._sysfs_root)

    # -- MIG --------------------------------------------------------------------------------

    def _gi_profiles(self, h: Any) -> dict[int, Any]:
        """GPU-instance profile id -> NVML profile info, for the profiles this GPU supports."""
        found: dict[int, Any] = {}
        for p in range(int(getattr(self._nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 16))):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", h, p)
            except GpuReadError as e:
                if self._is(e, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                    continue
                raise
            found[int(info.id)] = info
        return found

    def _read_mig_devices(
        self, h: Any, gpu: GpuInfo
    ) -> tuple[list[MigDeviceInfo], list[DiscoveryError]]:
        profiles = self._gi_profiles(h)
        migs: list[MigDeviceInfo] = []
        errors: list[DiscoveryError] = []
        for j in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", h))):
            try:
                mh = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            except GpuReadError as e:
                if self._is(e, "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"):
                    continue
                raise
            try:
                migs.append(self._read_mig(h, mh, gpu, profiles))
            except (GpuReadError, ValueError, KeyError) as e:
                msg = f"MIG device {j} skipped: {e}"
                errors.append(DiscoveryError(gpu.index, msg))
                log.warning("GPU index %d: %s", gpu.index, msg)
        return migs, errors

    def _read_mig(self, h: Any, mh: Any, gpu: GpuInfo, profiles: dict[int, Any]) -> MigDeviceInfo:
        uuid = _text(self._call("nvmlDeviceGetUUID", mh))
        gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mh))
        ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", mh))
        gi = self._call("nvmlDeviceGetGpuInstanceById", h, gi_id)
        gi_info = self._call("nvmlGpuInstanceGetInfo", gi)
        ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
        ci_info = self._call("nvmlComputeInstanceGetInfo", ci)
        attrs = self._call("nvmlDeviceGetAttributes", mh)
        if int(attrs.computeInstanceSliceCount) != int(attrs.gpuInstanceSliceCount):
            raise ValueError(
                f"{uuid}: compute instance uses {attrs.computeInstanceSliceCount} of "
                f"{attrs.gpuInstanceSliceCount} slices; only whole-GI MIG devices are supported"
            )
        prof = profiles[int(gi_info.profileId)]
        return MigDeviceInfo(
            parent_minor=gpu.minor,
            parent_uuid=gpu.uuid,
            uuid=uuid,
            profile=profile_name(prof.name),
            gi_profile_id=int(gi_info.profileId),
            ci_profile_id=int(ci_info.profileId),
            gi_id=gi_id,
            ci_id=ci_id,
            placement_start=int(gi_info.placement.start),
            placement_size=int(gi_info.placement.size),
            memory_bytes=int(prof.memorySizeMB) * migprofiles.MIB,
            engines=MigEngines(
                multiprocessors=int(prof.multiprocessorCount),
                copy_engines=int(prof.copyEngineCount),
                decoders=int(prof.decoderCount),
                encoders=int(prof.encoderCount),
                jpeg_engines=int(prof.jpegCount),
                ofa_engines=int(prof.ofaCount),
            ),
        )


def _backend_failure(message: str) -> Discovery:
    log.error("%s", message)
    return Discovery(gpus=(), errors=(DiscoveryError(None, message),))
