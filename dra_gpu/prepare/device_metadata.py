"""Device metadata (KEP-5304): per claim and request, a file with the allocated devices'
attributes, which a container reads without asking the API server (KubeVirt does).

The protocol, as Kubernetes defines it (``k8s.io/dynamic-resource-allocation/api/metadata``):

* inside the container, under ``/var/run/kubernetes.io/dra-device-attributes``:
  ``resourceclaims/<claim>/<request>/<driver>-metadata.json`` for a claim the pod names, and
  ``resourceclaimtemplates/<podClaimName>/<request>/<driver>-metadata.json`` for one made from
  a template (``podClaimName``: the pod's ``spec.resourceClaims[].name``, which the claim
  carries in its ``resource.kubernetes.io/pod-claim-name`` annotation). A subrequest's name is
  dropped from the path (``gpu/large`` -> ``gpu``) and kept in the file;
* the file: a ``DeviceMetadata`` object of ``metadata.resource.k8s.io/v1alpha1`` (the claim's
  name, namespace, UID and a ``generation``), its ``podClaimName``, and per request the devices
  (driver, pool, name) with their attributes as the ResourceSlice publishes them; for a MIG
  device created at prepare, with the ``uuid`` it got;
* read-only in the container, through a bind mount in the claim's CDI spec: every device of a
  request mounts its request's file (CDI replaces a mount of the same container path, so two
  devices of one request give one mount).

On the node the files live in the plugin's state directory, one flat directory:
``<state dir>/dra-device-metadata/<claim UID>.<request>.json`` (kept across reboots, like the
checkpoint; keyed by UID, since names repeat across namespaces; a UID has no dot and a request
name is a DNS label, so the name splits back). Flat, because a directory per claim and request
cost two ``mkdir`` at prepare and two ``rmdir`` at unprepare, each a new inode on ext4: 7 % of
the plugin's CPU per cycle (``perf`` under ``bench/prepare.py``, docs/development/performance.md).
Release 0.2.0 wrote ``<claim UID>/<request>/metadata.json``: such files are still read, and
removed at unprepare (:data:`OLD_FILE_NAME`); a start rewrites those claims' specs to the flat
files. Pure builders here,
plus the small file functions :mod:`dra_gpu.prepare.state` calls at the points it writes and
removes the claim's CDI spec.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dra_gpu.devices import model
from dra_gpu.devices.model import Device
from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.kubeletplugin.slices import encode_attribute
from dra_gpu.prepare.checkpoint import ClaimRecord
from dra_gpu.prepare.plan import ClaimPlan

API_VERSION: Final = "metadata.resource.k8s.io/v1alpha1"
KIND: Final = "DeviceMetadata"
CONTAINER_DIR: Final = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR: Final = "resourceclaims"
TEMPLATES_SUBDIR: Final = "resourceclaimtemplates"
POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
HOST_SUBDIR: Final = "dra-device-metadata"
SUFFIX: Final = ".json"
# Release 0.2.0's layout, <claim UID>/<request>/metadata.json: read and removed, never written.
OLD_FILE_NAME: Final = "metadata.json"


@dataclass(frozen=True)
class MetadataDevice:
    """One prepared device: its request (as allocated, maybe ``req/sub``) and facts."""

    request: str
    pool: str
    name: str
    uuid: str | None  # the UUID it has now (a created MIG device's, which the slice lacks)


@dataclass(frozen=True)
class ClaimMetadata:
    """What the files of one claim say, and where they go."""

    uid: ClaimUID
    namespace: str
    name: str
    pod_claim_name: str | None  # None: a claim the pod names itself
    devices: tuple[MetadataDevice, ...]

    def requests(self) -> dict[str, list[MetadataDevice]]:
        """Base request name (the path's) -> its devices, in allocation order."""
        out: dict[str, list[MetadataDevice]] = {}
        for d in self.devices:
            out.setdefault(base_request(d.request), []).append(d)
        return out


def base_request(request: str) -> str:
    """``gpu/large`` -> ``gpu``: a subrequest's files go under its request."""
    return request.split("/", 1)[0]


def pod_claim_name(annotations: Mapping[str, str] | None) -> str | None:
    return (annotations or {}).get(POD_CLAIM_NAME_ANNOTATION)


def from_plan(plan: ClaimPlan, *, pod_claim: str | None) -> ClaimMetadata:
    ref = plan.ref
    devices = tuple(
        MetadataDevice(request=r, pool=d.pool, name=d.cdi.name, uuid=d.cdi.uuid)
        for d in plan.devices
        for r in d.requests
    )
    return ClaimMetadata(ref.uid, ref.namespace, ref.name, pod_claim, devices)


def from_record(uid: ClaimUID, record: ClaimRecord, *, pod_claim: str | None) -> ClaimMetadata:
    """The metadata of a recorded claim (a record rebuilt from a CDI spec, or an older
    plugin's, names no requests: it gets no files)."""
    devices = tuple(
        MetadataDevice(request=r, pool=d.pool, name=d.device, uuid=d.uuid)
        for d in record.devices
        for r in d.request_names
    )
    return ClaimMetadata(uid, record.namespace, record.name, pod_claim, devices)


# --- pure ------------------------------------------------------------------------------------


def container_path(meta: ClaimMetadata, request: str, *, driver: str) -> str:
    if meta.pod_claim_name is not None:
        where = f"{TEMPLATES_SUBDIR}/{meta.pod_claim_name}"
    else:
        where = f"{CLAIMS_SUBDIR}/{meta.name}"
    return f"{CONTAINER_DIR}/{where}/{base_request(request)}/{driver}-metadata.json"


def attributes(device: MetadataDevice, published: Device | None) -> dict[str, Any]:
    """The device's attributes as its slice publishes them, plus the UUID it has now."""
    attrs: dict[str, Any] = {}
    if published is not None:
        attrs = {name: encode_attribute(v) for name, v in published.attributes.items()}
    if device.uuid:  # a MIG device not yet created has no UUID to say
        attrs[model.ATTR_UUID] = encode_attribute(device.uuid)
    return attrs


def document(
    meta: ClaimMetadata,
    request: str,
    *,
    driver: str,
    inventory: Mapping[str, Device],
    generation: int = 1,
) -> dict[str, Any]:
    """The ``DeviceMetadata`` object of one (base) request of the claim."""
    devices = meta.requests()[request]
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "uid": str(meta.uid),
            "generation": generation,
        },
    }
    if meta.pod_claim_name is not None:
        body["podClaimName"] = meta.pod_claim_name
    # One entry per allocated request reference: a subrequest is named in full.
    names = list(dict.fromkeys(d.request for d in devices))
    body["requests"] = [
        {
            "name": name,
            "devices": [
                {
                    "driver": driver,
                    "pool": d.pool,
                    "name": d.name,
                    "attributes": attributes(d, inventory.get(d.name)),
                }
                for d in devices
                if d.request == name
            ],
        }
        for name in names
    ]
    return body


