"""Host-level cleanup after a real node: nothing a test run started may outlive it.

A kubelet + containerd node leaves things behind that killing its two daemons does not remove:
runc shims (re-parented to init by design), container processes, mounts (container root
filesystems, network namespaces, kubelet volumes) under the node's directory, cgroups under the
node's cgroup root, and the CNI bridge. Each function here removes one kind of leftover, scoped
to what this node owns (its directory, its cgroup root, its containerd socket, its bridge), so a
cleanup never touches anything else on the machine. Every step is best effort and keeps going.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from e2e.node import netlink

RECORD = "node.json"


@dataclass(frozen=True)
class NodeRecord:
    """What a node owns on the host, written to ``<root>/node.json`` when it starts, so that a
    later run can clean up after a test process that was killed before its teardown."""

    root: str
    containerd_socket: str
    cgroup: str
    links: tuple[str, ...]
    owner_pid: int
    remove_root: bool

    def write(self) -> None:
        (Path(self.root) / RECORD).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> NodeRecord:
        data = json.loads(path.read_text())
        return cls(**{**data, "links": tuple(data["links"])})


def clean(record: NodeRecord) -> None:
    """Remove everything ``record`` lists (its daemons must already be stopped or dead)."""
    kill_pids(pids_with_arg(record.containerd_socket))  # shims outlive containerd by design
    remove_cgroup(record.cgroup)
    unmount_under(Path(record.root))
    for link in record.links:
        delete_link(link)
    if record.remove_root:
        shutil.rmtree(record.root, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            (Path(record.root) / RECORD).unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale(parent: Path | None = None) -> list[str]:
    """Clean the nodes under ``parent`` (the temp dir) whose owning process is gone."""
    reaped = []
    for path in sorted((parent or Path(tempfile.gettempdir())).glob(f"dra-gpu-*/{RECORD}")):
        try:
            record = NodeRecord.read(path)
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if not _alive(record.owner_pid):
            clean(record)
            reaped.append(record.root)
    return reaped


def _unescape_mount_path(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts_under(root: Path, mountinfo: str) -> list[str]:
    """Mount points at or below ``root`` in ``mountinfo`` text, deepest first (unmount order)."""
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = _unescape_mount_path(fields[4])
        if point == str(root) or point.startswith(prefix):
            points.append(point)
    return sorted(set(points), key=lambda p: (p.count("/"), p), reverse=True)


def unmount_under(root: Path) -> None:
    # Each pass unmounts the deepest first; mounts stacked on the same point need more passes.
    for _ in range(5):
        points = mounts_under(root, Path("/proc/self/mountinfo").read_text())
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies plus the unified one (hybrid hosts) or the v2 root."""
    result = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] in ("cgroup", "cgroup2"):
            result.append(Path(fields[1]))
    return result


def cgroup_pids(directory: Path) -> set[int]:
    pids: set[int] = set()
    for procs in directory.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def remove_cgroup(name: str) -> None:
    """Kill every process in cgroup ``name`` (all hierarchies), then remove it bottom-up."""
    dirs = [h / name.lstrip("/") for h in cgroup_hierarchies()]
    dirs = [d for d in dirs if d.is_dir()]
    for _ in range(20):
        pids = set().union(*(cgroup_pids(d) for d in dirs)) if dirs else set()
        if not pids:
            break
        kill_pids(pids)
        time.sleep(0.1)
    for directory in dirs:
        subdirs = sorted(
            (p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        )
        for sub in [*subdirs, directory]:
            with contextlib.suppress(OSError):
                sub.rmdir()


def create_cgroup(name: str) -> None:
    """Create cgroup ``name`` in every hierarchy (cgroup v1, hybrid or v2 only)."""
    for hierarchy in cgroup_hierarchies():
        create_in_hierarchy(hierarchy, name)


def create_in_hierarchy(hierarchy: Path, name: str) -> Path:
    """Create ``name`` under one mounted hierarchy. A v1 cpuset starts empty and refuses tasks,
    so it gets its parent's CPUs and memory nodes; in v2 an empty ``cpuset.cpus`` means "the
    parent's", and the root there has no such file to copy (the GPU machines are v2 only)."""
    directory = hierarchy / name.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    for knob in ("cpuset.cpus", "cpuset.mems"):
        own, parent = directory / knob, directory.parent / knob
        if own.exists() and parent.exists() and not own.read_text().strip():
            own.write_text(parent.read_text())
    return directory


def pids_with_arg(needle: str) -> list[int]:
    """Processes whose command line contains ``needle`` as one argument (e.g. our socket path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(needle.encode() in arg for arg in args):
            found.append(int(entry.name))
    return [p for p in found if p != os.getpid()]


def delete_link(name: str) -> None:
    netlink.delete_link(name)


def add_address_link(name: str, address: str) -> None:
    """An interface holding ``address``/32: a host-local IP that no network can reach.

    A port-less bridge, since these VMs' kernels have no ``dummy`` module; local delivery works.
    Made over rtnetlink, not with ``ip``, which GPU machines often lack.
    """
    delete_link(name)  # a leftover of a killed run
    netlink.add_bridge(name)
    netlink.add_ipv4(name, address, 32)
    netlink.set_up(name)


def host_addresses() -> list[str]:
    """IPv4 addresses configured on this host's interfaces."""
    return netlink.ipv4_addresses()
