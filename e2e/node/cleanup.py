"""Host-level cleanup after a real node: nothing a test run started may outlive it.

Every node registers a ``NodeRecord`` in ``REGISTRY`` before it creates anything on the host, and
removes it when its teardown is done; a node's start reaps the records whose owning process is
gone (``reap_stale``), wherever their roots are.

A kubelet + containerd node leaves things behind that killing its two daemons does not remove:
runc shims (re-parented to init by design), container processes, mounts (container root
filesystems, network namespaces, kubelet volumes) under the node's directory, cgroups under the
node's cgroup root, and the CNI bridge. Each function here removes one kind of leftover, scoped
to what this node owns (its directory, its cgroup root, its containerd socket, its bridge), so a
cleanup never touches anything else on the machine. Every step is best effort and keeps going.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from e2e.node import netlink

# Host-wide, whatever directory a node's root is in (a default temp dir, the demo's work dir, the
# deployed kit's short root for socket paths): a later run finds every record in one place.
REGISTRY = Path("/run/dra-gpu-nodes")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class NodeRecord:
    """What a node owns on the host, registered (``register``) before it creates any of it, so
    that a later run can clean up after a test process that was killed before its teardown.

    ``containerd_socket`` and ``cgroup`` may be empty: a record of a kit's own host-wide things
    (the deployed kit's API server link) has neither, and an empty one matches nothing."""

    root: str
    containerd_socket: str
    cgroup: str
    links: tuple[str, ...]
    owner_pid: int
    owner_started: str | None  # ``process_identity(owner_pid)``: a reused pid is another process
    remove_root: bool

    @classmethod
    def read(cls, path: Path) -> NodeRecord:
        data = json.loads(path.read_text())
        return cls(**{**data, "links": tuple(data["links"])})


def owned_by_this_process(
    root: Path, *, containerd_socket: str, cgroup: str, links: tuple[str, ...], remove_root: bool
) -> NodeRecord:
    pid = os.getpid()
    return NodeRecord(
        root=str(root),
        containerd_socket=containerd_socket,
        cgroup=cgroup,
        links=links,
        owner_pid=pid,
        owner_started=process_identity(pid),
        remove_root=remove_root,
    )


def record_path(root: str, registry: Path = REGISTRY) -> Path:
    """The one file that registers the node rooted at ``root`` (one per root directory)."""
    return registry / (hashlib.sha256(root.encode()).hexdigest()[:16] + ".json")


def register(record: NodeRecord, registry: Path = REGISTRY) -> Path:
    """Record ``record`` where ``reap_stale`` looks; readers see the whole file or none."""
    registry.mkdir(parents=True, exist_ok=True)
    path = record_path(record.root, registry)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, path)
    return path


def registered(registry: Path = REGISTRY) -> list[NodeRecord]:
    """Every readable record, deepest root first (a node inside a kit's root goes before the
    kit's own record, which removes that root)."""
    records = []
    for path in sorted(registry.glob("*.json")):
        try:
            records.append(NodeRecord.read(path))
        except (OSError, ValueError, TypeError, KeyError):
            continue  # half a file, or another version's: not ours to judge
    return sorted(records, key=lambda r: r.root, reverse=True)


def clean(record: NodeRecord, registry: Path = REGISTRY) -> None:
    """Remove everything ``record`` lists (its daemons must already be stopped or dead), then
    the record itself."""
    if record.containerd_socket:
        kill_trees(pids_with_arg(record.containerd_socket))  # shims outlive containerd by design
    if record.cgroup:
        remove_cgroup(record.cgroup)
    unmount_under(Path(record.root))
    for link in record.links:
        delete_link(link)
    if record.remove_root:
        shutil.rmtree(record.root, ignore_errors=True)
    record_path(record.root, registry).unlink(missing_ok=True)


def identity_from(stat: str, boot_id: str) -> str | None:
    """A process's identity from its ``/proc/<pid>/stat``: boot and start time, so that a pid
    reused by another process (or after a reboot) does not pass for the owner; None for a
    zombie, which runs no teardown any more."""
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return f"{boot_id.strip()}:{fields[19]}"  # field 22 of proc(5): starttime


def process_identity(pid: int) -> str | None:
    """``identity_from`` of ``pid``; None when there is no such process."""
    try:
        return identity_from(Path(f"/proc/{pid}/stat").read_text(), BOOT_ID.read_text())
    except (OSError, IndexError):
        return None


def is_stale(record: NodeRecord) -> bool:
    """The process that registered ``record`` is gone, so no teardown of its will run."""
    alive = process_identity(record.owner_pid)
    return alive is None or alive != record.owner_started


def reap_stale(
    registry: Path = REGISTRY, *, cleaner: Callable[[NodeRecord, Path], None] = clean
) -> list[str]:
    """Clean the registered nodes whose owning process is gone; returns their roots."""
    reaped = []
    for record in registered(registry):
        if is_stale(record):
            cleaner(record, registry)
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
    if not name.strip("/"):
        raise ValueError(f"cgroup {name!r} is a hierarchy's root: every process of the host")
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
    if not needle:
        return []  # "" is in every argument
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


def descendants(roots: Iterable[int], parents: Mapping[int, int]) -> set[int]:
    """``roots`` and every process below them, given each process's parent pid."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def parent_pids() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def kill_trees(pids: Iterable[int]) -> None:
    """SIGKILL ``pids`` and everything below them, listed first: a shim's containers would be
    re-parented away from it once it died, and their cgroup is not always ours (Docker's)."""
    kill_pids(descendants(pids, parent_pids()))


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
