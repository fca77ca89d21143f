"""A fake pynvml module for NvmlBackend tests: real error types, scripted answers and faults.

GPU facts default to the real H200 of shared/fixtures/nvml-h200.json. Faults are keyed by
``(function name, GPU index)``: ``fail`` raises that NVML error, ``hang`` blocks until the test
releases it (the fixture that owns the fake always releases, so no thread outlives a test).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from dra_gpu.devices import migprofiles


@dataclass
class FakeMig:
    uuid: str
    gi_id: int
    profile: migprofiles.MigProfile
    start: int
    ci_slices: int | None = None  # compute slices of the CI; None = whole GI
    has_ci: bool = True  # False between GPU-instance and compute-instance creation


@dataclass
class FakeGpu:
    index: int
    minor: int
    uuid: str = "GPU-dca98826-84b3-01c9-07e5-0760ceb4833e"
    name: str = "NVIDIA H200"
    brand: int = 14
    arch: int = 9
    cc: tuple[int, int] = (9, 0)
    memory_total: int = 150754820096
    bus_id: bytes = b"00000000:00:06.0"
    mig_mode: tuple[int, int] | None = (0, 0)  # None: NOT_SUPPORTED
    addressing_mode: int | None = 0  # None: NOT_SUPPORTED
    numa_node: int | None = None  # None: NOT_SUPPORTED, what the fixture's H200 VM answers
    mig_table: migprofiles.MigTable = migprofiles.H200_141GB
    migs: list[FakeMig] = field(default_factory=list)
    ecc_uncorrected: int | None = 0  # None: NOT_SUPPORTED (ECC off)


class FakeNvml:
    """Duck-types the parts of pynvml that NvmlBackend uses."""

    NVMLError = pynvml.NVMLError
    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.fail: dict[tuple[str, int | None], int] = {}
        self.hang: set[tuple[str, int | None]] = set()
        self.release = threading.Event()
        self.calls: list[str] = []
        self.driver_version = "580.159.04"
        # events: what the H200 answered, and (GPU index, event type, data) waiting to be read
        self.supported_events = 0xFF9F
        self.registered: dict[int, int] = {}
        self.pending: list[tuple[int, int, int]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML_"):  # constants come from the real module
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _enter(self, fn: str, index: int | None) -> None:
        self.calls.append(fn)
        if (fn, index) in self.hang:
            self.release.wait(timeout=30)
        code = self.fail.get((fn, index))
        if code is not None:
            raise pynvml.NVMLError(code)

    @staticmethod
    def _idx(h: Any) -> int:
        return int(h.index if isinstance(h, FakeGpu) else h.parent.index)

    # system
    def nvmlInit(self) -> None:
        self._enter("nvmlInit", None)

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", None)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion", None)
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion", None)
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", None)
        return len(self.gpus)

    # GPU
    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self._enter("nvmlDeviceGetHandleByIndex", i)
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        self._enter("nvmlDeviceGetUUID", self._idx(h))
        return str(h.uuid)

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        self._enter("nvmlDeviceGetName", h.index)
        return h.name

    def nvmlDeviceGetBrand(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetBrand", h.index)
        return h.brand

    def nvmlDeviceGetArchitecture(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetArchitecture", h.index)
        return h.arch

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability", h.index)
        return h.cc

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", h.index)
        return SimpleNamespace(busId=h.bus_id)

    def nvmlDeviceGetMinorNumber(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMinorNumber", h.index)
        return h.minor

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", h.index)
        return SimpleNamespace(total=h.memory_total, free=h.memory_total, used=0)

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        self._enter("nvmlDeviceGetMigMode", h.index)
        if h.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.mig_mode

    def nvmlDeviceGetAddressingMode(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetAddressingMode", h.index)
        if h.addressing_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.addressing_mode

    def nvmlDeviceGetNumaNodeId(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetNumaNodeId", h.index)
        if h.numa_node is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.numa_node

    # MIG
    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: FakeGpu, p: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", h.index)
        profiles = h.mig_table.profiles
        if p >= len(profiles):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        prof = profiles[p]
        return SimpleNamespace(
            id=prof.gi_profile_id,
            sliceCount=prof.compute_slices,
            memorySizeMB=prof.memory_mib,
            multiprocessorCount=prof.engines.multiprocessors,
            copyEngineCount=prof.engines.copy_engines,
            decoderCount=prof.engines.decoders,
            encoderCount=prof.engines.encoders,
            jpegCount=prof.engines.jpeg_engines,
            ofaCount=prof.engines.ofa_engines,
            name=f"MIG {prof.name}".encode(),
        )

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h.index)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, j: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h.index)
        devices = [m for m in h.migs if m.has_ci]  # a GI without a CI is no MIG device
        if j >= len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return SimpleNamespace(parent=h, mig=devices[j], uuid=devices[j].uuid)

    def nvmlDeviceGetGpuInstanceId(self, mh: SimpleNamespace) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", self._idx(mh))
        return int(mh.mig.gi_id)

    def nvmlDeviceGetComputeInstanceId(self, mh: SimpleNamespace) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", self._idx(mh))
        return 0

    def nvmlDeviceGetGpuInstanceById(self, h: FakeGpu, gi_id: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceById", h.index)
        mig = next((m for m in h.migs if m.gi_id == gi_id), None)
        if mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return SimpleNamespace(parent=h, mig=mig)

    def nvmlGpuInstanceGetInfo(self, gi: SimpleNamespace) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetInfo", self._idx(gi))
        m = gi.mig
        placement = SimpleNamespace(start=m.start, size=m.profile.memory_slices)
        return SimpleNamespace(id=m.gi_id, profileId=m.profile.gi_profile_id, placement=placement)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: SimpleNamespace, ci: int) -> Any:
        self._enter("nvmlGpuInstanceGetComputeInstanceById", self._idx(gi))
        if not gi.mig.has_ci:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gi

    def nvmlComputeInstanceGetInfo(self, ci: SimpleNamespace) -> SimpleNamespace:
        self._enter("nvmlComputeInstanceGetInfo", self._idx(ci))
        return SimpleNamespace(id=0, profileId=ci.mig.profile.ci_profile_id)

    def nvmlDeviceGetAttributes(self, mh: SimpleNamespace) -> SimpleNamespace:
        self._enter("nvmlDeviceGetAttributes", self._idx(mh))
        m = mh.mig
        g = m.profile.compute_slices
        return SimpleNamespace(gpuInstanceSliceCount=g, computeInstanceSliceCount=m.ci_slices or g)

    # MIG creation and destruction, with the real placement rules of the GPU's table
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, h: FakeGpu, profile_id: int, placement: Any
    ) -> SimpleNamespace:
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement", h.index)
        if h.mig_mode is None or h.mig_mode[0] != 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        prof = h.mig_table.by_gi_profile_id(profile_id)
        layout = [(m.profile.name, m.start) for m in h.migs] + [(prof.name, placement.start)]
        if placement.size != prof.memory_slices or migprofiles.layout_errors(h.mig_table, layout):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = 1 + max((m.gi_id for m in h.migs), default=0)
        mig = FakeMig(f"MIG-fake-{h.index}-{gi_id}", gi_id, prof, placement.start, has_ci=False)
        h.migs.append(mig)
        return SimpleNamespace(parent=h, mig=mig)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: SimpleNamespace, profile: int, engines: int
    ) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo", self._idx(gi))
        if profile != gi.mig.profile.ci_profile_id:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: SimpleNamespace, profile_id: int) -> Any:
        self._enter("nvmlGpuInstanceCreateComputeInstance", self._idx(gi))
        if gi.mig.has_ci:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi.mig.has_ci = True
        return gi

    def nvmlComputeInstanceDestroy(self, ci: SimpleNamespace) -> None:
        self._enter("nvmlComputeInstanceDestroy", self._idx(ci))
        ci.mig.has_ci = False

    def nvmlGpuInstanceDestroy(self, gi: SimpleNamespace) -> None:
        self._enter("nvmlGpuInstanceDestroy", self._idx(gi))
        if gi.mig.has_ci:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)
        gi.parent.migs.remove(gi.mig)

    # events
    def nvmlDeviceGetSupportedEventTypes(self, h: FakeGpu) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", h.index)
        return self.supported_events

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate", None)
        return object()

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, mask: int, event_set: object) -> None:
        self._enter("nvmlDeviceRegisterEvents", h.index)
        self.registered[h.index] = mask

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2", None)
        if not self.pending:
            self.release.wait(min(timeout_ms / 1000, 0.01))
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, event_type, data = self.pending.pop(0)
        return SimpleNamespace(device=self.gpus[index], eventType=event_type, eventData=data)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._enter("nvmlEventSetFree", None)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        gpu = next((g for g in self.gpus if g.uuid == uuid), None)
        self._enter("nvmlDeviceGetHandleByUUID", None if gpu is None else gpu.index)
        if gpu is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h.index)
        if h.ecc_uncorrected is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.ecc_uncorrected
