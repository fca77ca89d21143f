"""``MigInstances`` through pynvml: create and destroy GPU + compute instances.

Every call goes through the NVML backend's bounded call (a hung driver becomes a named error, not
a hung prepare) and each operation runs between its own ``nvmlInit``/``nvmlShutdown``, as
discovery does. Creation: ``nvmlDeviceCreateGpuInstanceWithPlacement`` at the partition's
placement, then ``nvmlGpuInstanceCreateComputeInstance`` with the compute-instance profile that
spans the GI (``migprofiles.FULL_CI_PROFILE_ID``); if the CI cannot be created the GI is
destroyed again, so a failed create leaves the GPU as it was. Destruction checks that the GI
with that ID still has the expected placement and profile before it destroys anything (GI IDs
are reused), and treats NOT_FOUND as already destroyed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dra_gpu.devices.bounded import CallTimeoutError
from dra_gpu.devices.model import GpuInfo, MigPartition
from dra_gpu.devices.nvml import GpuReadError, NvmlBackend, profile_name, text
from dra_gpu.mig.instances import InstanceError, MigInstance


class NvmlInstances:
    """``MigInstances`` over pynvml; ``backend`` provides the bounded calls."""

    def __init__(self, backend: NvmlBackend) -> None:
        self._backend = backend
        self._nvml: Any = backend.nvml

    @contextmanager
    def _session(self, what: str) -> Iterator[None]:
        try:
            self._backend.call("nvmlInit")
        except (GpuReadError, CallTimeoutError) as exc:
            raise InstanceError(f"{what}: NVML could not be initialised: {exc}") from exc
        try:
            yield
        except (GpuReadError, CallTimeoutError) as exc:
            raise InstanceError(f"{what}: {exc}") from exc
        finally:
            with contextlib.suppress(GpuReadError, CallTimeoutError):
                self._backend.call("nvmlShutdown")  # the next session initialises again

    def _call(self, fn: str, *args: Any) -> Any:
        return self._backend.call(fn, *args)

    def list(self, gpu_uuid: str) -> list[MigInstance]:
        with self._session(f"listing MIG devices of {gpu_uuid}"):
            h = self._call("nvmlDeviceGetHandleByUUID", gpu_uuid)
            return list(self._instances(h, gpu_uuid))

    def _instances(self, h: Any, gpu_uuid: str) -> Iterator[MigInstance]:
        profiles = self._backend.gi_profiles(h)
        for j in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", h))):
            try:
                mh = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            except GpuReadError as exc:
                if self._backend.is_error(
                    exc, "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"
                ):
                    continue
                raise
            gi_id = int(self._call("nvmlDeviceGetGpuInstanceId", mh))
            ci_id = int(self._call("nvmlDeviceGetComputeInstanceId", mh))
            gi = self._call("nvmlDeviceGetGpuInstanceById", h, gi_id)
            info = self._call("nvmlGpuInstanceGetInfo", gi)
            profile = profiles.get(int(info.profileId))
            yield MigInstance(
                gpu_uuid=gpu_uuid,
                profile=profile_name(profile.name) if profile is not None else "?",
                gi_profile_id=int(info.profileId),
                start=int(info.placement.start),
                size=int(info.placement.size),
                gi_id=gi_id,
                ci_id=ci_id,
                uuid=text(self._call("nvmlDeviceGetUUID", mh)),
            )

    def create(self, gpu: GpuInfo, partition: MigPartition) -> MigInstance:
        what = f"creating MIG {partition.profile}@{partition.start} on {gpu.uuid}"
        with self._session(what):
            h = self._call("nvmlDeviceGetHandleByUUID", gpu.uuid)
            placement = self._nvml.c_nvmlGpuInstancePlacement_t()
            placement.start = partition.start
            placement.size = partition.size
            gi = self._call(
                "nvmlDeviceCreateGpuInstanceWithPlacement", h, partition.gi_profile_id, placement
            )
            try:
                ci_profile = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    gi,
                    partition.ci_profile_id,
                    self._nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
                self._call("nvmlGpuInstanceCreateComputeInstance", gi, ci_profile.id)
            except (GpuReadError, CallTimeoutError):
                self._call("nvmlGpuInstanceDestroy", gi)  # leave the GPU as it was
                raise
            gi_id = int(self._call("nvmlGpuInstanceGetInfo", gi).id)
            for instance in self._instances(h, gpu.uuid):
                if instance.gi_id == gi_id:
                    return instance
            raise InstanceError(f"{what}: GPU instance {gi_id} created but no MIG device found")

    def destroy(self, gpu_uuid: str, instance: MigInstance) -> bool:
        with self._session(f"destroying MIG device {instance}"):
            h = self._call("nvmlDeviceGetHandleByUUID", gpu_uuid)
            try:
                gi = self._call("nvmlDeviceGetGpuInstanceById", h, instance.gi_id)
            except GpuReadError as exc:
                if self._backend.is_error(
                    exc, "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"
                ):
                    return False
                raise
            info = self._call("nvmlGpuInstanceGetInfo", gi)
            if (int(info.placement.start), int(info.profileId)) != (
                instance.start,
                instance.gi_profile_id,
            ):
                return False  # the ID was reused by another instance: ours is gone
            try:
                ci = self._call("nvmlGpuInstanceGetComputeInstanceById", gi, instance.ci_id)
                self._call("nvmlComputeInstanceDestroy", ci)
            except GpuReadError as exc:
                if not self._backend.is_error(exc, "NVML_ERROR_NOT_FOUND"):
                    raise
            self._call("nvmlGpuInstanceDestroy", gi)
            return True
