"""Simulated backend: GPUs described as data, for machines without GPUs (tests, demos, kind).

A ``SimProfile`` lists GPUs by product (facts from ``PRODUCTS``) with optional MIG layouts. The
backend turns it into the same ``GpuInfo`` values NVML would give, following the real rules:
MIG layouts are checked with ``migprofiles.layout_errors`` (valid placement starts, no shared
memory slice, engines within the GPU), and a GPU whose layout breaks them is reported as a
discovery error, exactly like a GPU NVML cannot read.

UUIDs are derived from (node name, profile name, minor[, GI id]) with SHA-256, so one node sees
the same UUIDs on every run and two nodes never share one.

Built-in profiles: ``h200x8`` (the real H200 of ``shared/fixtures``, eight of them),
``h100x8`` (H100 SXM 80GB HBM3), ``h100x8-mig`` (the same with MIG on and no MIG devices, for
dynamic MIG) and ``a100x4-mig`` (A100-SXM4-40GB, three with MIG layouts of
mixed profiles). Custom profiles are files read by ``dra_gpu.devices.simfile`` (format in
docs/user/simulated-profiles.md); ``dra_gpu.devices.profiles`` picks one of the two for
``--simulate``. This module imports neither pydantic nor yaml.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dra_gpu.devices import migprofiles
from dra_gpu.devices.model import (
    Discovery,
    DiscoveryError,
    DriverStatus,
    GpuInfo,
    MigDeviceInfo,
)
from dra_gpu.errors import UserError

MIB = migprofiles.MIB
log = logging.getLogger(__name__)
# pynvml's words when nvmlInit finds no kernel driver (NVML_ERROR_DRIVER_NOT_LOADED).
DRIVER_NOT_LOADED = "nvmlInit: Driver Not Loaded"


class ProfileError(UserError, ValueError):
    """A simulated profile cannot be used; the message lists every problem."""


@dataclass(frozen=True)
class Product:
    """Facts of one GPU product as NVML reports them."""

    key: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    mig_table: str | None


PRODUCTS: Mapping[str, Product] = {
    p.key: p
    for p in (
        # nvml-h200.json: name, brand 14, arch 9, CC 9.0, memory.total
        Product(
            "H200-141GB", "NVIDIA H200", "Nvidia", "Hopper", (9, 0), 150754820096, "H200-141GB"
        ),
        Product(
            "H100-80GB",
            "NVIDIA H100 80GB HBM3",
            "Nvidia",
            "Hopper",
            (9, 0),
            81559 * MIB,
            "H100-80GB",
        ),
        Product(
            "A100-SXM4-40GB",
            "NVIDIA A100-SXM4-40GB",
            "Nvidia",
            "Ampere",
            (8, 0),
            40960 * MIB,
            "A100-SXM4-40GB",
        ),
    )
}


@dataclass(frozen=True)
class SimMig:
    profile: str  # "3g.20gb"
    placement: int  # placement start, in memory slices


@dataclass(frozen=True)
class SimGpu:
    product: str  # key of PRODUCTS
    pci_bus_id: str
    pcie_root: str | None
    mig_enabled: bool = False
    mig_devices: tuple[SimMig, ...] = ()
    addressing_mode: str | None = "None"  # what NVML reports on the fixture's H200
    product_name: str | None = None  # overrides the product's
    memory_bytes: int | None = None  # overrides the product's
    numa_node: int | None = None  # None: unknown (left out, as on a VM)


@dataclass(frozen=True)
class SimProfile:
    name: str
    gpus: tuple[SimGpu, ...]
    driver_version: str = "580.159.04"  # from the fixture
    cuda_driver_version: str = "13.0"
    # False: the kernel driver is unloaded (an upgrade in progress): NVML cannot be initialised
    driver_loaded: bool = True


def default_pci(i: int) -> tuple[str, str]:
    """Bus ID and PCIe root for the i-th GPU when a profile does not say (one root per GPU)."""
    domain, slot = divmod(i, 14)
    bus = 0x18 + 0x10 * slot
    return f"{domain:04x}:{bus:02x}:00.0", f"pci{domain:04x}:{bus - 3:02x}"


# An HGX 8-GPU board: every GPU behind its own PCIe root; GPUs 0-3 on the first socket's NUMA
# node, 4-7 on the second's (two-socket hosts), so matchAttribute on numaNode pairs within a half.
_HGX_PCI = (
    ("0000:18:00.0", "pci0000:15"),
    ("0000:2a:00.0", "pci0000:27"),
    ("0000:3a:00.0", "pci0000:37"),
    ("0000:5d:00.0", "pci0000:59"),
    ("0000:9a:00.0", "pci0000:97"),
    ("0000:ab:00.0", "pci0000:a8"),
    ("0000:ba:00.0", "pci0000:b7"),
    ("0000:db:00.0", "pci0000:d7"),
)


def _hgx_numa(i: int) -> int:
    return i // 4


_A100 = "A100-SXM4-40GB"

BUILTIN_PROFILES: Mapping[str, SimProfile] = {
    "h200x8": SimProfile(
        name="h200x8",
        gpus=tuple(
            SimGpu("H200-141GB", bus, root, numa_node=_hgx_numa(i))
            for i, (bus, root) in enumerate(_HGX_PCI)
        ),
    ),
    "h100x8": SimProfile(
        name="h100x8",
        gpus=tuple(
            SimGpu("H100-80GB", bus, root, numa_node=_hgx_numa(i))
            for i, (bus, root) in enumerate(_HGX_PCI)
        ),
    ),
    # MIG on, no MIG devices: for nodes with --mig-mode=dynamic (claims create them).
    "h100x8-mig": SimProfile(
        name="h100x8-mig",
        gpus=tuple(
            SimGpu("H100-80GB", bus, root, mig_enabled=True, numa_node=_hgx_numa(i))
            for i, (bus, root) in enumerate(_HGX_PCI)
        ),
    ),
    "a100x4-mig": SimProfile(
        name="a100x4-mig",
        gpus=(
            # two GPUs per root complex, one root complex per socket (NUMA node), as on a
            # two-socket A100 server
            SimGpu(_A100, "0000:07:00.0", "pci0000:00", numa_node=0),
            SimGpu(
                _A100,
                "0000:0f:00.0",
                "pci0000:00",
                numa_node=0,
                mig_enabled=True,
                mig_devices=(
                    SimMig("2g.10gb", 0),
                    SimMig("1g.5gb", 2),
                    SimMig("1g.5gb", 3),
                    SimMig("3g.20gb", 4),
                ),
            ),
            SimGpu(
                _A100,
                "0000:47:00.0",
                "pci0000:40",
                numa_node=1,
                mig_enabled=True,
                mig_devices=(SimMig("4g.20gb", 0), SimMig("2g.10gb", 4), SimMig("1g.5gb+me", 6)),
            ),
            SimGpu(
                _A100,
                "0000:4e:00.0",
                "pci0000:40",
                numa_node=1,
                mig_enabled=True,
                mig_devices=(SimMig("3g.20gb", 0), SimMig("3g.20gb", 4)),
            ),
        ),
    ),
}


def fake_uuid(*parts: object) -> str:
    """A stable UUID-shaped string from ``parts`` (8-4-4-4-12 lower-case hex)."""
    h = hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def profile_errors(profile: SimProfile) -> list[str]:
    """Everything wrong with a profile, one message per problem, GPU by GPU."""
    errors: list[str] = []
    seen_bus: set[str] = set()
    for minor, gpu in enumerate(profile.gpus):
        errors += [f"gpu {minor}: {e}" for e in _gpu_errors(gpu)]
        if gpu.pci_bus_id in seen_bus:
            errors.append(f"gpu {minor}: PCI bus ID {gpu.pci_bus_id} used twice")
        seen_bus.add(gpu.pci_bus_id)
    return errors


def _gpu_errors(gpu: SimGpu) -> list[str]:
    product = PRODUCTS.get(gpu.product)
    if product is None:
        return [f"unknown product {gpu.product!r} (known: {', '.join(sorted(PRODUCTS))})"]
    if not gpu.mig_enabled:
        return ["MIG devices listed but MIG is not enabled"] if gpu.mig_devices else []
    if product.mig_table is None:
        return [f"{product.key} does not support MIG"]
    table = migprofiles.TABLES[product.mig_table]
    return migprofiles.layout_errors(table, [(m.profile, m.placement) for m in gpu.mig_devices])


class SimulatedBackend:
    """``GpuBackend`` over a ``SimProfile``; UUIDs seeded from ``node_name``."""

    def __init__(self, *, profile: SimProfile, node_name: str) -> None:
        self.profile = profile
        self.node_name = node_name

    def driver_status(self) -> DriverStatus:
        """What NVML would say of the driver: its versions, or NVML's error when unloaded."""
        if not self.profile.driver_loaded:
            return DriverStatus(loaded=False, reason=DRIVER_NOT_LOADED)
        return DriverStatus(
            loaded=True,
            version=self.profile.driver_version,
            cuda_version=self.profile.cuda_driver_version,
        )

    def discover(self) -> Discovery:
        if not self.profile.driver_loaded:
            # As the NVML backend reports an nvmlInit that fails: the whole backend, no GPU.
            message = f"NVML could not be initialised: {DRIVER_NOT_LOADED}"
            return Discovery(gpus=(), errors=(DiscoveryError(None, message),))
        gpus: list[GpuInfo] = []
        errors: list[DiscoveryError] = []
        for minor, sim in enumerate(self.profile.gpus):
            problems = _gpu_errors(sim)
            if problems:
                error = DiscoveryError(minor, "skipped: " + "; ".join(problems))
                log.warning("simulated %s", error)
                errors.append(error)
                continue
            gpus.append(self._gpu(minor, sim))
        return Discovery(gpus=tuple(gpus), errors=tuple(errors))

    def _gpu(self, minor: int, sim: SimGpu) -> GpuInfo:
        product = PRODUCTS[sim.product]
        uuid = "GPU-" + fake_uuid(self.node_name, self.profile.name, minor)
        gpu = GpuInfo(
            minor=minor,
            index=minor,
            uuid=uuid,
            product_name=sim.product_name or product.product_name,
            brand=product.brand,
            architecture=product.architecture,
            cuda_compute_capability=product.cuda_compute_capability,
            driver_version=self.profile.driver_version,
            cuda_driver_version=self.profile.cuda_driver_version,
            memory_bytes=sim.memory_bytes or product.memory_bytes,
            pci_bus_id=sim.pci_bus_id,
            pcie_root=sim.pcie_root,
            addressing_mode=sim.addressing_mode,
            numa_node=sim.numa_node,
            mig_enabled=sim.mig_enabled,
            mig_capable=product.mig_table is not None,
            mig_table=product.mig_table,
        )
        if not sim.mig_enabled or product.mig_table is None:
            return gpu
        table = migprofiles.TABLES[product.mig_table]
        migs = tuple(
            self._mig(gpu, table.by_name(m.profile), m.placement, gi_id)
            for gi_id, m in enumerate(sim.mig_devices, start=1)
        )
        return replace(gpu, mig_devices=migs)

    def _mig(
        self, gpu: GpuInfo, prof: migprofiles.MigProfile, start: int, gi_id: int
    ) -> MigDeviceInfo:
        return MigDeviceInfo(
            parent_minor=gpu.minor,
            parent_uuid=gpu.uuid,
            uuid="MIG-" + fake_uuid(self.node_name, self.profile.name, gpu.minor, "gi", gi_id),
            profile=prof.name,
            gi_profile_id=prof.gi_profile_id,
            ci_profile_id=prof.ci_profile_id,
            gi_id=gi_id,
            ci_id=0,
            placement_start=start,
            placement_size=prof.memory_slices,
            memory_bytes=prof.memory_bytes,
            engines=prof.engines,
        )