def host_path(state_dir: Path, uid: ClaimUID, request: str) -> Path:
    return state_dir / HOST_SUBDIR / f"{uid}.{base_request(request)}{SUFFIX}"


def _claim_of(file_name: str) -> ClaimUID | None:
    """The claim UID of a file of the flat layout; None for anything else (a temp file)."""
    if file_name.startswith(".") or not file_name.endswith(SUFFIX) or "." not in file_name:
        return None
    return ClaimUID(file_name.split(".", 1)[0])


def cdi_edits(
    meta: ClaimMetadata, *, driver: str, state_dir: Path
) -> dict[str, dict[str, list[Mapping[str, Any]]]]:
    """Per device name, the read-only bind mount of its request's file."""
    edits: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for d in meta.devices:
        mount = {
            "hostPath": str(host_path(state_dir, meta.uid, d.request)),
            "containerPath": container_path(meta, d.request, driver=driver),
            "options": ["ro", "bind"],
            "type": "bind",
        }
        edits.setdefault(d.name, {"mounts": []})["mounts"].append(mount)
    return edits


def merge_edits(
    *parts: Mapping[str, Mapping[str, Sequence[Any]]],
) -> dict[str, dict[str, list[Any]]]:
    """Per device name, the ``env`` and ``mounts`` of every part, in order."""
    out: dict[str, dict[str, list[Any]]] = {}
    for part in parts:
        for name, edits in part.items():
            into = out.setdefault(name, {})
            for key, values in edits.items():
                into.setdefault(key, []).extend(values)
    return out


