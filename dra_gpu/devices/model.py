"""Device model: what discovery found on a node, as plain immutable values.

Two layers:

* ``GpuInfo`` / ``MigDeviceInfo`` are the *facts* a backend (NVML or simulated) reports, in
  backend-neutral units (bytes, counts, raw version strings as NVML prints them).
* ``Device`` is what we *publish*: a DRA device name, its attributes and capacities, built from the
  facts by the pure function ``dra_gpu.devices.naming.build_devices``.

Invariants: every value here is a frozen dataclass or a tuple/mapping built once, so a
``Discovery`` can be shared between threads (publisher, health, prepare) without copying.
Attribute values are ``bool | int | str | Version``; ``Version`` is kept distinct from ``str``
because the API encodes the two differently (``{"version": ...}`` vs ``{"string": ...}``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

DeviceType = Literal["gpu", "mig"]

_NUMERIC_PARTS = re.compile(r"^\d+(\.\d+)*$")


@dataclass(frozen=True, order=True)
class Version:
    """A semantic version ``major.minor.patch`` without pre-release or build parts.

    NVML prints versions with leading zeros (``580.159.04``) or fewer parts (``9.0``); semver
    forbids leading zeros and needs three parts, so everything goes through ``parse``.
    """

    major: int
    minor: int = 0
    patch: int = 0

    def __post_init__(self) -> None:
        if min(self.major, self.minor, self.patch) < 0:
            raise ValueError(f"version parts must be >= 0, got {self}")

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @classmethod
    def parse(cls, text: str) -> Version:
        """Parse ``"580.159.04"`` -> 580.159.4, ``"9.0"`` -> 9.0.0, ``"13"`` -> 13.0.0.

        More than three numeric parts are refused rather than silently truncated, since two
        different driver builds must never compare equal.
        """
        cleaned = text.strip()
        if not _NUMERIC_PARTS.match(cleaned):
            raise ValueError(f"not a numeric version: {text!r}")
        parts = [int(p) for p in cleaned.split(".")]
        if len(parts) > 3:
            raise ValueError(f"version has more than three parts: {text!r}")
        parts += [0] * (3 - len(parts))
        return cls(parts[0], parts[1], parts[2])

    @classmethod
    def from_cuda_int(cls, value: int) -> Version:
        """NVML's CUDA driver version integer (``13000`` = 13.0, ``12080`` = 12.8)."""
        if value < 0:
            raise ValueError(f"negative CUDA version {value}")
        return cls(value // 1000, (value % 1000) // 10, 0)


AttributeValue = bool | int | str | Version


@dataclass(frozen=True)
class MigEngines:
    """What one MIG instance gets of its GPU's units (NVML's GPU-instance profile counts).

    Shared by a profile (what any instance of it gets) and an existing MIG device.
    """

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int

    def capacities(self) -> dict[str, int]:
        """As published: capacity name -> count."""
        return {
            CAP_MULTIPROCESSORS: self.multiprocessors,
            CAP_COPY_ENGINES: self.copy_engines,
            CAP_DECODERS: self.decoders,
            CAP_ENCODERS: self.encoders,
            CAP_JPEG_ENGINES: self.jpeg_engines,
            CAP_OFA_ENGINES: self.ofa_engines,
        }


@dataclass(frozen=True)
class MigDeviceInfo:
    """One existing MIG device (a GPU instance plus one compute instance inside it)."""

    parent_minor: int
    parent_uuid: str
    uuid: str
    profile: str  # e.g. "1g.18gb" (or "1c.2g.20gb" when the CI is smaller than its GI)
    gi_profile_id: int
    ci_profile_id: int
    gi_id: int
    ci_id: int
    placement_start: int  # in memory slices
    placement_size: int  # in memory slices
    memory_bytes: int
    engines: MigEngines


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as a backend found it."""

    minor: int
    index: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    driver_version: str  # raw, as NVML prints it ("580.159.04")
    cuda_driver_version: str  # "13.0"
    memory_bytes: int
    pci_bus_id: str  # "0000:00:06.0", sysfs form (4-digit domain, lower case)
    pcie_root: str | None  # "pci0000:00"; None when sysfs could not tell
    addressing_mode: str | None  # "None" / "HMM" / "ATS"; None when NVML cannot tell
    mig_enabled: bool
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    mig_capable: bool = False
    # Key into dra_gpu.devices.migprofiles (e.g. "H200-141GB"); None when unknown.
    mig_table: str | None = None
    # Dynamic MIG (the node's setting): MIG devices are created for claims, so every
    # (profile, placement) is published as a partition of the GPU (docs/concepts/dynamic-mig.md).
    mig_dynamic: bool = False
    # The GPU's NUMA node (>= 0); None when neither NVML nor sysfs knows it (common in VMs),
    # so an unknown node is never published as node 0 or -1.
    numa_node: int | None = None


@dataclass(frozen=True)
class MigPartition:
    """A MIG device that prepare creates: one (profile, placement) of a dynamic-MIG GPU.

    ``consumes``: the counters it takes from its GPU's counter set ``counter_set``, whose full
    values are ``gpu_counters``; the scheduler never lets allocated partitions exceed them.
    """

    profile: str
    gi_profile_id: int
    ci_profile_id: int
    start: int  # placement start, in memory slices
    size: int  # in memory slices
    counter_set: str
    consumes: Mapping[str, int]
    gpu_counters: Mapping[str, int]

    @property
    def set_counters(self) -> Mapping[str, int]:
        """The kit's name for the whole set (``kubeletplugin.slices.CounterUse``)."""
        return self.gpu_counters


@dataclass(frozen=True)
class Device:
    """A device as published in a ResourceSlice."""

    name: str
    type: DeviceType
    uuid: str | None  # None only for MIG devices that do not exist yet (dynamic MIG)
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, int]
    gpu: GpuInfo
    mig: MigDeviceInfo | None = None
    partition: MigPartition | None = None  # dynamic MIG: created by prepare


