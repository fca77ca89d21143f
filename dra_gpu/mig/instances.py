"""MIG instances on a GPU: list, create (GPU instance + compute instance), destroy.

``MigInstances`` is what dynamic MIG needs of a GPU; two implementations follow the same state
machine: ``SimulatedInstances`` (here: a JSON file per node, so simulated instances survive a
plugin restart as real ones do, with the real placement rules of ``migprofiles.layout_errors``)
and ``nvml_instances.NvmlInstances`` (pynvml, every call bounded in time).

A GPU instance is identified by its GPU, placement start and GI profile: two instances on one
GPU never share a memory slice, so no two share a placement start.
"""

from __future__ import annotations

import json
import threading
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Protocol

from dra_gpu.devices import migprofiles
from dra_gpu.devices.model import GpuInfo, MigPartition
from dra_gpu.devices.simulated import fake_uuid
from dra_gpu.kubeletplugin import atomicfile

# The simulated ledger's lock is held for one read and write of a small file: a holder that keeps
# it this long is stuck, and the prepare waiting for it fails naming it.
LEDGER_LOCK_TIMEOUT_S: Final = 30.0


class InstanceError(RuntimeError):
    """Creating or destroying a MIG instance failed; the message names the GPU and placement."""


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: a GPU instance with one compute instance spanning it."""

    gpu_uuid: str
    profile: str
    gi_profile_id: int
    start: int
    size: int
    gi_id: int
    ci_id: int
    uuid: str

    def at(self, gpu_uuid: str, start: int, gi_profile_id: int) -> bool:
        return (self.gpu_uuid, self.start, self.gi_profile_id) == (gpu_uuid, start, gi_profile_id)

    def __str__(self) -> str:
        return f"{self.profile}@{self.start} (GI {self.gi_id}, CI {self.ci_id}) on {self.gpu_uuid}"


class MigInstances(Protocol):
    def list(self, gpu_uuid: str) -> list[MigInstance]:
        """Every MIG instance on the GPU, whoever created it; raises InstanceError."""
        ...

    def create(self, gpu: GpuInfo, partition: MigPartition) -> MigInstance:
        """Create the GI at the partition's placement and its whole-GI CI; raises InstanceError."""
        ...

    def destroy(self, gpu_uuid: str, instance: MigInstance) -> bool:
        """Destroy CI then GI; False when it no longer exists; raises InstanceError."""
        ...


class SimulatedInstances:
    """``MigInstances`` of simulated GPUs, kept in ``path`` (written durably and atomically)."""

    def __init__(self, path: Path, *, node_name: str) -> None:
        self.path = path
        self._node_name = node_name
        self._lock = threading.Lock()

    def _load(self) -> dict[str, list[MigInstance]]:
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise InstanceError(f"simulated MIG state {self.path} is unreadable: {exc}") from exc
        return {gpu: [MigInstance(**i) for i in items] for gpu, items in raw.items()}

    def _save(self, state: dict[str, list[MigInstance]]) -> None:
        data = {gpu: [asdict(i) for i in items] for gpu, items in state.items() if items}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomicfile.write_atomic(
            self.path, json.dumps(data, indent=1, sort_keys=True).encode(), durable=True
        )

    def _file_lock(self) -> AbstractContextManager[int]:
        # Another plugin instance (rolling update) may create on the same node.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        return atomicfile.locked(lock, timeout_s=LEDGER_LOCK_TIMEOUT_S)

    def list(self, gpu_uuid: str) -> list[MigInstance]:
        with self._lock:
            return self._load().get(gpu_uuid, [])

    def create(self, gpu: GpuInfo, partition: MigPartition) -> MigInstance:
        table = migprofiles.TABLES.get(gpu.mig_table or "")
        if table is None or not gpu.mig_enabled:
            raise InstanceError(f"GPU {gpu.uuid}: MIG is not enabled")
        with self._lock, self._file_lock():
            state = self._load()
            have = state.get(gpu.uuid, [])
            layout = [(i.profile, i.start) for i in have] + [(partition.profile, partition.start)]
            problems = migprofiles.layout_errors(table, layout)
            if problems:
                raise InstanceError(
                    f"GPU {gpu.uuid}: cannot create {partition.profile}@{partition.start}: "
                    + "; ".join(problems)
                )
            gi_id = 1 + max((i.gi_id for i in have), default=0)
            instance = MigInstance(
                gpu_uuid=gpu.uuid,
                profile=partition.profile,
                gi_profile_id=partition.gi_profile_id,
                start=partition.start,
                size=partition.size,
                gi_id=gi_id,
                ci_id=0,
                uuid="MIG-" + fake_uuid(self._node_name, gpu.uuid, partition.start, gi_id),
            )
            state[gpu.uuid] = [*have, instance]
            self._save(state)
            return instance

    def destroy(self, gpu_uuid: str, instance: MigInstance) -> bool:
        with self._lock, self._file_lock():
            state = self._load()
            have = state.get(gpu_uuid, [])
            left = [i for i in have if i.gi_id != instance.gi_id]
            if len(left) == len(have):
                return False
            state[gpu_uuid] = left
            self._save(state)
            return True
