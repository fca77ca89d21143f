"""Teardown finds exactly the node's own mounts, deepest first; the node registry finds every
node a killed run left, in any root layout, and only those."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from e2e.node.cleanup import (
    NodeRecord,
    descendants,
    identity_from,
    mounts_under,
    pids_with_arg,
    process_identity,
    reap_stale,
    register,
    registered,
    remove_cgroup,
)

MOUNTINFO = """\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 22 0:40 / /tmp/node rw - tmpfs tmpfs rw
31 30 0:41 / /tmp/node/kubelet/pods/a/volumes/x rw - tmpfs tmpfs rw
32 30 0:42 / /tmp/node/containerd/state/netns/cni-1 rw - nsfs nsfs rw
33 22 0:43 / /tmp/node-other/x rw - tmpfs tmpfs rw
34 30 0:44 / /tmp/node/with\\040space rw - tmpfs tmpfs rw
"""


def test_mounts_under_lists_only_the_node_dir_deepest_first() -> None:
    points = mounts_under(Path("/tmp/node"), MOUNTINFO)
    assert points[-1] == "/tmp/node"
    assert "/tmp/node-other/x" not in points
    assert "/tmp/node/with space" in points
    assert points.index("/tmp/node/kubelet/pods/a/volumes/x") < points.index("/tmp/node")
    assert set(points) == {
        "/tmp/node",
        "/tmp/node/kubelet/pods/a/volumes/x",
        "/tmp/node/containerd/state/netns/cni-1",
        "/tmp/node/with space",
    }


# -- the registry: a later run finds every node a killed run left, whatever its root --------------

LAYOUTS = {  # the roots the harness's kits give their nodes
    "deployed": "/tmp/dg-1a2b3c/h200",  # short, for the kubelet plugin's socket paths
    "default": "/tmp/dra-gpu-gpu-h200-k2j4",  # tests/node, bench, the GPU demo
    "demo": "/tmp/dra-gpu-demo-x/gpu-a100",  # the demo's work directory
}


def _record(root: str, *, pid: int, started: str | None) -> NodeRecord:
    return NodeRecord(
        root=root,
        containerd_socket=f"{root}/containerd/containerd.sock",
        cgroup="/dra-gpu-n-12345678",
        links=("dragpu12345678",),
        owner_pid=pid,
        owner_started=started,
        remove_root=True,
    )


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_nodes_of_a_killed_run_are_reaped_in_every_layout_and_live_ones_are_not(
    tmp_path: Path,
) -> None:
    me, dead = os.getpid(), _dead_pid()
    for root in LAYOUTS.values():
        register(_record(root, pid=dead, started="boot:1"), tmp_path)
    live = _record("/tmp/dg-1a2b3c/a100", pid=me, started=process_identity(me))
    register(live, tmp_path)
    cleaned: list[str] = []

    def cleaner(record: NodeRecord, registry: Path) -> None:
        assert registry == tmp_path
        cleaned.append(record.root)

    assert sorted(reap_stale(tmp_path, cleaner=cleaner)) == sorted(LAYOUTS.values())
    assert sorted(cleaned) == sorted(LAYOUTS.values())


def test_a_reused_pid_does_not_pass_for_the_owner(tmp_path: Path) -> None:
    me = os.getpid()
    register(_record("/tmp/dg-1a2b3c/h200", pid=me, started="another boot:42"), tmp_path)
    assert reap_stale(tmp_path, cleaner=lambda record, registry: None) == ["/tmp/dg-1a2b3c/h200"]


def test_a_kit_root_is_cleaned_after_the_nodes_inside_it(tmp_path: Path) -> None:
    dead = _dead_pid()
    for root in ("/tmp/dg-1a2b3c", "/tmp/dg-1a2b3c/a100", "/tmp/dg-1a2b3c/h200"):
        register(_record(root, pid=dead, started=None), tmp_path)
    order = reap_stale(tmp_path, cleaner=lambda record, registry: None)
    assert order[-1] == "/tmp/dg-1a2b3c"


def test_a_record_is_replaced_whole_and_a_torn_one_is_skipped(tmp_path: Path) -> None:
    first = _record("/tmp/dg-1a2b3c/h200", pid=1, started="a")
    register(first, tmp_path)
    second = dataclasses.replace(first, owner_started="b")
    path = register(second, tmp_path)
    assert registered(tmp_path) == [second]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    (tmp_path / "0000000000000000.json").write_text('{"root": "/tmp/x", "cont')
    assert registered(tmp_path) == [second]


def test_clean_removes_the_record_and_the_root(tmp_path: Path) -> None:
    root = tmp_path / "node"
    (root / "kubelet").mkdir(parents=True)
    registry = tmp_path / "registry"
    record = NodeRecord(
        root=str(root),
        containerd_socket="",  # nothing to kill, no cgroup: a kit's record
        cgroup="",
        links=(),
        owner_pid=_dead_pid(),
        owner_started=None,
        remove_root=True,
    )
    register(record, registry)
    assert reap_stale(registry) == [str(root)]
    assert not root.exists()
    assert registered(registry) == []


def test_process_identity_is_the_boot_and_start_time_and_none_for_a_zombie() -> None:
    stat = "123 (a (b) c) S 1 123 123 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 5"
    assert identity_from(stat, "boot-1\n") == "boot-1:987654"
    assert identity_from(stat.replace(") S ", ") Z "), "boot-1") is None
    assert process_identity(os.getpid()) == process_identity(os.getpid())
    assert process_identity(_dead_pid()) is None


def test_an_empty_needle_or_cgroup_matches_no_process() -> None:
    # A kit's record has no socket and no cgroup: "" is in every command line, and the cgroup
    # "" is each hierarchy's root, every process on the host.
    assert pids_with_arg("") == []
    with pytest.raises(ValueError, match="every process"):
        remove_cgroup("/")


def test_descendants_are_the_whole_tree_below_the_roots() -> None:
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    assert descendants([10], parents) == {10, 11, 12, 13}
    assert descendants([11, 21], parents) == {11, 12, 21}
    assert descendants([99], parents) == {99}