# --- files -----------------------------------------------------------------------------------


def write(
    meta: ClaimMetadata, *, driver: str, state_dir: Path, inventory: Mapping[str, Device]
) -> None:
    """Write the claim's files atomically (not fsynced: like the CDI spec, start rewrites a
    file a power loss took, from the checkpoint)."""
    for request in meta.requests():
        body = document(meta, request, driver=driver, inventory=inventory)
        # Compact, as the CDI spec: with ``indent`` the json module falls back to its
        # pure-Python encoder, most of a prepare's JSON time (bench/prepare_profile.py).
        data = (json.dumps(body, separators=(",", ":")) + "\n").encode()
        atomicfile.write_atomic(host_path(state_dir, meta.uid, request), data, durable=False)


def missing(meta: ClaimMetadata, *, state_dir: Path) -> bool:
    return any(not host_path(state_dir, meta.uid, r).is_file() for r in meta.requests())


def remove(state_dir: Path, uid: ClaimUID, requests: Iterable[str] | None = None) -> None:
    """Remove the claim's files; nothing there is not an error (unprepare repeats).

    ``requests``: the claim's requests as its record names them, so unprepare removes its
    files by name; None (a rollback, a record without them) looks through the directory. A
    temp file of a write killed midway stays until the next start sweeps it
    (:func:`remove_temp_files`). Files of release 0.2.0's layout go too.
    """
    root = state_dir / HOST_SUBDIR
    if requests is None:
        try:
            names = [n for n in os.listdir(root) if _claim_of(n) == uid]
        except OSError:  # no directory yet, or unreadable: nothing of ours to remove
            names = []
        paths = [root / n for n in names]
    else:
        paths = [host_path(state_dir, uid, r) for r in dict.fromkeys(map(base_request, requests))]
    for path in paths:
        atomicfile.remove(path)
    _remove_old(root / str(uid))


def _remove_old(claim_dir: Path) -> None:
    """Release 0.2.0's directory of a claim, if there is one (one failing call when not)."""
    try:
        requests = os.listdir(claim_dir)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError:
        requests = []
    for request in requests:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.unlink(claim_dir / request / OLD_FILE_NAME)
    for directory in [*(claim_dir / r for r in requests), claim_dir]:
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            pass
        except OSError:  # a temp file of a killed write: the whole directory is ours
            shutil.rmtree(directory, ignore_errors=True)


def remove_temp_files(state_dir: Path) -> int:
    """Temp files of writes killed before their rename (the caller holds the node-wide lock)."""
    root = state_dir / HOST_SUBDIR
    if not root.is_dir():
        return 0
    flat = atomicfile.remove_temp_files(root, f"*{SUFFIX}")
    return flat + sum(atomicfile.remove_temp_files(d, OLD_FILE_NAME) for d in root.glob("*/*"))


def claims_with_files(state_dir: Path) -> set[ClaimUID]:
    root = state_dir / HOST_SUBDIR
    if not root.is_dir():
        return set()
    found = set()
    for p in root.iterdir():
        uid = ClaimUID(p.name) if p.is_dir() else _claim_of(p.name)  # a directory: 0.2.0's
        if uid is not None:
            found.add(uid)
    return found


def recorded_pod_claim_name(state_dir: Path, uid: ClaimUID) -> tuple[bool, str | None]:
    """(found, podClaimName) from a file of the claim written earlier: how a rebuilt CDI spec
    finds the container path without the API server. ``found`` False: no readable file."""
    root = state_dir / HOST_SUBDIR
    paths = [*sorted(root.glob(f"{uid}.*{SUFFIX}")), *sorted(root.glob(f"{uid}/*/{OLD_FILE_NAME}"))]
    for path in paths:
        try:
            body = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(body, dict):
            name = body.get("podClaimName")
            return True, name if isinstance(name, str) else None
    return False, None
