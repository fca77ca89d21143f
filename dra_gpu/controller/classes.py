"""DeviceClasses this driver owns: the desired state, and the diff against the cluster.

Pure functions on JSON-shaped dicts. :func:`builtin_classes` and :func:`admin_class` say what
should exist; :func:`plan` compares that with what the API server returned and lists the calls
that bring the cluster there. Invariants:

- Ownership is the label ``app.kubernetes.io/managed-by: dra-gpu``. A class without it is never
  modified or deleted, even when its name is one we want (reported as a conflict instead), so an
  administrator takes a class over by removing the label.
- Owned classes that are no longer desired (removed from the classes file) are deleted.
- Drift is judged on ``spec`` and our label only, after dropping empty values, so defaulting of
  empty fields by the API server does not cause endless rewrites. When the server stores a spec
  that differs from the one sent (an older server dropping ``extendedResourceName``), the stored
  form is remembered by the caller as *accepted* for that desired spec and not fought over.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_gpu import DRIVER_NAME

GPU_CLASS: Final = "gpu.nvidia.com"
MIG_CLASS: Final = "mig.nvidia.com"
BUILTIN_NAMES: Final = frozenset({GPU_CLASS, MIG_CLASS})
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = "dra-gpu"
API_VERSION: Final = "resource.k8s.io/v1"

JSON = dict[str, Any]


@dataclass(frozen=True)
class DesiredClass:
    """A DeviceClass the controller keeps applied; ``spec`` is the DeviceClass ``spec``."""

    name: str
    spec: Mapping[str, Any]
    origin: str  # "builtin" or where it was configured, for log lines

    def body(self, *, base_metadata: Mapping[str, Any] | None = None) -> JSON:
        """The object to send; ``base_metadata`` keeps the server's metadata on updates."""
        # managedFields is the server's bookkeeping; sending it back would overwrite it.
        metadata: JSON = {k: v for k, v in (base_metadata or {}).items() if k != "managedFields"}
        metadata["name"] = self.name
        metadata["labels"] = {**(metadata.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY_VALUE}
        return {
            "apiVersion": API_VERSION,
            "kind": "DeviceClass",
            "metadata": metadata,
            "spec": json.loads(json.dumps(self.spec)),
        }


def type_selector(device_type: str) -> str:
    """CEL matching this driver's devices of one type (``gpu`` or ``mig``)."""
    return (
        f"device.driver == '{DRIVER_NAME}' && "
        f"device.attributes['{DRIVER_NAME}'].type == '{device_type}'"
    )


def cel_selectors(expressions: Iterable[str]) -> list[JSON]:
    return [{"cel": {"expression": e}} for e in expressions]


def builtin_classes(*, extended_resource_name: str | None) -> tuple[DesiredClass, ...]:
    """The two classes claims written for NVIDIA's driver name: ``gpu`` and ``mig``."""
    gpu_spec: JSON = {"selectors": cel_selectors([type_selector("gpu")])}
    if extended_resource_name:
        gpu_spec["extendedResourceName"] = extended_resource_name
    mig_spec: JSON = {"selectors": cel_selectors([type_selector("mig")])}
    return (
        DesiredClass(GPU_CLASS, gpu_spec, "builtin"),
        DesiredClass(MIG_CLASS, mig_spec, "builtin"),
    )


def is_owned(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE)


def pruned(value: Any) -> Any:
    """``value`` without None, empty lists and empty maps, at any depth (for comparisons)."""
    if isinstance(value, Mapping):
        out = {k: pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


def spec_key(spec: Mapping[str, Any]) -> str:
    """A canonical text of a spec, to remember accepted forms by."""
    return json.dumps(pruned(spec), sort_keys=True)


class Action(enum.Enum):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True)
class Step:
    action: Action
    name: str
    reason: str
    body: JSON | None = None  # for CREATE and UPDATE
    resource_version: str | None = None  # precondition for UPDATE and DELETE


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...] = ()
    # Desired classes whose name is taken by a class we do not own: left alone, reported.
    conflicts: tuple[str, ...] = ()


def _drift(want: DesiredClass, have: Mapping[str, Any], accepted: Mapping[str, str]) -> str | None:
    have_spec = pruned(have.get("spec") or {})
    if have_spec == pruned(want.spec):
        return None
    # The server keeps a different form of exactly this desired spec: not drift.
    if accepted.get(spec_key(want.spec)) == spec_key(have_spec):
        return None
    return "spec differs from the desired one"


def plan(
    desired: Sequence[DesiredClass],
    existing: Sequence[Mapping[str, Any]],
    *,
    accepted: Mapping[str, str] | None = None,
) -> Plan:
    """Calls that make ``existing`` (all DeviceClasses in the cluster) match ``desired``.

    ``accepted`` maps :func:`spec_key` of a desired spec to :func:`spec_key` of the spec the
    server stored when it was last written, so a server that drops or defaults fields does not
    make every resync rewrite the class.
    """
    accepted = accepted or {}
    by_name = {str((o.get("metadata") or {}).get("name")): o for o in existing}
    wanted = {d.name for d in desired}
    steps: list[Step] = []
    conflicts: list[str] = []
    for want in desired:
        have = by_name.get(want.name)
        if have is None:
            steps.append(Step(Action.CREATE, want.name, "missing", body=want.body()))
            continue
        if not is_owned(have):
            conflicts.append(want.name)
            continue
        reason = _drift(want, have, accepted)
        if reason is not None:
            meta = have.get("metadata") or {}
            steps.append(
                Step(
                    Action.UPDATE,
                    want.name,
                    reason,
                    body=want.body(base_metadata=meta),
                    resource_version=meta.get("resourceVersion"),
                )
            )
    for name, have in sorted(by_name.items()):
        if name not in wanted and is_owned(have):
            rv = (have.get("metadata") or {}).get("resourceVersion")
            steps.append(Step(Action.DELETE, name, "no longer desired", resource_version=rv))
    return Plan(steps=tuple(steps), conflicts=tuple(conflicts))
