"""A validator for CDI specs, written from the CDI specification (versions 0.3.0 to 1.1.0).

Used before every write (a spec a runtime would reject must never reach the CDI directory) and
by tests on the files we leave behind. :func:`validate_spec` returns a list of problems, each
naming the JSON path and the rule, empty for a valid spec.

Rules checked:

- required: ``cdiVersion`` (a released version), ``kind``, ``devices`` (at least one, unique
  names), per device ``name`` and non-empty ``containerEdits``;
- unknown fields at any level make the spec invalid;
- ``kind`` is ``vendor/class``: vendor starts with a letter, ends alphanumeric, holds letters,
  digits, ``-``, ``_``, ``.``; class likewise without ``.`` (dots need 0.6.0), ≤ 63 characters;
- device names hold alphanumerics and ``_ - . :``, start and end alphanumeric (a leading digit
  needs 0.5.0);
- env entries are ``NAME=value``; device node and container paths are absolute; device type
  is one of ``b c u p``; permissions only ``r w m``; hook names are OCI hook names, timeouts > 0;
- ``cdiVersion`` is at least the minimum the fields used require (:func:`minimum_version`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

VERSIONS: Final = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

_VENDOR_RE: Final = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS_RE: Final = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME_RE: Final = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ENV_RE: Final = re.compile(r"^[^=]+=")
_HOOK_NAMES: Final = frozenset(
    ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
)

_SPEC_FIELDS: Final = frozenset(("cdiVersion", "kind", "annotations", "devices", "containerEdits"))
_DEVICE_FIELDS: Final = frozenset(("name", "annotations", "containerEdits"))
_EDIT_FIELDS: Final = frozenset(
    ("env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices")
)
_NODE_FIELDS: Final = frozenset(
    ("path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid")
)
_MOUNT_FIELDS: Final = frozenset(("hostPath", "containerPath", "options", "type"))
_HOOK_FIELDS: Final = frozenset(("hookName", "path", "args", "env", "timeout"))
_RDT_FIELDS: Final = frozenset(("closID", "l3CacheSchema", "memBwSchema", "enableCMT", "enableMBM"))
_NET_FIELDS: Final = frozenset(("hostInterfaceName", "name"))


def _vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _all_edits(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    edits = spec.get("containerEdits")
    if isinstance(edits, Mapping):
        yield edits
    for device in spec.get("devices") or ():
        if isinstance(device, Mapping) and isinstance(device.get("containerEdits"), Mapping):
            yield device["containerEdits"]


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest CDI version that has every feature ``spec`` uses."""
    edits = list(_all_edits(spec))
    devices = [d for d in spec.get("devices") or () if isinstance(d, Mapping)]
    if any(e.get("netDevices") for e in edits):
        return "1.0.0"
    if any(e.get("intelRdt") is not None or e.get("additionalGids") for e in edits):
        return "0.7.0"
    kind = str(spec.get("kind", ""))
    if spec.get("annotations") or any(d.get("annotations") for d in devices):
        return "0.6.0"
    if "/" in kind and "." in kind.split("/", 1)[1]:
        return "0.6.0"
    nodes = [n for e in edits for n in e.get("deviceNodes") or () if isinstance(n, Mapping)]
    if any(n.get("hostPath") for n in nodes):
        return "0.5.0"
    if any(str(d.get("name", "a"))[:1].isdigit() for d in devices):
        return "0.5.0"
    mounts = [m for e in edits for m in e.get("mounts") or () if isinstance(m, Mapping)]
    if any(m.get("type") for m in mounts):
        return "0.4.0"
    return "0.3.0"


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, reason: str) -> None:
        self.problems.append(f"{path}: {reason}")

    def fields(self, path: str, value: object, allowed: frozenset[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.add(path, f"must be an object, got {type(value).__name__}")
            return {}
        for key in value:
            if key not in allowed:
                self.add(f"{path}.{key}", "unknown field")
        return value

    def string(self, path: str, value: object, *, absolute: bool = False) -> str | None:
        if not isinstance(value, str) or not value:
            self.add(path, "must be a non-empty string")
            return None
        if absolute and not value.startswith("/"):
            self.add(path, f"must be an absolute path, got {value!r}")
        return value

    def strings(self, path: str, value: object) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.add(path, "must be a list of strings")
            return []
        return value

    def integer(self, path: str, value: object, *, minimum: int = 0) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.add(path, f"must be an integer >= {minimum}")

    def items(self, path: str, value: object) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, "must be a list")
            return []
        return value


def _check_env(c: _Checker, path: str, value: object) -> None:
    for i, entry in enumerate(c.strings(path, value)):
        if not _ENV_RE.match(entry):
            c.add(f"{path}[{i}]", f"must be NAME=value, got {entry!r}")


def _check_node(c: _Checker, path: str, raw: object) -> None:
    node = c.fields(path, raw, _NODE_FIELDS)
    if not node:
        return
    c.string(f"{path}.path", node.get("path"), absolute=True)
    if "hostPath" in node:
        c.string(f"{path}.hostPath", node["hostPath"], absolute=True)
    if node.get("type", "") not in ("", "b", "c", "u", "p"):
        c.add(f"{path}.type", f"must be one of b, c, u, p, got {node['type']!r}")
    permissions = node.get("permissions", "")
    if not isinstance(permissions, str) or set(permissions) - set("rwm"):
        c.add(f"{path}.permissions", f"may hold only r, w, m, got {permissions!r}")
    for key in ("major", "minor", "fileMode", "uid", "gid"):
        if key in node:
            c.integer(f"{path}.{key}", node[key])


def _check_mount(c: _Checker, path: str, raw: object) -> None:
    mount = c.fields(path, raw, _MOUNT_FIELDS)
    if not mount:
        return
    c.string(f"{path}.hostPath", mount.get("hostPath"))
    c.string(f"{path}.containerPath", mount.get("containerPath"), absolute=True)
    if "options" in mount:
        c.strings(f"{path}.options", mount["options"])
    if "type" in mount:
        c.string(f"{path}.type", mount["type"])


def _check_hook(c: _Checker, path: str, raw: object) -> None:
    hook = c.fields(path, raw, _HOOK_FIELDS)
    if not hook:
        return
    if hook.get("hookName") not in _HOOK_NAMES:
        c.add(f"{path}.hookName", f"must be an OCI hook name, got {hook.get('hookName')!r}")
    c.string(f"{path}.path", hook.get("path"), absolute=True)
    if "args" in hook:
        c.strings(f"{path}.args", hook["args"])
    if "env" in hook:
        _check_env(c, f"{path}.env", hook["env"])
    if "timeout" in hook:
        c.integer(f"{path}.timeout", hook["timeout"], minimum=1)


def _check_edits(c: _Checker, path: str, raw: object, *, required: bool) -> None:
    edits = c.fields(path, raw, _EDIT_FIELDS)
    if required and not any(edits.get(k) for k in _EDIT_FIELDS):
        c.add(path, "a device needs at least one container edit")
    if "env" in edits:
        _check_env(c, f"{path}.env", edits["env"])
    for i, node in enumerate(c.items(f"{path}.deviceNodes", edits.get("deviceNodes"))):
        _check_node(c, f"{path}.deviceNodes[{i}]", node)
    for i, mount in enumerate(c.items(f"{path}.mounts", edits.get("mounts"))):
        _check_mount(c, f"{path}.mounts[{i}]", mount)
    for i, hook in enumerate(c.items(f"{path}.hooks", edits.get("hooks"))):
        _check_hook(c, f"{path}.hooks[{i}]", hook)
    for i, gid in enumerate(c.items(f"{path}.additionalGids", edits.get("additionalGids"))):
        c.integer(f"{path}.additionalGids[{i}]", gid)
    if edits.get("intelRdt") is not None:
        c.fields(f"{path}.intelRdt", edits["intelRdt"], _RDT_FIELDS)
    for i, net in enumerate(c.items(f"{path}.netDevices", edits.get("netDevices"))):
        net_fields = c.fields(f"{path}.netDevices[{i}]", net, _NET_FIELDS)
        for key in sorted(_NET_FIELDS):
            c.string(f"{path}.netDevices[{i}].{key}", net_fields.get(key))


def _check_kind(c: _Checker, kind: object) -> None:
    if not isinstance(kind, str) or kind.count("/") != 1:
        c.add("kind", f"must be vendor/class, got {kind!r}")
        return
    vendor, cls = kind.split("/")
    if not _VENDOR_RE.match(vendor):
        c.add("kind", f"invalid vendor {vendor!r}")
    if len(cls) > 63 or not _CLASS_RE.match(cls):
        c.add("kind", f"invalid class {cls!r}")


def _check_annotations(c: _Checker, path: str, value: object) -> None:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        c.add(path, "must be an object of strings")


def _check_devices(c: _Checker, devices: object) -> None:
    if not isinstance(devices, list) or not devices:
        c.add("devices", "must be a non-empty list")
        return
    seen: set[str] = set()
    for i, raw in enumerate(devices):
        path = f"devices[{i}]"
        device = c.fields(path, raw, _DEVICE_FIELDS)
        if not device:
            continue
        name = c.string(f"{path}.name", device.get("name"))
        if name is not None and not _DEVICE_NAME_RE.match(name):
            c.add(f"{path}.name", f"invalid device name {name!r}")
        if name in seen:
            c.add(f"{path}.name", f"duplicate device name {name!r}")
        seen.add(name or "")
        if "annotations" in device:
            _check_annotations(c, f"{path}.annotations", device["annotations"])
        _check_edits(c, f"{path}.containerEdits", device.get("containerEdits"), required=True)


def validate_spec(spec: object) -> list[str]:
    """Problems with ``spec`` (parsed JSON); empty when it is a valid CDI spec."""
    c = _Checker()
    top = c.fields("spec", spec, _SPEC_FIELDS)
    if not top:
        return c.problems
    version = top.get("cdiVersion")
    if version not in VERSIONS:
        c.add("cdiVersion", f"must be one of {', '.join(VERSIONS)}, got {version!r}")
    _check_kind(c, top.get("kind"))
    if "annotations" in top:
        _check_annotations(c, "annotations", top["annotations"])
    _check_devices(c, top.get("devices"))
    if "containerEdits" in top:
        _check_edits(c, "containerEdits", top["containerEdits"], required=False)
    if not c.problems and isinstance(version, str):
        needed = minimum_version(top)
        if _vtuple(version) < _vtuple(needed):
            c.add("cdiVersion", f"{version} is too old for the fields used (needs {needed})")
    return c.problems
