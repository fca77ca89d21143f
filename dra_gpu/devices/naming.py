"""Facts -> published devices: names, attributes and capacities (pure).

Compatibility contract (claims written for NVIDIA's driver must select our devices unchanged):

* full GPU ``gpu-<minor>``; MIG ``gpu-<parentMinor>-mig-<profile>-<giProfileId>-<placementStart>``
  where ``<profile>`` is the profile name lower-cased with everything but ``[a-z0-9]`` dropped
  (``1g.18gb`` -> ``1g18gb``, ``1g.18gb+me`` -> ``1g18gbme``) so the name stays a DNS label.
* the minor number, not the NVML index, names a GPU: the index follows PCI enumeration order and
  has changed across reboots, the minor is the ``/dev/nvidia<minor>`` node.
* a GPU with MIG enabled is published only through its MIG devices: its whole-GPU form cannot be
  handed to a container while MIG is on. With dynamic MIG (``GpuInfo.mig_dynamic``) those are
  every (profile, placement) of its table, named as the static MIG device of that placement
  would be, without ``uuid`` (prepare creates the device; ``dra_gpu.devices.partitions``).
* versions become semver (``580.159.04`` -> ``580.159.4``, ``9.0`` -> ``9.0.0``).
* ``addressingMode`` is NVML's mode as NVIDIA names it (``None``, ``HMM``, ``ATS``) and is left
  out only where NVML cannot answer (NOT_SUPPORTED); ``pcieRoot`` is left out when unknown rather
  than published empty.
* ``resource.kubernetes.io/numaNode`` is the GPU's NUMA node (a MIG device: its parent's), left
  out when unknown: a VM often cannot tell, and a guessed 0 would let ``matchAttribute`` pair
  GPUs that share no node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import MappingProxyType

from dra_gpu.devices import migprofiles, model, partitions
from dra_gpu.devices.model import (
    AttributeValue,
    Device,
    GpuInfo,
    MigDeviceInfo,
    MigPartition,
    Version,
)

_NOT_NAME_CHARS = re.compile(r"[^a-z0-9]")


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device_name(*, parent_minor: int, profile: str, gi_profile_id: int, start: int) -> str:
    compact = _NOT_NAME_CHARS.sub("", profile.lower())
    return f"gpu-{parent_minor}-mig-{compact}-{gi_profile_id}-{start}"


def compute_capability_version(cc: tuple[int, int]) -> Version:
    return Version(cc[0], cc[1], 0)


def _common_attributes(gpu: GpuInfo) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {
        model.ATTR_PRODUCT_NAME: gpu.product_name,
        model.ATTR_BRAND: gpu.brand,
        model.ATTR_ARCHITECTURE: gpu.architecture,
        model.ATTR_CUDA_COMPUTE_CAPABILITY: compute_capability_version(gpu.cuda_compute_capability),
        model.ATTR_DRIVER_VERSION: Version.parse(gpu.driver_version),
        model.ATTR_CUDA_DRIVER_VERSION: Version.parse(gpu.cuda_driver_version),
        model.ATTR_PCI_BUS_ID: gpu.pci_bus_id,
    }
    if gpu.pcie_root:
        attrs[model.ATTR_PCIE_ROOT] = gpu.pcie_root
    if gpu.numa_node is not None:
        attrs[model.ATTR_NUMA_NODE] = gpu.numa_node
    return attrs


def gpu_device(gpu: GpuInfo) -> Device:
    attrs: dict[str, AttributeValue] = {
        model.ATTR_TYPE: "gpu",
        model.ATTR_UUID: gpu.uuid,
        **_common_attributes(gpu),
    }
    if gpu.addressing_mode:
        attrs[model.ATTR_ADDRESSING_MODE] = gpu.addressing_mode
    return Device(
        name=gpu_device_name(gpu.minor),
        type="gpu",
        uuid=gpu.uuid,
        attributes=MappingProxyType(attrs),
        capacity=MappingProxyType({model.CAP_MEMORY: gpu.memory_bytes}),
        gpu=gpu,
    )


def mig_device(gpu: GpuInfo, mig: MigDeviceInfo) -> Device:
    capacity = {**mig.engines.capacities(), model.CAP_MEMORY: mig.memory_bytes}
    where = (mig.profile, mig.gi_profile_id, mig.placement_start)
    return _mig_device(gpu, where, capacity, uuid=mig.uuid, mig=mig)


def partition_device(gpu: GpuInfo, partition: MigPartition) -> Device:
    """A MIG device that prepare creates: the attributes of the static one, but no ``uuid``."""
    profile = migprofiles.TABLES[gpu.mig_table or ""].by_name(partition.profile)
    capacity = {**profile.engines.capacities(), model.CAP_MEMORY: profile.memory_bytes}
    where = (partition.profile, partition.gi_profile_id, partition.start)
    return _mig_device(gpu, where, capacity, uuid=None, partition=partition)


def _mig_device(
    gpu: GpuInfo,
    where: tuple[str, int, int],  # profile, GI profile id, placement start
    capacity: dict[str, int],
    *,
    uuid: str | None,
    mig: MigDeviceInfo | None = None,
    partition: MigPartition | None = None,
) -> Device:
    profile, gi_profile_id, start = where
    attrs: dict[str, AttributeValue] = {model.ATTR_TYPE: "mig"}
    if uuid is not None:
        attrs[model.ATTR_UUID] = uuid
    attrs |= {
        model.ATTR_PARENT_UUID: gpu.uuid,
        model.ATTR_PROFILE: profile,
        **_common_attributes(gpu),
    }
    name = mig_device_name(
        parent_minor=gpu.minor, profile=profile, gi_profile_id=gi_profile_id, start=start
    )
    return Device(
        name=name,
        type="mig",
        uuid=uuid,
        attributes=MappingProxyType(attrs),
        capacity=MappingProxyType(capacity),
        gpu=gpu,
        mig=mig,
        partition=partition,
    )


def _gpu_devices(gpu: GpuInfo) -> list[Device]:
    if not gpu.mig_enabled:
        return [gpu_device(gpu)]
    table = migprofiles.TABLES.get(gpu.mig_table or "")
    if gpu.mig_dynamic and table is not None:
        return [partition_device(gpu, p) for p in partitions.partitions(table, gpu.minor)]
    migs = sorted(gpu.mig_devices, key=lambda m: (m.placement_start, m.gi_id, m.ci_id))
    return [mig_device(gpu, mig) for mig in migs]


def build_devices(gpus: Iterable[GpuInfo]) -> list[Device]:
    """All devices a node publishes, ordered by GPU minor then MIG placement (deterministic).

    Raises ``ValueError`` if two devices would get the same name (two GPUs reporting one minor):
    publishing either would silently hide the other.
    """
    devices: list[Device] = []
    for gpu in sorted(gpus, key=lambda g: g.minor):
        devices += _gpu_devices(gpu)
    seen: set[str] = set()
    for d in devices:
        if d.name in seen:
            raise ValueError(f"two devices are named {d.name!r}; GPU minors must be unique")
        seen.add(d.name)
    return devices
