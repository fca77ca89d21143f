"""Dynamic MIG as counters: what each (profile, placement) of a GPU takes from it (pure).

KEP-4815 (partitionable devices): a ResourceSlice declares counter sets, each device lists the
counters it consumes, and the scheduler never allocates devices whose consumption of a set
exceeds its counters. One counter set per GPU, named ``gpu-<minor>-counter-set``, holds:

* ``memory-slice-<i>`` = 1 for each of the GPU's memory slices (8 on A100/H100/H200): a GPU
  instance occupies consecutive memory slices from its placement start, so two instances that
  overlap both need the same slice and cannot be allocated together;
* ``compute-slices`` (7) and the engines of the whole-GPU profile (``multiprocessors``,
  ``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines``, ``ofa-engines``): what no
  layout may use more of than the GPU has (this is what keeps a second ``+me`` profile out: the
  GPU has one OFA engine).

These are exactly the rules ``migprofiles.layout_errors`` checks (placement starts come from
the profile table, so only valid placements are published), and the unit tests check that the
two agree on every layout they try. The whole-GPU profile (``7g``) consumes every counter.
Counter names are DNS labels, as the API requires; only non-zero consumptions are listed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType

from dra_gpu.devices import migprofiles
from dra_gpu.devices.model import Discovery, GpuBackend, MigPartition

COMPUTE_SLICES = "compute-slices"
# Engine capacities as published on a MIG device -> counter name (a DNS label).
ENGINE_COUNTERS: Mapping[str, str] = {
    "multiprocessors": "multiprocessors",
    "copyEngines": "copy-engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegEngines": "jpeg-engines",
    "ofaEngines": "ofa-engines",
}


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


def consumption(profile: migprofiles.MigProfile, start: int) -> dict[str, int]:
    """The counters a GPU instance of ``profile`` at ``start`` takes (zeros left out)."""
    taken = {memory_slice_counter(i): 1 for i in range(start, start + profile.memory_slices)}
    taken[COMPUTE_SLICES] = profile.compute_slices
    for capacity, count in profile.engines.capacities().items():
        if count:
            taken[ENGINE_COUNTERS[capacity]] = count
    return taken


def gpu_counters(table: migprofiles.MigTable) -> dict[str, int]:
    """The counter set of one GPU: everything its whole-GPU profile takes."""
    return consumption(table.full, 0)


def placements(table: migprofiles.MigTable) -> Iterator[tuple[migprofiles.MigProfile, int]]:
    """Every (profile, placement start) of a table, in the order they are published.

    The scheduler allocates the first device (in published order) whose counters still fit and
    never moves an earlier allocation, so the order decides how well a GPU packs: small
    profiles fill from memory slice 0 up, ``3g`` and larger from the top down. Then, for
    example, ``3g + 2g + 1g + 1g`` (which fits only with the ``3g`` at 4) is placed whatever
    order the claims arrive in; with every profile in start order, one arrival order in four fails.
    """
    for profile in table.profiles:
        top_down = profile.compute_slices >= 3
        for start in sorted(profile.placement_starts, reverse=top_down):
            yield profile, start


def partitions(table: migprofiles.MigTable, minor: int) -> list[MigPartition]:
    """Every (profile, placement) of GPU ``minor`` as a partition consuming its counters."""
    full = MappingProxyType(gpu_counters(table))
    return [
        MigPartition(
            profile=profile.name,
            gi_profile_id=profile.gi_profile_id,
            ci_profile_id=profile.ci_profile_id,
            start=start,
            size=profile.memory_slices,
            counter_set=counter_set_name(minor),
            consumes=MappingProxyType(consumption(profile, start)),
            gpu_counters=full,
        )
        for profile, start in placements(table)
    ]


def fits(counters: Mapping[str, int], chosen: list[MigPartition]) -> bool:
    """Whether ``chosen`` partitions of one GPU fit its counters (the scheduler's rule)."""
    used: dict[str, int] = {}
    for p in chosen:
        for name, n in p.consumes.items():
            used[name] = used.get(name, 0) + n
    return all(n <= counters.get(name, 0) for name, n in used.items())


class DynamicMigBackend:
    """A ``GpuBackend`` whose MIG-enabled GPUs are published as partitions (dynamic MIG).

    The node's setting (``--mig-mode=dynamic``) wraps the NVML or simulated backend in this;
    a GPU with MIG off, or without a profile table, stays as it is.
    """

    def __init__(self, inner: GpuBackend) -> None:
        self.inner = inner

    def discover(self) -> Discovery:
        found = self.inner.discover()
        gpus = tuple(
            replace(g, mig_dynamic=True)
            if g.mig_enabled and g.mig_table in migprofiles.TABLES
            else g
            for g in found.gpus
        )
        return replace(found, gpus=gpus)
