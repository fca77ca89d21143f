"""Read-only: compare a real GPU's MIG profiles and placements with ``migprofiles``' tables.

``python -m e2e.gpu.mig_tables`` on a GPU machine prints, per GPU, NVML's answer for every
GPU-instance profile (id, slices, memory, SMs, engines, possible placements) next to the table
the driver uses for dynamic MIG, and every difference; then what a ``--mig-mode=dynamic`` node
would publish from this GPU. Only queries: nothing on the GPU changes (MIG mode included).
Exit status 1 when NVML and the table disagree.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from collections.abc import Sequence
from typing import Any

from dra_gpu.devices import migprofiles, naming, partitions
from dra_gpu.devices.nvml import NvmlBackend, profile_name

MAX_PLACEMENTS = 8


def possible_placements(nvml: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    array = (nvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
    count = ctypes.c_uint(MAX_PLACEMENTS)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]


def compare(nvml: Any, handle: Any, table: migprofiles.MigTable) -> tuple[list[Any], list[str]]:
    rows: list[Any] = []
    differences: list[str] = []
    for index in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 16))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except nvml.NVMLError as exc:
            rows.append({"profile": index, "error": str(exc)})
            continue
        try:
            placements: Any = possible_placements(nvml, handle, int(info.id))
        except nvml.NVMLError as exc:
            placements = f"error: {exc}"
        got = {
            "name": profile_name(info.name),
            "id": int(info.id),
            "slices": int(info.sliceCount),
            "memoryMiB": int(info.memorySizeMB),
            "sm": int(info.multiprocessorCount),
            "engines": [
                int(info.copyEngineCount),
                int(info.decoderCount),
                int(info.encoderCount),
                int(info.jpegCount),
                int(info.ofaCount),
            ],
            "placements": placements,
        }
        rows.append(got)
        try:
            want = table.by_gi_profile_id(got["id"])
        except KeyError:
            differences.append(f"NVML profile {got['name']} (id {got['id']}) is not in the table")
            continue
        e = want.engines
        expected = {
            "name": want.name,
            "slices": want.compute_slices,
            "memoryMiB": want.memory_mib,
            "sm": e.multiprocessors,
            "engines": [e.copy_engines, e.decoders, e.encoders, e.jpeg_engines, e.ofa_engines],
        }
        if isinstance(placements, list):
            expected["placements"] = [(s, want.memory_slices) for s in want.placement_starts]
        for key, value in expected.items():
            if got[key] != value:
                differences.append(f"{want.name} {key}: NVML {got[key]}, table {value}")
    return rows, differences


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m e2e.gpu.mig_tables",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    import pynvml

    backend = NvmlBackend(nvml=pynvml)
    found = partitions.DynamicMigBackend(backend).discover()
    pynvml.nvmlInit()
    failed = False
    try:
        for gpu in found.gpus:
            table = migprofiles.TABLES.get(gpu.mig_table or "")
            report: dict[str, Any] = {
                "gpu": gpu.minor,
                "product": gpu.product_name,
                "migEnabled": gpu.mig_enabled,
                "table": gpu.mig_table,
                "published": [d.name for d in naming.build_devices([gpu])],
            }
            if table is not None:
                handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                rows, differences = compare(pynvml, handle, table)
                report["nvml"] = rows
                report["differences"] = differences
                report["partitionsIfMigOn"] = len(partitions.partitions(table, gpu.minor))
                failed = failed or bool(differences)
            print(json.dumps(report, indent=1))
    finally:
        pynvml.nvmlShutdown()
    print("errors:", [str(e) for e in found.errors])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
