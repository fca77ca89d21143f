"""Which pod a process runs in, from its cgroup: the kubelet names each pod's cgroup after the
pod's UID.

The forms the kubelet writes (cgroup v2 and v1, systemd and cgroupfs drivers, any QoS class):

* ``0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, _ for ->.slice/...``
* ``0::/kubepods/besteffort/pod<uid>/<container id>``
* ``11:memory:/kubepods/pod<uid>/<container id>`` (v1; guaranteed pods sit under ``kubepods``)

A static pod's UID is its config hash (32 hex digits, no dashes). :func:`pod_uid` is pure;
:func:`pod_uid_of_pid` reads ``<proc_root>/<pid>/cgroup``.
"""

from __future__ import annotations

import re
from pathlib import Path

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:^|[/-])pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?(?:/|$)")


def pod_uid(cgroup_text: str) -> str | None:
    """The pod UID named by a ``/proc/<pid>/cgroup`` file's content, or None."""
    for line in cgroup_text.splitlines():
        _hierarchy, _sep, path = line.partition(":")
        _controllers, _sep, path = path.partition(":")
        for part in path.split("/"):
            match = _POD.search("/" + part + "/")
            if match:
                return match.group(1).replace("_", "-")
    return None


def pod_uid_of_pid(pid: int, *, proc_root: Path = Path("/proc")) -> str | None:
    """The pod UID of process ``pid`` as seen under ``proc_root``; None when unknown or gone."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return pod_uid(text)
