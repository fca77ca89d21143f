"""Reconcile planning for one node's ResourceSlice pool: desired + existing -> writes to make.

Pure: no I/O, no clock. ``publisher`` lists what exists, calls ``plan`` and performs the writes.

Invariants the plan keeps:
- One pool per node; its slices have deterministic names (``slices.slice_name``, unless the
  desired bodies already carry names), so every instance of the driver on a node (rolling
  update) converges on the same objects instead of each creating its own.
- Every slice of the pool carries the same ``pool.generation`` and ``pool.resourceSliceCount``.
  Whenever a slice of the pool's highest generation must change, the generation goes up by one
  past anything seen (existing slices and the last generation this process published), so
  consumers, which use only the highest generation of a pool, never mix old and new content.
- A pool that is only incomplete is completed at its own generation: when every slice at the
  highest generation is named by the desired state and already holds it, the missing slices
  (a publish that failed half-way, a slice someone deleted) are created, and those left at an
  older generation updated, at that generation. The slices at that generation are then at every
  moment a subset of the desired state's, so no consumer sees old and new content mixed, and
  the slices that were right are not rewritten (a thousand nodes' partly failed publishes
  would otherwise rewrite whole pools). A pool with no slice left at its highest generation
  (wiped) still comes back one generation higher.
- Slices of our node and driver that the desired state does not name are deleted, whatever
  their pool (leftovers of an earlier run, a renamed node, a smaller inventory).
- Two instances on one node (a rolling update, possibly of different versions that publish
  different content) must not take turns overwriting each other's slices. Each slice names the
  instance that wrote it and when that instance started (annotation ``<driver>/publisher``);
  an instance that finds a slice of its pool written by an instance started later, and still
  alive (the caller decides how to tell; the plugin connects to its registration socket),
  stands by and writes nothing. The kubelet, too, sends calls to the newest instance. A dead
  writer is ignored, so a clock set back or a crashed instance cannot silence the pool.
- "Up to date" is decided by a content hash that the publisher writes as an annotation, plus a
  structural check of what a hand edit could break (pool, node, device names). Comparing the
  whole spec would loop forever, since the API server canonicalizes quantities ("1024Mi" ->
  "1Gi") in what it returns.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_gpu.kube.objects import ResourceSlice
from dra_gpu.kubeletplugin import slices

JSON = dict[str, Any]

HASH_ANNOTATION = "content-hash"
PUBLISHER_ANNOTATION = "publisher"


@dataclasses.dataclass(frozen=True, order=True)
class Instance:
    """One running plugin process: ordered by start time, then name (a deterministic tie)."""

    started_ns: int
    name: str  # the pod UID, or host and PID outside a pod

    def __str__(self) -> str:
        return f"{self.started_ns}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> Instance | None:
        started, sep, name = text.partition("/")
        if not sep or not started.isdigit():
            return None
        return cls(int(started), name)


@dataclasses.dataclass(frozen=True)
class Existing:
    """The parts of an existing ResourceSlice that planning needs."""

    name: str
    uid: str
    resource_version: str
    pool: str
    generation: int
    body: ResourceSlice
    publisher: Instance | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
    generation: int
    creates: tuple[JSON, ...] = ()
    updates: tuple[JSON, ...] = ()
    deletes: tuple[Existing, ...] = ()
    standby_for: Instance | None = None  # a newer instance publishes the pool: write nothing

    @property
    def is_empty(self) -> bool:
        return not (self.creates or self.updates or self.deletes)


def hash_annotation_key(driver: str) -> str:
    return f"{driver}/{HASH_ANNOTATION}"


def publisher_annotation_key(driver: str) -> str:
    return f"{driver}/{PUBLISHER_ANNOTATION}"


def parse_existing(item: ResourceSlice) -> Existing:
    """Existing slice from API JSON; missing fields become empty values, never exceptions."""
    raw: Mapping[str, Any] = item  # read as plain JSON: not relying on what the type guarantees
    meta = raw.get("metadata") or {}
    pool = (raw.get("spec") or {}).get("pool") or {}
    try:
        generation = int(pool.get("generation") or 0)
    except (TypeError, ValueError):
        generation = 0
    driver = str((raw.get("spec") or {}).get("driver", ""))
    written_by = (meta.get("annotations") or {}).get(publisher_annotation_key(driver))
    return Existing(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        pool=str(pool.get("name", "")),
        generation=generation,
        body=item,
        publisher=Instance.parse(written_by) if isinstance(written_by, str) else None,
    )


def content_hash(body: Mapping[str, Any]) -> str:
    """Hash of what we own in a slice: spec, labels and owner references."""
    meta = body.get("metadata") or {}
    owned = {
        "spec": body.get("spec"),
        "labels": meta.get("labels"),
        "ownerReferences": meta.get("ownerReferences"),
    }
    text = json.dumps(owned, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def stamp(
    body: Mapping[str, Any],
    *,
    name: str,
    pool: str,
    generation: int,
    count: int,
    publisher: Instance | None = None,
) -> JSON:
    """A desired slice with its name, pool fields, content hash and writer filled in (a copy)."""
    out: JSON = copy.deepcopy(dict(body))
    meta: JSON = out.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta["name"] = name
    spec: JSON = out.setdefault("spec", {})
    spec["pool"] = {"name": pool, "generation": generation, "resourceSliceCount": count}
    annotations: JSON = meta.setdefault("annotations", {})
    driver = str(spec.get("driver", ""))
    annotations[hash_annotation_key(driver)] = content_hash(out)
    if publisher is not None:
        # Not part of the hash: instances that agree on the content have nothing to write.
        annotations[publisher_annotation_key(driver)] = str(publisher)
    return out


def _device_names(spec: Mapping[str, Any]) -> list[str]:
    return [str(d.get("name")) for d in spec.get("devices") or []]


def is_up_to_date(desired: Mapping[str, Any], existing: Existing) -> bool:
    """Whether ``existing`` already holds what ``desired`` (a stamped slice) says."""
    want_spec = desired["spec"]
    have: Mapping[str, Any] = existing.body  # as plain JSON, like ``parse_existing``
    have_spec = have.get("spec") or {}
    key = hash_annotation_key(str(want_spec.get("driver", "")))
    want_hash = desired["metadata"]["annotations"][key]
    have_hash = ((have.get("metadata") or {}).get("annotations") or {}).get(key)
    return (
        have_hash == want_hash
        and have_spec.get("pool") == want_spec["pool"]
        and have_spec.get("nodeName") == want_spec.get("nodeName")
        and have_spec.get("driver") == want_spec.get("driver")
        and _device_names(have_spec) == _device_names(want_spec)
    )


def _diff(desired: Sequence[JSON], existing: Sequence[Existing], generation: int) -> Plan:
    by_name = {e.name: e for e in existing}
    creates: list[JSON] = []
    updates: list[JSON] = []
    for body in desired:
        have = by_name.get(body["metadata"]["name"])
        if have is None:
            creates.append(body)
        elif not is_up_to_date(body, have):
            body["metadata"]["resourceVersion"] = have.resource_version  # ``stamp`` made a copy
            updates.append(body)
    wanted = {body["metadata"]["name"] for body in desired}
    deletes = tuple(e for e in existing if e.name not in wanted)
    return Plan(generation, tuple(creates), tuple(updates), deletes)


def plan(
    *,
    desired: Sequence[Mapping[str, Any]],
    existing: Sequence[ResourceSlice],
    node: str,
    driver: str,
    last_generation: int,
    instance: Instance | None = None,
    alive: Callable[[Instance], bool],
) -> Plan:
    """What to write so that the node's pool (named after the node) is exactly ``desired``.

    ``desired``: slice bodies as built from the inventory, in a stable order; their names and
    ``spec.pool`` are overwritten here. ``existing``: the slices the API server lists for this
    node and driver. ``last_generation``: the highest generation this process published (0 if
    none), so that a pool wiped by someone else comes back with a higher generation.
    ``instance``: this process, written into each slice; None leaves instances out of it.
    ``alive``: whether another instance still runs (only a live newer one makes us stand by).
    """
    current = [parse_existing(item) for item in existing]
    seen = max([last_generation, *(e.generation for e in current if e.pool == node)])
    if instance is not None:
        newer = [
            e.publisher
            for e in current
            if e.pool == node and e.publisher is not None and e.publisher > instance
        ]
        newer = [other for other in set(newer) if alive(other)]
        if newer:
            return Plan(seen, standby_for=max(newer))

    def stamped(generation: int) -> list[JSON]:
        return [
            stamp(
                body,
                name=body.get("metadata", {}).get("name")
                or slices.slice_name(node_name=node, driver_name=driver, index=i),
                pool=node,
                generation=generation,
                count=len(desired),
                publisher=instance,
            )
            for i, body in enumerate(desired)
        ]

    if seen > 0:  # a pool never published has no generation to keep
        unchanged = _diff(stamped(seen), current, seen)
        if not (unchanged.creates or unchanged.updates) or _completes(unchanged, current, node):
            return unchanged
    return _diff(stamped(seen + 1), current, seen + 1)


def _completes(at_seen: Plan, current: Sequence[Existing], pool: str) -> bool:
    """Whether ``at_seen`` (the writes at the pool's highest generation) only adds slices to
    that generation: some slice is there, and none there is updated or deleted."""
    members = {e.name for e in current if e.pool == pool and e.generation == at_seen.generation}
    touched = {str(body["metadata"]["name"]) for body in at_seen.updates}
    touched |= {e.name for e in at_seen.deletes}
    return bool(members) and not members & touched
