"""MIG profile tables per GPU product, and the placement rules they imply.

Sources: NVIDIA's MIG user guide ("Supported MIG Profiles") and ``nvidia-smi mig -lgip/-lgipp``
output for A100-SXM4-40GB and H100-SXM5-80GB; for H200 the real NVML answers in
``shared/fixtures/nvml-h200.json`` (memory sizes, SMs and engines exactly as NVML reported them).

Model: a GPU has ``memory_slices`` (8) memory slices and ``compute_slices`` (7) compute slices.
A GPU instance (GI) of a profile occupies ``memory_slices`` consecutive memory slices starting at
one of the profile's valid ``placement_starts`` (NVML placements are in memory-slice units).
A layout is valid when every placement start is allowed for its profile, no two GIs share a
memory slice, the compute slices, SMs and engines add up to no more than the full GPU has, and no
profile is used more often than its instance count. These rules hold for every real layout the
user guide shows and reject the invalid ones we know of (two ``+me`` profiles, overlaps).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dra_gpu.devices.model import MigEngines

MIB = 1 << 20

# NVML compute-instance profile id of the CI that spans a whole GI, by GI compute slices
# (NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7,8,6}_SLICE).
FULL_CI_PROFILE_ID: Mapping[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile (with the compute instance that spans it)."""

    name: str  # "1g.18gb", "1g.18gb+me"
    gi_profile_id: int
    compute_slices: int
    memory_slices: int
    max_instances: int
    placement_starts: tuple[int, ...]
    memory_mib: int
    engines: MigEngines

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def ci_profile_id(self) -> int:
        return FULL_CI_PROFILE_ID[self.compute_slices]


@dataclass(frozen=True)
class MigTable:
    """All MIG profiles of one product; ``profiles[-1]``-style lookups go through the methods."""

    key: str  # "A100-SXM4-40GB", "H100-80GB", "H200-141GB"
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def by_name(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"{self.key} has no MIG profile {name!r} (known: {known})")

    def by_gi_profile_id(self, gi_profile_id: int) -> MigProfile:
        for p in self.profiles:
            if p.gi_profile_id == gi_profile_id:
                return p
        raise KeyError(f"{self.key} has no GPU instance profile id {gi_profile_id}")

    @property
    def full(self) -> MigProfile:
        """The profile spanning the whole GPU; its engines bound any layout."""
        return max(self.profiles, key=lambda p: (p.compute_slices, p.memory_slices))


def _p(
    name: str,
    gi_id: int,
    g: int,
    mem_slices: int,
    count: int,
    starts: tuple[int, ...],
    mib: int,
    sm: int,
    engines: tuple[int, int, int, int, int],  # copy, dec, enc, jpeg, ofa
) -> MigProfile:
    return MigProfile(name, gi_id, g, mem_slices, count, starts, mib, MigEngines(sm, *engines))


_ALL7 = (0, 1, 2, 3, 4, 5, 6)
_EVEN4 = (0, 2, 4, 6)
_EVEN3 = (0, 2, 4)

A100_40GB = MigTable(
    key="A100-SXM4-40GB",
    memory_slices=8,
    compute_slices=7,
    profiles=(
        _p("1g.5gb", 19, 1, 1, 7, _ALL7, 4864, 14, (1, 0, 0, 0, 0)),
        _p("1g.5gb+me", 20, 1, 1, 1, _ALL7, 4864, 14, (1, 1, 0, 1, 1)),
        _p("1g.10gb", 15, 1, 2, 4, _EVEN4, 9856, 14, (1, 1, 0, 0, 0)),
        _p("2g.10gb", 14, 2, 2, 3, _EVEN3, 9856, 28, (2, 1, 0, 0, 0)),
        _p("3g.20gb", 9, 3, 4, 2, (0, 4), 19968, 42, (3, 2, 0, 0, 0)),
        _p("4g.20gb", 5, 4, 4, 1, (0,), 19968, 56, (4, 2, 0, 0, 0)),
        _p("7g.40gb", 0, 7, 8, 1, (0,), 40192, 98, (7, 5, 0, 1, 1)),
    ),
)

