"""Dynamic MIG on a node: MIG instances created for claims, destroyed when no claim owns them.

How the driver tells its instances from an administrator's: the **ledger**, a file in the
plugin's state directory (``dynamic-mig.json``), lists every instance the driver creates, with
the claim it is for, by GPU, placement start and GI profile (which identify a GPU instance: two
never share a memory slice). An entry is written durably *before* the GPU instance is created,
so a crash at any point leaves either nothing on the GPU or an instance the ledger names.
Instances the ledger does not name were made by someone else and are never touched; a claim
allocated a placement such an instance overlaps fails prepare, naming it.

Crash safety, both ways (``reconcile``, run at start-up with the claims the checkpoint has as
``PrepareCompleted``): an entry whose claim is not completed is a prepare that never answered
the kubelet (or an unprepare that did not finish): its instance is destroyed, reported, and the
entry dropped; the kubelet's retry creates it again. Unprepare destroys first and then drops the
entry, so a crash in between destroys again (a no-op) on the next unprepare or start.

Created before binding (KEP-5007, ``plugin.mig_binding``): an entry made for an allocated claim
before its pod is bound is marked ``ahead`` and names the claim's namespace and name. Where the
binder runs (``keep_ahead``), ``reconcile`` leaves such entries to it: it asks the API server
whether the claim is still allocated those devices and reports the condition or destroys them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dra_gpu.devices.model import Device
from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.mig.instances import InstanceError, MigInstance, MigInstances

log = logging.getLogger(__name__)

LEDGER_NAME = "dynamic-mig.json"


@dataclass(frozen=True)
class Owned:
    """One ledger entry: an instance the driver creates or created for ``claim``."""

    claim: str
    device: str
    gpu_uuid: str
    gi_profile_id: int
    start: int
    # Created for an allocated claim before its pod bound (KEP-5007): the claim's name, so
    # that a restarted plugin can ask whether it is still allocated these devices.
    ahead: bool = False
    namespace: str = ""
    name: str = ""

    def matches(self, instance: MigInstance) -> bool:
        return instance.at(self.gpu_uuid, self.start, self.gi_profile_id)


class Ledger:
    """The driver's instances (see the module docstring); every write is durable."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LEDGER_NAME
        self._lock = threading.Lock()

    def load(self) -> list[Owned]:
        try:
            raw: list[dict[str, Any]] = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            raise InstanceError(f"dynamic MIG ledger {self.path} is unreadable: {exc}") from exc
        return [Owned(**e) for e in raw]

    def change(self, edit: Callable[[list[Owned]], list[Owned]]) -> None:
        with self._lock:
            entries = edit(self.load())
            self.path.parent.mkdir(parents=True, exist_ok=True)
            data = json.dumps([asdict(e) for e in entries], indent=1, sort_keys=True)
            atomicfile.write_atomic(self.path, data.encode(), durable=True)


class DynamicMig:
    """Creates and destroys the MIG instances of dynamic-MIG claims on this node."""

    def __init__(
        self, *, state_dir: Path, instances: MigInstances, keep_ahead: bool = False
    ) -> None:
        self.ledger = Ledger(state_dir)
        self.instances = instances
        self.keep_ahead = keep_ahead  # reconcile leaves ``ahead`` entries to the binder

    def ensure(
        self, claim: str, device: Device, *, ahead: tuple[str, str] | None = None
    ) -> MigInstance:
        """The instance for ``device`` (a partition) owned by ``claim``, created if needed.
        ``ahead``: (namespace, name) of a claim whose pod is not bound yet (the binder)."""
        part = device.partition
        if part is None:
            raise ValueError(f"{device.name} is not a dynamic MIG partition")
        gpu = device.gpu
        present = self.instances.list(gpu.uuid)
        mine = [e for e in self.ledger.load() if e.claim == claim and e.device == device.name]
        for instance in present:
            if mine and mine[0].matches(instance):
                return instance  # created by an earlier call for this claim
            if (
                instance.start < part.start + part.size
                and part.start < instance.start + instance.size
            ):
                owner = self._owner(instance)
                raise InstanceError(
                    f"{device.name}: placement {part.start}-{part.start + part.size - 1} of GPU "
                    f"{gpu.uuid} overlaps MIG device {instance.uuid} ({instance.profile}@"
                    f"{instance.start}), {owner}"
                )
        if not mine:
            namespace, name = ahead or ("", "")
            entry = Owned(
                claim,
                device.name,
                gpu.uuid,
                part.gi_profile_id,
                part.start,
                ahead=ahead is not None,
                namespace=namespace,
                name=name,
            )
            self.ledger.change(lambda entries: [*entries, entry])
        instance = self.instances.create(gpu, part)
        log.info("created MIG device %s for claim %s: %s", instance.uuid, claim, instance)
        return instance

    def _owner(self, instance: MigInstance) -> str:
        for e in self.ledger.load():
            if e.matches(instance):
                return f"created by this driver for claim {e.claim}"
        return "not created by this driver (left alone)"

    def release(self, claim: str) -> list[MigInstance]:
        """Destroy the instances ``claim`` owns, then forget them; raises InstanceError."""
        destroyed: list[MigInstance] = []
        owned = [e for e in self.ledger.load() if e.claim == claim]
        for entry in owned:
            instance = self._present(entry)
            if instance is not None and self.instances.destroy(entry.gpu_uuid, instance):
                destroyed.append(instance)
                log.info("destroyed MIG device %s of claim %s: %s", instance.uuid, claim, instance)
        if owned:
            self.ledger.change(lambda entries: [e for e in entries if e.claim != claim])
        return destroyed

    def created_uuid(self, claim: str, device: str) -> str | None:
        """The UUID of the instance ``claim`` owns for ``device``; None when there is none."""
        for entry in self.ledger.load():
            if entry.claim == claim and entry.device == device:
                instance = self._present(entry)
                return instance.uuid if instance is not None else None
        return None

    def _present(self, entry: Owned) -> MigInstance | None:
        return next((i for i in self.instances.list(entry.gpu_uuid) if entry.matches(i)), None)

    def ahead(self, completed: Collection[str]) -> list[Owned]:
        """The entries made before binding whose claims are not prepared (the binder's)."""
        return [e for e in self.ledger.load() if e.ahead and e.claim not in completed]

    def reconcile(self, completed: Collection[str]) -> list[str]:
        """Destroy instances of ours that no completed claim owns; one message per instance.
        With ``keep_ahead``, those made before binding are left to the binder."""
        messages: list[str] = []
        kept = {e.claim for e in self.ahead(completed)} if self.keep_ahead else set()
        orphans = {e.claim for e in self.ledger.load() if e.claim not in completed}
        for claim in sorted(orphans - kept):
            for instance in self.release(claim):
                messages.append(
                    f"destroyed MIG device {instance.uuid} ({instance}): created for claim "
                    f"{claim}, which no prepared claim owns"
                )
        return messages


SIMULATED_STATE_NAME = "simulated-mig.json"