@dataclass(frozen=True)
class DiscoveryError:
    """A GPU (or the whole backend) that could not be read; reported, never fatal."""

    index: int | None  # NVML index of the failing GPU; None for a backend-wide failure
    message: str

    def __str__(self) -> str:
        where = "backend" if self.index is None else f"GPU index {self.index}"
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class Discovery:
    """Result of one discovery pass: the GPUs that could be read plus what went wrong."""

    gpus: tuple[GpuInfo, ...]
    errors: tuple[DiscoveryError, ...] = field(default=())


@dataclass(frozen=True)
class DriverStatus:
    """One look at the kernel driver through NVML: loaded (and its versions, as NVML prints
    them) or not, and why not (NVML's own words, e.g. ``nvmlInit: Driver Not Loaded``)."""

    loaded: bool
    version: str = ""  # "580.159.04"
    cuda_version: str = ""  # "13.0"
    reason: str = ""  # why it is not loaded


class GpuBackend(Protocol):
    """Source of GPU facts. Implementations: ``NvmlBackend``, ``SimulatedBackend``."""

    def discover(self) -> Discovery:
        """Read all GPUs; per-GPU failures go to ``Discovery.errors``, never raised."""
        ...


# --- names we publish (attributes unprefixed are in the driver's domain) --------------------

ATTR_TYPE = "type"
ATTR_UUID = "uuid"
ATTR_PARENT_UUID = "parentUUID"
ATTR_PROFILE = "profile"
ATTR_PRODUCT_NAME = "productName"
ATTR_BRAND = "brand"
ATTR_ARCHITECTURE = "architecture"
ATTR_CUDA_COMPUTE_CAPABILITY = "cudaComputeCapability"
ATTR_DRIVER_VERSION = "driverVersion"
ATTR_CUDA_DRIVER_VERSION = "cudaDriverVersion"
ATTR_ADDRESSING_MODE = "addressingMode"
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
ATTR_NUMA_NODE = "resource.kubernetes.io/numaNode"

CAP_MEMORY = "memory"
CAP_MULTIPROCESSORS = "multiprocessors"
CAP_COPY_ENGINES = "copyEngines"
CAP_DECODERS = "decoders"
CAP_ENCODERS = "encoders"
CAP_JPEG_ENGINES = "jpegEngines"
CAP_OFA_ENGINES = "ofaEngines"

_COMMON_ATTRIBUTES: tuple[str, ...] = (
    ATTR_TYPE,
    ATTR_UUID,
    ATTR_PRODUCT_NAME,
    ATTR_BRAND,
    ATTR_ARCHITECTURE,
    ATTR_CUDA_COMPUTE_CAPABILITY,
    ATTR_DRIVER_VERSION,
    ATTR_CUDA_DRIVER_VERSION,
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    ATTR_NUMA_NODE,
)

#: Every attribute a full GPU may carry (``addressingMode``, ``pcieRoot`` and ``numaNode``
#: only when known).
GPU_ATTRIBUTE_NAMES: frozenset[str] = frozenset((*_COMMON_ATTRIBUTES, ATTR_ADDRESSING_MODE))
#: Every attribute a MIG device may carry (``uuid`` only for MIG devices that exist).
MIG_ATTRIBUTE_NAMES: frozenset[str] = frozenset(
    (*_COMMON_ATTRIBUTES, ATTR_PARENT_UUID, ATTR_PROFILE)
)
ATTRIBUTE_NAMES: frozenset[str] = GPU_ATTRIBUTE_NAMES | MIG_ATTRIBUTE_NAMES

GPU_CAPACITY_NAMES: frozenset[str] = frozenset((CAP_MEMORY,))
MIG_CAPACITY_NAMES: frozenset[str] = frozenset(
    (
        CAP_MULTIPROCESSORS,
        CAP_COPY_ENGINES,
        CAP_DECODERS,
        CAP_ENCODERS,
        CAP_JPEG_ENGINES,
        CAP_OFA_ENGINES,
        CAP_MEMORY,
    )
)
CAPACITY_NAMES: frozenset[str] = GPU_CAPACITY_NAMES | MIG_CAPACITY_NAMES

#: Attribute name -> the kind of value it holds (for docs, webhook hints and tests).
ATTRIBUTE_KINDS: Mapping[str, type] = {
    ATTR_TYPE: str,
    ATTR_UUID: str,
    ATTR_PARENT_UUID: str,
    ATTR_PROFILE: str,
    ATTR_PRODUCT_NAME: str,
    ATTR_BRAND: str,
    ATTR_ARCHITECTURE: str,
    ATTR_CUDA_COMPUTE_CAPABILITY: Version,
    ATTR_DRIVER_VERSION: Version,
    ATTR_CUDA_DRIVER_VERSION: Version,
    ATTR_ADDRESSING_MODE: str,
    ATTR_PCI_BUS_ID: str,
    ATTR_PCIE_ROOT: str,
    ATTR_NUMA_NODE: int,
}