H100_80GB = MigTable(
    key="H100-80GB",
    memory_slices=8,
    compute_slices=7,
    profiles=(
        _p("1g.10gb", 19, 1, 1, 7, _ALL7, 9984, 16, (1, 1, 0, 1, 0)),
        _p("1g.10gb+me", 20, 1, 1, 1, _ALL7, 9984, 16, (1, 1, 0, 1, 1)),
        _p("1g.20gb", 15, 1, 2, 4, _EVEN4, 20096, 26, (1, 1, 0, 1, 0)),
        _p("2g.20gb", 14, 2, 2, 3, _EVEN3, 20096, 32, (2, 2, 0, 2, 0)),
        _p("3g.40gb", 9, 3, 4, 2, (0, 4), 40448, 60, (3, 3, 0, 3, 0)),
        _p("4g.40gb", 5, 4, 4, 1, (0,), 40448, 64, (4, 4, 0, 4, 0)),
        _p("7g.80gb", 0, 7, 8, 1, (0,), 81152, 132, (8, 7, 0, 7, 1)),
    ),
)

# From the real H200's NVML answers (fixture); placements follow the Hopper pattern above.
H200_141GB = MigTable(
    key="H200-141GB",
    memory_slices=8,
    compute_slices=7,
    profiles=(
        _p("1g.18gb", 19, 1, 1, 7, _ALL7, 16384, 16, (1, 1, 0, 1, 0)),
        _p("1g.18gb+me", 20, 1, 1, 1, _ALL7, 16384, 16, (1, 1, 0, 1, 1)),
        _p("1g.35gb", 15, 1, 2, 4, _EVEN4, 33280, 26, (1, 1, 0, 1, 0)),
        _p("2g.35gb", 14, 2, 2, 3, _EVEN3, 33280, 32, (2, 2, 0, 2, 0)),
        _p("3g.71gb", 9, 3, 4, 2, (0, 4), 71424, 60, (3, 3, 0, 3, 0)),
        _p("4g.71gb", 5, 4, 4, 1, (0,), 71424, 64, (4, 4, 0, 4, 0)),
        _p("7g.141gb", 0, 7, 8, 1, (0,), 143360, 132, (8, 7, 0, 7, 1)),
    ),
)

TABLES: Mapping[str, MigTable] = {t.key: t for t in (A100_40GB, H100_80GB, H200_141GB)}

# NVML product names -> table key. Exact names only: a near miss (A100 80GB) has other sizes.
_PRODUCT_TABLES: Mapping[str, str] = {
    "NVIDIA A100-SXM4-40GB": A100_40GB.key,
    "NVIDIA A100-PCIE-40GB": A100_40GB.key,
    "NVIDIA H100 80GB HBM3": H100_80GB.key,
    "NVIDIA H100 PCIe": H100_80GB.key,
    "NVIDIA H200": H200_141GB.key,
    "NVIDIA H200 NVL": H200_141GB.key,
}


def table_key_for_product(product_name: str) -> str | None:
    """The MIG table key for an NVML product name, or None if we have no table for it."""
    return _PRODUCT_TABLES.get(product_name)


def layout_errors(table: MigTable, placements: Iterable[tuple[str, int]]) -> list[str]:
    """Why a set of ``(profile name, placement start)`` GIs cannot coexist on one GPU.

    Returns an empty list for a valid layout. Pure; used by the simulated backend and by any
    code that plans MIG devices.
    """
    errors: list[str] = []
    owner: dict[int, str] = {}
    used: Counter[str] = Counter()
    totals = Counter[str]()
    for name, start in placements:
        try:
            prof = table.by_name(name)
        except KeyError as e:
            errors.append(str(e.args[0]))
            continue
        label = f"{name}@{start}"
        if start not in prof.placement_starts:
            errors.append(f"{label}: placement start must be one of {list(prof.placement_starts)}")
            continue
        for s in range(start, start + prof.memory_slices):
            if s in owner:
                errors.append(f"{label}: memory slice {s} already used by {owner[s]}")
            owner[s] = label
        used[name] += 1
        totals.update(_resources(prof))
    for name, n in used.items():
        limit = table.by_name(name).max_instances
        if n > limit:
            errors.append(f"{name}: {n} instances, at most {limit}")
    limits = _resources(table.full)
    for what, total in sorted(totals.items()):
        if total > limits[what]:
            errors.append(f"layout needs {total} {what}, the GPU has {limits[what]}")
    return errors


def _resources(p: MigProfile) -> dict[str, int]:
    return {"compute slices": p.compute_slices, **p.engines.capacities()}
